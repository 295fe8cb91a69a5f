"""Cron recurrence maths for schedules: pure functions, no database, no Django.

Everything here takes time explicitly (``after``, ``until``, ``now``), so the scheduler can pass the
database clock and tests need no fake clock. Every datetime taken must be aware (a naive one raises
``ValueError``); every datetime returned is an aware UTC datetime with whole seconds.

Expressions
===========
Standard cron syntax as croniter parses it, with 5 fields (``minute hour day-of-month month
day-of-week``) or 6 fields, where the sixth and LAST field is seconds (croniter's default
``second_at_beginning=False``: ``"* * * * * 30"`` is "every minute at second 30"). Lists, ranges,
steps, month and weekday names, ``L``, ``W``, ``#`` and the aliases ``@yearly``, ``@annually``,
``@monthly``, ``@weekly``, ``@daily``, ``@midnight`` and ``@hourly`` are accepted. When both the
day-of-month and day-of-week fields are restricted, a day matching either one matches (classic cron
OR, croniter's default). Rejected (``InvalidCron``): 7 fields (croniter's year field), hashed
``H`` and random ``R`` values (not deterministic without an id), anything croniter refuses, and
expressions that never match (``0 0 30 2 *``).

Time zones and DST
==================
Cron fields are matched against the LOCAL WALL-CLOCK time of the schedule's zone (an IANA name such
as ``"Europe/Berlin"``, resolved with :mod:`zoneinfo`). An occurrence is the UTC instant at which
the schedule fires; occurrences are strictly increasing and never repeat, so the UTC instant is a
stable identity for the occurrence (the scheduler's unique key).

Where local wall time does not map one-to-one onto real time, the hour field decides (this is
Vixie cron's rule: a field is a "wildcard" only when it begins with ``*``):

1. Fixed-hour expressions -- the hour field does not begin with ``*`` (``30 2 * * *``,
   ``0 14 * * *``, ``0 9 * * 1``, ``0 8,20 * * *``, ``0 9-17 * * *``, ``0 1-23/2 * * *``,
   ``@daily``, ``@weekly`` ...) fire once per matching local wall time, i.e. once per matching
   local day for a single time of day:

   * A repeated wall time (fall-back) fires only at its first instance (the earlier UTC instant,
     fold=0). ``30 1 * * *`` in America/New_York on 2026-11-01 fires at 05:30Z (01:30 EDT) only.
   * A nonexistent wall time (spring-forward gap) fires at the first instant after the gap, which
     is the transition instant itself. ``30 2 * * *`` in Europe/Berlin on 2026-03-29 fires at
     01:00Z (03:00 CEST); in America/New_York on 2026-03-08 at 07:00Z (03:00 EDT). All matches
     inside one gap collapse into that single occurrence (``*/15 2 * * *`` fires once, at 03:00
     CEST, that day), which also absorbs a match at the first wall time after the gap (``0 2,3``
     fires once at 03:00 CEST). This is croniter's own rule for nonexistent times (move forward
     to the next existing time) and Vixie/cronie cron's (jobs of a skipped interval run right
     after the change); it never fires twice and never loses the day's run.

2. Wildcard-hour expressions -- the hour field begins with ``*`` (``* * * * *``, ``0 * * * *``,
   ``*/15 * * * *``, ``0 */2 * * *``, ``@hourly``, 6-field per-second expressions ...) fire at
   every real instant whose local wall time matches:

   * A repeated hour fires in both instances (two distinct UTC instants). ``0 * * * *`` in
     America/New_York on 2026-11-01 fires at 05:00Z and at 06:00Z, both 01:00 local.
   * A skipped hour produces nothing: those wall times do not exist, and nothing fires late or
     extra. ``0 * * * *`` in Europe/Berlin on 2026-03-29 goes from 00:00Z (01:00 CET) straight to
     01:00Z (03:00 CEST).

3. Hour steps (``*/2``, ``*/3``, ...) are wildcard hours (rule 2). The step applies to the local
   wall-clock hour, not to elapsed time: ``0 */2 * * *`` in Europe/Berlin gives 23:00Z (00:00 CET)
   then 02:00Z (04:00 CEST) on 2026-03-29 (the nonexistent 02:00 is dropped, so that interval is
   three real hours), and 22:00Z, 00:00Z (02:00 CEST), 01:00Z (02:00 CET), 03:00Z (04:00 CET) on
   2026-10-24/25. A step whose start is explicit (``1-23/2``, ``0-23``) is a fixed hour (rule 1).

The minute and second fields never change the class. Day, month and weekday fields are matched on
the local date, so a daily or weekly run is never lost or doubled by a transition at midnight
(America/Santiago, America/Havana, Atlantic/Azores): ``0 0 * * *`` fires at 01:00 local on a day
whose midnight does not exist.

How it is computed: croniter parses and validates the expression and decides which local DATES
match (day of month, month, day of week, ``L``, ``W``, ``#``), on naive wall-clock midnights where it
is plain calendar arithmetic. The times of day come from croniter's expanded minute, hour and second
fields. croniter's own time-zone handling is not used: it has had the bugs these rules avoid
(repeated timestamps and a stuck ``get_next`` after a transition, double firing on fall-back;
croniter 7.0.0 with an aware start still fires ``30 1 * * *`` at both 05:30Z and 06:30Z in
America/New_York on 2026-11-01, and moves ``0 */2 * * *``'s nonexistent 02:00 to 03:00 CEST).
Wall time is mapped to UTC here with zoneinfo offsets: the UTC timeline is split at the zone's
offset changes, found by sampling the offset every 12 hours and bisecting to the second (tzdata has
had no two offset changes closer than 7 days since 1970), and each interval is evaluated with its
own fixed offset.

Catch-up after downtime
=======================
See :func:`due`. In short: ``"latest"`` (default) emits one job for the most recent missed
occurrence; ``"all"`` emits the most recent ``limit`` missed occurrences; ``"none"`` emits an
occurrence only when it is the only one since the last run (no downtime), otherwise it skips them
all. Counting missed occurrences is bounded (:data:`MAX_COUNTED_OCCURRENCES`), so a per-second
schedule after a three-day outage costs milliseconds, not 259,200 croniter steps.
"""

