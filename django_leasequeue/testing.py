"""Helpers for testing a project's own tasks: run jobs in the test's process, assert what was
enqueued, move the database clock, and prove a handler is fenced when its lease is lost.

Everything here runs on the test's own database connection, in the calling thread, through the
real claim and executor path (:mod:`store` claims, :class:`~django_leasequeue.worker.WorkerService`
builds the context, the :class:`~django_leasequeue.executor.Executor` classifies the outcome and the
:class:`~django_leasequeue.worker.completer.Completer` writes it, fenced on the token). So it works inside a
pytest-django ``db`` test (one transaction that no other connection can see) as well as with
``transactional_db``; no thread, process or ``sleep`` is involved.

* :func:`drain` runs due jobs until none is left; :func:`eager` runs each job enqueued inside its
  block as soon as a worker could see it (when the enqueuing transaction commits).
* :func:`enqueued_jobs`, :func:`assert_enqueued`, :func:`assert_not_enqueued` read the job table.
* :class:`Clock` (:func:`advance_clock`) shifts ``leasequeue_now()``, the clock every store
  statement and the scheduler read: run_at, backoff, lease expiry and schedules move with it.
* :func:`tick_schedules` runs one scheduler tick; :func:`simulate_lost_lease` runs a job twice,
  a stale worker against a worker that took its lease over, and reports what each one achieved.

The pytest plugin (:mod:`django_leasequeue.pytest_plugin`) wraps these in fixtures
(``leasequeue``, ``leasequeue_clock``, ``leasequeue_eager``). The guide is ``docs/howto/testing.md``.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from django.db import connections, transaction

from . import reaper, registry, signals, store
from .context import JobContext
from .models import Job
from .worker import WorkerService

__all__ = [
    "Clock",
    "DrainResult",
    "JobFailed",
    "JobRun",
    "LeaseQueue",
    "LostLease",
    "advance_clock",
    "assert_enqueued",
    "assert_not_enqueued",
    "drain",
    "eager",
    "enqueued_jobs",
    "simulate_lost_lease",
    "tick_schedules",
]

# Outcomes of an attempt that count as a failure of the job's handler.
FAILED_OUTCOMES = frozenset({"ready", "dead", "unrecorded"})
# drain() without max_jobs stops with an error after this many runs (a handler that enqueues
# itself, or include_future=True with a job that snoozes forever, would otherwise never end).
DRAIN_SAFETY_LIMIT = 10_000


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobRun:
    """One attempt run by :func:`drain`, :func:`eager` or :func:`simulate_lost_lease`.

    Attributes:
        job_id (int), task (str), queue (str): the job.
        attempt (int): 1 for the first claim, 2 for the first retry...
        token (int): the fencing token (``lease_version``) this attempt held.
        outcome (str): ``done``; ``ready`` (failed, retry scheduled after the backoff); ``dead``
            (failed, attempts exhausted, or not retryable); ``snoozed``; ``cancelled``;
            ``lease_lost`` (a fenced write of this attempt was refused); ``unrecorded`` (the
            failure could not be written).
        worker (str): the worker id that ran it (``host:pid:name``).
    """

    job_id: int
    task: str
    queue: str
    attempt: int
    token: int
    outcome: str
    worker: str

    @property
    def failed(self) -> bool:
        """True when the handler failed this attempt (outcome ``ready``, ``dead`` or ``unrecorded``)."""
        return self.outcome in FAILED_OUTCOMES


@dataclass
class DrainResult:
    """What :func:`drain` (or an :func:`eager` block) ran, in order.

    Attributes:
        runs (list[JobRun]): every attempt, in the order run.
        reaped (int): expired leases taken back by the reaper sweep before claiming.
        throttled (bool): the drain stopped because a queue's rate limit was used up.
        not_due (list[int]): (eager mode) ids of jobs enqueued in the block that were not run:
            scheduled for later, in a paused queue or over their concurrency limit.
    """

    runs: list[JobRun] = field(default_factory=list)
    reaped: int = 0
    throttled: bool = False
    not_due: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.runs)

    def __iter__(self) -> Iterator[JobRun]:
        return iter(self.runs)

    @property
    def outcomes(self) -> collections.Counter[str]:
        """Number of attempts per outcome, e.g. ``Counter({"done": 3, "ready": 1})``."""
        return collections.Counter(run.outcome for run in self.runs)

    @property
    def done(self) -> int:
        """Number of attempts that ended ``done``."""
        return self.outcomes["done"]

    @property
    def failed(self) -> list[JobRun]:
        """The attempts whose handler failed (see :attr:`JobRun.failed`)."""
        return [run for run in self.runs if run.failed]

    @property
    def job_ids(self) -> list[int]:
        """Distinct job ids run, in first-run order."""
        return list(dict.fromkeys(run.job_id for run in self.runs))

    def raise_failures(self) -> None:
        """Raise :class:`JobFailed` if any attempt failed.

        Raises:
            JobFailed: naming each failed attempt with the error its job row recorded.
        """
        if self.failed:
            raise JobFailed(self.failed, self)


class JobFailed(AssertionError):
    """A job's handler failed while a testing helper ran it.

    The message shows, for each failed attempt, the exception type, message and traceback that
    the job row recorded. An ``AssertionError``, so pytest reports it as a test failure.

    Attributes:
        failures (list[JobRun]): the failed attempts.
        result (DrainResult): everything that was run.
    """

    def __init__(self, failures: Sequence[JobRun], result: DrainResult) -> None:
        self.failures = list(failures)
        self.result = result
        errors = {job.pk: job.errors for job in Job.objects.using(store.db_alias())
                  .filter(pk__in=[run.job_id for run in failures])}
        parts = []
        for run in failures:
            entries = [e for e in errors.get(run.job_id) or [] if e.get("attempt") == run.attempt]
            entry = entries[-1] if entries else {}
            parts.append(
                f"job {run.job_id} ({run.task}) attempt {run.attempt}: {run.outcome}; "
                f"{entry.get('type', '?')}: {entry.get('message', '')}\n{entry.get('traceback', '').rstrip()}"
            )
        super().__init__(
            f"{len(self.failures)} job attempt(s) failed (pass raise_failures=False to inspect failures "
            "instead):\n" + "\n".join(parts)
        )


# ---------------------------------------------------------------------------------------------
# Running jobs in the test's process
# ---------------------------------------------------------------------------------------------


def _inline_worker(queues: Sequence[str] | None = None, name: str = "inline") -> WorkerService:
    """A WorkerService that is never started: no threads, no LISTEN, no registry row. Only its
    pool's held-jobs table, its executor and its completer are used, through :func:`_run_inline`."""
    registry.autodiscover()
    return WorkerService(queues=queues, concurrency=1, notify=False, reap=False, burst=True,
                         worker_name=f"{name}-{uuid.uuid4().hex[:6]}")


