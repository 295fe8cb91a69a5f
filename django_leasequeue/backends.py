"""A backend for Django's tasks framework: ``@task`` code runs on django-leasequeue workers.

Configure it in ``TASKS`` (Django >= 6.0 ``django.tasks``, or the ``django_tasks`` backport on
Django 5.2; see :mod:`django_leasequeue.compat_tasks`)::

    TASKS = {
        "default": {
            "BACKEND": "django_leasequeue.backends.LeaseQueueBackend",
            "QUEUES": ["default", "emails"],          # the framework's own queue check
            "OPTIONS": {"LEASE": 60, "MAX_ATTEMPTS": 5, "BACKOFF": {"base": 2, "max": 600}, "TIMEOUT": None},
        }
    }

and run ``manage.py runworker``. Every framework task then gets our leases, heartbeats, fencing
tokens, retries with backoff, dead letters and admin replay.

How it maps (docs/howto/django-tasks.md has the user's view):

* ``enqueue``/``aenqueue`` validate through :func:`enqueue.build_job` (JSON arguments, queue,
  priority, ``run_after`` as an aware datetime or a ``timedelta`` from the database clock) and
  insert through :func:`enqueue.insert_job` (``store.job_insert_one``) **in the caller's
  transaction**, like our own ``enqueue``. The job's ``task`` column is the task's
  ``module_path``; the result id is the job id as a string.
* ``get_result``/``aget_result`` read the job row: status ``ready`` -> READY, ``leased`` ->
  RUNNING, ``done`` -> SUCCESSFUL, ``dead`` and ``cancelled`` -> FAILED; ``errors`` has one
  ``TaskError`` per failed attempt; ``worker_ids`` has one entry per counted attempt (so the
  framework's ``attempts``, which is ``len(worker_ids)``, equals the job's ``attempts``).
* **Only registered framework tasks run.** ``Task.__post_init__`` calls :meth:`validate_task` when
  ``@task`` decorates a function (Django 6.x and the backport alike), and that call records the
  Task object here; a worker learns the tasks by importing the project's modules
  (:func:`registry.autodiscover`: every app's ``tasks``/``jobs`` module and
  ``LEASEQUEUE["IMPORTS"]``). A job naming anything else (``os.system``, a module never imported)
  is dead-lettered with :class:`~django_leasequeue.exceptions.UnknownTask`; nothing is imported
  from a job row.
* The worker sends the framework's ``task_started`` before each attempt and ``task_finished``
  after the attempt's outcome is written: status SUCCESSFUL, FAILED (dead-lettered or cancelled)
  or READY (a retry is scheduled; ``task_result.is_finished`` is then False). ``task_enqueued`` is
  sent by ``enqueue`` for a new job (not when a unique key returned an existing one).
* ``takes_context`` tasks get a :class:`LeaseQueueTaskContext`: the framework's ``TaskContext``
  (``task_result``, ``attempt``) plus our fencing token and ``fenced_atomic()``.
* Async task functions are supported: the worker runs them with the framework's ``Task.call``
  (``async_to_sync``) on the job's worker thread, so ``sync_to_async`` ORM calls inside them run on
  that thread and its connection.
* Per-task options (``max_attempts``, ``backoff``, ``lease``, ``timeout``, ``unique_key``,
  ``unique_scope``) live on :class:`LeaseQueueTask`, the backend's ``task_class``. Django 6.1 and
  the backport (0.12) pass extra ``@task(...)`` keywords to it; on Django 6.0 use
  :func:`task_options` under ``@task``. Precedence: the task's own option, then
  :func:`task_options`, then ``OPTIONS``, then ``LEASEQUEUE``.

Where the ideas come from: the capability flags and ``check()`` are Django's backend contract
(``django/tasks/backends/base.py``); the lazy model import follows django-tasks-db, so that
``@task`` in a module imported during app loading never raises ``AppRegistryNotReady``.
"""

from __future__ import annotations

import builtins
import dataclasses
import inspect
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from django.apps import apps
from django.core import checks
from django.core.signals import setting_changed
from django.utils import timezone

