"""Test tasks: each records what happened in ``qa.models`` so tests can count executions, effects
and refused writes exactly. Names are explicit (``qa.<name>``) so tests can enqueue them by name.

Retry delays are short (``backoff=0.05`` s) so retry tests do not sleep; ``raise_base`` uses a
60 s backoff so its retry is visibly scheduled and not run again within a test.
"""

import asyncio
import collections
import os
import threading
import time
from decimal import Decimal

from django_leasequeue import Backoff, JobContext, LeaseLost, Retry, task

from . import ledger
from .effects import commit_fenced_effect
from .models import Effect, Execution, Probe

# Task names this process leaves unregistered (comma-separated): the chaos suite's rolling deploy
# starts an "old" worker with QA_SKIP_TASKS=qa.chaos_new, a build that does not know that task yet.
SKIP_TASKS = frozenset(filter(None, os.environ.get("QA_SKIP_TASKS", "").split(",")))


def _record(context: JobContext, tag: str = "") -> None:
    Execution.objects.create(job_id=context.job_id, lease_version=context.lease_version, attempt=context.attempt,
                             worker=context.worker_id, tag=tag)


@task(name="qa.record", takes_context=True, max_attempts=3)
def record(context: JobContext, tag: str = "", sleep: float = 0.0) -> str:
    """Count one execution, then sleep ``sleep`` seconds (a job that is "in the middle" while tests
    signal its worker)."""
    _record(context, tag)
    if sleep:
        time.sleep(sleep)
    return tag


@task(name="qa.fenced_effect", takes_context=True, max_attempts=5)
def fenced_effect(context: JobContext, key: str, sleep: float = 0.0) -> None:
    """Work ``sleep`` seconds, renew the lease once by hand, then write an :class:`Effect` inside
    ``fenced_atomic()``. Both outcomes are recorded as :class:`Probe` rows, so a test can see that a
    stale worker's heartbeat and fenced completion were refused."""
    _record(context, key)
    if sleep:
        time.sleep(sleep)
    renewed = context.heartbeat()
    Probe.objects.create(job_id=context.job_id, lease_version=context.lease_version, kind="heartbeat", ok=renewed)
    try:
        with context.fenced_atomic():
            Effect.objects.create(key=key, job_id=context.job_id, lease_version=context.lease_version)
    except LeaseLost:
        Probe.objects.create(job_id=context.job_id, lease_version=context.lease_version, kind="fenced", ok=False)
        raise
    Probe.objects.create(job_id=context.job_id, lease_version=context.lease_version, kind="fenced", ok=True)


@task(name="qa.flaky", takes_context=True, max_attempts=4, backoff=0.05)
def flaky(context: JobContext, failures: int = 2) -> int:
    """Fail the first ``failures`` attempts, then succeed."""
    _record(context, "flaky")
    if context.attempt <= failures:
        raise ConnectionError(f"attempt {context.attempt} of {failures} planned failures")
    return context.attempt


@task(name="qa.poison", takes_context=True, max_attempts=3, backoff=0.05)
def poison(context: JobContext) -> None:
    """Always fail."""
    _record(context, "poison")
    raise ValueError("malformed payload")


@task(name="qa.fail_once", takes_context=True, max_attempts=1)
def fail_once(context: JobContext) -> None:
    """Fail with max_attempts=1: must execute exactly once, then be dead (case C02)."""
    _record(context, "fail_once")
    raise ValueError("no retries for this one")


@task(name="qa.fails_first", takes_context=True, max_attempts=2, backoff=Backoff(base=0, jitter=0))
def fails_first(context: JobContext) -> int:
    """Fail attempt 1, return the attempt number on attempt 2. The retry is due at once (backoff
    0), so a ``--burst`` worker runs it before it finds nothing left."""
    _record(context, "fails_first")
    if context.attempt == 1:
        raise ConnectionError("the first attempt fails")
    return context.attempt