def _run_inline(worker: WorkerService, job: store.ClaimedJob, context_class: type[JobContext] = JobContext) -> str:
    """Run a claimed job in the calling thread, on its database connection, and write its
    completion before returning: no handler thread, no completer thread, no heartbeat.

    For ``drain()`` inside a test's transaction, where no other connection can see the test's
    rows. The job goes through the worker's own pool, :class:`~django_leasequeue.executor.Executor`
    and completer; only the threads are missing, so a handler that runs longer than its lease is
    not renewed.

    Args:
        worker: a never-started worker (:func:`_inline_worker`).
        job: a job claimed with that worker's id.
        context_class: :class:`JobContext` or a subclass (the lost-lease simulation uses one).

    Returns:
        The outcome: ``done``, ``ready`` (retry scheduled), ``dead``, ``snoozed``, ``cancelled``,
        ``lease_lost`` (a fenced write was refused, the completion included) or ``unrecorded``.
    """
    pool = worker.pool
    item = pool.track(job, context_class)
    item.started = True  # never a prefetched job: release_unstarted() must leave it alone
    if item.timeout:
        item.deadline = time.monotonic() + item.timeout
    try:
        outcome = worker.executor.run(job, item.ctx)
        worker.completer.flush()
    finally:
        pool.forget(item)
    if outcome == "done" and not item.ctx.completed_in_transaction:
        # The completer decided: done, cancelled (requested while it ran) or refused (lease lost).
        if item.ctx.lease_lost:
            return "lease_lost"
        if item.ctx.cancel_requested:
            return "cancelled"
    return outcome


