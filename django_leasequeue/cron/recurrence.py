"""The public recurrence API: occurrences in a window, the next occurrence, and one scheduler
tick's plan with its catch-up policy (:func:`due`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, tzinfo

from .engine import _backward, _ceil_seconds, _datetime, _forward, _seconds
from .parsing import _compile, _zone

CATCH_UP_CHOICES: tuple[str, ...] = ("latest", "all", "none")
"""Catch-up policies accepted by :func:`due`."""

DEFAULT_CATCH_UP = "latest"
"""The default catch-up policy: one job for the latest missed occurrence."""

DEFAULT_CATCH_UP_LIMIT = 10
"""Default number of occurrences the ``"all"`` policy emits per tick."""

MAX_COUNTED_OCCURRENCES = 10_000
"""Missed occurrences counted one by one before :func:`due` stops counting (``skipped`` then
becomes a lower bound and :attr:`DuePlan.skipped_is_lower_bound` is true)."""


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