@task(name="qa.crash", takes_context=True, max_attempts=3)
def crash(context: JobContext) -> None:
    """Kill the worker process running it, every time (case C02)."""
    _record(context, "crash")
    os._exit(1)


_BASE_EXCEPTIONS = {
    "SystemExit": lambda: SystemExit(3),
    "KeyboardInterrupt": KeyboardInterrupt,
    "CancelledError": asyncio.CancelledError,
}


@task(name="qa.raise_base", takes_context=True, max_attempts=2, backoff=Backoff(base=60, jitter=0))
def raise_base(context: JobContext, kind: str) -> None:
    """Raise an exception outside the ``Exception`` hierarchy (case C06)."""
    _record(context, kind)
    raise _BASE_EXCEPTIONS[kind]()


@task(name="qa.bad_return", takes_context=True, max_attempts=2)
def bad_return(context: JobContext) -> object:
    """Return a value that is not JSON (case C25)."""
    _record(context, "bad_return")
    return object()


class Unprintable(Exception):
    """An exception whose message cannot be rendered and whose args are not JSON (case C25)."""

    def __str__(self) -> str:
        raise RuntimeError("cannot print me")


@task(name="qa.unprintable", takes_context=True, max_attempts=1)
def unprintable(context: JobContext) -> None:
    _record(context, "unprintable")
    raise Unprintable(Decimal("1"), object())


@task(name="qa.hang", takes_context=True, max_attempts=3, timeout=1)
def hang(context: JobContext, seconds: float) -> None:
    """Hang for ``seconds`` on the first attempt only; ``timeout=1`` stops its heartbeats."""
    _record(context, "hang")
    if context.attempt == 1:
        time.sleep(seconds)


@task(name="qa.busy", takes_context=True, max_attempts=3)
def busy(context: JobContext, seconds: float) -> None:
    """Spin pure-Python CPU for ``seconds`` (the heartbeat thread must still get the GIL)."""
    _record(context, "busy")
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        n += 1


# ---- regressions of hostile input and edge cases (tests across tests/worker, tests/store, tests/enqueue) ----
# Handlers that misuse the API or hand the queue values PostgreSQL refuses. Each test asserts the
# intended outcome (the job ends in a definite state, other jobs are unaffected).


@task(name="qa.adv_result", takes_context=True, max_attempts=3)
def adv_result(context: JobContext, kind: str, sleep: float = 0.0) -> object:
    """Return a result that cannot be stored when ``kind`` is "nul" (a str with U+0000, refused by
    jsonb), "surrogate" (a lone surrogate, not UTF-8) or "bigint" (an int of 5,000 digits, which
    Python will not print); any other ``kind`` returns "ok". Sleeps ``sleep`` seconds first."""
    _record(context, kind)
    if sleep:
        time.sleep(sleep)
    return {"nul": "a\x00b", "surrogate": "\ud800", "bigint": {"n": 10**5000}}.get(kind, "ok")


@task(name="qa.adv_raise_nul", takes_context=True, max_attempts=2)
def adv_raise_nul(context: JobContext) -> None:
    """Fail with a message holding a NUL and a lone surrogate (user input echoed in an error)."""
    _record(context, "raise_nul")
    raise ValueError("cannot parse 'bad\x00input\ud800'")


@task(name="qa.adv_fenced_slow", takes_context=True, max_attempts=3)
def adv_fenced_slow(context: JobContext, key: str, inside: float = 0.0) -> None:
    """A fenced completion whose transaction stays open ``inside`` seconds (a large batch of
    business writes): the job row is locked all that time."""
    _record(context, key)
    with context.fenced_atomic():
        Effect.objects.create(key=key, job_id=context.job_id, lease_version=context.lease_version)
        time.sleep(inside)


class _Abort(Exception):
    pass