def _run(worker: WorkerService, job: store.ClaimedJob, context_class: type[JobContext] = JobContext) -> JobRun:
    outcome = _run_inline(worker, job, context_class)
    return JobRun(job_id=job.id, task=job.task, queue=job.queue, attempt=job.attempts, token=job.lease_version,
                  outcome=outcome, worker=worker.worker_id)


def drain(queues: Sequence[str] | None = None, *, include_future: bool = False, max_jobs: int | None = None,
          now: datetime | None = None, raise_failures: bool = True) -> DrainResult:
    """Run jobs in this thread, on this database connection, until no claimable job is left.

    Each round sweeps expired leases back to ``ready`` (the reaper), claims ONE job as a worker
    would (:func:`store.job_claim`: highest priority, then oldest run_at; paused queues, per-key
    concurrency limits and queue rate limits apply), runs it through the real executor and writes
    its outcome, fenced on its token. A failed attempt is retried only once its backoff has passed
    by the database clock; jobs enqueued by a handler are run in the same drain when they are due.

    Args:
        queues: queue names to drain; None: every queue.
        include_future: also run ready jobs whose ``run_at`` is later (scheduled jobs, and retries
            waiting for their backoff): they are moved to now before each claim, so a failing job
            is retried at once until it succeeds or is dead-lettered.
        max_jobs: stop after this many attempts. None: run until empty, but raise
            ``RuntimeError`` after ``DRAIN_SAFETY_LIMIT`` attempts (a job that re-enqueues itself).
        now: aware datetime: run the drain with the database clock set to it (through the session
            clock offset, restored afterwards), so every statement sees the same time as the claim.
        raise_failures: raise :class:`JobFailed` at the end when an attempt failed (after every
            job has run). False: return the failures in the result.

    Returns:
        A :class:`DrainResult`.

    Raises:
        JobFailed: an attempt failed and ``raise_failures`` is true.
        ValueError: ``now`` is naive, or ``max_jobs`` < 0.
        RuntimeError: the safety limit was reached.
    """
    if max_jobs is not None and max_jobs < 0:
        raise ValueError(f"max_jobs must be >= 0, got {max_jobs!r}")
    result = DrainResult()
    with Clock().at(now) if now is not None else contextlib.nullcontext():
        worker = _inline_worker(queues, "drain")
        result.reaped += len(reaper.reap_once(alias=worker.alias))
        limit = DRAIN_SAFETY_LIMIT if max_jobs is None else max_jobs
        while len(result.runs) < limit:
            if include_future:
                store.job_make_due(queues=queues, alias=worker.alias)
            claimed = store.job_claim(queues=queues, limit=1, worker_id=worker.worker_id, lease=worker.lease,
                                      alias=worker.alias)
            if not claimed:
                reaped = reaper.reap_once(alias=worker.alias)
                result.reaped += len(reaped)
                if reaped:
                    continue
                result.throttled = claimed.throttle_wait is not None
                break
            result.runs.append(_run(worker, claimed[0]))
        else:
            if max_jobs is None:
                raise RuntimeError(
                    f"drain() ran {DRAIN_SAFETY_LIMIT} attempts and jobs are still claimable: does a handler "
                    "enqueue itself? Pass max_jobs= to stop earlier."
                )
    if raise_failures:
        result.raise_failures()
    return result


def _depth(alias: str) -> int:
    """Open ``atomic`` blocks on the connection (0 in autocommit)."""
    conn = connections[alias]
    return len(conn.atomic_blocks) if conn.in_atomic_block else 0


