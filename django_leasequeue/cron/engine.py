"""The occurrence engine: matching local wall times mapped to UTC instants across a zone's offset
changes, forwards and backwards, following the DST rules of :mod:`django_leasequeue.cron`.

Instants are integer seconds since the epoch (UTC); "walls" are local wall-clock times encoded the
same way (naive time read as if it were UTC), which is what croniter computes on."""

from __future__ import annotations

import copy
import functools
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, tzinfo

from croniter import CroniterBadDateError, croniter

from .parsing import _PROBE_START, _Spec

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SECOND = timedelta(seconds=1)
_SAMPLE_STEP = 12 * 3600  # offset sampling step when looking for transitions (seconds)
_MAX_SHIFT = 36 * 3600  # bound on |offset(t1) - offset(t2)| within one zone, plus margin (seconds)
_CHUNK = 4 * 86400  # UTC span evaluated at a time (seconds)


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
