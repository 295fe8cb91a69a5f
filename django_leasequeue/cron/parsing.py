"""Cron expressions and time zones: validation and parsing into the compiled form the engine
evaluates (see the package documentation of :mod:`django_leasequeue.cron` for the accepted syntax)."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone, tzinfo
from zoneinfo import ZoneInfo

from croniter import CroniterBadDateError, croniter

_ALIASES = {
    "@yearly": False,
    "@annually": False,
    "@monthly": False,
    "@weekly": False,
    "@daily": False,
    "@midnight": False,
    "@hourly": True,
}  # alias -> whether its hour field is a wildcard
_FIELD_NAMES = ("minute", "hour", "day of month", "month", "day of week", "second")
_HASH_OR_RANDOM = re.compile(r"^[hr](\(\d+-\d+\))?(/\d+)?$", re.IGNORECASE | re.ASCII)
_FIELDS = re.compile(r"\S+", re.ASCII)

_PROBE_START = datetime(2000, 1, 1)


class InvalidCron(ValueError):
    """A cron expression that cannot be used; the message names the expression and the reason."""


class InvalidTimezone(ValueError):
    """A time zone name that zoneinfo does not know; the message names it."""


@dataclass(frozen=True, slots=True)
class _Spec:
    expr: str  # normalised expression (aliases lower-cased)
    wildcard_hour: bool  # hour field begins with "*": DST rule 2
    day_expr: str  # "0 0 <day of month> <month> <day of week>": the day part, for croniter
    hours: tuple[int, ...]  # sorted matching hours, minutes and seconds (seconds: (0,) for 5 fields)
    minutes: tuple[int, ...]
    seconds: tuple[int, ...]


# --------------------------------------------------------------------------------------------------
# Validation


def validate_cron(expr: str) -> None:
    """Check that ``expr`` is a usable cron expression.

    :param expr: a 5-field expression (``minute hour day month weekday``), a 6-field one whose
        sixth field is seconds, or one of the aliases ``@yearly``, ``@annually``, ``@monthly``,
        ``@weekly``, ``@daily``, ``@midnight``, ``@hourly``.
    :returns: None.
    :raises InvalidCron: (a ``ValueError``) when ``expr`` is not a string, is empty, is not ASCII,
        has a number of fields other than 5 or 6, uses hashed ``H`` or random ``R`` values, is
        refused by croniter (out-of-range value, bad step, unknown name ...), or never matches any
        date. The message contains the offending expression and the reason.
    """
    _compile(expr)


def is_wildcard_hour(expr: str) -> bool:
    """Tell which DST rule applies to ``expr`` (see the module documentation).

    :param expr: a cron expression (as for :func:`validate_cron`).
    :returns: True when the hour field begins with ``*`` (fires at every real matching instant:
        twice in a repeated hour, never in a skipped one); False for a fixed hour (fires once per
        matching wall time: first instance of a repeated time, transition instant for a skipped one).
    :raises InvalidCron: as :func:`validate_cron`.
    """
    return _compile(expr).wildcard_hour


def _compile(expr: str) -> _Spec:
    if not isinstance(expr, str):
        raise InvalidCron(f"cron expression must be a string, got {type(expr).__name__} {expr!r}")
    return _compile_str(expr)


@functools.lru_cache(maxsize=512)
def _compile_str(expr: str) -> _Spec:
    if not expr.isascii():
        raise InvalidCron(f"cron expression {expr!r} contains non-ASCII characters")
    text = expr.strip()
    if not text:
        raise InvalidCron(f"cron expression {expr!r} is empty")
    if text.startswith("@"):
        alias = text.lower()
        if alias not in _ALIASES:
            raise InvalidCron(
                f"cron expression {expr!r} is not a supported alias (use one of {', '.join(_ALIASES)})"
            )
        wildcard = _ALIASES[alias]
        text = alias
    else:
        fields = _FIELDS.findall(text)
        if len(fields) not in (5, 6):
            raise InvalidCron(
                f"cron expression {expr!r} has {len(fields)} field(s); expected 5 (minute hour "
                f"day-of-month month day-of-week) or 6 (the same, then seconds)"
            )
        for name, field in zip(_FIELD_NAMES, fields, strict=False):
            for item in field.split(","):
                if _HASH_OR_RANDOM.match(item):
                    raise InvalidCron(
                        f"cron expression {expr!r}: hashed (H) and random (R) values are not "
                        f"supported ({name} field {field!r})"
                    )
        wildcard = fields[1].startswith("*")
        text = " ".join(fields)
    try:
        probe = croniter(text, _PROBE_START)
        probe.get_next(float)
        fields = [str(f) for f in probe.expressions]
        day_expr = " ".join(["0", "0", *fields[2:5]])
        croniter(day_expr, _PROBE_START)
        hours = _values(probe.expanded[1], 24)
        minutes = _values(probe.expanded[0], 60)
        seconds = _values(probe.expanded[5], 60) if len(probe.expanded) > 5 else (0,)
    except CroniterBadDateError as exc:
        raise InvalidCron(f"cron expression {expr!r} never matches any date") from exc
    except (ValueError, TypeError, KeyError, IndexError, OverflowError) as exc:
        raise InvalidCron(f"cron expression {expr!r} is invalid: {exc}") from exc
    return _Spec(text, wildcard, day_expr, hours, minutes, seconds)


def _values(expanded: Sequence[int | str], size: int) -> tuple[int, ...]:
    """Sorted values of one expanded croniter time field (``['*']`` means all of ``range(size)``)."""
    if "*" in expanded:
        return tuple(range(size))
    values = tuple(sorted({int(v) for v in expanded}))
    if not values or values[0] < 0 or values[-1] >= size:
        raise ValueError(f"unexpected expanded field {expanded!r}")
    return values


def validate_timezone(name: str) -> ZoneInfo:
    """Resolve an IANA time zone name.

    :param name: an IANA key such as ``"Europe/Berlin"`` or ``"UTC"`` (case-sensitive, as tzdata
        spells it).
    :returns: the :class:`zoneinfo.ZoneInfo` for ``name``.
    :raises InvalidTimezone: (a ``ValueError``) when ``name`` is not a string, is empty, is not a
        normalised relative key, or names no zone known to zoneinfo. The message contains ``name``.
    """
    if not isinstance(name, str):
        raise InvalidTimezone(f"time zone must be a name (str), got {type(name).__name__} {name!r}")
    if not name:
        raise InvalidTimezone(f"time zone name {name!r} is empty")
    try:
        return ZoneInfo(name)
    except (KeyError, ValueError, OSError) as exc:  # ZoneInfoNotFoundError is a KeyError
        raise InvalidTimezone(f"unknown time zone {name!r}") from exc


def _zone(tz: str | tzinfo) -> tzinfo:
    if isinstance(tz, str):
        return validate_timezone(tz)
    if isinstance(tz, ZoneInfo | timezone):
        return tz
    raise InvalidTimezone(
        f"time zone must be an IANA name, a zoneinfo.ZoneInfo or a datetime.timezone, got {tz!r}"
    )

