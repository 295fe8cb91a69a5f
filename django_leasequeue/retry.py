"""Backoff maths for retries, exponential with jitter and capped, and the decision that follows a
failed attempt (:func:`decide`: ``retry_on``, ``discard_on``, ``Retry``). Pure functions, no database.

The shape is the "exponential backoff with jitter" of the AWS Architecture Blog (Marc Brooker,
2015), in its "equal jitter" variant: the delay for attempt *n* is drawn from
``[raw * (1 - jitter), raw]`` where ``raw = min(max, base * factor ** (n - 1))``.

>>> Backoff(base=2, factor=2, max=60, jitter=0).delay(1)
2.0
>>> Backoff(base=2, factor=2, max=60, jitter=0).delay(4)
16.0
>>> Backoff(base=2, factor=2, max=60, jitter=0).delay(10)
60.0
"""

from __future__ import annotations

import inspect
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .exceptions import ConfigurationError, Retry


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff policy.

    Args:
        base (float): delay after the first failed attempt, in seconds.
        factor (float): multiplier per further attempt.
        max (float): cap on the delay, in seconds.
        jitter (float): 0..1, fraction of the delay that is randomised (0 = deterministic).
    """

    base: float = 2.0
    factor: float = 2.0
    max: float = 3600.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        def number(value: Any) -> bool:
            return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)

        if not all(number(v) for v in (self.base, self.factor, self.max, self.jitter)) \
                or self.base < 0 or self.factor < 1 or self.max < 0 or not 0 <= self.jitter <= 1 \
                or self.base > MAX_BACKOFF_SECONDS or self.max > MAX_BACKOFF_SECONDS:
            raise ValueError(f"invalid backoff {self!r}: need finite numbers with 0 <= base <= "
                             f"{MAX_BACKOFF_SECONDS:.0f} s, factor >= 1, 0 <= max <= {MAX_BACKOFF_SECONDS:.0f} s "
                             "(100 years), 0 <= jitter <= 1")

    def delay(self, attempt: int, rng: Callable[[], float] = random.random) -> float:
        """Return the delay in seconds before the retry that follows failed attempt ``attempt`` (1-based).

        Never raises for any ``attempt``: the power is capped before it can overflow (a large
        ``factor`` reaches ``max`` in a few attempts), and the result is in ``[0, max]``.
        """
        exponent = max(attempt - 1, 0)
        # Cap the exponent before the power so that huge attempt numbers cannot overflow, and catch
        # the overflow of a large factor (1e5 ** 64 is past the largest float): the delay is max.
        try:
            raw = self.max if exponent > 64 else min(self.max, self.base * self.factor**exponent)
        except OverflowError:
            raw = self.max
        return raw * (1 - self.jitter * rng())


#: The longest backoff delay, in seconds (100 years, the longest enqueue delay): a longer one would
#: overflow PostgreSQL's interval arithmetic when the retry's run_at is computed.
MAX_BACKOFF_SECONDS = 100 * 366 * 24 * 3600.0


def clamp_delay(value: Any) -> float:
    """Turn whatever a backoff function returned into a delay in seconds in ``[0, MAX_BACKOFF_SECONDS]``.

    Raises:
        TypeError, ValueError: ``value`` is not a real number (``float(value)`` fails).
    """
    delay = float(value)
    if math.isnan(delay):
        raise ValueError("backoff returned NaN")
    return min(max(delay, 0.0), MAX_BACKOFF_SECONDS)


#: A task's ``backoff=`` option: a policy, base seconds, ``attempt -> seconds`` or
#: ``(attempt, exc) -> seconds | None``.
BackoffLike = Backoff | float | int | Callable[[int], float] | Callable[[int, BaseException], float | None]


def as_backoff(value: BackoffLike | None, default: Backoff) -> Callable[..., Any]:
    """Turn a task's ``backoff=`` option into a function ``attempt -> seconds`` (or, for a callable
    that takes the exception, the callable itself: see :func:`backoff_takes_exception`).

    Args:
        value: a :class:`Backoff`, a number (the base delay in seconds, other parameters from
            ``default``), a callable ``attempt -> seconds`` or ``(attempt, exc) -> seconds | None``,
            or None for ``default``.
        default: the policy built from the ``LEASEQUEUE`` settings.

    Raises:
        TypeError: ``value`` is none of the above, or a callable of the wrong arity.
        ValueError: ``value`` is a number that is not a delay (negative, NaN, infinite, over 100 years).
    """
    if value is None:
        return default.delay
    if isinstance(value, Backoff):
        return value.delay
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value) or not 0 <= value <= MAX_BACKOFF_SECONDS:
            raise ValueError(f"backoff must be a number of seconds from 0 to {MAX_BACKOFF_SECONDS:.0f} "
                             f"(100 years), got {value!r}")
        return Backoff(base=float(value), factor=default.factor, max=max(default.max, float(value)),
                       jitter=default.jitter).delay
    if callable(value):
        backoff_takes_exception(value)  # raises TypeError for a callable of the wrong arity
        return value
    raise TypeError(f"backoff must be a Backoff, a number of seconds or a callable, got {value!r}")


def backoff_takes_exception(fn: Callable[..., Any]) -> bool:
    """Whether a backoff callable is called as ``fn(attempt, exc)`` rather than ``fn(attempt)``.

    Decided from its signature: two required positional parameters, or ``*args`` with fewer than
    two required ones before it, mean ``(attempt, exc)``; one required positional parameter (more
    with defaults allowed, as ``Backoff.delay``'s ``rng``) means ``(attempt)``. A callable whose
    signature cannot be read (some builtins) is called as ``fn(attempt)``, as before.

    Raises:
        TypeError: the callable cannot take ``(attempt)`` nor ``(attempt, exc)``: no positional
            parameter, more than two required ones, or a required keyword-only one.
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    positional = [p for p in signature.parameters.values()
                  if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    required = sum(1 for p in positional if p.default is inspect.Parameter.empty)
    star = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in signature.parameters.values())
    keyword_only = [p.name for p in signature.parameters.values()
                    if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty]
    if keyword_only or required > 2 or (not positional and not star):
        raise TypeError(f"backoff callable {fn!r} must take (attempt) or (attempt, exc), "
                        f"not the parameters {signature}")
    if required == 2 or star:
        return True
    return required == 0 and len(positional) >= 2


ExceptionClasses = type[BaseException] | tuple[type[BaseException], ...]


def exception_classes(value: Any, what: str) -> tuple[type[BaseException], ...]:
    """Check a task's ``retry_on`` or ``discard_on`` option and return it as a tuple.

    Args:
        value: an exception class, a tuple (or list) of them, or None (an empty tuple).
        what: the option's name for the message (``"task 'x': retry_on"``).

    Raises:
        TypeError: ``value`` is not None, an exception class nor a non-empty sequence of them
            (an instance such as ``ValueError()`` is refused: matching is by class).
    """
    if value is None:
        return ()
    classes = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    bad = [c for c in classes if not (isinstance(c, type) and issubclass(c, BaseException))]
    if bad or not classes:
        raise TypeError(f"{what} must be an exception class or a tuple of them, got {value!r}")
    return classes


# The decisions a failed attempt can end with, as written into its error entry's "decision".
DISCARDED = "discarded"
NOT_RETRYABLE = "not_retryable"
RETRY_REQUESTED = "retry_requested"


@dataclass(frozen=True)
class RetryDecision:
    """What follows one failed attempt, before the store applies ``max_attempts`` and cancels.

    Attributes:
        delay (float | None): seconds from the failure to the retry; None dead-letters the job now.
        at (datetime | None): retry at exactly this aware time (``Retry(at=...)``); ``delay`` is
            then 0 and the executor turns ``at`` into a delay on the database clock.
        decision (str | None): :data:`DISCARDED`, :data:`NOT_RETRYABLE`, :data:`RETRY_REQUESTED`
            or None (an ordinary failure, retried after the backoff).
        reason (str | None): text for the error entry's ``reason``.
    """

    delay: float | None
    at: datetime | None = None
    decision: str | None = None
    reason: str | None = None

    def entry_fields(self) -> dict[str, str]:
        """The keys added to the attempt's error entry (none for an ordinary failure)."""
        fields: dict[str, str] = {}
        if self.decision is not None:
            fields["decision"] = self.decision
        if self.reason:
            fields["reason"] = self.reason
        return fields


def backoff_delay(backoff: BackoffLike | None, default: Backoff, attempt: int, exc: BaseException | None) -> float:
    """The task's backoff delay in seconds for failed attempt ``attempt`` (1-based) raising ``exc``.

    A callable taking ``(attempt, exc)`` receives the exception; one that returns None means "the
    default": ``default``'s delay (the ``BACKOFF_*`` settings) is used.

    Raises:
        whatever the callable raises, and TypeError/ValueError for a result that is not a number;
        the caller falls back to the default.
    """
    fn: Callable[..., Any] = as_backoff(backoff, default)
    if callable(backoff) and not isinstance(backoff, Backoff) and backoff_takes_exception(backoff):
        value = fn(attempt, exc)
    else:
        value = fn(attempt)
    return clamp_delay(default.delay(attempt) if value is None else value)


def decide(exc: BaseException, attempt: int, *, retry_on: Any = None, discard_on: Any = None,
           backoff: BackoffLike | None = None, default: Backoff,
           log: Callable[[str], None] | None = None) -> RetryDecision:
    """Decide what follows a failed attempt from its exception and the task's options.

    In order: a :class:`~django_leasequeue.exceptions.Retry` is retried when it asks (the options
    below do not apply to it); an exception matching ``discard_on`` (``isinstance``) is
    dead-lettered at once, even when it matches ``retry_on`` too; with ``retry_on`` given, an
    exception matching none of it is dead-lettered at once; anything else is retried after the
    backoff. ``max_attempts`` and cancel requests are applied by the store afterwards.

    Never raises: a backoff that raises or returns something that is not a number gives the
    default policy's delay (``log`` receives the message, with the exception being handled).

    Args:
        exc: the attempt's exception.
        attempt: its number (1-based).
        retry_on: the task's option (exception classes, checked at declaration), or None.
        discard_on: the task's option (exception classes, checked at declaration), or None.
        backoff: the task's backoff option.
        default: the policy of the ``BACKOFF_*`` settings.
        log: called with a message when the backoff failed (inside the ``except``), or None.

    Returns:
        A :class:`RetryDecision`.
    """
    if isinstance(exc, Retry):
        if exc.at is not None:
            return RetryDecision(delay=0.0, at=exc.at, decision=RETRY_REQUESTED, reason=exc.reason or None)
        if exc.delay is not None:
            return RetryDecision(delay=clamp_delay(exc.delay), decision=RETRY_REQUESTED, reason=exc.reason or None)
        return RetryDecision(delay=_safe_backoff(backoff, default, attempt, exc, log), decision=RETRY_REQUESTED,
                             reason=exc.reason or None)
    discard = _as_tuple(discard_on)
    if discard and isinstance(exc, discard):
        return RetryDecision(delay=None, decision=DISCARDED,
                             reason=f"{type(exc).__name__} matches discard_on ({_names(discard)})")
    retry = _as_tuple(retry_on)
    if retry and not isinstance(exc, retry):
        return RetryDecision(delay=None, decision=NOT_RETRYABLE,
                             reason=f"{type(exc).__name__} matches no retry_on class ({_names(retry)})")
    return RetryDecision(delay=_safe_backoff(backoff, default, attempt, exc, log))


def _as_tuple(value: Any) -> tuple[type[BaseException], ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _names(classes: tuple[type[BaseException], ...]) -> str:
    return ", ".join(getattr(c, "__qualname__", repr(c)) for c in classes)


def _safe_backoff(backoff: BackoffLike | None, default: Backoff, attempt: int, exc: BaseException,
                  log: Callable[[str], None] | None) -> float:
    try:
        return backoff_delay(backoff, default, attempt, exc)
    except BaseException:  # noqa: BLE001 - the retry policy must never take the handler's error with it
        if log is not None:
            log("the task's backoff failed; using the default")
        return clamp_delay(default.delay(attempt))


def check_retry_options(task_name: str, retry_on: Any, discard_on: Any) -> tuple[
        tuple[type[BaseException], ...] | None, tuple[type[BaseException], ...] | None]:
    """Validate a task's ``retry_on`` and ``discard_on`` at declaration (``@task``, the tasks backend).

    Returns:
        ``(retry_on, discard_on)`` as tuples of classes, each None when not given.

    Raises:
        ConfigurationError: naming the task and the option, for anything but an exception class
            or a non-empty tuple (or list) of them.
    """
    checked: list[tuple[type[BaseException], ...] | None] = []
    for option, value in (("retry_on", retry_on), ("discard_on", discard_on)):
        try:
            checked.append(exception_classes(value, f"task {task_name!r}: {option}") or None)
        except TypeError as exc:
            raise ConfigurationError(str(exc)) from None
    return checked[0], checked[1]