from . import arguments, registry
from . import exceptions as lq_exceptions
from . import signals as lq_signals
from .compat_tasks import (
    DEFAULT_TASK_QUEUE_NAME,
    BaseTaskBackend,
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_enqueued,
    task_finished,
    task_started,
)
from .conf import queue_name_problem, unknown_keys_hint
from .context import JobContext
from .enqueueing import build_job, insert_job
from .exceptions import ConfigurationError, JobCancelled, LeaseLost, PayloadNotSerializable, Snooze
from .retry import Backoff, BackoffLike

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from .models import Job
    from .store import ClaimedJob

logger = logging.getLogger("django_leasequeue.backends")

# A framework dataclass (Task or TaskResult) copied by _clone.
_D = TypeVar("_D", bound="DataclassInstance")
# A framework task's parameters and return type, carried from the Task to its TaskResult.
_P = ParamSpec("_P")
_R = TypeVar("_R")

# The framework's Task and TaskContext are generic for type checkers only (django-stubs); at run
# time they cannot be subscripted, so the subclasses below name these bases.
if TYPE_CHECKING:
    _TaskBase = Task[..., Any]
    _TaskContextBase = TaskContext[..., Any]
else:
    _TaskBase = Task
    _TaskContextBase = TaskContext

__all__ = ["LeaseQueueBackend", "LeaseQueueTask", "LeaseQueueTaskContext", "task_options", "task_result_status"]

# ---------------------------------------------------------------------------------------------
# Status mapping
# ---------------------------------------------------------------------------------------------

