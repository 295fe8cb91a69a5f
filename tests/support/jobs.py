"""Helpers shared by the tests: run a claimed job in-process, read job rows, parse error times."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import pytest

from django_leasequeue import registry, store
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


def in_threads(count: int, target, *, timeout: float = 60.0) -> list:
    """Run ``target(i)`` in ``count`` threads, each with its own database connection (closed at
    the end); return the results in thread order and re-raise the first error."""
    import threading

    from django.db import connections

    results: list = [None] * count
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = target(i)
        except BaseException as exc:  # noqa: BLE001 - surface it in the test thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,), name=f"test-{i}") for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if any(t.is_alive() for t in threads):
        raise AssertionError(f"threads still running after {timeout}s")
    if errors:
        raise errors[0]
    return results


def wait_for(predicate: Callable[[], object], timeout: float = 20.0, interval: float = 0.02, what: str = "") -> object:
    """Poll ``predicate`` until it returns a truthy value; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


def job_in(job_id: int, *statuses: str):
    """The job if its status is one of ``statuses``, else None (for :func:`wait_for`)."""
    from django_leasequeue.models import Job

    return Job.objects.filter(pk=job_id, status__in=statuses).first()


@contextmanager
def tasks_registered(specs: Iterable[registry.TaskSpec[..., Any]]) -> Iterator[None]:
    """Register the task specs ``specs`` (made by ``@task`` and taken out of the registry by their
    module, as testproject's ``qa.async_tasks`` are) for the block, and take them out again after;
    tolerantly, as other test modules register the same ones."""
    specs = list(specs)
    for spec in specs:
        registry.register_task(spec)
    try:
        yield
    finally:
        for spec in specs:
            registry._REGISTRY.pop(spec.name, None)