from __future__ import annotations

import copy
import functools
import re
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from zoneinfo import ZoneInfo

from croniter import CroniterBadDateError, croniter

__all__ = [
    "CATCH_UP_CHOICES",
    "DEFAULT_CATCH_UP",
    "DEFAULT_CATCH_UP_LIMIT",
    "MAX_COUNTED_OCCURRENCES",
    "DuePlan",
    "InvalidCron",
    "InvalidTimezone",
    "due",
    "is_wildcard_hour",
    "next_occurrence",
    "occurrences",
    "validate_cron",
    "validate_timezone",
]

CATCH_UP_CHOICES: tuple[str, ...] = ("latest", "all", "none")
"""Catch-up policies accepted by :func:`due`."""

DEFAULT_CATCH_UP = "latest"
"""The default catch-up policy: one job for the latest missed occurrence."""

DEFAULT_CATCH_UP_LIMIT = 10
"""Default number of occurrences the ``"all"`` policy emits per tick."""

MAX_COUNTED_OCCURRENCES = 10_000
"""Missed occurrences counted one by one before :func:`due` stops counting (``skipped`` then
becomes a lower bound and :attr:`DuePlan.skipped_is_lower_bound` is true)."""

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

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SECOND = timedelta(seconds=1)
_SAMPLE_STEP = 12 * 3600  # offset sampling step when looking for transitions (seconds)
_MAX_SHIFT = 36 * 3600  # bound on |offset(t1) - offset(t2)| within one zone, plus margin (seconds)
_CHUNK = 4 * 86400  # UTC span evaluated at a time (seconds)
_PROBE_START = datetime(2000, 1, 1)


class InvalidCron(ValueError):
    """A cron expression that cannot be used; the message names the expression and the reason."""


class InvalidTimezone(ValueError):
    """A time zone name that zoneinfo does not know; the message names it."""


@dataclass(frozen=True, slots=True)
class DuePlan:
    """What one scheduler tick must do for one schedule (see :func:`due`).

    ``emit``: occurrences to enqueue, ascending aware UTC datetimes (each one's unique key derives
    from the instant). ``skipped``: due occurrences not emitted. ``next_at``: the next occurrence to
    wait for, always strictly after the tick's ``now``. ``skipped_is_lower_bound``: true when more
    than :data:`MAX_COUNTED_OCCURRENCES` occurrences were due and counting stopped, so ``skipped``
    is a lower bound rather than the exact number.
    """

    emit: list[datetime]
    skipped: int
    next_at: datetime
    skipped_is_lower_bound: bool = False


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


