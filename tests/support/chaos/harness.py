"""The chaos harness: a fleet of real ``runworker`` processes, a workload of fenced effects, fault
injectors, and the ledger that must balance at the end.

The workload is the ``qa.chaos`` task (``testproject/qa/tasks.py``): each job commits one
``Effect`` row keyed by its id and fencing token inside ``ctx.fenced_atomic()``, together with its
``done``; a commit refused for a stale token leaves a ``Probe(kind="fenced", ok=False)`` row. So
at the end, whatever was killed, frozen or cut off:

* every job is ``done``, ``dead`` or ``cancelled`` (nothing ``ready``/``leased`` is left);
* every ``done`` job has exactly one effect, written under its final token;
* a job that is not ``done`` has no effect, and no effect exists under a token whose write was
  refused (a ``Probe`` or a ``lease_lost`` note in the job's history names that token);
* the number of jobs equals the number enqueued.

The second workload, ``qa.chaos_plain``, returns a value and is completed by the worker's default
(batched) completion path, without a fence: there is no effect to count, so the execution ledger
does the counting. Every workload handler writes a ``qa.LedgerEntry`` row per start, completed
when it returns, on a connection of its own outside the job's transaction (``qa.ledger``).
:func:`execution_books` reads it: handler executions, re-runs of jobs whose handler had already
returned, attempts of one job running at the same time, and the most handlers of one concurrency
key running at once.

Times that go into the results (fault instants, recoveries) are read from the database clock,
because that is the only clock the queue uses.

Each test records a row of ``build/reliability.json`` with :func:`record`;
``python -m tests.support.chaos.report`` renders them as the table in ``docs/explanation/reliability.md``.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest
from django.db import connection
from qa.models import Effect, Execution, LedgerEntry, Probe

from django_leasequeue import enqueue_many, store
from django_leasequeue.models import Job, WorkerProcess
from tests.support import wait_for

ROOT = Path(__file__).resolve().parents[3]
# ``python -m tests.support.chaos.report --run`` points this at a scratch copy, so that the file only
# changes when the suite passed.
RESULTS = Path(os.environ.get("LEASEQUEUE_CHAOS_RESULTS") or ROOT / "build" / "reliability.json")

# Short leases and a fast embedded reaper, so that a fault costs seconds; SHUTDOWN_GRACE bounds a
# graceful stop. Every worker process gets these unless a test overrides them.
CHAOS_ENV = {
    "LEASEQUEUE_LEASE": "2",
    "LEASEQUEUE_REAPER_INTERVAL": "0.5",
    "LEASEQUEUE_POLL_INTERVAL": "0.5",
    "LEASEQUEUE_SHUTDOWN_GRACE": "3",
}
LEASE = float(CHAOS_ENV["LEASEQUEUE_LEASE"])

ACTIVE = ("ready", "leased")


FULL_JOBS = 5000  # the least workload of a fault class in a --full run


def scaled(n: int, *, workload: bool = True) -> int:
    """``n`` times ``LEASEQUEUE_CHAOS_SCALE`` (default 1): the suite's sizes fit a few minutes on
    a loaded 2-core machine; a bigger machine, or a nightly run, can multiply them. With
    ``LEASEQUEUE_CHAOS_FULL=1`` (``python -m tests.support.chaos.report --run --full``) a fault class's
    workload is at least :data:`FULL_JOBS`, the size the published table is measured at;
    ``workload=False`` for the other sizes of a test (jobs per key, ...), which only scale."""
    size = max(1, round(n * float(os.environ.get("LEASEQUEUE_CHAOS_SCALE", "1"))))
    full = workload and os.environ.get("LEASEQUEUE_CHAOS_FULL") == "1"
    return max(FULL_JOBS, size) if full else size
FINISHED = ("done", "dead", "cancelled")


# ---------------------------------------------------------------------------------------------
# Workload
# ---------------------------------------------------------------------------------------------


def enqueue_chaos(n: int, *, seed: int, long_share: float = 0.005, long_work: tuple[float, float] = (1.0, 3.0),
                  short_share: float = 0.1, short_work: tuple[float, float] = (0.01, 0.08),
                  max_attempts: int | None = None, queue: str | None = None, mark: bool = False,
                  priority: int | None = None) -> list[int]:
    """Enqueue ``n`` ``qa.chaos`` jobs in one statement; return their ids (in id order).

    Most jobs do no work beyond their fenced commit; ``short_share`` of them sleep a few
    milliseconds (so threads are caught mid-job) and ``long_share`` sleep one to three seconds,
    longer than a heartbeat interval (so faults also land mid-heartbeat). ``seed`` makes the mix
    reproducible. ``mark``: each handler writes a started marker first (see :func:`started`).
    """
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        r = rng.random()
        if r < long_share:
            work = round(rng.uniform(*long_work), 3)
        elif r < long_share + short_share:
            work = round(rng.uniform(*short_work), 3)
        else:
            work = 0.0
        kwargs: dict[str, object] = {"work": work} if work else {}
        if mark:
            kwargs["mark"] = True
        items.append(([], kwargs))
    before = set(Job.objects.filter(task="qa.chaos").values_list("id", flat=True))
    options = {"max_attempts": max_attempts} if max_attempts else {}
    if queue:
        options["queue"] = queue
    if priority is not None:
        options["priority"] = priority
    assert enqueue_many("qa.chaos", items, **options) == n
    ids = sorted(set(Job.objects.filter(task="qa.chaos").values_list("id", flat=True)) - before)
    assert len(ids) == n
    return ids


def enqueue_plain(n: int, *, seed: int, long_share: float = 0.005, long_work: tuple[float, float] = (1.0, 3.0),
                  short_share: float = 0.1, short_work: tuple[float, float] = (0.01, 0.08),
                  max_attempts: int | None = None, queue: str | None = None, task: str = "qa.chaos_plain",
                  size: int = 0) -> list[int]:
    """Enqueue ``n`` jobs of the plain workload (``qa.chaos_plain``: the handler returns a value,
    completed by the default completion path), with the same mix of work as :func:`enqueue_chaos`;
    return their ids in id order. ``task``: another plain ledger task (``qa.chaos_new``);
    ``size``: each returns a string of that many characters."""
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        r = rng.random()
        kwargs: dict[str, object] = {}
        if r < long_share:
            kwargs["work"] = round(rng.uniform(*long_work), 3)
        elif r < long_share + short_share:
            kwargs["work"] = round(rng.uniform(*short_work), 3)
        if size:
            kwargs["size"] = size
        items.append(([], kwargs))
    before = set(Job.objects.filter(task=task).values_list("id", flat=True))
    options: dict[str, object] = {"max_attempts": max_attempts} if max_attempts else {}
    if queue:
        options["queue"] = queue
    assert enqueue_many(task, items, **options) == n
    ids = sorted(set(Job.objects.filter(task=task).values_list("id", flat=True)) - before)
    assert len(ids) == n
    return ids


def enqueue_both(n: int, *, seed: int, **options: object) -> tuple[list[int], list[int]]:
    """``n`` jobs of each workload: ``(fenced qa.chaos ids, plain qa.chaos_plain ids)``."""
    return enqueue_chaos(n, seed=seed, **options), enqueue_plain(n, seed=seed + 1, **options)


WORKLOAD = ("qa.chaos", "qa.chaos_plain")


def started(ids: Iterable[int]) -> set[tuple[int, int]]:
    """``(job id, token)`` of the marked ``qa.chaos`` handlers (``mark=True``) among ``ids`` that
    have started: a lease without a marker was only claimed (prefetched), not run."""
    return set(Execution.objects.filter(job_id__in=list(ids), tag="chaos-started").values_list(
        "job_id", "lease_version"))


def remaining(task: str | None = "qa.chaos") -> int:
    """Jobs still ``ready`` or ``leased`` (of ``task``; of every task when None)."""
    qs = Job.objects.filter(status__in=ACTIVE)
    return (qs.filter(task=task) if task else qs).count()


def finished_count(task: str = "qa.chaos") -> int:
    return Job.objects.filter(task=task, status__in=FINISHED).count()


def wait_drained(timeout: float, *, task: str | None = "qa.chaos", tick: Callable[[], None] | None = None,
                 interval: float = 0.25) -> float:
    """Wait until no job (of ``task``) is ``ready`` or ``leased``; call ``tick()`` between polls
    (fault injection, supervision). Returns the seconds waited; fails the test on timeout with the
    counts left."""
    start = time.monotonic()
    while remaining(task):
        if time.monotonic() - start > timeout:
            left = Counter(Job.objects.filter(status__in=ACTIVE).values_list("status", flat=True))
            pytest.fail(f"queue not drained after {timeout:.0f}s: {dict(left)} left")
        if tick is not None:
            tick()
        time.sleep(interval)
    return time.monotonic() - start


def wait_settled(timeout: float, *, tick: Callable[[], None] | None = None, interval: float = 0.25) -> float | None:
    """Like :func:`wait_drained` over every task, but on timeout return None instead of failing:
    the test records its row (the figures of a failing run are the "before" of a fix) and then
    asserts."""
    start = time.monotonic()
    while remaining(None):
        if time.monotonic() - start > timeout:
            return None
        if tick is not None:
            tick()
        time.sleep(interval)
    return time.monotonic() - start


def statuses(ids: Iterable[int]) -> dict[str, int]:
    """``{status: jobs}`` of jobs ``ids``."""
    return dict(Counter(Job.objects.filter(id__in=list(ids)).values_list("status", flat=True)))


def runs_note(books: Ledger) -> str:
    """The execution ledger's side figures for a row's notes."""
    runs = books.runs
    if runs is None:
        return ""
    parts = [f"{runs.executions:,} handler executions ({runs.returned:,} returned)"]
    if runs.reruns:
        parts.append(f"{runs.reruns} re-runs of {runs.rerun_jobs} returned jobs")
    if runs.overlaps:
        parts.append(f"{runs.overlaps} overlapping attempt pairs on {runs.overlapping_jobs} jobs")
    if runs.open_ended or runs.unknown_end:
        parts.append(f"{runs.open_ended} still running, {runs.unknown_end} of exited processes never returned")
    return "; ".join(parts)


def db_now() -> datetime:
    """The database clock of the test's connection (what the queue's statements read)."""
    return store.db_now()


# ---------------------------------------------------------------------------------------------
# Worker fleet
# ---------------------------------------------------------------------------------------------


@dataclass(eq=False)
class Member:
    """One worker process of a :class:`Fleet`."""

    name: str
    proc: object  # tests.conftest.WorkerProcess
    started: float = field(default_factory=time.monotonic)

    @property
    def running(self) -> bool:
        return self.proc.running

    @property
    def pid(self) -> int:
        return self.proc.pid

    def registered(self) -> bool:
        """True once the worker has written its registry row (it is claiming)."""
        return WorkerProcess.objects.filter(id__endswith=f":{self.name}", pid=self.pid).exists()


class Fleet:
    """Named ``runworker`` processes started through the ``spawn`` fixture.

    Each one gets ``--worker-id <name>`` (so ``leased_by`` ends with ``:<name>``) and
    ``PGAPPNAME=chaos-<name>`` (so its database sessions can be found in ``pg_stat_activity``).
    """

    def __init__(self, spawn: Callable[..., object], *, concurrency: int = 4, env: dict[str, str] | None = None,
                 prefix: str = "w", args: tuple[str, ...] = ()) -> None:
        self.spawn = spawn
        self.concurrency = concurrency
        self.args = args  # extra runworker options, e.g. ("--queues", "a,b")
        self.env = {**CHAOS_ENV, **(env or {})}
        self.prefix = prefix
        self.members: list[Member] = []
        self.kills = 0
        # pid -> database time by which that process was gone (killed, stopped, or seen exited):
        # the end of any execution of it that never returned (see execution_books()).
        self.deaths: dict[int, datetime] = {}

    def start(self, *, env: dict[str, str] | None = None, name: str | None = None,
              args: tuple[str, ...] | None = None) -> Member:
        """Start one more worker; ``args`` replaces the fleet's extra runworker options for it."""
        name = name or f"{self.prefix}{len(self.members) + 1}"
        full_env = {**self.env, "PGAPPNAME": f"chaos-{name}", **(env or {})}
        proc = self.spawn("runworker", "--concurrency", str(self.concurrency), "--worker-id", name,
                          *(self.args if args is None else args), env=full_env)
        member = Member(name, proc)
        self.members.append(member)
        return member

    def start_reaper(self) -> object:
        """A standalone ``runreaper`` sweeping every 0.5 s, which faults never hit: recovery from
        a kill then depends on the lease alone, not on whether some worker is up to reap."""
        return self.spawn("runreaper", "--interval", CHAOS_ENV["LEASEQUEUE_REAPER_INTERVAL"],
                          env={**self.env, "PGAPPNAME": "chaos-reaper"})

    def live(self) -> list[Member]:
        return [m for m in self.members if m.running]

    def wait_registered(self, members: Iterable[Member] | None = None, timeout: float = 90) -> None:
        """Wait until these workers (default: every live one) are registered and claiming."""
        pending = list(members if members is not None else self.live())
        deadline = time.monotonic() + timeout
        while pending:
            dead = [m for m in pending if not m.running]
            if dead:
                pytest.fail(f"worker {dead[0].name} exited during start-up:\n{dead[0].proc.output()}")
            pending = [m for m in pending if not m.registered()]
            if time.monotonic() > deadline:
                pytest.fail(f"workers {[m.name for m in pending]} not registered after {timeout}s")
            time.sleep(0.2)

    def sigkill(self, member: Member) -> None:
        """SIGKILL ``member``, then wait until its database sessions are gone: a statement it sent
        just before dying (a claim, a COMMIT) may still run on the server until then, so only
        afterwards do its rows hold still."""
        member.proc.kill()
        self.kills += 1
        wait_for(lambda: not [b for b in backends() if b[1] == f"chaos-{member.name}"], timeout=60, interval=0.02,
                 what=f"the sessions of killed worker {member.name} to end")
        self.deaths[member.pid] = db_now()

    def note_exits(self) -> None:
        """Record, as an upper bound of its death, the database time now for every member seen
        exited whose death is not recorded yet (call it between polls)."""
        gone = [m for m in self.members if m.pid not in self.deaths and not m.running]
        if gone:
            at = db_now()
            for m in gone:
                self.deaths[m.pid] = at

    def stop(self, timeout: float = 60) -> dict[str, tuple[int, float]]:
        """SIGTERM every live worker at once; return ``{name: (exit code, seconds to exit)}``."""
        live = self.live()
        start = time.monotonic()
        for m in live:
            m.proc.signal(signal.SIGTERM)
        result = {}
        for m in live:
            code = m.proc.wait(timeout)
            result[m.name] = (code, time.monotonic() - start)
        self.note_exits()
        return result