_STATUS = {
    "ready": TaskResultStatus.READY,
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


# ---------------------------------------------------------------------------------------------
# Per-task options
# ---------------------------------------------------------------------------------------------

TASK_OPTION_NAMES = ("max_attempts", "backoff", "lease", "timeout", "unique_key", "unique_scope")
_FUNC_ATTR = "_leasequeue_task_options"


def task_options(**options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Attach django-leasequeue options to a task function, for Django 6.0 (whose ``@task`` does
    not pass extra keywords on). Put it *under* the framework's decorator::

        @task(queue_name="emails")
        @task_options(max_attempts=8, backoff=30, lease=120)
        def send_newsletter(issue_id): ...

    On Django 6.1 and the backport ``@task(max_attempts=8, ...)`` does the same; when both are
    used, the ``@task`` keywords win. The function itself is returned unchanged (an attribute is
    set on it), so the framework still sees a plain module-level function.

    Args:
        options: any of ``max_attempts`` (int >= 1), ``backoff`` (a
            :class:`~django_leasequeue.retry.Backoff`, base seconds, or ``attempt -> seconds``),
            ``lease`` and ``timeout`` (seconds or timedelta), ``unique_key`` (see
            :class:`LeaseQueueTask`), ``unique_scope`` (``"retained"`` or ``"active"``).

    Raises:
        TypeError: an unknown option name (values are checked when ``@task`` validates the task).
    """
    unknown = sorted(set(options) - set(TASK_OPTION_NAMES))
    if unknown:
        raise TypeError(f"task_options() got unknown option(s) {unknown}; allowed: {list(TASK_OPTION_NAMES)}")

    def attach(func: Callable[..., Any]) -> Callable[..., Any]:
        setattr(func, _FUNC_ATTR, dict(options))
        return func

    return attach


@dataclass(frozen=True)
class _Options:
    max_attempts: int | None = None
    backoff: BackoffLike | None = None
    lease: float | None = None
    timeout: float | None = None
    unique_key: str | Callable[..., str] | None = None
    unique_scope: str = "retained"


def _seconds(value: Any, what: str) -> float | None:
    # One wording for a wrongly typed duration, here and in @task of the native API.
    seconds = arguments.seconds_option(value, what, ConfigurationError)
    return None if seconds is None else float(seconds)


def _options_of(task: Task[..., Any]) -> _Options:
    """The task's own options: its :class:`LeaseQueueTask` fields over :func:`task_options`."""
    merged = dict(getattr(task.func, _FUNC_ATTR, None) or {})
    for name in TASK_OPTION_NAMES:
        value = getattr(task, name, None)
        if value is not None:
            merged[name] = value
    name = task.module_path
    return _Options(
        max_attempts=merged.get("max_attempts"),
        backoff=merged.get("backoff"),
        lease=_seconds(merged.get("lease"), f"task {name!r}: lease"),
        timeout=_seconds(merged.get("timeout"), f"task {name!r}: timeout"),
        unique_key=merged.get("unique_key"),
        unique_scope=merged.get("unique_scope") or "retained",
    )


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
    """

    max_attempts: int | None = None
    backoff: BackoffLike | None = None
    lease: float | timedelta | None = None
    timeout: float | timedelta | None = None
    unique_key: str | Callable[..., str] | None = None
    unique_scope: str | None = None

    def using(self, *, priority: int | None = None, queue_name: str | None = None,
              run_after: datetime | timedelta | None = None, backend: str | None = None,
              max_attempts: int | None = None, unique_key: str | Callable[..., str] | None = None,
              unique_scope: str | None = None, **unsupported: Any) -> LeaseQueueTask:
        """Return a copy with other per-enqueue options (None keeps the current value).

        Besides the framework's ``priority``, ``queue_name``, ``run_after`` (an aware datetime or
        a ``timedelta``) and ``backend``, accepts ``max_attempts``, ``unique_key`` and
        ``unique_scope``. ``lease``, ``backoff`` and ``timeout`` are per task, set where the task
        is declared: the worker reads them from the registered task, not from the job.

        Raises:
            TypeError: an unknown or per-task-only option.
            InvalidTask: the copy is invalid (the backend validates it, as for any ``Task``).
        """
        if unsupported:
            raise TypeError(
                f"using() got {sorted(unsupported)}; lease, backoff and timeout are per task: set them in "
                "@task(...) (Django 6.1, backport) or @task_options(...) (Django 6.0)"
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


# ---------------------------------------------------------------------------------------------
# The framework-task registry (fed by validate_task, read by the worker through registry)
# ---------------------------------------------------------------------------------------------

_TASKS: dict[str, Task[..., Any]] = {}
_TASKS_LOCK = threading.Lock()


def _register(task: Task[..., Any]) -> None:
    """Remember a validated framework Task under its ``module_path``.

    The first Task seen for a function is the decorated one (``.using()`` copies come later and
    share its function), so it is kept; a new function object under the same path (a module
    reload) replaces it.
    """
    name = task.module_path
    with _TASKS_LOCK:
        current = _TASKS.get(name)
        if current is None or current.func is not task.func:
            _TASKS[name] = task


def registered_framework_tasks() -> dict[str, Task[..., Any]]:
    """Return a snapshot of the framework tasks this process knows, by ``module_path``."""
    return dict(_TASKS)


# Backends by alias for the worker's lookups (the framework's handler keeps one instance per
# thread behind an asgiref Local, which costs more than the rest of the lookup). Ours are
# stateless apart from caches, so threads may share one; cleared when TASKS changes.
_BACKENDS: dict[str, LeaseQueueBackend] = {}


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in ("TASKS", "LEASEQUEUE"):
        _BACKENDS.clear()


setting_changed.connect(_on_setting_changed, dispatch_uid="leasequeue-tasks-backends")


def _backend_of(task: Task[..., Any]) -> LeaseQueueBackend:
    cached = _BACKENDS.get(task.backend)
    if cached is not None:
        return cached
    backend = task.get_backend()
    if not isinstance(backend, LeaseQueueBackend):
        raise InvalidTaskBackend(
            f"task {task.module_path!r} uses backend {task.backend!r}, which is not a LeaseQueueBackend"
        )
    _BACKENDS[task.backend] = backend
    return backend


def _spec_for(task: Task[..., Any], backend: LeaseQueueBackend) -> registry.TaskSpec[..., Any]:
    """The native job spec that runs ``task``: its options over the backend's defaults.

    Cached on the backend instance (one per thread and ``TASKS`` setting) by Task identity: the
    worker looks a job's spec up twice per attempt.
    """
    cached = backend._specs.get(id(task))
    if cached is not None and cached[0] is task:
        return cached[1]
    task_spec = _build_spec(task, backend)
    if len(backend._specs) > 10_000:  # .using() copies are enqueue-time only; keep the cache small
        backend._specs.clear()
    backend._specs[id(task)] = (task, task_spec)
    return task_spec


def _build_spec(task: Task[..., Any], backend: LeaseQueueBackend) -> registry.TaskSpec[..., Any]:
    own = _options_of(task)
    defaults = backend.defaults
    return registry.TaskSpec(
        func=_Runner(task), name=task.module_path, queue=task.queue_name, priority=task.priority,
        max_attempts=own.max_attempts or defaults.max_attempts,
        backoff=own.backoff if own.backoff is not None else defaults.backoff,
        lease=own.lease or defaults.lease, timeout=own.timeout or defaults.timeout,
        takes_context=True,
    )


def _resolve(name: str) -> registry.TaskSpec[..., Any] | None:
    """Registry resolver: the spec of the framework task registered as ``name``, else None.

    Only Task objects that passed :meth:`LeaseQueueBackend.validate_task` in this process are
    found; ``name`` is never imported.
    """
    task = _TASKS.get(name)
    if task is None:
        return None
    return _spec_for(task, _backend_of(task))


registry.add_resolver(_resolve, names=lambda: list(_TASKS))


# ---------------------------------------------------------------------------------------------
# Running a framework task inside the worker
# ---------------------------------------------------------------------------------------------


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

    def fenced_atomic(self) -> AbstractContextManager[None]:
        """Context manager: commit the block and the job's completion together, only while this
        worker holds the lease (see :meth:`JobContext.fenced_atomic`). The task's return value is
        stored after the block, fenced on the same token.

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


@dataclass(eq=False)
class _Attempt:
    """What the worker knows of a running attempt, to send ``task_finished`` without a query."""

    task: Task[..., Any]
    result: TaskResult[..., Any]  # RUNNING, as sent with task_started
    exc: BaseException | None = None  # set when the task raised
    value: Any = None


# The key of the running attempt's _Attempt in ``JobContext.attempt_data``.
_ATTEMPT_KEY = "django_leasequeue.backends"


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
        _install_attempt_hook()
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
        from . import store

        try:
            result_json = arguments.json_dumps_result(value)
        except PayloadNotSerializable as exc:
            logger.warning("job %s completed in fenced_atomic(); its return value is not stored: %s", job.job_id, exc)
            return
        if not store.job_set_result(job.job_id, job.lease_version, result_json, alias=job.alias):
            logger.warning("job %s: return value not stored (the job is no longer done under token %s)",
                           job.job_id, job.lease_version)


def _load_job(job_id: int, alias: str | None = None) -> Job | None:
    from . import store

    return store.job_get(job_id, alias=alias)


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
    from .failures import describe_error

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
    """Install :class:`_FinishedHook` in the executor (once). Called when a backend is configured
    once the app registry is ready (the executor's modules import the models; this module is
    imported while Django loads its settings), and by the runner before the task starts, for a
    backend configured earlier."""
    from .executor import install_attempt_hook

    install_attempt_hook(_FINISHED_HOOK)


def _connect_lease_expired() -> None:
    """Send ``task_finished`` when the reaper takes back a framework task's lease (once)."""
    lq_signals.job_lease_expired.connect(_on_lease_expired, dispatch_uid="leasequeue-tasks-lease_expired")


# ---------------------------------------------------------------------------------------------
# Row -> TaskResult
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# The backend
# ---------------------------------------------------------------------------------------------

OPTION_KEYS = ("LEASE", "MAX_ATTEMPTS", "BACKOFF", "TIMEOUT")


def _parse_options(raw: Any) -> _Options:
    """Validate ``OPTIONS``. Raises ConfigurationError naming the key."""
    if raw is None:
        return _Options()
    if not isinstance(raw, Mapping):
        raise ConfigurationError(f"OPTIONS must be a dict, got {raw!r}")
    unknown = sorted(set(raw) - set(OPTION_KEYS))
    if unknown:
        raise ConfigurationError(f"unknown OPTIONS key(s) {unknown_keys_hint(unknown, OPTION_KEYS)}; "
                                 f"allowed: {list(OPTION_KEYS)}")
    lease = _seconds(raw.get("LEASE"), "OPTIONS['LEASE']")
    timeout = _seconds(raw.get("TIMEOUT"), "OPTIONS['TIMEOUT']")
    backoff = raw.get("BACKOFF")
    if isinstance(backoff, Mapping):
        try:
            backoff = Backoff(**backoff)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"OPTIONS['BACKOFF']: {exc}")
    try:
        arguments.check_task_options("OPTIONS", max_attempts=raw.get("MAX_ATTEMPTS"), lease=lease, timeout=timeout,
                                    backoff=backoff)
    except ConfigurationError as exc:
        raise ConfigurationError(str(exc).replace("task 'OPTIONS': ", "OPTIONS: "))
    return _Options(max_attempts=raw.get("MAX_ATTEMPTS"), backoff=backoff, lease=lease, timeout=timeout)


