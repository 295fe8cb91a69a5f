"""Assertions on what was enqueued: :func:`enqueued_jobs`, :func:`assert_enqueued` and
:func:`assert_not_enqueued` read the job table."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .. import registry, store
from ..models import Job


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