class _EagerRunner:
    """State of one :func:`eager` block (see there)."""

    def __init__(self, *, raise_failures: bool) -> None:
        self.raise_failures = raise_failures
        self.alias = store.db_alias()
        self.worker = _inline_worker(name="eager")
        self.result = DrainResult()
        self.pending: collections.deque[int] = collections.deque()
        self.running = False
        self.active = False
        self.thread = threading.get_ident()
        self.baseline = 0
        self.uid = f"leasequeue-eager-{id(self)}"
        self.errors: list[Exception] = []

    # -- signal and transaction hooks --------------------------------------------------------------
    def on_enqueued(self, sender: Any = None, *, job_id: int, **fields: Any) -> None:
        if not self.active or threading.get_ident() != self.thread:
            return  # another thread's enqueue (a live server thread): not ours to run
        if _depth(self.alias) <= self.baseline:
            self.pending.append(job_id)  # visible to workers now (autocommit)
            self.run_pending()
        else:
            # Visible when the enqueuing transaction commits. A rolled-back savepoint drops the
            # callback (Django removes it); see also release_hook for a test's own transaction.
            transaction.on_commit(_Committed(self, job_id), using=self.alias)

    def release_hook(self, execute: Callable[..., Any], sql: str, params: Any, many: bool,
                     context: Mapping[str, Any]) -> Any:
        """Execute wrapper: after a RELEASE SAVEPOINT that brings the connection back to the
        block's baseline depth, the enqueuing "transaction" committed as far as the test can tell
        (inside a pytest-django ``db`` test the real COMMIT never comes): run its jobs now."""
        result = execute(sql, params, many, context)
        if (self.active and isinstance(sql, str) and sql.startswith("RELEASE SAVEPOINT")
                and _depth(self.alias) <= self.baseline):
            self.collect_committed()
            self.run_pending()
        return result

    def collect_committed(self) -> None:
        """Move our callbacks that survived to the baseline out of Django's on-commit list."""
        conn = connections[self.alias]
        kept = []
        for entry in conn.run_on_commit:
            func = entry[1]
            if isinstance(func, _Committed) and func.runner is self:
                self.pending.append(func.job_id)
            else:
                kept.append(entry)
        conn.run_on_commit = kept

    def run_pending(self) -> None:
        """Run the pending jobs in order; jobs enqueued by those handlers join the end of the line
        (not nested inside the running handler).

        Never raises: it is called from a signal receiver (whose errors Django's ``send_robust``
        would swallow) and from inside ``Atomic.__exit__``; an error is kept and raised when the
        :func:`eager` block ends."""
        if self.running:
            return
        self.running = True
        try:
            while self.pending:
                job_id = self.pending.popleft()
                claimed = store.job_claim_ids([job_id], worker_id=self.worker.worker_id, lease=self.worker.lease,
                                              alias=self.alias)
                if not claimed:
                    self.result.not_due.append(job_id)
                    continue
                self.result.runs.append(_run(self.worker, claimed[0]))
        except Exception as exc:  # noqa: BLE001 - reported at the end of the block
            self.errors.append(exc)
        finally:
            self.running = False


class _Committed:
    """The on-commit callback of one eagerly-run job (recognisable in ``run_on_commit``)."""

    def __init__(self, runner: _EagerRunner, job_id: int) -> None:
        self.runner = runner
        self.job_id = job_id

    def __call__(self) -> None:
        if self.runner.active:
            self.runner.pending.append(self.job_id)
            self.runner.run_pending()


@contextlib.contextmanager
def eager(*, raise_failures: bool = True) -> Iterator[DrainResult]:
    """Run every job enqueued inside the block as soon as a worker could see it.

    "As soon as a worker could see it" means when the transaction that enqueued it commits, as in
    production: a job enqueued in autocommit mode runs before ``enqueue()`` returns; one enqueued
    inside ``transaction.atomic()`` runs when that block commits, and never if it rolls back, so
    the handler sees the rows the enqueuing code committed with it, not a half-done state. Inside a
    pytest-django ``db`` test the test's own transaction (and any atomic block already open when
    ``eager()`` was entered) counts as committed: a job runs when the outermost atomic block
    opened inside ``eager()`` ends.

    Each job runs once, through the real claim and executor, in this thread. A failed attempt is
    recorded as a worker would (retry after backoff, or dead letter) and is not retried by the
    block; use :func:`drain` with ``include_future=True`` for that. Jobs whose ``run_at`` is in the
    future are left ready (listed in ``result.not_due``). Jobs that handlers enqueue run after
    the current handler returns, in order. Only enqueues made by this thread are run.

    Args:
        raise_failures: at the end of the block, raise :class:`JobFailed` if an attempt failed
            (with the recorded traceback). Not raised when the block itself raises.

    Yields:
        A :class:`DrainResult` that fills up as jobs run.

    Raises:
        JobFailed: see ``raise_failures``.
    """
    runner = _EagerRunner(raise_failures=raise_failures)
    runner.baseline = _depth(runner.alias)
    runner.active = True
    signals.job_enqueued.connect(runner.on_enqueued, weak=False, dispatch_uid=runner.uid)
    try:
        with connections[runner.alias].execute_wrapper(runner.release_hook):
            yield runner.result
            # An atomic(savepoint=False) block ends without a RELEASE: pick its jobs up here.
            if _depth(runner.alias) <= runner.baseline:
                runner.collect_committed()
                runner.run_pending()
    finally:
        runner.active = False
        signals.job_enqueued.disconnect(dispatch_uid=runner.uid)
    if runner.errors:
        raise runner.errors[0]
    if raise_failures:
        runner.result.raise_failures()