class LeaseQueueBackend(BaseTaskBackend):
    """Django tasks backend that stores tasks as django-leasequeue jobs. See the module docstring.

    Args:
        alias (str): the ``TASKS`` alias.
        params (dict): ``QUEUES`` (list of queue names the framework accepts; default
            ``["default"]``; an empty list accepts any) and ``OPTIONS``: ``LEASE`` (seconds or
            timedelta), ``MAX_ATTEMPTS`` (int >= 1), ``BACKOFF`` (a
            :class:`~django_leasequeue.retry.Backoff`, a dict of its arguments, base seconds or a
            callable ``attempt -> seconds``), ``TIMEOUT`` (seconds or timedelta). Unset options
            fall back to ``LEASEQUEUE``.

    A bad ``QUEUES`` or ``OPTIONS`` does not raise here (``@task`` at import time would then break
    every module that declares a task); it is reported by ``manage.py check`` (``leasequeue.E102``)
    and raised as ``InvalidTaskBackend`` by :meth:`enqueue` and :meth:`get_result`.
    """

    task_class = LeaseQueueTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        _connect_lease_expired()
        if apps.apps_ready:  # the executor's modules import the models
            _install_attempt_hook()
        self.config_errors: list[str] = []
        self._specs: dict[int, tuple[Task[..., Any], registry.TaskSpec[..., Any]]] = {}
        queues = params.get("QUEUES", [DEFAULT_TASK_QUEUE_NAME])
        if isinstance(queues, (str, bytes)) or not isinstance(queues, Iterable) or not all(
            isinstance(q, str) and 0 < len(q) <= 100 for q in queues
        ):
            self.config_errors.append(
                f"TASKS[{alias!r}]['QUEUES'] must be a list of queue names (1 to 100 characters), got {queues!r}"
            )
            self.queues = set()
        try:
            self.defaults = _parse_options(self.options)
        except ConfigurationError as exc:
            self.config_errors.append(f"TASKS[{alias!r}]: {exc}")
            self.defaults = _Options()

    def _raise_config_errors(self) -> None:
        if self.config_errors:
            raise InvalidTaskBackend("; ".join(self.config_errors))

    # -- validation ---------------------------------------------------------------------------
    def validate_task(self, task: Task[..., Any]) -> None:
        """Check ``task`` (the framework's rules, plus ours) and register it for the workers.

        Accepts ``run_after`` as an aware datetime or a ``timedelta`` (the framework's own check
        would crash on a timedelta). Naive datetimes are refused even with ``USE_TZ = False``:
        jobs are due by the database clock, in absolute time.

        Raises:
            InvalidTask: the framework's checks failed, ``run_after`` is naive or not a time, the
                task's options are invalid, or its module path is longer than 255 characters.
        """
        run_after = task.run_after
        framework_view = task
        if isinstance(run_after, timedelta):
            framework_view = _clone(task, run_after=None)
        elif isinstance(run_after, datetime):
            if timezone.is_naive(run_after):
                raise InvalidTask("run_after must be an aware datetime (or a timedelta); got a naive datetime")
        elif run_after is not None:
            raise InvalidTask(f"run_after must be an aware datetime or a timedelta, got {run_after!r}")
        super().validate_task(framework_view)
        name = task.module_path
        if len(name) > 255:
            raise InvalidTask(f"task path {name!r} is longer than 255 characters")
        problem = queue_name_problem(task.queue_name, "queue_name")
        if problem:
            raise InvalidTask(problem)
        try:
            own = _options_of(task)
            arguments.check_task_options(name, priority=int(task.priority), max_attempts=own.max_attempts,
                                        lease=own.lease, timeout=own.timeout, backoff=own.backoff)
        except ConfigurationError as exc:
            raise InvalidTask(str(exc))
        if own.unique_scope not in ("retained", "active"):
            raise InvalidTask(f"unique_scope must be 'retained' or 'active', got {own.unique_scope!r}")
        if own.unique_key is not None and not (isinstance(own.unique_key, str) or callable(own.unique_key)):
            raise InvalidTask(f"unique_key must be a str template or a callable, got {own.unique_key!r}")
        _register(task)

    # -- enqueue ------------------------------------------------------------------------------
    def enqueue(self, task: Task[_P, _R], args: Any, kwargs: Any) -> TaskResult[_P, _R]:
        """Write a job for ``task`` in the caller's transaction and return its READY result.

        Args:
            task: a framework Task (its ``run_after``: aware datetime, ``timedelta`` from the
                database clock, or None).
            args: the task's positional arguments; they must round-trip through JSON unchanged.
            kwargs: the task's keyword arguments; the same rule.

        Returns:
            The job's ``TaskResult`` (``id`` is the job id); with a ``unique_key`` already taken,
            the existing job's result (and no ``task_enqueued`` signal).

        Raises:
            InvalidTask: see :meth:`validate_task`.
            InvalidTaskBackend: ``QUEUES`` or ``OPTIONS`` are invalid.
            PayloadNotSerializable: (a ``TypeError``) an argument is not JSON; nothing is written.
            EnqueueError: (a ``ValueError``) the queue is not allowed by ``LEASEQUEUE["QUEUES"]``,
                the unique key could not be computed, the payload is too large.
        """
        self._raise_config_errors()
        self.validate_task(task)
        task_spec = _spec_for(task, self)
        own = _options_of(task)
        kwargs = dict(kwargs)
        new = build_job(task_spec, list(args), kwargs, run_at=task.run_after, queue=task.queue_name,
                        priority=task.priority, unique_key=_unique_key(own.unique_key, args, kwargs),
                        unique_scope=own.unique_scope)
        job, created = insert_job(new)
        result = self.result_from_job(job, task)
        if created:
            _send(task_enqueued, self, result)
        return result

    # -- results ------------------------------------------------------------------------------
    def get_result(self, result_id: str) -> TaskResult[..., Any]:
        """Return the ``TaskResult`` of the job ``result_id`` as it is in the database now.

        Raises:
            TaskResultDoesNotExist: no such job, or the job is not a registered framework task
                (a native ``@task`` job, or a task whose module this process never imported even
                after :func:`registry.autodiscover`).
            InvalidTaskBackend: ``QUEUES`` or ``OPTIONS`` are invalid.
        """
        self._raise_config_errors()
        try:
            job_id = int(str(result_id))
        except (TypeError, ValueError):
            raise TaskResultDoesNotExist(result_id)
        row = _load_job(job_id)
        if row is None:
            raise TaskResultDoesNotExist(result_id)
        task = _TASKS.get(row.task)
        if task is None:
            registry.autodiscover()
            task = _TASKS.get(row.task)
        if task is None:
            raise TaskResultDoesNotExist(
                f"job {job_id} runs {row.task!r}, which is not a Django task registered with this backend"
            )
        return self.result_from_job(row, task)

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

    # -- checks -------------------------------------------------------------------------------
    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """System checks: ``leasequeue.E101`` app not installed, ``E102`` bad ``QUEUES``/``OPTIONS``,
        ``E103`` a ``QUEUES`` entry that ``LEASEQUEUE["QUEUES"]`` does not allow."""
        from django.apps import apps

        from .conf import get_settings

        messages: list[checks.CheckMessage] = []
        if not apps.is_installed("django_leasequeue"):
            messages.append(checks.Error(
                f"TASKS[{self.alias!r}] uses LeaseQueueBackend but 'django_leasequeue' is not in INSTALLED_APPS",
                id="leasequeue.E101",
            ))
        messages.extend(checks.Error(msg, id="leasequeue.E102") for msg in self.config_errors)
        try:
            settings = get_settings()
        except ConfigurationError:
            return messages  # leasequeue.E001 reports it
        refused = sorted(q for q in self.queues if not settings.queue_allowed(q))
        if refused:
            messages.append(checks.Error(
                f"TASKS[{self.alias!r}]['QUEUES'] has {refused}, which LEASEQUEUE['QUEUES'] does not allow; "
                "enqueueing there would fail",
                id="leasequeue.E103",
            ))
        return messages


def _unique_key(template: str | Callable[..., str] | None, args: Any, kwargs: Mapping[str, Any]) -> str | None:
    """Compute a job's unique key from the task's template or callable and its arguments."""
    if template is None:
        return None
    from .exceptions import EnqueueError

    try:
        if callable(template):
            return str(template(*args, **kwargs))
        return template.format(*args, **kwargs)
    except Exception as exc:
        raise EnqueueError(f"unique_key {template!r} failed on these arguments: {exc!r}")
