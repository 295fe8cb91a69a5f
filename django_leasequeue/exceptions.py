"""Exceptions raised by django-leasequeue.

Every error this package raises on purpose derives from :class:`LeaseQueueError`, so callers can
catch the whole family in one clause.
"""

from __future__ import annotations

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