@dataclass(frozen=True)
class Held:
    """A lease a worker held when a fault hit it."""

    job_id: int
    token: int
    attempt: int
    worker: str  # leased_by (host:pid:name)


def held_by(name: str) -> list[Held]:
    """The leases worker ``name`` holds right now."""
    return [Held(*row) for row in Job.objects.filter(status="leased", leased_by__endswith=f":{name}")
            .values_list("id", "lease_version", "attempts", "leased_by")]


def reaped_at(held: Held) -> datetime | None:
    """When the reaper took that lease back (database time of the attempt's ``LeaseExpired``
    error entry), or None if it did not expire (its worker finished or released it first)."""
    errors = Job.objects.values_list("errors", flat=True).get(pk=held.job_id)
    for entry in errors:
        if (entry.get("type"), entry.get("attempt"), entry.get("worker")) == ("LeaseExpired", held.attempt,
                                                                               held.worker):
            return datetime.fromisoformat(entry["at"])
    return None


def backends(app_prefix: str = "chaos-") -> list[tuple[int, str, str, str]]:
    """Worker sessions of the test database: ``(pid, application_name, state, query)``."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT pid, application_name, coalesce(state, ''), coalesce(query, '') FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() AND application_name LIKE %s",
            [app_prefix + "%"],
        )
        return cur.fetchall()


def terminate(pid: int) -> bool:
    """``pg_terminate_backend(pid)``: True if the session existed."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(%s)", [pid])
        return bool(cur.fetchone()[0])


