"""Backoff maths for retries: exponential with jitter, capped. Pure functions, no database.

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

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


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


BackoffLike = Backoff | float | int | Callable[[int], float]


def as_backoff(value: BackoffLike | None, default: Backoff) -> Callable[[int], float]:
    """Turn a task's ``backoff=`` option into a function ``attempt -> seconds``.

    Args:
        value: a :class:`Backoff`, a number (the base delay in seconds, other parameters from
            ``default``), a callable ``attempt -> seconds``, or None for ``default``.
        default: the policy built from the ``LEASEQUEUE`` settings.

    Raises:
        TypeError: ``value`` is none of the above.
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
        return value
    raise TypeError(f"backoff must be a Backoff, a number of seconds or a callable, got {value!r}")
