"""Helpers shared by the tests: run a claimed job in-process, read job rows, parse error times."""

from __future__ import annotations

from datetime import datetime

from django_leasequeue import store
from django_leasequeue.conf import get_settings
from django_leasequeue.context import JobContext
from django_leasequeue.executor import Executor
from django_leasequeue.models import Job


def context_for(job: store.ClaimedJob, worker_id: str = "test:0:t") -> JobContext:
    """The JobContext a worker would build for ``job``."""
    return JobContext(job_id=job.id, task=job.task, queue=job.queue, attempt=job.attempts,
                      max_attempts=job.max_attempts, lease_version=job.lease_version, worker_id=worker_id,
                      leased_until=job.leased_until, lease_seconds=job.lease_seconds, alias=store.db_alias())


def run_claimed(job: store.ClaimedJob, worker_id: str = "test:0:t") -> str:
    """Run one claimed job through the real :class:`Executor`, completing synchronously.

    Returns the executor's outcome name ("done", "ready", "dead", "lease_lost", ...).
    """
    alias = store.db_alias()

    def complete(ctx: JobContext, result_json: str | None) -> None:
        if ctx.job_id not in store.job_complete([(ctx.job_id, ctx.lease_version, result_json)], alias=alias):
            ctx.mark_lease_lost()

    executor = Executor(worker_id=worker_id, settings=get_settings(), alias=alias, complete=complete)
    return executor.run(job, context_for(job, worker_id))


def claim(now: datetime | None = None, *, limit: int = 10, lease: float = 30, queues: list[str] | None = None,
          worker_id: str = "test:0:t") -> list[store.ClaimedJob]:
    """Claim due jobs (every queue unless ``queues`` is given)."""
    return store.job_claim(queues=queues, limit=limit, worker_id=worker_id, lease=lease, now=now)


def error_time(entry: dict) -> datetime:
    """The database time recorded in an ``errors`` entry."""
    return datetime.fromisoformat(entry["at"])


def statuses() -> dict[str, int]:
    """Count jobs per status."""
    counts: dict[str, int] = {}
    for status in Job.objects.values_list("status", flat=True):
        counts[status] = counts.get(status, 0) + 1
    return counts