# ---------------------------------------------------------------------------------------------
# Ledger
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One handler execution from the execution ledger: ``ended`` is when it returned or raised,
    None if it never did (still running, or its process died)."""

    job_id: int
    token: int
    pid: int
    started: datetime
    ended: datetime | None
    outcome: str  # "returned", "raised", or "" (never ended)
    concurrency_key: str = ""
    worker: str = ""


@dataclass
class ExecutionBooks:
    """What the execution ledger says about a set of jobs (see :func:`analyse_runs`)."""

    executions: int  # handler starts
    returned: int  # executions that returned a value (not raised)
    reruns: int  # starts with a later token than a recorded return of the same job
    rerun_jobs: int  # jobs with at least one such start
    overlaps: int  # pairs of executions of one job whose intervals overlap
    overlapping_jobs: int
    max_per_key: dict[str, int]  # most executions of one concurrency key running at once
    max_per_process: dict[int, int]  # most executions running at once in one worker process (by pid)
    open_ended: int  # executions that never ended, of a process still alive at the reading
    unknown_end: int  # executions that never ended, of a process gone at an unknown time
    examples: list[str] = field(default_factory=list)  # a few re-runs and overlaps, for messages

    @property
    def max_concurrent_per_key(self) -> int | None:
        return max(self.max_per_key.values()) if self.max_per_key else None


def analyse_runs(runs: Iterable[Run], *, deaths: dict[int, datetime] | None = None,
                 alive: Callable[[int], bool] | None = None, now: datetime | None = None) -> ExecutionBooks:
    """The ledger's arithmetic, on rows already read (a pure function, self-tested on synthetic
    rows in ``test_ledger_arithmetic.py``).

    * A *re-run* is a start whose token is later than the token of a recorded return of the same
      job: its handler had already returned a value, and it ran again.
    * Two executions of one job *overlap* when their intervals ``[started, end)`` intersect. The
      end is the return (or raise); for one that never ended, the death of its process
      (``deaths[pid]``, database time), else ``now`` while the process is ``alive(pid)`` (still
      running, so open-ended), else unknown: then the execution is counted in ``unknown_end`` and
      closes at its own start (it cannot be shown to overlap).
    * ``max_per_key``: the most executions of one concurrency key whose intervals hold at once;
      ``max_per_process``: the same per worker process (to compare with its ``--concurrency``).
    """
    deaths = deaths or {}
    alive = alive or _pid_alive
    runs = list(runs)
    by_job: dict[int, list[Run]] = defaultdict(list)
    for r in runs:
        by_job[r.job_id].append(r)
    open_ended = unknown = 0
    FAR = datetime.max.replace(tzinfo=runs[0].started.tzinfo) if runs else None

    def end_of(r: Run) -> datetime:
        nonlocal open_ended, unknown
        if r.ended is not None:
            return r.ended
        if r.pid in deaths:
            return max(deaths[r.pid], r.started)
        if alive(r.pid):
            open_ended += 1
            return now or FAR  # type: ignore[return-value]
        unknown += 1
        return r.started

    ends = {id(r): end_of(r) for r in runs}
    reruns = rerun_jobs = overlaps = overlapping_jobs = 0
    examples: list[str] = []
    for job_id, job_runs in by_job.items():
        returned = [r.token for r in job_runs if r.outcome == "returned"]
        if returned:
            later = [r for r in job_runs if r.token > min(returned)]
            reruns += len(later)
            rerun_jobs += bool(later)
            if later and len(examples) < 6:
                examples.append(f"job {job_id} returned under token {min(returned)}, ran again under "
                                f"{sorted(r.token for r in later)}")
        job_runs.sort(key=lambda r: r.started)
        pairs = 0
        for i, a in enumerate(job_runs):
            for b in job_runs[i + 1:]:
                if b.started < ends[id(a)] and a.started < ends[id(b)]:
                    pairs += 1
                    if len(examples) < 6:
                        examples.append(f"job {job_id}: tokens {a.token} ({a.worker}) and {b.token} ({b.worker}) "
                                        "ran at once")
        overlaps += pairs
        overlapping_jobs += bool(pairs)
    by_key: dict[str, list[Run]] = defaultdict(list)
    by_process: dict[int, list[Run]] = defaultdict(list)
    for r in runs:
        by_process[r.pid].append(r)
        if r.concurrency_key:
            by_key[r.concurrency_key].append(r)

    def peak(group: list[Run]) -> int:
        events = [e for r in group if ends[id(r)] > r.started for e in ((r.started, 1), (ends[id(r)], -1))]
        events.sort(key=lambda e: (e[0], e[1]))  # an end before a start at the same instant
        level = most = 0
        for _, step in events:
            level += step
            most = max(most, level)
        return most

    max_per_key = {key: peak(group) for key, group in by_key.items()}
    max_per_process = {pid: peak(group) for pid, group in by_process.items()}
    return ExecutionBooks(
        executions=len(runs), returned=sum(1 for r in runs if r.outcome == "returned"), reruns=reruns,
        rerun_jobs=rerun_jobs, overlaps=overlaps, overlapping_jobs=overlapping_jobs, max_per_key=max_per_key,
        max_per_process=max_per_process, open_ended=open_ended, unknown_end=unknown, examples=examples)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet waited for) still answers kill(0): it is not running anything.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


def read_runs(ids: Iterable[int]) -> list[Run]:
    """The execution ledger's rows for jobs ``ids``."""
    return [Run(job_id=e.job_id, token=e.lease_version, pid=e.pid, started=e.started_at, ended=e.returned_at,
                outcome=e.outcome, concurrency_key=e.concurrency_key, worker=e.worker.rsplit(":", 1)[-1])
            for e in LedgerEntry.objects.filter(job_id__in=list(ids))]