def _seconds(value: datetime, name: str) -> int:
    """Whole seconds since the epoch, rounded down; refuses naive datetimes."""
    if not isinstance(value, datetime):
        raise TypeError(f"{name} must be an aware datetime, got {type(value).__name__} {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(
            f"{name} must be an aware datetime (with tzinfo), got naive {value.isoformat()}; "
            f"use e.g. {name}.replace(tzinfo=datetime.UTC) if it is UTC"
        )
    return (value - _EPOCH) // _SECOND


def _ceil_seconds(value: datetime, name: str) -> int:
    floor = _seconds(value, name)
    return floor if value.microsecond == 0 else floor + 1


def _datetime(ts: int) -> datetime:
    return _EPOCH + timedelta(seconds=ts)


# --------------------------------------------------------------------------------------------------
# Engine. Instants are integer seconds since the epoch (UTC); "walls" are local wall-clock times
# encoded the same way (naive time read as if it were UTC), which is what croniter computes on.


def _offset(zone: tzinfo, ts: int) -> int:
    offset = _datetime(ts).astimezone(zone).utcoffset()
    assert offset is not None
    return offset // _SECOND


def _transitions(zone: tzinfo, start: int, end: int) -> list[tuple[int, int, int]]:
    """Offset changes at instants ``t`` with ``start < t < end``: ``(t, offset before, offset from t)``."""
    found: list[tuple[int, int, int]] = []
    lo, lo_off = start, _offset(zone, start)
    while lo < end - 1:
        hi = min(lo + _SAMPLE_STEP, end - 1)
        hi_off = _offset(zone, hi)
        if hi_off == lo_off:
            lo = hi
            continue
        a, b = lo, hi  # offset(a) == lo_off != offset(b): bisect to the first changed second
        while b - a > 1:
            mid = (a + b) // 2
            if _offset(zone, mid) == lo_off:
                a = mid
            else:
                b = mid
        new_off = hi_off if b == hi else _offset(zone, b)
        found.append((b, lo_off, new_off))
        lo, lo_off = b, new_off
    return found


_RANGE = 0  # walls in [ws, we) fire at wall - offset
_POINT = 1  # if any wall in [ws, we) matches (a gap), fire once at the given instant


def _pieces(zone: tzinfo, wildcard: bool, lo: int, hi: int) -> list[tuple[int, int, int, int]]:
    """Split the UTC window ``[lo, hi)`` into pieces whose images are disjoint and ascending."""
    start = lo - _MAX_SHIFT  # look back for a transition whose fold or gap reaches into the window
    segments: list[tuple[int, int, int, int]] = []  # (utc start, utc end, offset, offset before)
    a = start
    off = off_before = _offset(zone, start)
    for t, before, after in _transitions(zone, start, hi):
        segments.append((a, t, off, off_before))
        a, off_before, off = t, before, after
    segments.append((a, hi, off, off_before))

    pieces: list[tuple[int, int, int, int]] = []
    for a, b, off, off_before in segments:
        if wildcard:
            s = max(a, lo)
            if s < b:
                pieces.append((_RANGE, s + off, b + off, off))
            continue
        if off_before < off and a >= lo:  # spring-forward gap at a: its matches fire at a
            pieces.append((_POINT, a + off_before, a + off, a))
        # after a fold, the repeated walls [a + off, a + off_before) belong to the previous segment
        ws = max(a + max(off, off_before), lo + off)
        we = b + off
        if ws < we:
            pieces.append((_RANGE, ws, we, off))
    return pieces


@functools.lru_cache(maxsize=512)
def _day_template(day_expr: str) -> croniter:
    return croniter(day_expr, _PROBE_START)