@task(name="qa.adv_fenced_nested", takes_context=True, max_attempts=1)
def adv_fenced_nested(context: JobContext, key: str) -> str:
    """fenced_atomic() inside an outer atomic block that the handler rolls back afterwards (a
    service function wrapping its own transaction). fenced_atomic() must refuse to start."""
    from django.db import transaction

    _record(context, key)
    try:
        with transaction.atomic():
            with context.fenced_atomic():
                Effect.objects.create(key=key, job_id=context.job_id, lease_version=context.lease_version)
            raise _Abort("validation failed after the fenced block")
    except _Abort:
        pass
    return "handled"


@task(name="qa.adv_fenced_twice", takes_context=True, max_attempts=3)
def adv_fenced_twice(context: JobContext, key: str) -> None:
    """Two fenced blocks in one attempt (two business steps): the second must be refused."""
    _record(context, key)
    with context.fenced_atomic():
        Effect.objects.create(key=key + "-1", job_id=context.job_id, lease_version=context.lease_version)
    with context.fenced_atomic():
        Effect.objects.create(key=key + "-2", job_id=context.job_id, lease_version=context.lease_version)


@task(name="qa.adv_fenced_set_rollback", takes_context=True, max_attempts=1)
def adv_fenced_set_rollback(context: JobContext, key: str) -> str:
    """Marks the fenced transaction for rollback (a validation helper calls set_rollback)."""
    from django.db import transaction

    _record(context, key)
    with context.fenced_atomic():
        Effect.objects.create(key=key, job_id=context.job_id, lease_version=context.lease_version)
        transaction.set_rollback(True)
    return "ok"


# Gates for in-process workers: a test opens ``GATES[key]`` to let ``qa.adv_gated`` return.
GATES: collections.defaultdict[str, threading.Event] = collections.defaultdict(threading.Event)


@task(name="qa.adv_gated", takes_context=True, max_attempts=3)
def adv_gated(context: JobContext, key: str, timeout: float = 30.0) -> str:
    """Record the execution, then wait (at most ``timeout`` seconds) until the test sets
    ``GATES[key]``; return ``key``. Only meaningful for a worker running in the test process."""
    _record(context, key)
    GATES[key].wait(timeout)
    return key


@task(name="qa.adv_fenced_commit_fails", takes_context=True, max_attempts=2)
def adv_fenced_commit_fails(context: JobContext, key: str) -> str:
    """A fenced block whose COMMIT fails: an Invoice pointing at a missing account violates a
    deferred foreign key, checked only at commit. Neither the effect nor the completion commits."""
    from invoices.models import Invoice

    _record(context, key)
    with context.fenced_atomic():
        Effect.objects.create(key=key, job_id=context.job_id, lease_version=context.lease_version)
        Invoice.objects.create(account_id=-1, period="2026-11", amount_cents=1, job_id=context.job_id,
                               lease_version=context.lease_version)
    return "unreachable"


# ---- reliability suite (tests marked chaos) ----


@task(name="qa.chaos", takes_context=True, max_attempts=25, backoff=Backoff(base=0.05, factor=2, max=0.5))
def chaos(context: JobContext, work: float = 0.0, mark: bool = False) -> None:
    """The chaos suite's workload (tests/chaos): work ``work`` seconds, then commit one
    :class:`Effect` keyed by job id and token inside ``fenced_atomic()``, together with the job's
    completion. A refused commit (stale token) leaves a ``Probe(kind="fenced", ok=False)`` row, so
    the ledger can check that no effect exists for that token. ``max_attempts`` is high and the
    backoff short: faults (a dropped connection inside the handler) cost an attempt, and the suite
    asserts that every job still ends ``done``.

    ``mark``: first write an ``Execution(tag="chaos-started")`` row (outside any fence), so a test
    can tell a handler that started from a job only claimed (a prefetched job waiting for a thread)."""
    with ledger.execution(context, "qa.chaos"):
        if mark:
            _record(context, "chaos-started")
        if work:
            time.sleep(work)
        commit_fenced_effect(context)