def execution_books(ids: Iterable[int], *, deaths: dict[int, datetime] | None = None) -> ExecutionBooks:
    """:func:`analyse_runs` on the ledger rows of jobs ``ids``, as of the database clock now."""
    return analyse_runs(read_runs(ids), deaths=deaths, now=db_now())


@dataclass
class Ledger:
    """The books of a chaos run: the fenced workload's effects (``qa.chaos``) and, for every
    workload job, the execution ledger."""

    enqueued: int
    jobs: int
    statuses: dict[str, int]
    effects: int
    duplicate_effects: int  # effects beyond one per done job, on jobs not done, or under a stale token
    refused_tokens: int  # (job, token) pairs whose write was refused (probes + lease_lost notes)
    effects_under_refused: int
    lease_expiries: int  # LeaseExpired error entries (attempts ended by the reaper)
    failed_attempts: int  # other error entries (handler raised, e.g. a dropped connection)
    retried_jobs: int  # jobs with more than one attempt
    under_refused: list[str] = field(default_factory=list)  # what refused the tokens that have an effect
    fenced_done: int = 0  # done jobs of the fenced workload (qa.chaos): each must have its effect
    runs: ExecutionBooks | None = None  # the execution ledger of these jobs

    @property
    def lost(self) -> int:
        """Enqueued jobs not accounted for: missing rows, or rows still ready/leased."""
        return self.enqueued - sum(self.statuses.get(s, 0) for s in FINISHED)