# ---------------------------------------------------------------------------------------------
# Assertions on what was enqueued
# ---------------------------------------------------------------------------------------------


def _task_name(task: Any) -> str:
    """The name stored in job rows for a :class:`Task`, a Django tasks-framework task or a str."""
    if isinstance(task, str):
        return task
    if isinstance(task, registry.TaskSpec):
        return task.name
    module_path = getattr(task, "module_path", None)  # django.tasks.Task
    if isinstance(module_path, str):
        return module_path
    raise TypeError(f"expected a task or a task name, got {task!r}")


def enqueued_jobs(task: Any = None, *, args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
                  queue: str | None = None, status: str | Iterable[str] | None = None) -> list[Job]:
    """Return the jobs in the job table that match, oldest first.

    A pytest-django test starts with an empty job table, so "enqueued" means "written during this
    test", whatever happened to the job since (``status`` narrows it down).

    Args:
        task: a :class:`~django_leasequeue.enqueueing.Task`, a Django tasks-framework task, or a
            registered name; None: every task.
        args: the positional arguments, compared as a list after the JSON round trip; elements
            may be ``unittest.mock.ANY``. None: any arguments.
        kwargs: the keyword arguments, compared as a dict (values may be ``ANY``). None: any.
        queue: queue name; None: any queue.
        status: ``ready``, ``leased``, ``done``, ``dead``, ``cancelled`` or several; None: any.

    Returns:
        A list of :class:`~django_leasequeue.models.Job`.
    """
    qs = Job.objects.using(store.db_alias()).order_by("id")
    if task is not None:
        qs = qs.filter(task=_task_name(task))
    if queue is not None:
        qs = qs.filter(queue=queue)
    if status is not None:
        qs = qs.filter(status__in=[status] if isinstance(status, str) else list(status))
    return [job for job in qs if _matches(job, args, kwargs)]


def _matches(job: Job, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None) -> bool:
    # The expected value on the left, so that unittest.mock.ANY's __eq__ decides for its element.
    return (args is None or list(args) == list(job.args or [])) and (
        kwargs is None or dict(kwargs) == dict(job.kwargs or {}))


def _describe(task: Any, args: Any, kwargs: Any, queue: str | None, status: Any) -> str:
    parts = [_task_name(task) if task is not None else "any task"]
    for name, value in (("args", args), ("kwargs", kwargs), ("queue", queue), ("status", status)):
        if value is not None:
            parts.append(f"{name}={value!r}")
    return " ".join(parts)


def _listing(task: Any) -> str:
    jobs = enqueued_jobs(task)
    if not jobs:
        return "  (no jobs of that task)" if task is not None else "  (the job table is empty)"
    lines = [f"  #{j.pk} {j.task} {j.status} queue={j.queue} args={j.args!r} kwargs={j.kwargs!r} "
             f"run_at={j.run_at.isoformat()}" for j in jobs[:20]]
    if len(jobs) > 20:
        lines.append(f"  ... and {len(jobs) - 20} more")
    return "\n".join(lines)