@task(name="qa.chaos_plain", takes_context=True, max_attempts=25, backoff=Backoff(base=0.05, factor=2, max=0.5))
def chaos_plain(context: JobContext, work: float = 0.0, size: int = 0) -> object:
    """The chaos suite's second workload: a plain handler that returns a value, completed by the
    worker's default (batched) completion path, with no fence. Every run is in the execution
    ledger (``qa.ledger``), outside the job's transaction, so a run of a job whose handler had
    already returned shows up as a second ledger row. ``size`` > 0: return a string of that many
    characters instead (the huge-result fault)."""
    with ledger.execution(context, "qa.chaos_plain"):
        if work:
            time.sleep(work)
        if size:
            return "x" * size
        return {"job": context.job_id, "token": context.lease_version}


@task(name="qa.chaos_keyed", takes_context=True, max_attempts=5, timeout=1, backoff=0.05,
      concurrency_key="{key}", concurrency_limit=1)
def chaos_keyed(context: JobContext, key: str, work: float = 0.0, first_only: bool = True) -> str:
    """A plain handler under a per-key limit of 1 with ``timeout=1``: sleeps ``work`` seconds (on
    the first attempt only when ``first_only``), so a ``work`` above 1 s runs past the timeout. The
    ledger row carries the key, so the suite can count handlers of one key running at once."""
    with ledger.execution(context, "qa.chaos_keyed", concurrency_key=key):
        if work and (context.attempt == 1 or not first_only):
            time.sleep(work)
        return key


def _chaos_new(context: JobContext, work: float = 0.0) -> dict[str, int]:
    """The rolling deploy's new task: a plain handler only the "new" build registers."""
    with ledger.execution(context, "qa.chaos_new"):
        if work:
            time.sleep(work)
        return {"job": context.job_id, "pid": os.getpid()}


if "qa.chaos_new" not in SKIP_TASKS:
    chaos_new = task(name="qa.chaos_new", takes_context=True, max_attempts=3, backoff=0.05)(_chaos_new)


def _recurse(depth: int = 0) -> int:
    return _recurse(depth + 1) + 1


def _raise(exc: BaseException) -> None:
    raise exc


_POISON = {
    "SystemExit": lambda: _raise(SystemExit(3)),
    "KeyboardInterrupt": lambda: _raise(KeyboardInterrupt()),
    "RecursionError": _recurse,  # genuine: recurses until the interpreter's limit
    "MemoryError": lambda: bytearray(1 << 60),  # genuine: the allocator refuses an exabyte at once
    "os._exit": lambda: os._exit(1),
    "segfault": lambda: __import__("ctypes").string_at(0),  # SIGSEGV: the process dies (-11)
}


@task(name="qa.hostile", takes_context=True, max_attempts=2, backoff=0.05)
def hostile(context: JobContext, kind: str) -> None:
    """A poison handler (hostile input): raises a ``BaseException`` the worker must
    treat as a failed attempt, or takes its whole process down (``os._exit``, a segfault), which
    only a lease expiry can detect. Every run is counted in :class:`Execution`."""
    _record(context, kind)
    _POISON[kind]()


@task(name="qa.hang_forever", takes_context=True, max_attempts=3, timeout=1, backoff=0.05)
def hang_forever(context: JobContext) -> None:
    """Hang for good on the first attempt, blocked on an event nobody sets (``timeout=1`` stops
    its heartbeats); the retry returns at once."""
    _record(context, "hang_forever")
    if context.attempt == 1:
        threading.Event().wait()


@task(name="qa.digest", max_attempts=1)
def digest(blob: str, items: list[object] | None = None) -> dict[str, object]:
    """Return the length and SHA-256 of ``blob`` and the number of ``items`` (case C24: a big
    payload arrives intact)."""
    import hashlib

    return {"len": len(blob), "sha256": hashlib.sha256(blob.encode()).hexdigest(), "items": len(items or [])}


@task(name="qa.overlap", takes_context=True, max_attempts=2, timeout=1, backoff=0.05,
      concurrency_key="{key}", concurrency_limit=1)