def ledger(ids: list[int], *, deaths: dict[int, datetime] | None = None) -> Ledger:
    """Read the books for the workload jobs ``ids`` (``qa.chaos`` and plain ledger tasks) of this
    run; ``deaths``: :attr:`Fleet.deaths`, the ends of executions that never returned."""
    wanted = set(ids)
    jobs = {j["id"]: j for j in Job.objects.filter(id__in=ids).values(
        "id", "task", "status", "lease_version", "history", "errors", "attempts")}
    effects: dict[int, list[int]] = defaultdict(list)
    for job_id, token in Effect.objects.filter(job_id__in=wanted).values_list("job_id", "lease_version"):
        effects[job_id].append(token)
    refused: dict[tuple[int, int], str] = dict.fromkeys(
        Probe.objects.filter(job_id__in=wanted, kind="fenced", ok=False).values_list("job_id", "lease_version"),
        "fenced probe")
    for job in jobs.values():
        for event in job["history"]:
            if event.get("event") == "lease_lost":
                refused.setdefault((job["id"], event["token"]), f"lease_lost note ({event.get('write')})")
    duplicates = 0
    for job_id, tokens in effects.items():
        job = jobs.get(job_id)
        if job is None or job["status"] != "done":
            duplicates += len(tokens)
            continue
        duplicates += len(tokens) - 1
        duplicates += sum(1 for t in tokens if t != job["lease_version"])
    under_refused = [f"job {job_id} token {token}: {how}" for (job_id, token), how in refused.items()
                     if token in effects.get(job_id, ())]
    expiries = failed = 0
    for job in jobs.values():
        for entry in job["errors"]:
            if entry.get("type") == "LeaseExpired":
                expiries += 1
            else:
                failed += 1
    return Ledger(
        enqueued=len(ids), jobs=len(jobs), statuses=dict(Counter(j["status"] for j in jobs.values())),
        effects=sum(len(t) for t in effects.values()), duplicate_effects=duplicates, refused_tokens=len(refused),
        effects_under_refused=len(under_refused), under_refused=under_refused, lease_expiries=expiries,
        failed_attempts=failed,
        retried_jobs=sum(1 for j in jobs.values() if j["attempts"] > 1),
        fenced_done=sum(1 for j in jobs.values() if j["task"] == "qa.chaos" and j["status"] == "done"),
        runs=execution_books(ids, deaths=deaths),
    )


