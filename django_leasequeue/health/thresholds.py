"""Check levels and thresholds: :class:`Level` (the monitoring-plugin exit codes), :class:`Threshold`
(a warning and a critical limit on one figure) and the parsers of the ``queuehealth`` limits
(:func:`parse_threshold`, :func:`parse_rate`, :func:`parse_number`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import IntEnum


class Level(IntEnum):
    """Check outcome; the values are the monitoring-plugin exit codes."""

    OK = 0
    WARNING = 1
    CRITICAL = 2
    UNKNOWN = 3


_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_NUMBER = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhd]?)\s*$")


def parse_number(text: str, *, duration: bool) -> float:
    """Parse ``"12"``, ``"1.5"``, or with ``duration`` a unit: ``"90s"``, ``"5m"``, ``"2h"``, ``"1d"``.

    Returns:
        The value (seconds for durations).

    Raises:
        ValueError: not a non-negative number (with a unit only where a duration is expected).
    """
    match = _NUMBER.match(text)
    if not match or (match.group(2) and not duration):
        kind = "a duration such as 30, 90s, 5m or 1h" if duration else "a non-negative number"
        raise ValueError(f"{text!r} is not {kind}")
    return float(match.group(1)) * _UNITS[match.group(2)]


@dataclass(frozen=True)
class Threshold:
    """A warning and a critical limit for one figure; either may be None (not checked).

    ``direction`` is ``"max"`` (alert when the value goes above a limit) or ``"min"`` (alert when
    it goes below, e.g. live workers). Limits themselves are allowed: ``--max-oldest-age 300``
    alerts at 300.1 s, not at 300 s; ``--min-workers 2`` alerts at 1 worker, not at 2.
    """

    warning: float | None = None
    critical: float | None = None
    direction: str = "max"

    def level(self, value: float | None) -> Level:
        """The level of ``value``; None counts as infinitely bad (no data means nothing runs)."""
        if value is None:
            value = math.inf if self.direction == "max" else -math.inf
        for limit, level in ((self.critical, Level.CRITICAL), (self.warning, Level.WARNING)):
            if limit is None:
                continue
            if (value > limit) if self.direction == "max" else (value < limit):
                return level
        return Level.OK

    def describe(self, unit: str = "") -> str:
        """Human form, e.g. ``"warn > 60 s, crit > 300 s"``."""
        op = ">" if self.direction == "max" else "<"
        parts = []
        if self.warning is not None:
            parts.append(f"warn {op} {_fmt(self.warning)}{unit}")
        if self.critical is not None:
            parts.append(f"crit {op} {_fmt(self.critical)}{unit}")
        return ", ".join(parts)

    def perfdata_range(self, limit: float | None) -> str:
        """A monitoring-plugin perfdata range for one limit (``"5"`` for max, ``"2:"`` for min)."""
        if limit is None:
            return ""
        return _fmt(limit) if self.direction == "max" else f"{_fmt(limit)}:"


def _fmt(value: float) -> str:
    return f"{value:g}" if value == int(value) else f"{value:.1f}"


def parse_threshold(text: str, *, direction: str = "max", duration: bool = False) -> Threshold:
    """Parse a threshold: ``CRIT``, ``WARN:CRIT``, ``WARN:`` (warning only) or ``:CRIT``.

    Examples (``direction="max"``): ``"300"`` is critical above 300; ``"60:300"`` warns above 60
    and is critical above 300; ``"60:"`` only warns. For ``direction="min"``, ``"2:1"`` warns
    below 2 and is critical below 1, so the warning limit must not be below the critical one.
    With ``duration``, values take an optional unit ``s``/``m``/``h``/``d`` (``"1m:5m"``).

    Raises:
        ValueError: malformed, empty, or the warning limit is beyond the critical one.
    """
    text = text.strip()
    if ":" in text:
        warn_text, crit_text = text.split(":", 1)
    else:
        warn_text, crit_text = "", text
    warn = parse_number(warn_text, duration=duration) if warn_text.strip() else None
    crit = parse_number(crit_text, duration=duration) if crit_text.strip() else None
    if warn is None and crit is None:
        raise ValueError(f"{text!r} sets no limit; use CRIT, WARN:CRIT, WARN: or :CRIT")
    if warn is not None and crit is not None:
        if direction == "max" and warn > crit:
            raise ValueError(f"{text!r}: the warning limit must not be above the critical one")
        if direction == "min" and warn < crit:
            raise ValueError(f"{text!r}: for a minimum the warning limit must not be below the critical one")
    return Threshold(warning=warn, critical=crit, direction=direction)


def parse_rate(text: str, *, default_window: float = 300.0) -> tuple[Threshold, float]:
    """Parse a count-per-window threshold: ``THRESHOLD[/WINDOW]``.

    ``"10/300"``: critical above 10 in 300 s; ``"3:10/5m"``: warn above 3, critical above 10 in
    5 minutes; ``"10"``: critical above 10 in ``default_window`` seconds.

    Returns:
        ``(threshold, window seconds)``.

    Raises:
        ValueError: malformed threshold or a window that is not > 0.
    """
    limits, _, window_text = text.partition("/")
    window = parse_number(window_text, duration=True) if window_text.strip() else float(default_window)
    if window <= 0:
        raise ValueError(f"{text!r}: the window must be > 0 seconds")
    return parse_threshold(limits), window

