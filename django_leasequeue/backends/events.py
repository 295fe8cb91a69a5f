"""The framework's lifecycle signals for tasks run by django-leasequeue: ``task_started`` and
``task_finished`` through the executor's attempt hook, ``task_finished`` after the reaper takes a
lease back, and the robust sending every signal of this package goes through."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from .. import signals as lq_signals
from ..compat_tasks import BaseTaskBackend, Task, TaskError, TaskResult, TaskResultStatus, task_finished
from ..context import JobContext
from .registered import _TASKS, _backend_of
from .results import _load_job
from .tasks import _clone

logger = logging.getLogger("django_leasequeue.backends")


@dataclass(eq=False)
class _Attempt:
    """What the worker knows of a running attempt, to send ``task_finished`` without a query."""

    task: Task[..., Any]
    result: TaskResult[..., Any]  # RUNNING, as sent with task_started
    exc: BaseException | None = None  # set when the task raised
    value: Any = None


# The key of the running attempt's _Attempt in ``JobContext.attempt_data``.
_ATTEMPT_KEY = "django_leasequeue.backends"


def _send(signal: Any, backend: BaseTaskBackend, result: TaskResult[..., Any]) -> None:
    """Send a framework signal; a failing receiver is logged, never breaks job bookkeeping."""
    for receiver, response in signal.send_robust(sender=type(backend), task_result=result):
        if isinstance(response, Exception):
            logger.error("receiver %r of a tasks signal failed for job %s", receiver, result.id, exc_info=response)


_EVENT_STATUS = {
    "succeeded": TaskResultStatus.SUCCESSFUL,
    "retried": TaskResultStatus.READY,
    "snoozed": TaskResultStatus.READY,
    "dead_lettered": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}


def _send_finished(job_id: int, name: str, status: TaskResultStatus) -> None:
    """Send ``task_finished`` with the job as read from the database (the reaper's path)."""
    task = _TASKS.get(name)
    if task is None:
        return
    backend = _backend_of(task)
    row = _load_job(job_id)
    if row is None:
        return
    result = backend.result_from_job(row, task)
    # The status of the attempt that just ended, even if another worker re-claimed the job since.
    object.__setattr__(result, "status", status)
    _send(task_finished, backend, result)


def _finished_result(attempt: _Attempt, status: TaskResultStatus) -> TaskResult[..., Any]:
    """The attempt's RUNNING result moved to ``status``: the outcome the executor just wrote.

    ``finished_at`` is the worker's clock here; ``get_result`` shows the database's.
    """
    from ..failures import describe_error

    changes: dict[str, Any] = {"status": status, "errors": list(attempt.result.errors)}
    if attempt.exc is not None:
        # The executor stored describe_error() of this same exception, caught where it is caught
        # now (the signal is sent from its except block): same class path, same traceback text.
        entry = describe_error(attempt.exc, attempt=0, worker="")
        changes["errors"].append(TaskError(exception_class_path=entry["type"], traceback=entry["traceback"]))
    if status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED):
        changes["finished_at"] = timezone.now()
    if status == TaskResultStatus.SUCCESSFUL:
        changes["_return_value"] = attempt.value
    return _clone(attempt.result, **changes)


class _FinishedHook:
    """The executor's attempt hook that sends ``task_finished`` for the attempts whose
    ``task_started`` this process sent (their :class:`_Attempt` rides on the attempt's context).

    Built from what the worker already knows, without a query. Retries and dead letters are
    reported from inside the executor's ``except`` block, so receivers (Django's own logger among
    them) see the exception in ``sys.exc_info()``. A lost lease ends the attempt without a signal:
    its outcome is discarded.
    """

    def attempt_started(self, ctx: JobContext) -> None:
        """Nothing: ``task_started`` is sent by the task's runner, once its result is read."""

    def attempt_ended(self, ctx: JobContext, outcome: str) -> None:
        """Send ``task_finished`` with the status of ``outcome`` (an event name)."""
        try:
            attempt = ctx.attempt_data.pop(_ATTEMPT_KEY, None)
            if attempt is None or outcome not in _EVENT_STATUS:
                return
            status = _EVENT_STATUS[outcome]
            if outcome in ("retried", "dead_lettered") and attempt.exc is None:
                # Failed outside the task (a non-JSON return value): the row has the error entry.
                _send_finished(ctx.job_id, ctx.task, status)
                return
            _send(task_finished, _backend_of(attempt.task), _finished_result(attempt, status))
        except Exception:
            logger.exception("could not send task_finished for job %s", ctx.job_id)


_FINISHED_HOOK = _FinishedHook()


def _on_lease_expired(sender: Any, event: str, job_id: int | None = None, task: str | None = None,
                      status: str | None = None, **fields: Any) -> None:
    """The reaper took back an expired lease: the attempt ended (READY again, or FAILED when dead)."""
    try:
        if job_id is not None and task in _TASKS:
            _send_finished(job_id, task, TaskResultStatus.FAILED if status == "dead" else TaskResultStatus.READY)
    except Exception:
        logger.exception("could not send task_finished for job %s", job_id)


def _install_attempt_hook() -> None:
    """Install :class:`_FinishedHook` in the executor (once). Called by the app's ``ready()`` when
    ``TASKS`` names our backend, and by a backend configured after that (``override_settings``):
    the executor's modules import the models, so never before the app registry is ready."""
    from ..attempt_hooks import install_attempt_hook

    install_attempt_hook(_FINISHED_HOOK)


def _connect_lease_expired() -> None:
    """Send ``task_finished`` when the reaper takes back a framework task's lease (once)."""
    lq_signals.job_lease_expired.connect(_on_lease_expired, dispatch_uid="leasequeue-tasks-lease_expired")