def assert_enqueued(task: Any = None, *, args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
                    count: int | None = None, queue: str | None = None,
                    status: str | Iterable[str] | None = None) -> list[Job]:
    """Assert that matching jobs were enqueued (see :func:`enqueued_jobs` for the filters).

    Args:
        count: exact number of matching jobs; None: at least one.

    Returns:
        The matching jobs, oldest first.

    Raises:
        AssertionError: listing the jobs of that task that do exist, to compare.
    """
    jobs = enqueued_jobs(task, args=args, kwargs=kwargs, queue=queue, status=status)
    ok = len(jobs) == count if count is not None else bool(jobs)
    if not ok:
        wanted = f"exactly {count} job(s)" if count is not None else "at least one job"
        raise AssertionError(
            f"expected {wanted} of {_describe(task, args, kwargs, queue, status)}, found {len(jobs)}.\n"
            f"Jobs of {_task_name(task) if task is not None else 'any task'}:\n{_listing(task)}"
        )
    return jobs


def assert_not_enqueued(task: Any = None, *, args: Sequence[Any] | None = None,
                        kwargs: Mapping[str, Any] | None = None, queue: str | None = None,
                        status: str | Iterable[str] | None = None) -> None:
    """Assert that no job matches (see :func:`enqueued_jobs` for the filters).

    Raises:
        AssertionError: listing the matching jobs.
    """
    jobs = enqueued_jobs(task, args=args, kwargs=kwargs, queue=queue, status=status)
    if jobs:
        raise AssertionError(
            f"expected no job of {_describe(task, args, kwargs, queue, status)}, found {len(jobs)}:\n"
            + "\n".join(f"  #{j.pk} {j.status} queue={j.queue} args={j.args!r} kwargs={j.kwargs!r}" for j in jobs)
        )


# ---------------------------------------------------------------------------------------------
# The database clock
# ---------------------------------------------------------------------------------------------


def _seconds(value: float | timedelta) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


class Clock:
    """The database clock of this test's connection: ``leasequeue_now()``.

    Every store statement (claim, backoff, lease expiry, reaper, prune) and the scheduler's tick
    read ``leasequeue_now()`` = ``clock_timestamp()`` + the session setting
    ``leasequeue.clock_offset``. Moving the clock changes that offset: the clock keeps running at
    real speed from the new point; nothing sleeps. Python-side ``timezone.now()`` is not moved
    (use time-machine or freezegun for that if your own code needs it).

    The offset belongs to the database session. In a pytest-django ``db`` test it is rolled back
    with the test's transaction; on a connection that outlives the test (``transactional_db``),
    call :meth:`reset` (the ``leasequeue_clock`` fixture does). Worker subprocesses have their own
    sessions: pass them the offset through your settings (see :meth:`env`).

    Args:
        alias: database alias; default: the job table's (through the routers).
    """

    def __init__(self, alias: str | None = None) -> None:
        self.alias = alias or store.db_alias()

    @property
    def offset(self) -> float:
        """Seconds the database clock runs ahead of real time on this connection."""
        return store.clock_offset_get(alias=self.alias)

    def now(self) -> datetime:
        """The database clock now (aware datetime)."""
        return store.db_now(self.alias)

    def advance(self, seconds: float | timedelta) -> datetime:
        """Move the clock forward by ``seconds`` (float seconds or a timedelta; negative moves it
        back). Returns the new database time."""
        store.clock_offset_set(self.offset + _seconds(seconds), alias=self.alias)
        return self.now()

    def set(self, when: datetime) -> None:
        """Make the clock read ``when`` now (it keeps running from there).

        Raises:
            ValueError: ``when`` is naive.
        """
        if when.tzinfo is None or when.utcoffset() is None:
            raise ValueError(f"{when!r} is naive; pass an aware datetime")
        real = store.clock_real_now(alias=self.alias)
        store.clock_offset_set((when - real).total_seconds(), alias=self.alias)

    def reset(self) -> None:
        """Back to the real clock (offset 0)."""
        store.clock_offset_set(0, alias=self.alias)

    @contextlib.contextmanager
    def at(self, when: datetime) -> Iterator[None]:
        """Set the clock to ``when`` for the block, then restore the previous offset."""
        previous = self.offset
        self.set(when)
        try:
            yield
        finally:
            store.clock_offset_set(previous, alias=self.alias)

    def env(self) -> dict[str, str]:
        """``{"LEASEQUEUE_CLOCK_OFFSET": "<seconds>s"}``: the environment a worker subprocess needs
        when its settings turn that variable into the connection option
        ``-c leasequeue.clock_offset=...`` (see :meth:`connection_options`)."""
        return {"LEASEQUEUE_CLOCK_OFFSET": f"{self.offset:.6f}s"}

    def connection_options(self) -> dict[str, str]:
        """``DATABASES[...]["OPTIONS"]`` entries that start a new connection at this offset."""
        return {"options": f"-c leasequeue.clock_offset={self.offset:.6f}s"}