class _Walls:
    """Matching local wall times, as int seconds (naive wall time read as if it were UTC).

    Day matching (day of month, month, day of week, with ``L``, ``W``, ``#`` and cron's OR rule) is
    croniter's, run on naive midnights of the expression's day part (``0 0 dom month dow``). The
    minute, hour and second fields do not depend on the date, so the times of day are enumerated
    here from croniter's expanded fields by bisection: one croniter call per matching day instead
    of one per occurrence (croniter takes 50-250 microseconds a call).
    """

    def __init__(self, spec: _Spec) -> None:
        # A private copy of a parsed template: parsing costs more than a whole day of bisection.
        # Every query passes its own start time, and croniter never mutates its parsed fields.
        self._days = copy.copy(_day_template(spec.day_expr))
        self._h, self._m, self._s = spec.hours, spec.minutes, spec.seconds
        self._first = self._h[0] * 3600 + self._m[0] * 60 + self._s[0]
        self._last = self._h[-1] * 3600 + self._m[-1] * 60 + self._s[-1]
        self._cur = 0
        self._after_cache = (1, 0)  # (day, first matching day >= day)
        self._before_cache = (0, 1)  # (day, last matching day <= day)

    def next(self, after: int | None = None) -> int | None:
        """The first matching wall strictly after ``after`` (default: after the previous result)."""
        x = (self._cur if after is None else after) + 1
        day, tod = divmod(x, 86400)
        found = self._day_at_or_after(day)
        if found == day:
            t = self._next_tod(tod)
            if t is not None:
                self._cur = day * 86400 + t
                return self._cur
            found = self._day_at_or_after(day + 1)
        if found is None:
            return None
        self._cur = found * 86400 + self._first
        return self._cur

    def prev(self, before: int | None = None) -> int | None:
        """The last matching wall strictly before ``before`` (default: before the previous result)."""
        x = (self._cur if before is None else before) - 1
        day, tod = divmod(x, 86400)
        found = self._day_at_or_before(day)
        if found == day:
            t = self._prev_tod(tod)
            if t is not None:
                self._cur = day * 86400 + t
                return self._cur
            found = self._day_at_or_before(day - 1)
        if found is None:
            return None
        self._cur = found * 86400 + self._last
        return self._cur

    def _day_at_or_after(self, day: int) -> int | None:
        lo, match = self._after_cache
        if lo <= day <= match:
            return match
        try:
            midnight = self._days.get_next(float, start_time=float(day * 86400 - 1))
        except CroniterBadDateError:
            return None
        match = int(midnight) // 86400
        self._after_cache = (day, match)
        return match

    def _day_at_or_before(self, day: int) -> int | None:
        hi, match = self._before_cache
        if match <= day <= hi:
            return match
        try:
            midnight = self._days.get_prev(float, start_time=float((day + 1) * 86400))
        except CroniterBadDateError:
            return None
        match = int(midnight) // 86400
        self._before_cache = (day, match)
        return match

    def _next_tod(self, t: int) -> int | None:
        """The smallest matching time of day (seconds) >= t, or None."""
        hours, minutes, seconds = self._h, self._m, self._s
        h, rest = divmod(t, 3600)
        m, s = divmod(rest, 60)
        i = bisect_left(hours, h)
        if i < len(hours) and hours[i] == h:
            j = bisect_left(minutes, m)
            if j < len(minutes) and minutes[j] == m:
                k = bisect_left(seconds, s)
                if k < len(seconds):
                    return h * 3600 + m * 60 + seconds[k]
                j += 1
            if j < len(minutes):
                return h * 3600 + minutes[j] * 60 + seconds[0]
            i += 1
        if i < len(hours):
            return hours[i] * 3600 + minutes[0] * 60 + seconds[0]
        return None

    def _prev_tod(self, t: int) -> int | None:
        """The largest matching time of day (seconds) <= t, or None."""
        hours, minutes, seconds = self._h, self._m, self._s
        h, rest = divmod(t, 3600)
        m, s = divmod(rest, 60)
        i = bisect_right(hours, h) - 1
        if i >= 0 and hours[i] == h:
            j = bisect_right(minutes, m) - 1
            if j >= 0 and minutes[j] == m:
                k = bisect_right(seconds, s) - 1
                if k >= 0:
                    return h * 3600 + m * 60 + seconds[k]
                j -= 1
            if j >= 0:
                return h * 3600 + minutes[j] * 60 + seconds[-1]
            i -= 1
        if i >= 0:
            return hours[i] * 3600 + minutes[-1] * 60 + seconds[-1]
        return None


def _forward(spec: _Spec, zone: tzinfo, lo: int, hi: int | None) -> Iterator[int]:
    """Occurrence instants ``u`` with ``lo <= u < hi`` (``hi=None``: unbounded), ascending."""
    walls = _Walls(spec)
    last: int | None = None
    while hi is None or lo < hi:
        # Skip empty stretches: every occurrence u >= lo has a wall >= lo + offset(lo) - _MAX_SHIFT,
        # and u >= (first such matching wall) - offset(lo) - _MAX_SHIFT.
        off = _offset(zone, lo)
        first = walls.next(lo + off - _MAX_SHIFT - 1)
        if first is None:
            return
        lo = max(lo, first - off - _MAX_SHIFT)
        end = lo + _CHUNK if hi is None else min(lo + _CHUNK, hi)
        if lo >= end:
            return
        for kind, ws, we, x in _pieces(zone, spec.wildcard_hour, lo, end):
            w = walls.next(ws - 1)
            if kind == _POINT:
                items: Iterator[int] = iter((x,) if w is not None and w < we else ())
            else:
                items = _range_forward(walls, w, we, x)
            for u in items:
                if last is None or u > last:
                    last = u
                    yield u
        lo = end


