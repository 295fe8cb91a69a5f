"""Exceptions raised by django-leasequeue.

Every error this package raises on purpose derives from :class:`LeaseQueueError`, so callers can
catch the whole family in one clause.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.utils import ProgrammingError


class LeaseQueueError(Exception):
    """Base class of every django-leasequeue error."""


class ConfigurationError(LeaseQueueError):
    """The ``LEASEQUEUE`` setting or a task declaration is invalid."""


class NotMigrated(ConfigurationError, ProgrammingError):
    """The job table or the ``leasequeue_now()`` function does not exist in the database: run
    ``manage.py migrate``. A ``ProgrammingError`` too, so code catching database errors still does."""


class EnqueueError(LeaseQueueError, ValueError):
    """A job could not be enqueued because its input is invalid (bad argument, queue, priority...)."""


class PayloadNotSerializable(EnqueueError, TypeError):
    """An argument does not round-trip through JSON unchanged. The message names the argument."""


class ArgumentsMismatch(EnqueueError, TypeError):
    """The arguments given at enqueue do not fit the handler's signature (a missing or unexpected
    argument): the job would fail with a TypeError on every attempt. The message names the task and
    its signature. Nothing is written."""


class PayloadTooLarge(EnqueueError):
    """The JSON-encoded arguments exceed ``LEASEQUEUE["MAX_PAYLOAD_BYTES"]``."""


class ResultTooLarge(LeaseQueueError):
    """A handler's return value, encoded as JSON, exceeds ``LEASEQUEUE["MAX_RESULT_BYTES"]``.

    Recorded as the job's failed attempt (never retried: the same result would be refused again,
    so the job is dead-lettered); the message gives the size and the limit in bytes.

    Args:
        size (int): the UTF-8 size of the result's JSON, in bytes (with ``at_least``, a lower bound).
        limit (int): the ``MAX_RESULT_BYTES`` setting, in bytes.
        at_least (bool): ``size`` is a lower bound, found without encoding the whole value.
    """

    def __init__(self, size: int, limit: int, *, at_least: bool = False) -> None:
        bound = "at least " if at_least else ""
        super().__init__(f"the return value is {bound}{size} bytes of JSON, over LEASEQUEUE['MAX_RESULT_BYTES'] "
                         f"({limit} bytes); store large outputs elsewhere and return a reference")
        self.size = size
        self.limit = limit
        self.at_least = at_least


class UnknownTask(LeaseQueueError, LookupError):
    """No task is registered under that name. Workers dead-letter such jobs; they never import them."""


class LeaseLost(LeaseQueueError):
    """The worker no longer holds the job's lease: its fencing token (``lease_version``) is stale.

    Raised by :meth:`JobContext.check_lease` and by :meth:`JobContext.fenced_atomic` when the job
    was reaped, released or re-claimed by another worker. The handler's fenced writes are rolled back.
    """


class JobCancelled(LeaseQueueError):
    """Raised by :meth:`JobContext.check_cancel` when an operator asked to cancel the running job."""


class Snooze(LeaseQueueError):  # noqa: N818 - the name is the verb, as in Oban and River
    """Raise (or return) ``Snooze(seconds)`` from a handler to run the job again later.

    The job goes back to ``ready`` with ``run_at = now + seconds`` (database time); the attempt is
    not counted as a failure (see docs/howto/flow-control.md for how snoozes count against attempts).

    Args:
        seconds (float): delay before the job is due again, in seconds (>= 0).
    """

    def __init__(self, seconds: float) -> None:
        import math

        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
                or not 0 <= seconds <= 100 * 366 * 24 * 3600:
            raise ValueError(f"Snooze seconds must be a finite number from 0 to 100 years, got {seconds!r}")
        super().__init__(f"snoozed for {seconds} s")
        self.seconds = float(seconds)


class LeaseExpired(LeaseLost):
    """The reaper took a job back because its lease expired (the worker died, hung past its
    timeout or lost the database). Never raised in a handler: it names the ``LeaseExpired`` entry
    the reaper writes into ``Job.errors``, so that the Django tasks backend can report that entry
    as an exception class (``TaskError.exception_class``)."""


class SnoozeLimitExceeded(LeaseQueueError):
    """The job snoozed more than ``LEASEQUEUE["MAX_SNOOZES"]`` times and was dead-lettered. Like
    :class:`LeaseExpired`, it names an entry of ``Job.errors`` rather than being raised."""


class JobTimedOut(LeaseQueueError):
    """The handler ran past its task's ``timeout``: the attempt is recorded as a failed attempt of
    this type (retried after backoff, or dead-lettered on the last attempt).

    In thread mode the handler cannot be stopped: the worker keeps the job leased until it returns,
    then records this failure and discards what it returned. ``fenced_atomic()`` raises it inside a
    timed-out handler (nothing is committed). In process mode the child running the handler is
    killed at the timeout."""


class Interrupted(LeaseQueueError):
    """The job's handler was cut short by graceful stops more than ``LEASEQUEUE["MAX_INTERRUPTIONS"]``
    times and the job was dead-lettered. Like :class:`LeaseExpired`, it names an entry of
    ``Job.errors`` rather than being raised."""


class CorruptRow(LeaseQueueError):
    """A claimed job row could not be decoded (a number Python cannot read back, arguments that are
    not a list and an object, a time outside Python's range: a row written by hand or by an older
    version) and was dead-lettered without running. Like :class:`LeaseExpired`, it names an entry
    of ``Job.errors`` (its message gives the reason) rather than being raised."""


class Retry(LeaseQueueError):  # noqa: N818 - the name is the verb, as Snooze
    """Raise ``Retry(...)`` from a handler to fail this attempt and retry the job at a chosen time.

    Unlike :class:`Snooze`, the attempt counts: it is a failed attempt (recorded in ``Job.errors``
    with ``"decision": "retry_requested"`` and the ``reason``), retried at the time asked for. On the
    job's last attempt (``attempts == max_attempts``) the job is dead-lettered instead. The task's
    ``retry_on`` and ``discard_on`` do not apply to it: the handler decided.

    Give at most one of ``delay`` and ``at``; with neither, the task's backoff picks the delay.

    Args:
        delay (float | timedelta | None): seconds from the failure (database time) to the retry,
            from 0 to 100 years.
        at (datetime | None): an aware datetime; the retry's ``run_at`` is exactly this time (a
            time already past makes the retry due at once, at the failure's time).
        reason (str): why, recorded in the job's error entry (at most 4000 characters are kept).

    Raises:
        ValueError: both ``delay`` and ``at``; a naive ``at`` or one that is not a datetime; a
            negative, NaN, infinite or over-100-years ``delay``; a ``reason`` that is not a str.
            Raised inside the handler, so the attempt fails with this ValueError as its error
            (and the task's ``retry_on``, ``discard_on`` and backoff decide what follows).
    """

    def __init__(self, delay: float | timedelta | None = None, *, at: datetime | None = None,
                 reason: str = "") -> None:
        import math

        if delay is not None and at is not None:
            raise ValueError("Retry takes delay or at, not both")
        if isinstance(delay, timedelta):
            delay = delay.total_seconds()
        if delay is not None and (isinstance(delay, bool) or not isinstance(delay, (int, float))
                                  or not math.isfinite(delay) or not 0 <= delay <= 100 * 366 * 24 * 3600):
            raise ValueError(f"Retry delay must be a finite number of seconds from 0 to 100 years, got {delay!r}")
        if at is not None and (not isinstance(at, datetime) or at.tzinfo is None or at.utcoffset() is None):
            raise ValueError(f"Retry at must be an aware datetime, got {at!r}")
        if not isinstance(reason, str):
            raise ValueError(f"Retry reason must be a str, got {reason!r}")
        self.delay = None if delay is None else float(delay)
        self.at = at
        self.reason = reason
        when = f"at {at.isoformat()}" if at is not None else (
            "after the backoff" if delay is None else f"in {self.delay:g} s")
        super().__init__(f"retry requested {when}" + (f": {reason}" if reason else ""))

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled from a process-mode child to the worker: rebuild from the arguments, not the message.
        return (_rebuild_retry, (self.delay, self.at, self.reason))


def _rebuild_retry(delay: float | None, at: datetime | None, reason: str) -> Retry:
    return Retry(delay, at=at, reason=reason)
