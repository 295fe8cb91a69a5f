"""How an attempt's end is told: its event (``signals``), the attempt hooks, and the ``lease_lost``
note of an attempt whose fenced write was refused."""

from __future__ import annotations

import logging
from typing import Any

from django.db import DatabaseError

from . import signals, store
from .attempt_hooks import _HOOKS, attempt_ended
from .context import JobContext
from .runtime import close_broken_connections

logger = logging.getLogger("django_leasequeue.executor")


def end_attempt(ctx: JobContext, event: str, **fields: Any) -> None:
    """Emit ``event`` (see :func:`signals.emit`) for the attempt ``ctx``, then tell the hooks."""
    signals.emit(event, **fields)
    if _HOOKS:
        attempt_ended(ctx, event)


def ctx_fields(ctx: JobContext) -> dict[str, Any]:
    """The event fields of the attempt ``ctx`` (see :func:`signals.event_fields`)."""
    return signals.event_fields(ctx.job_id, ctx.task, ctx.queue, ctx.attempt, ctx.lease_version)


def job_fields(job: store.ClaimedJob) -> dict[str, Any]:
    """The event fields of the claimed ``job``'s attempt (see :func:`signals.event_fields`)."""
    return signals.event_fields(job.id, job.task, job.queue, job.attempts, job.lease_version)


# The event of an attempt whose outcome its own earlier write recorded (see report_lease_lost()).
_SETTLED_EVENTS = {"done": "succeeded", "ready": "retried", "dead": "dead_lettered", "cancelled": "cancelled"}


def report_lease_lost(ctx: JobContext, *, write: str, fields: dict[str, Any] | None = None) -> str | None:
    """Record that the worker running ``ctx`` lost its lease: flag, event, and a durable note;
    unless the refused write found the job settled by this very attempt.

    A fenced write is refused when the row no longer carries this token in ``leased``: the lease
    moved on, or an earlier write of this attempt whose reply was lost with its connection had
    landed (a completion committed as a pooler or server restarted, then repeated, or renewed
    against, on a new connection). The row, read under the token first, tells them apart: a job
    that left ``leased`` still under this token was settled by this attempt (only its holder
    writes so; claims, the reaper and operators move the token), and is no lost lease. Then
    nothing is written or emitted, and the caller records the attempt's outcome.

    Otherwise marks ``ctx`` lost, emits ``lease_lost`` (with ``write`` and ``timed_out``), and
    appends a ``lease_lost`` entry to the job's history through :func:`store.job_note_lease_lost`
    (once per token), which the lease report counts as a fence rejection. Never raises on
    database errors: the note is diagnostics, the fenced write already protected the job.

    Args:
        ctx: the attempt's context.
        write: the refused write (``renew``, ``complete``, ``fail``, ``snooze``, ``cancel``, ``handler``).
        fields: event fields; default built from ``ctx``.

    Returns:
        None when the lost lease was reported; else the status (``done``, ``ready``, ``dead``,
        ``cancelled``) in which this attempt's own earlier write left the job.
    """
    try:
        settled = store.job_settled_under([(ctx.job_id, ctx.lease_version)], alias=ctx.alias).get(ctx.job_id)
    except DatabaseError:
        close_broken_connections()  # cannot tell: report the loss (the note will likely fail too)
        settled = None
    if settled is not None:
        logger.warning("job %s: a %s write of token %s was refused, but the job is %s under that token: an "
                       "earlier write of this attempt landed (its reply was lost); not a lost lease",
                       ctx.job_id, write, ctx.lease_version, settled)
        return settled
    ctx.mark_lease_lost()
    if fields is None:
        fields = ctx_fields(ctx)
    end_attempt(ctx, "lease_lost", write=write, timed_out=ctx.timed_out, **fields)
    try:
        store.job_note_lease_lost(ctx.job_id, ctx.lease_version, worker=ctx.worker_id, write=write,
                                  timed_out=ctx.timed_out, alias=ctx.alias)
    except DatabaseError:
        logger.warning("job %s: could not record the lost lease in its history", ctx.job_id, exc_info=True)
        close_broken_connections()
    return None


def end_settled_attempt(ctx: JobContext, status: str, fields: dict[str, Any], *, write: str) -> str:
    """Emit the event of an attempt that :func:`report_lease_lost` found settled by its own
    earlier write (``status``: the job's status now); return ``status`` as the attempt's outcome
    (``snoozed`` for a snooze that put the job back to ``ready``)."""
    event = "snoozed" if write == "snooze" and status == "ready" else _SETTLED_EVENTS.get(status, "succeeded")
    end_attempt(ctx, event, **fields)
    return "snoozed" if event == "snoozed" else status
