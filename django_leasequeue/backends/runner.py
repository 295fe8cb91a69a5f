"""Running a framework task inside the worker: the native spec's handler that builds the
framework's result and context, sends ``task_started`` and calls the task."""

from __future__ import annotations

import inspect
import logging
from typing import Any

from .. import payload
from ..compat_tasks import Task, normalize_json, task_started
from ..context import JobContext
from ..exceptions import JobCancelled, LeaseLost, PayloadNotSerializable, Snooze
from .events import _ATTEMPT_KEY, _Attempt, _send
from .registered import _backend_of
from .results import _load_job
from .tasks import LeaseQueueTaskContext

logger = logging.getLogger("django_leasequeue.backends")


class _Runner:
    """The native spec's handler for one framework task; called by the executor with the JobContext."""

    __slots__ = ("task",)

    def __init__(self, task: Task[..., Any]) -> None:
        self.task = task

    def __repr__(self) -> str:
        return f"<framework task {self.task.module_path}>"

    @property
    def __signature__(self) -> inspect.Signature:
        """The framework task's parameters behind the JobContext this runner receives, so that
        enqueue names a bad argument and refuses arguments that do not bind, as for native tasks."""
        signature = inspect.signature(self.task.func)
        if self.task.takes_context:  # its own first parameter receives the framework's context
            return signature
        context = inspect.Parameter("__leasequeue_job", inspect.Parameter.POSITIONAL_ONLY)
        return signature.replace(parameters=[context, *signature.parameters.values()])

    def __call__(self, job: JobContext, *args: Any, **kwargs: Any) -> Any:
        task = self.task
        backend = _backend_of(task)
        claim = job.claim
        if claim is not None and claim.attempts == 1 and claim.error_count == 0 and claim.created_at is not None:
            # A first attempt with no history: the claim returned everything the result shows.
            result = backend.result_from_claim(claim, task, job.worker_id)
        else:
            # Retries (and replays) carry history the claim does not return: one primary-key read.
            row = _load_job(job.job_id, job.alias)
            if row is None or row.status != "leased" or row.lease_version != job.lease_version:
                job.mark_lease_lost()
                raise LeaseLost(f"job {job.job_id}: lease {job.lease_version} was lost before the task started")
            result = backend.result_from_job(row, task)
        attempt = _Attempt(task=task, result=result)
        job.attempt_data[_ATTEMPT_KEY] = attempt
        _send(task_started, backend, result)
        try:
            if task.takes_context:
                value = task.call(LeaseQueueTaskContext(task_result=result, job=job), *args, **kwargs)
            else:
                value = task.call(*args, **kwargs)
        except (LeaseLost, JobCancelled, Snooze):
            raise  # outcomes, not failures: the executor records them
        except BaseException as exc:  # noqa: BLE001 - recorded by the executor as a failed attempt
            attempt.exc = exc  # formatted when task_finished is sent, as the executor formats it
            raise
        try:
            # The framework's own normalisation (tuples become lists), as its built-in backends do.
            value = normalize_json(value)
        except (TypeError, ValueError):
            return value  # the executor dead-letters it with a message naming the value (case C25)
        attempt.value = value
        if job.completed_in_transaction and value is not None:
            self._store_late_result(job, value)
        return value

    def _store_late_result(self, job: JobContext, value: Any) -> None:
        # fenced_atomic() committed the job as done before the return value existed.
        from .. import store

        try:
            result_json = payload.json_dumps_result(value)
        except PayloadNotSerializable as exc:
            logger.warning("job %s completed in fenced_atomic(); its return value is not stored: %s", job.job_id, exc)
            return
        if not store.job_set_result(job.job_id, job.lease_version, result_json, alias=job.alias):
            logger.warning("job %s: return value not stored (the job is no longer done under token %s)",
                           job.job_id, job.lease_version)