def overlap(context: JobContext, key: str, sleep: float = 4.0) -> str:
    """Run past its ``timeout=1`` (a sleep the thread cannot be stopped in), writing an
    :class:`Execution` row at the start (tag ``start:<threads alive in the worker>``) and at the
    return (tag ``end``), outside any transaction: a ledger of which handlers ran at the same time.
    At most one job per ``key`` may be leased at once."""
    _record(context, f"start:{threading.active_count()}")
    time.sleep(sleep)
    _record(context, "end")
    return key


@task(name="qa.spin_forever", takes_context=True, max_attempts=1, timeout=1)
def spin_forever(context: JobContext) -> None:
    """A pure-Python loop that never ends (process mode must kill it at its 1 s timeout)."""
    _record(context, "spin_forever")
    while True:
        pass


@task(name="qa.gil_hog", takes_context=True, max_attempts=1, timeout=1)
def gil_hog(context: JobContext) -> int:
    """One C call that holds the GIL for hours (``sum`` over a huge range never releases it): in
    thread mode it would wedge its worker; process mode must kill it at its 1 s timeout."""
    _record(context, "gil_hog")
    return sum(range(10**13))


@task(name="qa.fenced_in_child", takes_context=True, max_attempts=2)
def fenced_in_child(context: JobContext, key: str) -> dict[str, object]:
    """Write an :class:`Effect` inside ``fenced_atomic()`` and return the pid it ran in (process
    mode: the child's, fenced on the job's token all the same)."""
    _record(context, key)
    with context.fenced_atomic():
        Effect.objects.create(key=key, job_id=context.job_id, lease_version=context.lease_version)
    return {"pid": os.getpid()}


@task(name="qa.fenced_late", takes_context=True, max_attempts=2, timeout=1, backoff=0.05)
def fenced_late(context: JobContext, key: str, sleep: float = 2.0) -> str:
    """Sleep past the ``timeout=1``, then try a fenced write: refused (JobTimedOut), nothing committed."""
    _record(context, key)
    time.sleep(sleep)
    try:
        with context.fenced_atomic():
            Effect.objects.create(key=key, job_id=context.job_id, lease_version=context.lease_version)
    except Exception as exc:
        Probe.objects.create(job_id=context.job_id, lease_version=context.lease_version, kind="fenced", ok=False)
        raise exc
    return key


@task(name="qa.returning", takes_context=True, max_attempts=5)
def returning(context: JobContext, work: float = 0.0) -> int:
    """A plain handler that returns a value (completed by the worker's batched completer, not by
    ``fenced_atomic()``). It appends ``start`` and ``return`` lines to a ledger file in
    ``QA_LEDGER_DIR`` (one file per process), outside the database: the lines are written even
    while the database is unreachable, so a test can count every execution and every re-run of a
    job whose handler had already returned."""
    path = os.path.join(os.environ["QA_LEDGER_DIR"], f"{os.getpid()}.log")
    with open(path, "a") as fh:
        fh.write(f"start {context.job_id} {context.lease_version}\n")
    if work:
        time.sleep(work)
    with open(path, "a") as fh:
        fh.write(f"return {context.job_id} {context.lease_version}\n")
    return context.job_id


@task(name="qa.sized", takes_context=True, max_attempts=3)
def sized(context: JobContext, n: int, fenced: bool = False) -> str:
    """Return a string of ``n`` characters (``n + 2`` bytes of JSON); with ``fenced``, first
    complete the job inside ``fenced_atomic()`` (an :class:`Effect`), so the value is the late
    result stored after the fenced commit."""
    _record(context, "sized")
    if fenced:
        with context.fenced_atomic():
            Effect.objects.create(key=f"sized-{context.job_id}", job_id=context.job_id,
                                  lease_version=context.lease_version)
    return "x" * n