def assert_balanced(books: Ledger, *, done: int | None = None) -> None:
    """The ledger rules of the module docstring, exactly. ``done``: the exact number of done jobs
    expected (default: every job not cancelled or dead)."""
    assert books.jobs == books.enqueued, f"rows missing: {books}"
    assert books.lost == 0, f"jobs not finished: {books}"
    assert set(books.statuses) <= set(FINISHED), books
    if done is not None:
        assert books.statuses.get("done", 0) == done, books
    assert books.effects == books.fenced_done, books
    assert books.duplicate_effects == 0, books
    assert books.effects_under_refused == 0, books


def assert_no_reruns(books: Ledger) -> None:
    """No job ran again after its handler had returned (the target of faults that kill or freeze
    no handler mid-run)."""
    runs = books.runs
    assert runs is not None
    if runs.reruns:
        # Name what the database recorded of each example (errors, history), so that a failure
        # says which path took the job back, not only that it ran again.
        ids = [int(m) for m in re.findall(r"job (\d+) returned", " ".join(runs.examples))]
        rows = {j.id: (j.status, j.lease_version, j.errors, j.history) for j in Job.objects.filter(id__in=ids)}
        runs_of = [(e.job_id, e.lease_version, e.worker, e.started_at, e.started_clock, e.returned_at,
                    e.returned_clock, e.outcome) for e in LedgerEntry.objects.filter(job_id__in=ids)]
        raise AssertionError(f"{runs.reruns} re-runs of {runs.rerun_jobs} returned jobs: {runs.examples}; "
                             f"their rows: {rows}; their executions: {runs_of}")