def advance_clock(seconds: float | timedelta) -> datetime:
    """Move the database clock of this connection forward (see :class:`Clock`); return the new time."""
    return Clock().advance(seconds)


def tick_schedules(*, sync: bool = True, now: datetime | None = None) -> Any:
    """Run one scheduler tick in this process, at the database clock (or ``now``).

    Args:
        sync: first write ``LEASEQUEUE_SCHEDULES`` into the schedule table (an upsert; a schedule
            already synced keeps its next occurrence, so sync, move the clock, tick works).
        now: aware datetime for the tick instead of the database clock.

    Returns:
        The scheduler's :class:`~django_leasequeue.scheduler.TickResult` (``emitted``: the
        ``(schedule id, occurrence)`` of each job inserted).
    """
    from .scheduler import SchedulerService, sync_schedules

    registry.autodiscover()
    if sync:
        sync_schedules()
    return SchedulerService(sync=False).tick(now=now)


# ---------------------------------------------------------------------------------------------
# Losing a lease on purpose
# ---------------------------------------------------------------------------------------------


@dataclass
class LostLease:
    """What :func:`simulate_lost_lease` observed.

    Attributes:
        stale (JobRun): the attempt of the worker that lost its lease. ``outcome`` is
            ``lease_lost`` when its fenced writes were refused, as they must be.
        takeover (JobRun): the attempt of the worker that took the job over (normally ``done``).
        interrupted_at (str): where the stale worker stalled: ``start`` (after its claim),
            ``fenced_atomic``, ``heartbeat`` or ``complete`` (returning its result).
        job (Job): the job row afterwards.
    """

    stale: JobRun
    takeover: JobRun
    interrupted_at: str
    job: Job

    @property
    def tokens(self) -> tuple[int, int]:
        """``(stale token, takeover token)``."""
        return self.stale.token, self.takeover.token


class _StallingContext(JobContext):
    """The stale worker's context: calls its ``stall`` hook before the first fenced write."""

    stall: Callable[[str], None] | None = None

    def _stall(self, point: str) -> None:
        hook, self.stall = self.stall, None
        if hook is not None:
            hook(point)

    @contextlib.contextmanager
    def fenced_atomic(self) -> Iterator[None]:
        self._stall("fenced_atomic")
        with super().fenced_atomic():
            yield

    def heartbeat(self) -> bool:
        self._stall("heartbeat")
        return super().heartbeat()