@task(name="qa.adv_sigterm_fenced", takes_context=True, max_attempts=1, timeout=1)
def adv_sigterm_fenced(context: JobContext, key: str, sleep: float = 1.5) -> str:
    """Process mode only (it needs the main thread): ignore SIGTERM, as a handler that installs
    its own handler may, sleep past the ``timeout=1``, then commit an :class:`Effect` inside
    ``fenced_atomic()`` during the 2 s between the worker's SIGTERM and its SIGKILL."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _record(context, key)
    time.sleep(sleep)
    with context.fenced_atomic():
        Effect.objects.create(key=key, job_id=context.job_id, lease_version=context.lease_version)
    return key


@task(name="qa.adv_grandchild", takes_context=True, max_attempts=1, timeout=1)
def adv_grandchild(context: JobContext, pidfile: str) -> None:
    """Start a subprocess that sleeps 30 s (its pid written to ``pidfile``), then hang past the
    ``timeout=1``: in process mode the child is killed at the timeout; is its subprocess?"""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    with open(pidfile, "w") as fh:
        fh.write(str(proc.pid))
    time.sleep(60)


# Retries decided by the error: one task per rule, each run counted as an Execution (tag = kind).
@task(name="qa.discarded_error", takes_context=True, max_attempts=5, discard_on=PermissionError)
def discarded_error(context: JobContext, n: int) -> None:
    """Raise a ``discard_on`` error: dead-lettered after its first attempt, 4 attempts unspent."""
    _record(context, "discarded")
    raise PermissionError(f"no access to record {n}")


@task(name="qa.flaky_until_third", takes_context=True, max_attempts=5, retry_on=ConnectionError,
      discard_on=PermissionError, backoff=lambda attempt, exc: 0.05 if isinstance(exc, ConnectionError) else None)
def flaky_until_third(context: JobContext, n: int) -> int:
    """Raise a ``retry_on`` error on attempts 1 and 2 (retried 50 ms later), return ``n`` on the third."""
    _record(context, "flaky")
    if context.attempt < 3:
        raise ConnectionError(f"upstream down (attempt {context.attempt})")
    return n


@task(name="qa.retry_at", takes_context=True, max_attempts=3)
def retry_at(context: JobContext, n: int, delay: float = 0.2) -> int:
    """First attempt: ``raise Retry(at=now + delay)`` (database time); second attempt: return ``n``."""
    from datetime import timedelta

    from django_leasequeue import store

    _record(context, "retry_at")
    if context.attempt == 1:
        raise Retry(at=store.db_now() + timedelta(seconds=delay), reason=f"quota resets (record {n})")
    return n


@task(name="qa.child_dies_once", takes_context=True, max_attempts=3, retry_on=ConnectionError, backoff=0.05)
def child_dies_once(context: JobContext, n: int) -> int:
    """Take the process down on attempt 1 (``os._exit``: in process execution, only the child
    dies), return ``n`` on attempt 2. ``retry_on`` names an error this never raises: a dead child
    is still retried."""
    _record(context, "child_dies")
    if context.attempt == 1:
        os._exit(3)
    return n


@task(name="qa.child_pid_sleeper", takes_context=True, max_attempts=3)
def child_pid_sleeper(context: JobContext, seconds: float) -> None:
    """Record this process's pid (the tag of an ``Execution``), then sleep ``seconds``: a long
    handler whose process the tests look for after its worker died or lost the lease."""
    _record(context, tag=f"pid:{os.getpid()}")
    time.sleep(seconds)
from . import failover_tasks, wf_chaos_tasks, wf_process_tasks  # noqa: E402,F401  (these test tasks register on import)


@task(name="qa.limited", takes_context=True, max_attempts=3, concurrency_key="limited-{key}", concurrency_limit=2)
def limited(context: JobContext, key: str, work: float = 0.05) -> str:
    """At most 2 handlers of one ``key`` at once, across every worker: each run is in the execution
    ledger with its concurrency key and database-clock start and end, so a test computes how many
    of one key really ran at once (tests/pgbouncer/test_flow_through_pgbouncer.py)."""
    with ledger.execution(context, "qa.limited", concurrency_key=f"limited-{key}"):
        time.sleep(work)
        return key
