"""Job rows and claims as the framework's ``TaskResult``: the status mapping, errors, worker ids,
and the backend base class that builds results (what the worker side of this package calls)."""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from .. import exceptions as lq_exceptions
from .. import registry
from ..compat_tasks import BaseTaskBackend, Task, TaskError, TaskResult, TaskResultStatus
from .options import _Options
from .tasks import _clone

if TYPE_CHECKING:
    from ..models import Job
    from ..store import ClaimedJob

# A framework task's parameters and return type, carried from the Task to its TaskResult.
_P = ParamSpec("_P")
_R = TypeVar("_R")


_STATUS = {
    "ready": TaskResultStatus.READY,
    # A workflow step (or dependent job) not released yet: queued, from the framework's view.
    "waiting": TaskResultStatus.READY,
    "leased": TaskResultStatus.RUNNING,
    "done": TaskResultStatus.SUCCESSFUL,
    "dead": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}


def task_result_status(job_status: str) -> TaskResultStatus:
    """Map a job status to the framework's status.

    ``ready`` -> READY (also while waiting for a retry or a future ``run_at``), ``leased`` ->
    RUNNING, ``done`` -> SUCCESSFUL, ``dead`` and ``cancelled`` -> FAILED.

    Raises:
        KeyError: an unknown job status.
    """
    return _STATUS[job_status]


def _exception_path(type_name: str) -> str:
    """Give the reaper's and snooze's bare error names an importable class path."""
    if "." in type_name:
        return type_name
    if isinstance(getattr(lq_exceptions, type_name, None), type):
        return f"django_leasequeue.exceptions.{type_name}"
    if isinstance(getattr(builtins, type_name, None), type):
        return f"builtins.{type_name}"
    return type_name


def _task_errors(errors: Iterable[Any]) -> list[TaskError]:
    out = []
    for entry in errors:
        if not isinstance(entry, Mapping):
            continue
        type_name = str(entry.get("type") or "builtins.Exception")
        traceback = entry.get("traceback") or f"{type_name}: {entry.get('message', '')}\n"
        out.append(TaskError(exception_class_path=_exception_path(type_name), traceback=traceback))
    return out


def _worker_ids(job: Job) -> list[str]:
    """One worker id per attempt counted in ``job.attempts``.

    Failed attempts are in ``errors`` (with the worker); the attempt that is running, or that
    succeeded, is the current ``leased_by``. After a replay ``attempts`` starts again from 0 while
    ``errors`` keeps the history, so only the newest ``attempts`` entries are kept.
    """
    ids = [str(e.get("worker") or "") for e in job.errors if isinstance(e, Mapping)]
    if job.status in ("leased", "done") and job.leased_by:
        ids.append(job.leased_by)
    n = job.attempts
    if len(ids) > n:
        ids = ids[len(ids) - n:] if n else []
    elif len(ids) < n:  # e.g. cancelled while leased: that attempt left no error entry
        ids.extend([job.leased_by] * (n - len(ids)))
    return ids


def _load_job(job_id: int, alias: str | None = None) -> Job | None:
    from .. import store

    return store.job_get(job_id, alias=alias)


class _ResultBackend(BaseTaskBackend):
    """The part of :class:`~django_leasequeue.backends.LeaseQueueBackend` that the worker side of
    this package calls: results built from job rows and claims, and the state its spec lookups
    read (set by ``LeaseQueueBackend.__init__``). Its only subclass is ``LeaseQueueBackend``; the
    runner and the lifecycle events name the backend by this class, below the module that
    defines ``LeaseQueueBackend`` (which imports them)."""

    defaults: _Options
    _specs: dict[int, tuple[Task[..., Any], registry.TaskSpec[..., Any]]]

    def result_from_job(self, job: Job, task: Task[_P, _R]) -> TaskResult[_P, _R]:
        """Build the framework's ``TaskResult`` from a job row.

        ``task`` is shown with the job's queue and priority. ``run_after`` is the job's ``run_at``
        while the job waits for it (deferred, or a retry's backoff), else None.
        """
        status = task_result_status(job.status)
        waiting = job.status == "ready" and job.run_at is not None and job.created_at is not None \
            and job.run_at > job.created_at
        view = _clone(task, queue_name=job.queue, priority=job.priority, run_after=job.run_at if waiting else None)
        result: TaskResult[_P, _R] = TaskResult(
            task=view, id=str(job.id), status=status, enqueued_at=job.created_at, started_at=job.started_at,
            finished_at=job.finished_at, last_attempted_at=job.attempted_at, args=job.args, kwargs=job.kwargs,
            backend=self.alias, errors=_task_errors(job.errors or []), worker_ids=_worker_ids(job),
        )
        if job.status == "done":
            object.__setattr__(result, "_return_value", job.result)
        return result

    def result_from_claim(self, claim: ClaimedJob, task: Task[..., Any], worker_id: str) -> TaskResult[..., Any]:
        """Build the RUNNING ``TaskResult`` of a first attempt from its claim (a
        ``store.ClaimedJob`` with no failed attempts before it, leased by ``worker_id``), equal to
        what :meth:`result_from_job` gives for the row at that moment, without reading the row."""
        view = _clone(task, queue_name=claim.queue, priority=claim.priority, run_after=None)
        return TaskResult(
            task=view, id=str(claim.id), status=TaskResultStatus.RUNNING, enqueued_at=claim.created_at,
            started_at=claim.started_at, finished_at=None, last_attempted_at=claim.claimed_at, args=claim.args,
            kwargs=claim.kwargs, backend=self.alias, errors=[], worker_ids=[worker_id],
        )
