"""Lifecycle signals and structured log records.

Each event is both a Django signal (``django_leasequeue.signals.job_<event>``, sent with keyword
arguments ``job_id``, ``task``, ``queue``, ``attempt``, ``token`` and event-specific extras) and a
log record on the ``django_leasequeue.events`` logger whose ``extra`` carries the same fields (so a
JSON log formatter emits them as structured fields).

Events: ``enqueued``, ``claimed``, ``succeeded``, ``retried``, ``dead_lettered``, ``lease_lost``,
``lease_expired`` (reaped), ``released``, ``snoozed``, ``cancelled``.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger("django_leasequeue.events")

job_enqueued = Signal()
job_claimed = Signal()
job_succeeded = Signal()
job_retried = Signal()
job_dead_lettered = Signal()
job_lease_lost = Signal()
job_lease_expired = Signal()
job_released = Signal()
job_snoozed = Signal()
job_cancelled = Signal()

SIGNALS: dict[str, Signal] = {
    "enqueued": job_enqueued,
    "claimed": job_claimed,
    "succeeded": job_succeeded,
    "retried": job_retried,
    "dead_lettered": job_dead_lettered,
    "lease_lost": job_lease_lost,
    "lease_expired": job_lease_expired,
    "released": job_released,
    "snoozed": job_snoozed,
    "cancelled": job_cancelled,
}

# Events that deserve an operator's attention are logged at WARNING; the rest at DEBUG/INFO.
_LEVELS = {"dead_lettered": logging.WARNING, "lease_lost": logging.WARNING, "lease_expired": logging.WARNING,
           "retried": logging.INFO, "released": logging.INFO, "cancelled": logging.INFO}


_RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


def event_fields(job_id: int, task: str, queue: str, attempt: int, token: int) -> dict[str, Any]:
    """The fields every job event carries, as keyword arguments for :func:`emit`.

    Args:
        job_id: the job's primary key. task: its task name. queue: its queue.
        attempt: the attempt number (1-based). token: the attempt's fencing token (``lease_version``).

    Returns:
        ``{"job_id", "task", "queue", "attempt", "token"}``.
    """
    return {"job_id": job_id, "task": task, "queue": queue, "attempt": attempt, "token": token}


def enabled(event: str) -> bool:
    """Return True when :func:`emit` of ``event`` would do anything: a receiver is connected to its
    signal or its log level is enabled. Hot paths check this before building the event's fields."""
    return bool(SIGNALS[event].receivers) or logger.isEnabledFor(_LEVELS.get(event, logging.DEBUG))


def _describe(event: str, fields: dict[str, Any]) -> str:
    """The log line of an event: an operator reading plain logs sees which task failed and why,
    not only the job id (the structured fields stay on the record for JSON formatters)."""
    text = f"job {fields.get('job_id')} {event}"
    if fields.get("task"):
        text += f" ({fields['task']}, attempt {fields.get('attempt')})"
    if fields.get("error"):
        text += f": {fields['error']}"
    if fields.get("message"):
        message = str(fields["message"])
        text += f": {message[:300]}{'...' if len(message) > 300 else ''}"
    run_at = fields.get("run_at")
    if event == "retried" and run_at:
        text += f"; next attempt at {run_at.isoformat(timespec='seconds') if hasattr(run_at, 'isoformat') else run_at}"
    if fields.get("reason"):
        text += f" ({fields['reason']})"
    return text.replace("%", "%%")


def emit(event: str, **fields: Any) -> None:
    """Send the signal for ``event`` and write its structured log record. Never raises.

    Args:
        event: one of the names in :data:`SIGNALS`.
        fields: ``job_id``, ``task``, ``queue``, ``attempt``, ``token`` and extras (``error``, ...).
            In the log record, a field whose name a LogRecord already uses gets a ``job_`` prefix.
    """
    level = _LEVELS.get(event, logging.DEBUG)
    try:
        if logger.isEnabledFor(level):
            extra = {("job_" + k if k in _RESERVED else k): v for k, v in fields.items()}
            logger.log(level, _describe(event, fields), extra={"event": event, **extra})
        signal = SIGNALS[event]
        if signal.receivers:
            signal.send_robust(sender=None, event=event, **fields)
    except Exception:  # observability must never break job bookkeeping
        logger.exception("could not emit %s", event)


def announce_enqueued(job_id: int, task_name: str, queue: str, **extra: Any) -> None:
    """Send the ``enqueued`` event of one written job (every insert path calls this, once it
    checked :func:`enabled`).

    Args:
        job_id: the new job's id; task_name, queue: its task and queue.
        extra: further fields of the event (a schedule's name and occurrence).
    """
    emit("enqueued", job_id=job_id, task=task_name, queue=queue, attempt=0, token=0, **extra)