def _range_forward(walls: _Walls, w: int | None, we: int, off: int) -> Iterator[int]:
    while w is not None and w < we:
        yield w - off
        w = walls.next()


def _backward(spec: _Spec, zone: tzinfo, hi: int, lo: int) -> Iterator[int]:
    """Occurrence instants ``u`` with ``lo <= u < hi``, descending."""
    walls = _Walls(spec)
    last: int | None = None
    while hi > lo:
        off = _offset(zone, hi)
        first = walls.prev(hi + off + _MAX_SHIFT + 1)
        if first is None:
            return
        hi = min(hi, first - off + _MAX_SHIFT + 1)
        start = max(hi - _CHUNK, lo)
        if start >= hi:
            return
        for kind, ws, we, x in reversed(_pieces(zone, spec.wildcard_hour, start, hi)):
            if kind == _POINT:
                w = walls.next(ws - 1)
                items: Iterator[int] = iter((x,) if w is not None and w < we else ())
            else:
                items = _range_backward(walls, walls.prev(we), ws, x)
            for u in items:
                if last is None or u < last:
                    last = u
                    yield u
        hi = start


def _range_backward(walls: _Walls, w: int | None, ws: int, off: int) -> Iterator[int]:
    while w is not None and w >= ws:
        yield w - off
        w = walls.prev()


# --------------------------------------------------------------------------------------------------
# Public recurrence API


def occurrences(expr: str, tz: str | tzinfo, after: datetime, until: datetime) -> Iterator[datetime]:
    """Every occurrence strictly after ``after`` and at or before ``until``.

    :param expr: cron expression (see :func:`validate_cron`), evaluated on local wall time in ``tz``.
    :param tz: IANA zone name, or a :class:`zoneinfo.ZoneInfo` / fixed :class:`datetime.timezone`.
    :param after: aware datetime, exclusive lower bound (any zone).
    :param until: aware datetime, inclusive upper bound (any zone).
    :returns: an iterator of aware UTC datetimes (whole seconds), strictly increasing, no
        duplicates, following the module's DST rules. It is lazy; empty when ``until <= after``.
    :raises InvalidCron: bad expression. :raises InvalidTimezone: bad zone.
    :raises ValueError: ``after`` or ``until`` is naive. (All raised at call time, not on iteration.)
    """
    spec = _compile(expr)
    zone = _zone(tz)
    lo = _seconds(after, "after") + 1
    hi = _seconds(until, "until") + 1
    return (_datetime(u) for u in _forward(spec, zone, lo, hi))


def next_occurrence(expr: str, tz: str | tzinfo, after: datetime) -> datetime:
    """The first occurrence strictly after ``after``.

    :param expr: cron expression (see :func:`validate_cron`).
    :param tz: IANA zone name, or a :class:`zoneinfo.ZoneInfo` / fixed :class:`datetime.timezone`.
    :param after: aware datetime, exclusive bound.
    :returns: aware UTC datetime, strictly after ``after``.
    :raises InvalidCron: bad expression. :raises InvalidTimezone: bad zone.
    :raises ValueError: ``after`` is naive, or no occurrence exists within croniter's search horizon
        (50 years after ``after``).
    """
    spec = _compile(expr)
    zone = _zone(tz)
    start = _seconds(after, "after") + 1
    for u in _forward(spec, zone, start, None):
        return _datetime(u)
    raise ValueError(f"cron expression {expr!r} has no occurrence after {after.isoformat()}")


