"""One claimed job run in the test's thread, on its database connection, through the worker's own
pool, executor and completer (no threads): what :func:`drain`, :func:`eager` and
:func:`simulate_lost_lease` run each attempt with."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

from django.db import connections

from .. import registry, store
from ..context import JobContext
from ..worker import WorkerService
from .results import JobRun


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


def _depth(alias: str) -> int:
    """Open ``atomic`` blocks on the connection (0 in autocommit)."""
    conn = connections[alias]
    return len(conn.atomic_blocks) if conn.in_atomic_block else 0

