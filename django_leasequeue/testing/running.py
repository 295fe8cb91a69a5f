"""Running work in the test's process until none is due: :func:`drain` (jobs) and
:func:`tick_schedules` (one scheduler tick)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from .. import reaper, registry, store
from .clock import Clock
from .inline import _inline_worker, _run
from .results import DrainResult

# drain() without max_jobs stops with an error after this many runs (a handler that enqueues
# itself, or include_future=True with a job that snoozes forever, would otherwise never end).
DRAIN_SAFETY_LIMIT = 10_000


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
    from ..scheduler import SchedulerService, sync_schedules

    registry.autodiscover()
    if sync:
        sync_schedules()
    return SchedulerService(sync=False).tick(now=now)