def assert_no_overlaps(books: Ledger, *, key_limit: int | None = None) -> None:
    """Never two attempts of one job at once; with ``key_limit``, never more handlers of one
    concurrency key at once than that (the target of every fault)."""
    runs = books.runs
    assert runs is not None
    assert runs.overlaps == 0, f"{runs.overlaps} overlapping attempts on {runs.overlapping_jobs} jobs: {runs.examples}"
    if key_limit is not None and runs.max_per_key:
        assert runs.max_concurrent_per_key <= key_limit, runs.max_per_key


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------


def attempt_errors(ids: Iterable[int]) -> tuple[int, int]:
    """``(lease expiries, other failed attempts)``: the error entries of jobs ``ids``, counted as
    :func:`ledger` counts them."""
    expiries = failed = 0
    for errors in Job.objects.filter(id__in=list(ids)).values_list("errors", flat=True):
        for entry in errors:
            if entry.get("type") == "LeaseExpired":
                expiries += 1
            else:
                failed += 1
    return expiries, failed


def record(key: str, *, fault: str, jobs: int, faults: int, books: Ledger | None, recovery: float | None,
           recovery_meaning: str, notes: str = "", also: Iterable[int] = (), **extra: object) -> dict:
    """Write this run's row of ``build/reliability.json`` (rows are keyed by ``key``; a new run of
    the same test replaces its row). ``also``: ids of the run's other jobs (the fault's own: poison
    handlers, hung jobs...), outside ``books``; their lease expiries and failed attempts are counted
    in the row too, so that the row's columns cover every job it counts in ``jobs``. Returns the row."""
    also_expiries, also_failed = attempt_errors(also)
    row = {
        "key": key, "fault": fault, "jobs": jobs, "faults": faults,
        "lost": books.lost if books else 0,
        "duplicate_effects": books.duplicate_effects if books else 0,
        "refused_writes": books.refused_tokens if books else 0,
        "lease_expiries": (books.lease_expiries if books else 0) + also_expiries,
        "failed_attempts": (books.failed_attempts if books else 0) + also_failed,
        "executions": books.runs.executions if books and books.runs else None,
        "reruns": books.runs.reruns if books and books.runs else None,
        "overlaps": books.runs.overlaps if books and books.runs else None,
        "max_per_key": books.runs.max_concurrent_per_key if books and books.runs else None,
        "recovery_s": None if recovery is None else round(recovery, 2),
        "recovery_meaning": recovery_meaning, "notes": notes,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "load_average": round(os.getloadavg()[0], 2),
        **extra,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    try:
        data = json.loads(RESULTS.read_text())
    except (FileNotFoundError, ValueError):
        data = {"rows": {}}
    data.setdefault("rows", {})[key] = row
    data["cpu_count"] = os.cpu_count()
    with connection.cursor() as cur:
        cur.execute("SHOW server_version")
        data["postgresql"] = cur.fetchone()[0]
    tmp = RESULTS.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
    tmp.replace(RESULTS)
    return row


def seconds(a: datetime, b: datetime) -> float:
    """``b - a`` in seconds."""
    return (b - a).total_seconds()
