"""Writing jobs that wait on other jobs: ``enqueue(depends_on=...)``, and the steps and members
of workflows and batches (which :mod:`django_leasequeue.workflows` builds and validates).

The SQL is the store's (:mod:`django_leasequeue.store.workflows`); this module turns its refusals
into :class:`~django_leasequeue.exceptions.EnqueueError` and sends the ``enqueued`` events.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from django.db import transaction

from . import signals, tracing
from .conf import get_settings
from .exceptions import EnqueueError

if TYPE_CHECKING:
    from .models import Job
    from .store import NewJob, NewMembers, NewStep


def dependency_id(dep: Any) -> int:
    """The job id of one ``depends_on`` item: an int id, or a saved Job of the job table's database.

    Raises:
        EnqueueError: anything else (nothing is written).
    """
    if isinstance(dep, int) and not isinstance(dep, bool):
        return dep
    if isinstance(getattr(dep, "pk", None), int):
        check_job_database(dep, "depends_on")
        return int(dep.pk)
    raise EnqueueError(f"depends_on takes job ids or Job objects, got {dep!r}")


def check_job_database(job: Any, what: str) -> None:
    """Refuse a Job object read from another database than the job table's: its id would name
    another job (or none) there.

    Args:
        job: a :class:`~django_leasequeue.models.Job` (or an object with ``pk`` and ``_state``).
        what: where it was given, for the message (e.g. ``"depends_on"``).

    Raises:
        EnqueueError: it was read from another database.
    """
    from . import store

    db = getattr(getattr(job, "_state", None), "db", None)
    alias = store.db_alias()
    if db is not None and db != alias:
        raise EnqueueError(f"{what}: job #{job.pk} was read from database {db!r}, but jobs are in {alias!r}; "
                           "a dependency must be a job of the job table's database")


def insert_dependent(new: NewJob, dependency_ids: list[int], policy: str) -> Job:
    """Insert one job that waits for existing jobs (``enqueue(depends_on=...)``), in a savepoint
    of the caller's transaction.

    Args:
        new: the job, built by ``enqueueing.build_job``.
        dependency_ids: the jobs it waits for (:func:`dependency_id`).
        policy: ``on_dependency_dead``: ``"hold"``, ``"cancel"`` or ``"run"``.

    Returns:
        The new job (``waiting``, or ``ready`` when its dependencies are done already).

    Raises:
        EnqueueError: a bad policy, no or repeated dependencies, a unique key, or a dependency
            that does not exist (nothing is written).
    """
    from . import store
    from .models import Job
    from .steps import DEPENDENCY_POLICIES

    if policy not in DEPENDENCY_POLICIES:
        raise EnqueueError(f"on_dependency_dead must be one of {DEPENDENCY_POLICIES}, got {policy!r}")
    if not dependency_ids:
        raise EnqueueError("on_dependency_dead is given without depends_on")
    if len(set(dependency_ids)) != len(dependency_ids):
        raise EnqueueError(f"depends_on names a job twice: {dependency_ids}")
    if new.unique_key is not None or new.unique_mode != "keep":
        raise EnqueueError("depends_on does not take a unique_key: build a Workflow with a unique_key instead")
    alias = store.db_alias()
    # A savepoint of its own: a refusal from the database (a dependency that does not exist) rolls
    # back only this insert, and the caller's transaction goes on.
    with transaction.atomic(using=alias):
        [job_id] = insert_steps(None, [store.NewStep(new, depends_on_ids=tuple(dependency_ids),
                                                     on_dependency_dead=policy)], alias=alias)
    return Job.objects.using(alias).get(id=job_id)


def _send_span(jobs: Sequence[NewJob], *, batch: bool) -> AbstractContextManager[tracing.Sending]:
    """The send span of one insert of workflow jobs: named after their queue when they share one."""
    queues = {job.queue for job in jobs}
    tasks = {job.task for job in jobs}
    return tracing.send_span(next(iter(queues)) if len(queues) == 1 else None,
                             next(iter(tasks)) if len(tasks) == 1 else None, batch=batch)


def insert_steps(workflow_id: int | None, steps: Sequence[NewStep], *, alias: str | None = None) -> list[int]:
    """Insert the jobs of a workflow (or one job with dependencies) in the caller's transaction,
    with their dependency edges, and send their ``enqueued`` events.

    Args:
        workflow_id: the workflow row, or None for a job that only depends on existing jobs.
        steps: built by :func:`build_job` and :mod:`django_leasequeue.workflows`, validated.
        alias: the database alias; None: the job table's.

    Returns:
        The new job ids in step order.

    Raises:
        EnqueueError: a ``depends_on_ids`` job does not exist (nothing is written).
    """
    from . import store

    settings = get_settings()
    with _send_span([step.job for step in steps], batch=workflow_id is not None) as sending:
        try:
            ids = store.workflow_insert_steps(workflow_id, steps, alias=alias,
                                              channel=settings.notify_channel if settings.notify else None,
                                              trace_context=sending.carrier)
        except LookupError as exc:
            raise EnqueueError(str(exc)) from None
        sending.sent(ids)
    if ids and signals.enabled("enqueued"):
        for job_id, step in zip(ids, steps, strict=True):
            signals.announce_enqueued(job_id, step.job.task, step.job.queue)
    return ids


def insert_members(workflow_id: int, members: NewMembers, *, alias: str | None = None) -> list[int]:
    """Insert members of a workflow that depend on nothing in one statement, in the caller's
    transaction, and send their ``enqueued`` events.

    Args:
        workflow_id: the workflow row, whose counters already count these members.
        members: built and validated by :mod:`django_leasequeue.workflows`.
        alias: the database alias; None: the job table's.

    Returns:
        The new job ids in member order.
    """
    from . import store

    settings = get_settings()
    with _send_span(members.templates, batch=True) as sending:
        ids = store.workflow_insert_members(workflow_id, members, alias=alias,
                                            channel=settings.notify_channel if settings.notify else None,
                                            trace_context=sending.carrier)
        sending.sent(ids)
    if ids and signals.enabled("enqueued"):
        shape = members.shape or [0] * len(ids)
        for job_id, index in zip(ids, shape, strict=True):
            template = members.templates[index]
            signals.announce_enqueued(job_id, template.task, template.queue)
    return ids
