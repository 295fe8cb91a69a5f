"""Per-task options of framework tasks (:func:`task_options`, :class:`LeaseQueueTask` fields) and
the backend's ``OPTIONS``: their names, validation and precedence."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .. import arguments
from ..compat_tasks import Task
from ..conf import unknown_keys_hint
from ..exceptions import ConfigurationError
from ..retry import Backoff, BackoffLike, ExceptionClasses

TASK_OPTION_NAMES = ("max_attempts", "backoff", "lease", "timeout", "unique_key", "unique_scope", "retry_on",
                     "discard_on")
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
            :class:`LeaseQueueTask`), ``unique_scope`` (``"retained"`` or ``"active"``),
            ``retry_on`` and ``discard_on`` (an exception class or a tuple of them, as in the
            native ``@task``).

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
    retry_on: ExceptionClasses | None = None
    discard_on: ExceptionClasses | None = None


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
        retry_on=merged.get("retry_on"),
        discard_on=merged.get("discard_on"),
    )


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

