"""An optional JSON log format: :class:`JSONFormatter`, one JSON object per line.

Every line carries the time, level, logger and message, and, when the record is about a job, the
job's ``job_id``, ``task``, ``queue``, ``attempt`` and ``lease_version`` (its fencing token). They
come from the record's ``extra`` (the lifecycle events of :mod:`django_leasequeue.signals` carry
them, the token as ``token``) or, for any other record logged on the thread running an attempt
(the handler's own logging, the executor's messages), from the attempt the worker marked current
with :func:`attempt_fields`. Put it in Django's ``LOGGING`` (docs/reference/monitoring.md)::

    "formatters": {"json": {"()": "django_leasequeue.logging.JSONFormatter"}},
    "filters": {"job": {"()": "django_leasequeue.logging.JobFieldsFilter"}},

The formatter reads the current attempt when it formats; a handler that formats later, on another
thread (``QueueHandler``, a test's captured records), needs :class:`JobFieldsFilter` on it, which
copies the fields onto the record when it is logged.

Stdlib only: the module imports nothing of the package, so a project can use it in any process.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

__all__ = ["JOB_FIELDS", "JSONFormatter", "JobFieldsFilter", "attempt_fields", "current_attempt"]

#: The job fields of a line, in this order.
JOB_FIELDS = ("job_id", "task", "queue", "attempt", "lease_version")

# The attempt running on this thread (or asyncio task): set by the executor around one attempt.
_ATTEMPT: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("leasequeue_attempt",
                                                                                 default=None)

# The attributes every LogRecord has; anything else on a record came from ``extra``.
_RESERVED = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


@contextlib.contextmanager
def attempt_fields(job_id: int, task: str, queue: str, attempt: int, lease_version: int) -> Iterator[None]:
    """Mark an attempt current on this thread for the ``with`` block: records logged inside it
    carry its fields in :class:`JSONFormatter`'s lines.

    Args:
        job_id: the job's primary key. task: its task name. queue: its queue.
        attempt: the attempt number (1-based). lease_version: the attempt's fencing token.
    """
    token = _ATTEMPT.set({"job_id": job_id, "task": task, "queue": queue, "attempt": attempt,
                          "lease_version": lease_version})
    try:
        yield
    finally:
        _ATTEMPT.reset(token)


def current_attempt() -> dict[str, Any] | None:
    """The fields of the attempt marked current on this thread by :func:`attempt_fields`, or None."""
    return _ATTEMPT.get()


class JobFieldsFilter(logging.Filter):
    """A filter that copies the current attempt's fields (:func:`attempt_fields`) onto each record
    logged on that thread which has no ``job_id`` of its own, so that a formatter running later
    or elsewhere still sees them. Passes every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Add the current attempt's fields to ``record`` (unless it names a job); return True."""
        attempt = _ATTEMPT.get()
        if attempt is not None and not hasattr(record, "job_id"):
            for name, value in attempt.items():
                setattr(record, name, value)
        return True


def _jsonable(value: Any) -> Any:
    """``value`` as JSON can hold it: datetimes in ISO 8601, anything unknown as its ``str()``."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


class JSONFormatter(logging.Formatter):
    """Format each record as one line of JSON.

    Keys: ``time`` (ISO 8601, UTC, milliseconds), ``level``, ``logger``, ``message``; the job
    fields of :data:`JOB_FIELDS` when the record is about a job (from its ``extra``, the event's
    ``token`` as ``lease_version``, else from the current attempt, see :func:`attempt_fields`);
    ``event`` for a lifecycle event; every other ``extra`` field (values that JSON cannot hold
    as their ``str()``); ``exception`` (the formatted traceback) when the record has one.

    Args:
        fmt, datefmt, style: ignored (accepted so that ``LOGGING`` may pass them); the line's shape
            is fixed.
    """

    def format(self, record: logging.LogRecord) -> str:
        """Return ``record`` as one line of JSON (no newline inside: tracebacks are escaped)."""
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        extra = {k: v for k, v in record.__dict__.items() if k not in _RESERVED}
        if "lease_version" not in extra and "token" in extra:
            extra["lease_version"] = extra.pop("token")
        if "job_id" not in extra:
            attempt = _ATTEMPT.get()
            if attempt is not None:
                extra = {**attempt, **extra}
        for name in JOB_FIELDS:
            if name in extra:
                line[name] = _jsonable(extra.pop(name))
        for name, value in extra.items():
            line[name] = _jsonable(value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False)
