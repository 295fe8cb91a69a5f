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

import random
from collections.abc import Callable
from dataclasses import dataclass


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
        if self.base < 0 or self.factor < 1 or self.max < 0 or not 0 <= self.jitter <= 1:
            raise ValueError(f"invalid backoff {self!r}: need base >= 0, factor >= 1, max >= 0, 0 <= jitter <= 1")

    def delay(self, attempt: int, rng: Callable[[], float] = random.random) -> float:
        """Return the delay in seconds before the retry that follows failed attempt ``attempt`` (1-based)."""
        exponent = max(attempt - 1, 0)
        # Cap the exponent before the power so that huge attempt numbers cannot overflow.
        raw = self.max if exponent > 64 else min(self.max, self.base * self.factor**exponent)
        return raw * (1 - self.jitter * rng())


BackoffLike = Backoff | float | int | Callable[[int], float]


def as_backoff(value: BackoffLike | None, default: Backoff) -> Callable[[int], float]:
    """Turn a task's ``backoff=`` option into a function ``attempt -> seconds``.

    Args:
        value: a :class:`Backoff`, a number (the base delay in seconds, other parameters from
            ``default``), a callable ``attempt -> seconds``, or None for ``default``.
        default: the policy built from the ``LEASEQUEUE`` settings.

    Raises:
        TypeError: ``value`` is none of the above.
    """
    if value is None:
        return default.delay
    if isinstance(value, Backoff):
        return value.delay
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Backoff(base=float(value), factor=default.factor, max=max(default.max, float(value)),
                       jitter=default.jitter).delay
    if callable(value):
        return value
    raise TypeError(f"backoff must be a Backoff, a number of seconds or a callable, got {value!r}")