def due(
    expr: str,
    tz: str | tzinfo,
    *,
    last: datetime | None,
    next_at: datetime | None,
    now: datetime,
    catch_up: str = DEFAULT_CATCH_UP,
    limit: int = DEFAULT_CATCH_UP_LIMIT,
) -> DuePlan:
    """Plan one scheduler tick for one schedule.

    Due occurrences are those after ``last`` (exclusive), at or after ``next_at`` (inclusive) and
    at or before ``now``. Either bound may be None; with both None (a brand-new schedule) nothing in
    the past is due and the schedule starts from ``now``. ``next_at`` is a floor: store the
    returned ``next_at`` and pass it back on the next tick, and recompute it (for example with
    :func:`next_occurrence` from the current time) when the expression or the zone changes, so a
    change never back-fills.

    Policies over the due occurrences D (ascending):

    * ``"latest"``: emit only ``D[-1]``, the most recent one; the rest are skipped.
    * ``"all"``: emit the most recent ``limit`` of D (a backlog larger than ``limit`` keeps its
      newest part); the older ones are skipped.
    * ``"none"``: emit ``D[0]`` only if it is the only due occurrence (the scheduler did not miss
      any: no downtime); otherwise skip all of D. Meant for schedules whose period is longer than
      the scheduler's tick interval: a schedule firing more often than the tick would always skip.

    Counting stops at :data:`MAX_COUNTED_OCCURRENCES` (or ``limit`` if larger): beyond it,
    ``skipped`` is a lower bound and ``skipped_is_lower_bound`` is true; the emitted occurrences are
    still the exact most recent ones (found by walking back from ``now``). The work is therefore
    bounded whatever the outage.

    Intended tick::

        plan = due(expr, tz, last=row.last_occurrence_at, next_at=row.next_occurrence_at, now=db_now,
                   catch_up=row.catch_up, limit=row.catch_up_limit)
        for occurrence in plan.emit: insert the job with key (schedule, occurrence), ON CONFLICT DO NOTHING
        row.last_occurrence_at = plan.emit[-1] if plan.emit else row.last_occurrence_at
        row.next_occurrence_at = plan.next_at

    :param expr: cron expression (see :func:`validate_cron`).
    :param tz: IANA zone name, or a :class:`zoneinfo.ZoneInfo` / fixed :class:`datetime.timezone`.
    :param last: aware datetime of the last emitted occurrence, or None.
    :param next_at: aware datetime of the stored next occurrence, or None.
    :param now: aware datetime, the tick's time (the database clock).
    :param catch_up: one of :data:`CATCH_UP_CHOICES`.
    :param limit: maximum occurrences emitted by ``"all"``, an int >= 1 (validated for every policy).
    :returns: a :class:`DuePlan`; its ``next_at`` is the first occurrence strictly after ``now``
        (and not before the ``next_at`` floor), so the scheduler always advances.
    :raises InvalidCron: bad expression. :raises InvalidTimezone: bad zone.
    :raises ValueError: a naive datetime, an unknown ``catch_up``, a ``limit`` below 1, or no future
        occurrence within croniter's 50-year horizon.
    """
    spec = _compile(expr)
    zone = _zone(tz)
    if catch_up not in CATCH_UP_CHOICES:
        raise ValueError(f"catch_up must be one of {CATCH_UP_CHOICES}, got {catch_up!r}")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be an int >= 1, got {limit!r}")
    now_s = _seconds(now, "now")
    hi = now_s + 1  # due: u < hi, i.e. u <= now
    bounds = []
    if last is not None:
        bounds.append(_seconds(last, "last") + 1)
    if next_at is not None:
        bounds.append(_ceil_seconds(next_at, "next_at"))
    lo = max(bounds) if bounds else hi

    keep = limit if catch_up == "all" else 1
    cap = max(MAX_COUNTED_OCCURRENCES, limit)
    recent: deque[int] = deque(maxlen=keep)
    count = 0
    capped = False
    if lo < hi:
        for u in _forward(spec, zone, lo, hi):
            count += 1
            if count > cap:
                capped = True
                break
            recent.append(u)
    if capped:  # the newest occurrences, exactly, by walking back from now
        newest = []
        for u in _backward(spec, zone, hi, lo):
            newest.append(u)
            if len(newest) == keep:
                break
        recent = deque(reversed(newest), maxlen=keep)

    if catch_up == "none":
        emit = list(recent) if count == 1 else []
    else:
        emit = list(recent)
    following = next(_forward(spec, zone, max(hi, lo), None), None)
    if following is None:
        raise ValueError(f"cron expression {expr!r} has no occurrence after {now.isoformat()}")
    return DuePlan(
        emit=[_datetime(u) for u in emit],
        skipped=count - len(emit),
        next_at=_datetime(following),
        skipped_is_lower_bound=capped,
    )
