"""Validation of the options a job is enqueued with, and of task options.

Every check here is pure Python (no database): queue names, keys, ``run_at``, priorities, attempts,
leases, unique-key modes. The arguments themselves (JSON round trip, signature, size) are checked
by :mod:`django_leasequeue.payload`. :mod:`django_leasequeue.enqueueing` builds job rows from these checks;
``@task`` and the Django tasks backend check task options with :func:`check_task_options`.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict

from .conf import MAX_ATTEMPTS_LIMIT, MAX_LEASE_SECONDS, check_lease_seconds, parse_rate, queue_name_problem
from .exceptions import ConfigurationError, EnqueueError
from .retry import Backoff, as_backoff

PRIORITY_MIN, PRIORITY_MAX = -100, 100
#: The largest per-key concurrency limit (the column is an int; no key needs more slots).
MAX_CONCURRENCY_LIMIT = 1_000_000



class JobOptions(TypedDict, total=False):
    """Per-enqueue options of :func:`~django_leasequeue.enqueueing.enqueue`, ``enqueue_many`` and
    ``enqueue_on_commit`` (all optional; see :func:`~django_leasequeue.enqueueing.enqueue` for their
    meaning)."""

    run_at: datetime | timedelta | None
    queue: str | None
    priority: int | None
    unique_key: str | None
    unique_scope: str | None
    max_attempts: int | None
    unique_mode: str | None
    debounce: float | timedelta | None
    debounce_max_wait: float | timedelta | None
    throttle: float | timedelta | None


class UsingOptions(TypedDict, total=False):
    """Options :meth:`~django_leasequeue.registry.TaskSpec.using` accepts (all optional; see
    :func:`~django_leasequeue.enqueueing.enqueue`). ``lease`` is in seconds (int or float) or a
    ``datetime.timedelta``."""

    run_at: datetime | timedelta | None
    queue: str | None
    priority: int
    unique_key: str | None
    unique_scope: str
    max_attempts: int | None
    lease: float | timedelta | None
    unique_mode: str
    debounce: float | timedelta | None
    debounce_max_wait: float | timedelta | None
    throttle: float | timedelta | None
    sequence_key: str
    rate_key: str | None
    rate_limit: str | None
    fair_key: str | None


def seconds_option(value: Any, what: str, error: type[Exception]) -> float | None:
    """A duration option as seconds: ``value`` unchanged when a number, converted when a timedelta.

    Args:
        value: None, a number of seconds (int or float, not bool) or a ``datetime.timedelta``.
        what: how to name the option in the message (e.g. ``"task 'x': timeout"``).
        error: the exception class to raise (``ConfigurationError`` at declaration,
            ``EnqueueError`` in :meth:`~django_leasequeue.registry.TaskSpec.using`).

    Returns:
        None for None, else the seconds (a float for a timedelta; the range is checked elsewhere).

    Raises:
        error: ``value`` is of another type (a str such as ``"5"``, a bool).
    """
    if value is None:
        return None
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise error(f"{what} must be a number of seconds (int or float) or a timedelta, got {value!r}")
    return value


def check_task_options(task_name: str, *, priority: int = 0, max_attempts: int | None = None,
                       lease: float | timedelta | None = None, timeout: float | timedelta | None = None,
                       backoff: Any = None,
                       concurrency_key: Any = None, concurrency_limit: int | None = None,
                       queue: str | None = None, takes_context: bool = False,
                       manual_heartbeat: bool = False,
                       rate_key: Any = None, rate_limit: Any = None, fair_key: Any = None) -> None:
    """Validate a task's options (shared by :func:`task` and the Django tasks backend).

    Args:
        task_name: the registry name (a non-empty str of at most 255 characters, no NUL).
        priority: int, -100..100. max_attempts: int from 1 to ``MAX_ATTEMPTS_LIMIT`` or None.
        lease: seconds (int, float or timedelta) in (0, 7 days] or None.
        timeout: finite seconds (int, float or timedelta) > 0 or None.
        backoff: a :class:`~django_leasequeue.retry.Backoff`, a number of seconds from 0 to 100
            years, a callable ``attempt -> seconds``, or None.
        concurrency_key: a ``str.format`` template or a callable, with ``concurrency_limit`` (an
            int from 1 to ``MAX_CONCURRENCY_LIMIT``); both or neither.
        queue: a queue name (see :func:`~django_leasequeue.conf.queue_name_problem`) or None.
        takes_context, manual_heartbeat: bool.
        rate_key: a ``str.format`` template or a callable, with ``rate_limit`` (a string
            ``"N/s|m|h"`` as for a queue's rate limit); both or neither.
        fair_key: a ``str.format`` template, a callable, or None.

    Raises:
        ConfigurationError: naming the task and the bad option.
    """
    if not isinstance(task_name, str) or not task_name or len(task_name) > 255 or "\x00" in task_name:
        raise ConfigurationError(f"task name {task_name!r} must be a non-empty str of at most 255 characters "
                                 "without NUL")
    if isinstance(priority, bool) or not isinstance(priority, int) or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise ConfigurationError(f"task {task_name!r}: priority {priority!r} is not an int in -100..100")
    if max_attempts is not None and (isinstance(max_attempts, bool) or not isinstance(max_attempts, int)
                                     or not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT):
        raise ConfigurationError(f"task {task_name!r}: max_attempts must be an int from 1 to {MAX_ATTEMPTS_LIMIT}, "
                                 f"got {max_attempts!r}")
    lease = seconds_option(lease, f"task {task_name!r}: lease", ConfigurationError)
    timeout = seconds_option(timeout, f"task {task_name!r}: timeout", ConfigurationError)
    for option, value in (("lease", lease), ("timeout", timeout)):
        if value is not None and (not math.isfinite(value) or value <= 0):
            raise ConfigurationError(f"task {task_name!r}: {option} must be > 0 seconds, got {value!r}")
    if lease is not None and lease > MAX_LEASE_SECONDS:
        # Every enqueue would refuse it (see check_lease): say so at declaration.
        raise ConfigurationError(f"task {task_name!r}: lease must be at most {MAX_LEASE_SECONDS:.0f} seconds "
                                 f"(7 days), got {lease!r}")
    if backoff is not None:
        try:
            as_backoff(backoff, Backoff())
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"task {task_name!r}: {exc}") from None
    if queue is not None:
        problem = queue_name_problem(queue, f"task {task_name!r}: queue")
        if problem:
            raise ConfigurationError(problem)
    for option, flag in (("takes_context", takes_context), ("manual_heartbeat", manual_heartbeat)):
        if not isinstance(flag, bool):
            raise ConfigurationError(f"task {task_name!r}: {option} must be True or False, got {flag!r}")
    if (concurrency_key is None) != (concurrency_limit is None):
        raise ConfigurationError(f"task {task_name!r}: concurrency_key and concurrency_limit go together")
    if concurrency_key is not None and not (isinstance(concurrency_key, str) or callable(concurrency_key)):
        raise ConfigurationError(f"task {task_name!r}: concurrency_key must be a str.format template or a callable, "
                                 f"got {concurrency_key!r}")
    if concurrency_limit is not None and (isinstance(concurrency_limit, bool) or not isinstance(concurrency_limit, int)
                                          or not 1 <= concurrency_limit <= MAX_CONCURRENCY_LIMIT):
        raise ConfigurationError(f"task {task_name!r}: concurrency_limit must be an int from 1 to "
                                 f"{MAX_CONCURRENCY_LIMIT}, got {concurrency_limit!r}")
    if (rate_key is None) != (rate_limit is None):
        raise ConfigurationError(f"task {task_name!r}: rate_key and rate_limit go together")
    if rate_limit is not None:
        parse_rate(rate_limit, f"task {task_name!r}: rate_limit")
    for option, key in (("rate_key", rate_key), ("fair_key", fair_key)):
        if key is not None and not (isinstance(key, str) or callable(key)):
            raise ConfigurationError(f"task {task_name!r}: {option} must be a str.format template or a callable, "
                                     f"got {key!r}")

MAX_QUEUE_LENGTH = 100  # Job.queue's max_length
MAX_DELAY_SECONDS = 100 * 366 * 24 * 3600.0


def check_name(value: Any, what: str, max_length: int) -> None:
    """Refuse a queue name, unique key or concurrency key the job table cannot store as given.

    Args:
        value: the value (must be a non-empty str of at most ``max_length`` characters, without NUL,
            encodable as UTF-8).
        what: how to name it in the message (``"unique_key"``).
        max_length: the column's length in characters.

    Raises:
        EnqueueError: naming ``what`` and the problem.
    """
    if not isinstance(value, str) or not value:
        raise EnqueueError(f"{what} must be a non-empty str, got {value!r}")
    if len(value) > max_length:
        raise EnqueueError(f"{what} is {len(value)} characters long; the limit is {max_length}: {value[:40]!r}...")
    if "\x00" in value:
        raise EnqueueError(f"{what} {value!r} contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise EnqueueError(f"{what} {value!r} is not valid UTF-8") from None


# The earliest and latest run_at accepted, in UTC. PostgreSQL stores far wider timestamps, but
# Python's datetime ends at years 1 and 9999: a run_at past 9999-12-31 in UTC (an aware value near
# the end of year 9999 in a zone west of UTC) is written, then cannot be read back, so enqueue would
# raise after the INSERT and every page listing the job would fail. A day of margin on each side
# keeps the value printable in every time zone (UTC-12 to UTC+14).
#: The earliest ``run_at`` accepted (UTC).
RUN_AT_MIN = datetime(1, 1, 2, tzinfo=UTC)
#: The latest ``run_at`` accepted (UTC): the end of 9999-12-30.
RUN_AT_MAX = datetime(9999, 12, 30, 23, 59, 59, 999999, tzinfo=UTC)


def check_run_at_range(run_at: datetime) -> None:
    """Refuse an aware ``run_at`` whose UTC value is outside [:data:`RUN_AT_MIN`, :data:`RUN_AT_MAX`].

    Raises:
        EnqueueError: naming the value and the range.
    """
    try:
        utc = run_at.astimezone(UTC)
    except (OverflowError, ValueError):
        utc = None
    if utc is None or not RUN_AT_MIN <= utc <= RUN_AT_MAX:
        raise EnqueueError(f"run_at {run_at.isoformat()} is outside the range a job can be stored and read back "
                           f"with: {RUN_AT_MIN.isoformat()} to {RUN_AT_MAX.isoformat()} in UTC")


def check_using(task_name: str, options: dict[str, Any]) -> None:
    """Validate the options given to :meth:`~django_leasequeue.registry.TaskSpec.using` now, not at
    the next enqueue.

    Raises:
        EnqueueError: naming the bad option, with the message
            :func:`~django_leasequeue.enqueueing.build_job` would give.
    """
    queue = options.get("queue")
    if queue is not None:
        problem = queue_name_problem(queue, "queue")
        if problem:
            raise EnqueueError(problem)
    check_priority(options.get("priority", 0))
    attempts = options.get("max_attempts")
    if attempts is not None:
        check_max_attempts(attempts)
    check_lease(options.get("lease"), f"task {task_name!r}: lease", EnqueueError)
    check_unique_scope(options.get("unique_scope", "retained"))
    if options.get("unique_key") is not None:
        check_name(options["unique_key"], "unique_key", 255)
    for option in ("rate_key", "fair_key"):
        if options.get(option) is not None:
            check_name(options[option], f"task {task_name!r}: {option}", 255)
    run_at_delay(options.get("run_at"))
    # Each value on its own; the combination (a key, the scope, run_at) is checked at the enqueue,
    # when every option is known.
    if "unique_mode" in options:
        check_unique_mode_name(options["unique_mode"])
    for name in ("debounce", "debounce_max_wait", "throttle"):
        if options.get(name) is not None:
            options[name] = _positive_seconds(options[name], name)


def check_priority(priority: Any) -> None:
    """Refuse a job priority that is not an int from -100 to 100.

    Raises:
        EnqueueError: naming the value.
    """
    if isinstance(priority, bool) or not isinstance(priority, int) or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise EnqueueError(f"priority must be an int from -100 to 100, got {priority!r}")


def check_max_attempts(attempts: Any) -> None:
    """Refuse a job's ``max_attempts`` that is not an int from 1 to ``MAX_ATTEMPTS_LIMIT``.

    Raises:
        EnqueueError: naming the value.
    """
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= MAX_ATTEMPTS_LIMIT:
        raise EnqueueError(f"max_attempts must be an int from 1 to {MAX_ATTEMPTS_LIMIT}, got {attempts!r}")


def check_unique_scope(scope: Any) -> None:
    """Refuse a ``unique_scope`` other than ``"retained"`` and ``"active"``.

    Raises:
        EnqueueError: naming the value.
    """
    if scope not in ("retained", "active"):
        raise EnqueueError(f"unique_scope must be 'retained' or 'active', got {scope!r}")


def run_at_delay(run_at: Any) -> tuple[float, datetime | None]:
    """Split a ``run_at`` option into what the insert statement takes.

    Args:
        run_at: None (due now), a ``timedelta`` from the database clock of at most 100 years either
            way, or an aware datetime within :data:`RUN_AT_MIN` .. :data:`RUN_AT_MAX` in UTC.

    Returns:
        ``(delay in seconds, None)`` for a timedelta, ``(0.0, run_at)`` for a datetime,
        ``(0.0, None)`` for None.

    Raises:
        EnqueueError: another type, a naive datetime, a value out of range.
    """
    if isinstance(run_at, timedelta):
        delay = run_at.total_seconds()
        if abs(delay) > MAX_DELAY_SECONDS:
            raise EnqueueError(f"run_at timedelta of {delay:.0f} seconds is more than 100 years away")
        return delay, None
    if run_at is not None:
        if not isinstance(run_at, datetime):
            raise EnqueueError(f"run_at must be an aware datetime or a timedelta, got {run_at!r}")
        if run_at.tzinfo is None or run_at.utcoffset() is None:
            raise EnqueueError(f"run_at {run_at.isoformat()} is naive; pass an aware datetime "
                               "(django.utils.timezone.make_aware) or a timedelta")
        check_run_at_range(run_at)
    return 0.0, run_at


def check_lease(value: Any, what: str, error: type[Exception]) -> None:
    """Refuse a lease that is not None (the worker's default) or finite seconds in (0, 7 days].

    Args:
        value: the lease in seconds (int or float), or None.
        what: how to name it in the message (``"task 'x': lease"``).
        error: the exception class to raise (``ConfigurationError`` or ``EnqueueError``).

    Raises:
        error: the lease is out of range or not a number.
    """
    problem = check_lease_seconds(value, what) if value is not None else None
    if problem:
        raise error(problem)


#: What an enqueue does when its ``unique_key`` is taken (see :func:`check_unique_mode`).
UNIQUE_MODES = ("keep", "replace", "debounce", "throttle")
#: The suffix a throttled key gets, "@" and the window's start in UTC: "@2026-12-02T04:00:00Z".
THROTTLE_SUFFIX_LENGTH = 21


def check_unique_mode_name(mode: Any) -> None:
    """Refuse a ``unique_mode`` other than those of :data:`UNIQUE_MODES`.

    Raises:
        EnqueueError: naming the value.
    """
    if mode not in UNIQUE_MODES:
        raise EnqueueError(f"unique_mode must be one of {', '.join(map(repr, UNIQUE_MODES))}, got {mode!r}")


def _positive_seconds(value: Any, what: str) -> float:
    seconds = seconds_option(value, what, EnqueueError)
    if seconds is None or not math.isfinite(seconds) or not 0 < seconds <= MAX_DELAY_SECONDS:
        raise EnqueueError(f"{what} must be more than 0 seconds and at most 100 years, got {value!r}")
    return seconds


def check_unique_mode(mode: Any, *, unique_key: str | None, unique_scope: str, run_at_given: bool,
                      debounce: Any = None, debounce_max_wait: Any = None,
                      throttle: Any = None) -> tuple[float | None, float | None, float | None]:
    """Validate a unique-key mode with the options it needs, before anything is written.

    Args:
        mode: one of :data:`UNIQUE_MODES`.
        unique_key: the job's key (already checked by :func:`check_name`); every mode but
            ``"keep"`` needs one.
        unique_scope: ``"retained"`` or ``"active"``; ``"throttle"`` needs ``"retained"``.
        run_at_given: whether the enqueue has a ``run_at``; ``"debounce"`` computes its own.
        debounce: ``"debounce"`` only, required: seconds (number or timedelta, > 0) from each
            enqueue to the job's run_at.
        debounce_max_wait: ``"debounce"`` only, optional: seconds (>= ``debounce``) from the first
            enqueue of the pending job past which run_at is not pushed.
        throttle: ``"throttle"`` only, required: the window, a whole number of seconds >= 1.

    Returns:
        ``(debounce, debounce_max_wait, throttle)`` as seconds (floats) or None.

    Raises:
        EnqueueError: an unknown mode, a mode without a unique key, a missing, non-positive or
            misplaced seconds option, a max wait below the delay, a fractional throttle window,
            throttle with the active scope or a key too long for its window suffix, debounce
            with a run_at.
    """
    check_unique_mode_name(mode)
    given = {"debounce": debounce, "debounce_max_wait": debounce_max_wait, "throttle": throttle}
    wanted = {"debounce": ("debounce", "debounce_max_wait"), "throttle": ("throttle",)}.get(mode, ())
    for name, value in given.items():
        if value is not None and name not in wanted:
            raise EnqueueError(f"{name} is an option of unique_mode="
                               f"{'throttle' if name == 'throttle' else 'debounce'!r}, not of {mode!r}")
    if mode == "keep":
        return None, None, None
    if unique_key is None:
        raise EnqueueError(f"unique_mode={mode!r} needs a unique_key (it says what to do when the key is taken)")
    if mode == "replace":
        return None, None, None
    if mode == "debounce":
        if debounce is None:
            raise EnqueueError("unique_mode='debounce' needs debounce=<seconds> (the delay from each enqueue)")
        if run_at_given:
            raise EnqueueError("unique_mode='debounce' sets run_at itself (each enqueue: now + debounce); "
                               "do not pass run_at")
        delay = _positive_seconds(debounce, "debounce")
        max_wait = None if debounce_max_wait is None else _positive_seconds(debounce_max_wait, "debounce_max_wait")
        if max_wait is not None and max_wait < delay:
            raise EnqueueError(f"debounce_max_wait ({max_wait} s) must be at least debounce ({delay} s)")
        return delay, max_wait, None
    if throttle is None:
        raise EnqueueError("unique_mode='throttle' needs throttle=<seconds> (the window)")
    window = _positive_seconds(throttle, "throttle")
    if window < 1 or not float(window).is_integer():
        raise EnqueueError(f"throttle must be a whole number of seconds, at least 1, got {throttle!r}")
    if unique_scope != "retained":
        raise EnqueueError("unique_mode='throttle' needs unique_scope='retained' (a window's key stays taken "
                           "while its job exists, so a finished job still throttles its window)")
    if len(unique_key) > 255 - THROTTLE_SUFFIX_LENGTH:
        raise EnqueueError(f"unique_key with unique_mode='throttle' can have at most "
                           f"{255 - THROTTLE_SUFFIX_LENGTH} characters (the window suffix takes "
                           f"{THROTTLE_SUFFIX_LENGTH}), got {len(unique_key)}")
    return None, None, window


def throttle_key(unique_key: str, window: float, at: datetime) -> str:
    """The key a throttled job is stored under: ``unique_key`` + ``"@"`` + the start, in UTC, of
    the window of ``window`` seconds (counted from the Unix epoch) that contains ``at``.

    Args:
        unique_key: the key the caller gave.
        window: the throttle window, whole seconds >= 1.
        at: the enqueue's database clock reading, an aware datetime.

    Returns:
        e.g. ``"digest:7@2026-12-02T04:00:00Z"`` for a window of 3600 and ``at`` 04:17 UTC.
    """
    seconds = int(window)
    epoch = math.floor(at.timestamp())
    start = datetime.fromtimestamp(epoch - epoch % seconds, UTC)
    return f"{unique_key}@{start:%Y-%m-%dT%H:%M:%S}Z"
