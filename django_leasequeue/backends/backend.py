"""The tasks backend itself: :class:`LeaseQueueBackend` (configuration, validation, enqueue in the
caller's transaction, results, system checks). See the package docstring for the mapping."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, ParamSpec, TypeVar

from django.apps import apps
from django.core import checks
from django.utils import timezone

from .. import arguments, registry
from ..compat_tasks import (
    DEFAULT_TASK_QUEUE_NAME,
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    task_enqueued,
)
from ..conf import queue_name_problem
from ..enqueueing import build_job, insert_job
from ..exceptions import ConfigurationError
from ..retry import check_retry_options
from .events import _connect_lease_expired, _install_attempt_hook, _send
from .options import _Options, _options_of, _parse_options
from .registered import _TASKS, _register
from .results import _load_job, _ResultBackend
from .specs import _spec_for
from .tasks import LeaseQueueTask, _clone

# A framework task's parameters and return type, carried from the Task to its TaskResult.
_P = ParamSpec("_P")
_R = TypeVar("_R")


class LeaseQueueBackend(_ResultBackend):
    """Django tasks backend that stores tasks as django-leasequeue jobs. See :mod:`django_leasequeue.backends`.

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
            check_retry_options(name, own.retry_on, own.discard_on)
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

        Args:
            result_id (str): a ``TaskResult.id`` this backend issued: the job's id in canonical
                decimal form (``"52"``). Anything else (``" 52 "``, ``"052"``, ``"+52"``, ``"5_2"``,
                non-ASCII digits, an int) names no result, although ``int()`` would accept it.

        Raises:
            TaskResultDoesNotExist: ``result_id`` is not such an id, no such job, or the job is not a
                registered framework task (a native ``@task`` job, or a task whose module this process
                never imported even after :func:`registry.autodiscover`).
            InvalidTaskBackend: ``QUEUES`` or ``OPTIONS`` are invalid.
        """
        self._raise_config_errors()
        job_id = _issued_job_id(result_id)
        if job_id is None:
            raise TaskResultDoesNotExist(f"{result_id!r} is not a result id this backend issued (the decimal "
                                         "digits of a job's id, as TaskResult.id gives them)")
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


    # -- checks -------------------------------------------------------------------------------
    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """System checks: ``leasequeue.E101`` app not installed, ``E102`` bad ``QUEUES``/``OPTIONS``,
        ``E103`` a ``QUEUES`` entry that ``LEASEQUEUE["QUEUES"]`` does not allow."""
        from django.apps import apps

        from ..conf import get_settings

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
    from ..exceptions import EnqueueError

    try:
        if callable(template):
            return str(template(*args, **kwargs))
        return template.format(*args, **kwargs)
    except Exception as exc:
        raise EnqueueError(f"unique_key {template!r} failed on these arguments: {exc!r}")


# The ids enqueue() issues: str(job.id), a positive bigint. Only these name a result, so that one
# job has exactly one result id (int() would also read " 52 ", "052", "+52", "5_2" and "٥٢").
_ISSUED_ID = re.compile(r"[1-9][0-9]{0,18}")
_MAX_JOB_ID = 2**63 - 1  # the job table's bigint primary key


def _issued_job_id(result_id: object) -> int | None:
    """The job id in ``result_id`` when it is one this backend issued, else None.

    Args:
        result_id: what the caller passed to ``get_result``.

    Returns:
        The job's id (int, 1 .. 2**63 - 1), or None for anything but its canonical decimal str.
    """
    if type(result_id) is not str or _ISSUED_ID.fullmatch(result_id) is None:
        return None
    job_id = int(result_id)
    return job_id if job_id <= _MAX_JOB_ID else None
