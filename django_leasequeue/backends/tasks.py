"""The framework's ``Task`` and ``TaskContext`` as django-leasequeue extends them:
:class:`LeaseQueueTask` (per-task options, ``using()``), :class:`LeaseQueueTaskContext` (the
lease and fencing token) and ``_clone`` (a validated Task or TaskResult viewed differently)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from ..compat_tasks import Task, TaskContext
from ..context import FencedCompletion, JobContext
from ..retry import BackoffLike, ExceptionClasses

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# A framework dataclass (Task or TaskResult) copied by _clone.
_D = TypeVar("_D", bound="DataclassInstance")

# The framework's Task and TaskContext are generic for type checkers only (django-stubs); at run
# time they cannot be subscripted, so the subclasses below name these bases.
if TYPE_CHECKING:
    _TaskBase = Task[..., Any]
    _TaskContextBase = TaskContext[..., Any]
else:
    _TaskBase = Task
    _TaskContextBase = TaskContext


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseQueueTask(_TaskBase):
    """The framework's ``Task`` plus django-leasequeue options; the backend's ``task_class``.

    On Django 6.1 and on the backport, ``@task(max_attempts=5, backoff=10)`` creates one; on
    Django 6.0 ``@task`` creates one with default options (see :func:`task_options`).

    Attributes:
        max_attempts (int | None): claims before the job is dead-lettered.
        backoff: retry delay: a :class:`~django_leasequeue.retry.Backoff`, the base delay in
            seconds, or a callable ``attempt -> seconds``.
        lease (float | timedelta | None): lease length (seconds); heartbeats renew it.
        timeout (float | timedelta | None): seconds one attempt may run. In thread mode a task
            past it keeps its thread's slot and its job's lease until it returns, then fails as
            ``JobTimedOut``; ``EXECUTION = "process"`` kills it at the timeout.
        unique_key (str | callable | None): idempotency key computed per enqueue: a
            ``str.format`` template over the task's arguments (``"invoice:{0}:{period}"``; double
            the braces for literal ones) or a callable taking the task's arguments. A duplicate
            enqueue returns the existing job's result instead of inserting.
        unique_scope (str | None): ``"retained"`` (default: the key stays taken while the row
            exists) or ``"active"`` (taken while the job is ready or leased).
        retry_on: an exception class or a tuple of them: only failures raising one are retried,
            any other is dead-lettered at once (see the native ``@task``).
        discard_on: an exception class or a tuple of them: a failure raising one is dead-lettered
            at once, without spending the remaining attempts.
    """

    max_attempts: int | None = None
    backoff: BackoffLike | None = None
    lease: float | timedelta | None = None
    timeout: float | timedelta | None = None
    unique_key: str | Callable[..., str] | None = None
    unique_scope: str | None = None
    retry_on: ExceptionClasses | None = None
    discard_on: ExceptionClasses | None = None

    def using(self, *, priority: int | None = None, queue_name: str | None = None,
              run_after: datetime | timedelta | None = None, backend: str | None = None,
              max_attempts: int | None = None, unique_key: str | Callable[..., str] | None = None,
              unique_scope: str | None = None, **unsupported: Any) -> LeaseQueueTask:
        """Return a copy with other per-enqueue options (None keeps the current value).

        Besides the framework's ``priority``, ``queue_name``, ``run_after`` (an aware datetime or
        a ``timedelta``) and ``backend``, accepts ``max_attempts``, ``unique_key`` and
        ``unique_scope``. ``lease``, ``backoff``, ``timeout``, ``retry_on`` and ``discard_on`` are
        per task, set where the task is declared: the worker reads them from the registered task,
        not from the job.

        Raises:
            TypeError: an unknown or per-task-only option.
            InvalidTask: the copy is invalid (the backend validates it, as for any ``Task``).
        """
        if unsupported:
            raise TypeError(
                f"using() got {sorted(unsupported)}; lease, backoff, timeout, retry_on and discard_on are per "
                "task: set them in @task(...) (Django 6.1, backport) or @task_options(...) (Django 6.0)"
            )
        changes: dict[str, Any] = {name: value for name, value in (
            ("priority", priority), ("queue_name", queue_name), ("run_after", run_after), ("backend", backend),
            ("max_attempts", max_attempts), ("unique_key", unique_key), ("unique_scope", unique_scope),
        ) if value is not None}
        return dataclasses.replace(self, **changes)


def _clone(task: _D, **changes: Any) -> _D:
    """Copy a Task with ``changes`` without running ``__post_init__`` (no re-validation).

    Used where a Task that already passed validation is only viewed differently: the framework's
    own run_after check cannot take a ``timedelta``, and a result read back from a job row shows
    that job's queue and priority.
    """
    copy = object.__new__(type(task))
    for f in dataclasses.fields(task):
        object.__setattr__(copy, f.name, changes.get(f.name, getattr(task, f.name)))
    return copy


# django-stubs declares TaskContext as a plain dataclass; Django's own class is frozen, as is this one.
@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseQueueTaskContext(_TaskContextBase):  # type: ignore[misc]
    """The framework's ``TaskContext`` for tasks run by django-leasequeue, with our lease.

    A subclass (``isinstance(context, TaskContext)`` holds) that adds the job's
    :class:`~django_leasequeue.context.JobContext` as ``job`` and forwards the lease tools.

    Attributes:
        task_result (TaskResult): the framework's result, RUNNING, as read when the attempt started.
        attempt (int): 1 for the first claim, 2 for the first retry, ... (``len(worker_ids)``).
        job (JobContext): our context: ``job_id``, ``lease_version``, ``leased_until``, ...
    """

    job: JobContext

    @property
    def job_id(self) -> int:
        """The job's primary key (also ``int(task_result.id)``)."""
        return self.job.job_id

    @property
    def lease_version(self) -> int:
        """The fencing token of this attempt: writes conditioned on it fail once another worker holds the job."""
        return self.job.lease_version

    @property
    def lease_lost(self) -> bool:
        """True once this worker is known to have lost the lease (its outcome will be discarded)."""
        return self.job.lease_lost

    def fenced_atomic(self) -> AbstractContextManager[FencedCompletion]:
        """Context manager: commit the block and the job's completion together, only while this
        worker holds the lease (see :meth:`JobContext.fenced_atomic`). The task's return value is
        stored after the block, fenced on the same token; ``fence.set_result(value)`` inside the
        block stores ``value`` with the completion instead.

        Raises:
            LeaseLost: the token is stale; nothing inside the block was committed.
        """
        return self.job.fenced_atomic()

    def check_lease(self) -> None:
        """Raise :class:`~django_leasequeue.exceptions.LeaseLost` if the lease is known to be lost."""
        self.job.check_lease()

    def check_cancel(self) -> None:
        """Raise :class:`~django_leasequeue.exceptions.JobCancelled` if an operator cancelled the job."""
        self.job.check_cancel()

    def heartbeat(self) -> bool:
        """Renew the lease now; False when it is lost. See :meth:`JobContext.heartbeat`."""
        return self.job.heartbeat()