def simulate_lost_lease(job: Job | int, *, at: Literal["fenced_write", "start"] = "fenced_write") -> LostLease:
    """Run ``job`` on a worker that loses its lease, while a second worker takes it over.

    The story, told with the real store statements: worker A claims the job (token N) and runs the
    handler; A stalls (a GC pause, a stopped VM) until its lease has expired; the reaper takes the
    job back (token N+1, "lease expired" recorded as A's attempt) and worker B claims it (token
    N+2) and runs the handler to its end; then A resumes with its stale token. A's fenced writes
    (``fenced_atomic()``, heartbeat, completion, failure) must all be refused: the job's outcome and
    the business rows written under the fence are B's alone. Writes A made outside the fence
    happened twice: that is what an idempotent handler must tolerate.

    Args:
        job: a ready, due job (or its id).
        at: where A stalls. ``"fenced_write"`` (default): at A's first fenced write, i.e. on
            entering ``fenced_atomic()``, on ``heartbeat()``, or when it returns its result; so A
            has done all its unfenced work before B runs. The handler must not have opened a
            transaction of its own around that point (on one connection, B's work would be inside
            A's transaction). ``"start"``: right after A's claim, before its handler runs; works
            for any handler.

    Returns:
        A :class:`LostLease` with both attempts and the job row afterwards.

    Raises:
        ValueError: the job cannot be claimed now (not ready, not due, paused queue...).
        AssertionError: with ``at="fenced_write"``, the handler ended (e.g. raised) before any
            fenced write, so the lease was never lost; try ``at="start"``.
        RuntimeError: the stall point is inside a transaction the handler opened (use ``at="start"``).
    """
    if at not in ("fenced_write", "start"):
        raise ValueError(f"at must be 'fenced_write' or 'start', got {at!r}")
    job_id = job.pk if isinstance(job, Job) else int(job)
    stale_worker = _inline_worker(name="stale")
    takeover_worker = _inline_worker(name="takeover")
    alias = stale_worker.alias
    claimed = store.job_claim_ids([job_id], worker_id=stale_worker.worker_id, lease=stale_worker.lease, alias=alias)
    if not claimed:
        row = Job.objects.using(alias).filter(pk=job_id).first()
        state = "does not exist" if row is None else f"is {row.status}, run_at {row.run_at.isoformat()}"
        raise ValueError(f"job {job_id} cannot be claimed now: it {state} (or its queue is paused)")
    stale_job = claimed[0]
    runs: dict[str, Any] = {"point": None, "takeover": None, "error": None}
    start_depth = _depth(alias)

    def take_over(point: str) -> None:
        if _depth(alias) > start_depth:
            runs["error"] = RuntimeError(
                f"simulate_lost_lease(at='fenced_write'): the handler of job {job_id} reached {point} inside a "
                "transaction of its own; the takeover would run inside it and be rolled back with it. "
                "Use at='start'."
            )
            raise runs["error"]
        runs["point"] = point
        if not store.job_expire_lease(job_id, stale_job.lease_version, alias=alias):
            raise RuntimeError(f"job {job_id}: the stale worker no longer held token {stale_job.lease_version}")
        reaper.reap_once(alias=alias)
        again = store.job_claim_ids([job_id], worker_id=takeover_worker.worker_id, lease=takeover_worker.lease,
                                    alias=alias)
        if not again:
            row = Job.objects.using(alias).get(pk=job_id)
            raise RuntimeError(f"job {job_id}: the takeover worker could not claim it after the reaper "
                               f"({row.status}, attempts {row.attempts}/{row.max_attempts})")
        runs["takeover"] = _run(takeover_worker, again[0])

    if at == "start":
        take_over("start")
        stale = _run(stale_worker, stale_job)
    else:
        class Context(_StallingContext):
            stall = staticmethod(take_over)

        submit = stale_worker.executor.complete

        def complete(ctx: JobContext, result_json: str | None) -> None:
            if isinstance(ctx, _StallingContext):
                ctx._stall("complete")
            submit(ctx, result_json)

        stale_worker.executor.complete = complete
        stale = _run(stale_worker, stale_job, Context)
        if runs["error"] is not None:
            raise runs["error"]
        if runs["takeover"] is None:
            raise AssertionError(
                f"job {job_id}: the handler ended with outcome {stale.outcome!r} before any fenced write, so the "
                "lease was never lost (a failure is recorded with the valid token). Use at='start' to take the "
                "lease away before the handler runs."
            )
    return LostLease(stale=stale, takeover=runs["takeover"], interrupted_at=runs["point"],
                     job=Job.objects.using(alias).get(pk=job_id))


# ---------------------------------------------------------------------------------------------
# One object for the fixture
# ---------------------------------------------------------------------------------------------


class LeaseQueue:
    """The helpers above on one object: the ``leasequeue`` pytest fixture.

    Attributes:
        clock (Clock): the database clock of the test's connection.
    """

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or Clock()

    drain = staticmethod(drain)
    eager = staticmethod(eager)
    enqueued_jobs = staticmethod(enqueued_jobs)
    assert_enqueued = staticmethod(assert_enqueued)
    assert_not_enqueued = staticmethod(assert_not_enqueued)
    simulate_lost_lease = staticmethod(simulate_lost_lease)
    tick_schedules = staticmethod(tick_schedules)

    def advance_clock(self, seconds: float | timedelta) -> datetime:
        """Move the database clock forward (see :meth:`Clock.advance`); return the new time."""
        return self.clock.advance(seconds)

    def now(self) -> datetime:
        """The database clock now."""
        return self.clock.now()

    def jobs(self, **filters: Any) -> list[Job]:
        """Same as :func:`enqueued_jobs` with keyword filters only (``task=`` included)."""
        return enqueued_jobs(**filters)
