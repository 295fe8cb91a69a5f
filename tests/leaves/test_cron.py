"""Unit tests for django_leasequeue.cron: pure recurrence maths, no database, no Django settings.

The DST policy under test is the one documented at the top of ``django_leasequeue/cron/__init__.py``:
fixed-hour expressions fire once per matching local wall time (first instance of a repeated time,
the transition instant for a nonexistent one); wildcard-hour expressions (hour field starting with
``*``) fire at every real instant whose local wall time matches.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter

from django_leasequeue.cron import (
    CATCH_UP_CHOICES,
    DuePlan,
    InvalidCron,
    InvalidTimezone,
    due,
    engine,
    is_wildcard_hour,
    next_occurrence,
    occurrences,
    parsing,
    recurrence,
    validate_cron,
    validate_timezone,
)


def z(*args: int) -> datetime:
    """An aware UTC datetime ("Z" time)."""
    return datetime(*args, tzinfo=UTC)


def occ(expr: str, tz: str, after: datetime, until: datetime) -> list[datetime]:
    result = list(occurrences(expr, tz, after, until))
    assert all(a < b for a, b in zip(result, result[1:], strict=False)), "not strictly increasing"
    assert all(r.tzinfo is UTC and r.microsecond == 0 for r in result)
    return result


# --------------------------------------------------------------------------------------------------
# Written-out expected lists around real transitions

BERLIN = "Europe/Berlin"
NEW_YORK = "America/New_York"

WRITTEN_OUT = [
    # Europe/Berlin spring 2026-03-29: 02:00 CET -> 03:00 CEST at 01:00Z
    pytest.param(
        "30 2 * * *", BERLIN, z(2026, 3, 28), z(2026, 3, 31),
        # 02:30 CET; nonexistent 02:30 -> transition instant 03:00 CEST; 02:30 CEST
        [z(2026, 3, 28, 1, 30), z(2026, 3, 29, 1, 0), z(2026, 3, 30, 0, 30)],
        id="berlin-spring-daily-0230",
    ),
    pytest.param(
        "0 * * * *", BERLIN, z(2026, 3, 28, 22), z(2026, 3, 29, 3),
        # 00:00 CET, 01:00 CET, (02:00 does not exist), 03:00 CEST, 04:00 CEST, 05:00 CEST
        [z(2026, 3, 28, 23), z(2026, 3, 29, 0), z(2026, 3, 29, 1), z(2026, 3, 29, 2), z(2026, 3, 29, 3)],
        id="berlin-spring-hourly",
    ),
    pytest.param(
        "*/15 * * * *", BERLIN, z(2026, 3, 29, 0, 30), z(2026, 3, 29, 1, 30),
        # one per real 15 minutes, straight through the gap (01:45 CET -> 03:00 CEST)
        [z(2026, 3, 29, 0, 45), z(2026, 3, 29, 1, 0), z(2026, 3, 29, 1, 15), z(2026, 3, 29, 1, 30)],
        id="berlin-spring-quarter-hourly",
    ),
    pytest.param(
        "0 0 * * *", BERLIN, z(2026, 3, 27), z(2026, 3, 31),
        # C20: midnight fires on 03-29 and 03-30 (no skipped day)
        [z(2026, 3, 27, 23), z(2026, 3, 28, 23), z(2026, 3, 29, 22), z(2026, 3, 30, 22)],
        id="c20-berlin-midnight",
    ),
    pytest.param(
        "0 14 * * *", BERLIN, z(2026, 3, 28), z(2026, 3, 31),
        # C20: 14:00 CEST = 12:00Z on 03-29 (not an hour late)
        [z(2026, 3, 28, 13), z(2026, 3, 29, 12), z(2026, 3, 30, 12)],
        id="c20-berlin-1400",
    ),
    pytest.param(
        "0 */2 * * *", BERLIN, z(2026, 3, 28, 20), z(2026, 3, 29, 6),
        # 22:00 CET, 00:00 CET, (02:00 does not exist), 04:00 CEST, 06:00 CEST, 08:00 CEST
        [z(2026, 3, 28, 21), z(2026, 3, 28, 23), z(2026, 3, 29, 2), z(2026, 3, 29, 4), z(2026, 3, 29, 6)],
        id="c20-berlin-every-2h",
    ),
    # Europe/Berlin autumn 2026-10-25: 03:00 CEST -> 02:00 CET at 01:00Z
    pytest.param(
        "30 2 * * *", BERLIN, z(2026, 10, 24), z(2026, 10, 27),
        # 02:30 CEST; first 02:30 (CEST) only; 02:30 CET
        [z(2026, 10, 24, 0, 30), z(2026, 10, 25, 0, 30), z(2026, 10, 26, 1, 30)],
        id="berlin-autumn-daily-0230",
    ),
    pytest.param(
        "0 * * * *", BERLIN, z(2026, 10, 24, 22), z(2026, 10, 25, 4),
        # 01:00 CEST, 02:00 CEST, 02:00 CET, 03:00 CET, 04:00 CET, 05:00 CET
        [z(2026, 10, 24, 23), z(2026, 10, 25, 0), z(2026, 10, 25, 1), z(2026, 10, 25, 2),
         z(2026, 10, 25, 3), z(2026, 10, 25, 4)],
        id="berlin-autumn-hourly",
    ),
    pytest.param(
        "*/15 * * * *", BERLIN, z(2026, 10, 25, 0, 30), z(2026, 10, 25, 1, 30),
        # 02:45 CEST, 02:00 CET, 02:15 CET, 02:30 CET: one per real 15 minutes
        [z(2026, 10, 25, 0, 45), z(2026, 10, 25, 1, 0), z(2026, 10, 25, 1, 15), z(2026, 10, 25, 1, 30)],
        id="berlin-autumn-quarter-hourly",
    ),
    pytest.param(
        "0 */2 * * *", BERLIN, z(2026, 10, 24, 20), z(2026, 10, 25, 4),
        # 00:00 CEST, 02:00 CEST, 02:00 CET, 04:00 CET
        [z(2026, 10, 24, 22), z(2026, 10, 25, 0), z(2026, 10, 25, 1), z(2026, 10, 25, 3)],
        id="berlin-autumn-every-2h",
    ),
    # America/New_York spring 2026-03-08: 02:00 EST -> 03:00 EDT at 07:00Z
    pytest.param(
        "30 2 * * *", NEW_YORK, z(2026, 3, 7), z(2026, 3, 10),
        # 02:30 EST; nonexistent -> 03:00 EDT; 02:30 EDT
        [z(2026, 3, 7, 7, 30), z(2026, 3, 8, 7, 0), z(2026, 3, 9, 6, 30)],
        id="ny-spring-daily-0230",
    ),
    pytest.param(
        "0 * * * *", NEW_YORK, z(2026, 3, 8, 5), z(2026, 3, 8, 9),
        # 01:00 EST, (02:00 does not exist), 03:00 EDT, 04:00 EDT, 05:00 EDT
        [z(2026, 3, 8, 6), z(2026, 3, 8, 7), z(2026, 3, 8, 8), z(2026, 3, 8, 9)],
        id="ny-spring-hourly",
    ),
    pytest.param(
        "*/15 * * * *", NEW_YORK, z(2026, 3, 8, 6, 30), z(2026, 3, 8, 7, 30),
        [z(2026, 3, 8, 6, 45), z(2026, 3, 8, 7, 0), z(2026, 3, 8, 7, 15), z(2026, 3, 8, 7, 30)],
        id="ny-spring-quarter-hourly",
    ),
    # America/New_York autumn 2026-11-01: 02:00 EDT -> 01:00 EST at 06:00Z
    pytest.param(
        "30 1 * * *", NEW_YORK, z(2026, 10, 31), z(2026, 11, 3),
        # 01:30 EDT; first 01:30 (EDT) only; 01:30 EST
        [z(2026, 10, 31, 5, 30), z(2026, 11, 1, 5, 30), z(2026, 11, 2, 6, 30)],
        id="ny-autumn-daily-0130",
    ),
    # C19 window 2026-11-01 04:00Z-08:00Z (inclusive)
    pytest.param(
        "30 1 * * *", NEW_YORK, z(2026, 11, 1, 3, 59, 59), z(2026, 11, 1, 8),
        [z(2026, 11, 1, 5, 30)],
        id="c19-daily-0130",
    ),
    pytest.param(
        "0 * * * *", NEW_YORK, z(2026, 11, 1, 3, 59, 59), z(2026, 11, 1, 8),
        # 00:00 EDT, 01:00 EDT, 01:00 EST, 02:00 EST, 03:00 EST
        [z(2026, 11, 1, 4), z(2026, 11, 1, 5), z(2026, 11, 1, 6), z(2026, 11, 1, 7), z(2026, 11, 1, 8)],
        id="c19-hourly",
    ),
    pytest.param(
        "*/15 * * * *", NEW_YORK, z(2026, 11, 1, 3, 59, 59), z(2026, 11, 1, 8),
        [z(2026, 11, 1, 4) + timedelta(minutes=15 * i) for i in range(17)],
        id="c19-quarter-hourly",
    ),
]


@pytest.mark.parametrize(("expr", "tz", "after", "until", "expected"), WRITTEN_OUT)
def test_written_out_dst_days(
    expr: str, tz: str, after: datetime, until: datetime, expected: list[datetime]
) -> None:
    assert occ(expr, tz, after, until) == expected


def test_c19_local_times_of_the_repeated_hour() -> None:
    hourly = occ("0 * * * *", NEW_YORK, z(2026, 11, 1, 4, 30), z(2026, 11, 1, 6, 30))
    local = [o.astimezone(ZoneInfo(NEW_YORK)) for o in hourly]
    assert [(t.hour, t.fold, t.tzname()) for t in local] == [(1, 0, "EDT"), (1, 1, "EST")]


def test_c20_spring_forward_is_fast_and_advances() -> None:
    slowest = 0.0
    for expr in ("30 2 * * *", "0 0 * * *", "0 14 * * *", "0 */2 * * *"):
        now = z(2026, 3, 28, 23, 59, 59)
        for _ in range(30):
            start = time.perf_counter()
            plan = due(expr, BERLIN, last=None, next_at=None, now=now)
            slowest = max(slowest, time.perf_counter() - start)
            assert plan.next_at > now
            now = plan.next_at
    assert slowest < 1.0  # C20: every tick returns in well under a second


# --------------------------------------------------------------------------------------------------
# Exhaustive check against an independent oracle: every offset change 2020-2035 in many zones.

ORACLE_ZONES = [
    "Europe/Berlin",
    "Europe/London",
    "Europe/Dublin",  # negative DST in tzdata (winter is the "DST" period)
    "Atlantic/Azores",  # transitions at local midnight
    "America/New_York",
    "America/Los_Angeles",
    "America/St_Johns",  # -03:30
    "America/Havana",  # transitions at local midnight
    "America/Santiago",  # southern hemisphere, transitions at 24:00
    "America/Sao_Paulo",  # DST abolished 2019: no transition in range
    "America/Mexico_City",  # DST abolished 2022
    "America/Nuuk",  # standard offset changed 2023
    "America/Asuncion",  # DST abolished 2024
    "Australia/Sydney",
    "Australia/Lord_Howe",  # 30-minute shift
    "Pacific/Auckland",
    "Pacific/Chatham",  # +12:45 / +13:45
    "Pacific/Apia",  # DST abolished 2021
    "Asia/Tehran",  # DST abolished 2022, +03:30
    "Africa/Cairo",  # DST reinstated 2023
    "Asia/Jerusalem",
    "Africa/Casablanca",  # Ramadan transitions
    "Antarctica/Troll",  # two-hour shift
    "Europe/Istanbul",  # no DST since 2016
    "Asia/Kolkata",
    "Asia/Tokyo",
    "UTC",
]
ZONES_WITHOUT_TRANSITIONS = {"America/Sao_Paulo", "Europe/Istanbul", "Asia/Kolkata", "Asia/Tokyo", "UTC"}
MINUTE = timedelta(minutes=1)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
DAY = timedelta(days=1)


def find_transitions(zone: ZoneInfo, start: datetime, end: datetime) -> list[tuple[datetime, int, int]]:
    """UTC instants where the zone's utcoffset changes: (instant, minutes before, minutes after)."""

    def offset(t: datetime) -> int:
        return int(t.astimezone(zone).utcoffset().total_seconds()) // 60  # type: ignore[union-attr]

    found = []
    step = timedelta(days=1)  # tzdata has no two offset changes closer than 7 days since 1970
    t, off = start, offset(start)
    while t < end:
        nxt = t + step
        nxt_off = offset(nxt)
        if nxt_off != off:
            lo, hi = t, nxt
            while hi - lo > timedelta(seconds=1):
                mid = lo + (hi - lo) / 2
                mid = mid.replace(microsecond=0)
                if offset(mid) == off:
                    lo = mid
                else:
                    hi = mid
            after = offset(hi)
            found.append((hi, off, after))
            t, off = hi, after
        else:
            t, off = nxt, nxt_off
    return found


@dataclass(frozen=True)
class Shape:
    label: str
    expr: str
    fixed: bool  # fixed-hour policy (True) or wildcard-hour policy (False)
    match: Callable[[int], bool]  # hand-written matcher on a local wall time in epoch minutes


def hour_of(wall: int) -> int:
    return wall // 60 % 24


def cron_weekday_of(wall: int) -> int:
    return (wall // 1440 + 4) % 7  # 1970-01-01 was a Thursday; cron: 0 = Sunday


def shapes_for(wall: int) -> list[Shape]:
    """Expressions whose fixed time of day is ``wall`` (a wall time inside the shifted range)."""
    h, m, dow = hour_of(wall), wall % 60, cron_weekday_of(wall)
    return [
        Shape("daily", f"{m} {h} * * *", True, lambda w: w % 60 == m and hour_of(w) == h),
        Shape(
            "weekly",
            f"{m} {h} * * {dow}",
            True,
            lambda w: w % 60 == m and hour_of(w) == h and cron_weekday_of(w) == dow,
        ),
        Shape("every-minute-of-hour", f"* {h} * * *", True, lambda w: hour_of(w) == h),
        Shape("hourly", "0 * * * *", False, lambda w: w % 60 == 0),
        Shape("quarter-hourly", "*/15 * * * *", False, lambda w: w % 15 == 0),
        Shape("two-hourly", "0 */2 * * *", False, lambda w: w % 60 == 0 and hour_of(w) % 2 == 0),
    ]


# One walked minute: (UTC epoch minute, local wall time in epoch minutes (naive local time read as
# UTC), whether no earlier minute of the walk had this wall time, the wall times the clock jumped
# over since the previous minute (a gap) or None).
Minute = tuple[int, int, bool, range | None]


def walk(zone: ZoneInfo, start: int, end: int) -> list[Minute]:
    """Every UTC minute in [start, end] with its local wall time, converted by zoneinfo."""
    minutes = []
    seen: set[int] = set()
    prev_wall: int | None = None
    fromtimestamp = datetime.fromtimestamp
    for u in range(start, end + 1):
        offset = fromtimestamp(u * 60, zone).utcoffset()
        wall = u + offset.days * 1440 + offset.seconds // 60  # type: ignore[union-attr]
        jumped = range(prev_wall + 1, wall) if prev_wall is not None and wall > prev_wall + 1 else None
        minutes.append((u, wall, wall not in seen, jumped))
        seen.add(wall)
        prev_wall = wall
    return minutes


def oracle(minutes: list[Minute], shape: Shape, after: int, until: int) -> list[int]:
    """Apply the documented policy minute by minute.

    Fixed hour: a minute is an occurrence when its wall time matches and no earlier minute had that
    wall time (first instance), or when the wall clock jumped over a matching wall time since the
    previous minute (the first instant after a gap). Wildcard hour: every minute whose wall time
    matches.
    """
    match = shape.match
    if shape.fixed:
        hits = [
            u
            for u, wall, first, jumped in minutes
            if (first and match(wall)) or (jumped and any(map(match, jumped)))
        ]
    else:
        hits = [u for u, wall, _, _ in minutes if match(wall)]
    return [u for u in hits if after < u <= until]


def windows_for(name: str) -> list[tuple[datetime, int, int]]:
    zone = ZoneInfo(name)
    found = find_transitions(zone, z(2020, 1, 1), z(2036, 1, 1))
    if name in ZONES_WITHOUT_TRANSITIONS:
        assert found == []
        # control windows: the same days as the Berlin and New York transitions
        return [(z(2026, 3, 29, 1), 0, 0), (z(2026, 11, 1, 6), 0, 0)]
    assert len(found) >= 3, name
    return found


def epoch_minutes(value: datetime) -> int:
    assert value.second == 0 and value.microsecond == 0
    return (value - EPOCH) // MINUTE


@pytest.mark.parametrize("name", ORACLE_ZONES)
def test_every_transition_2020_2035_matches_the_oracle(name: str) -> None:
    zone = ZoneInfo(name)
    for instant, before, after in windows_for(name):
        t = epoch_minutes(instant)  # the oracle walks whole minutes
        if after > before:  # gap: wall times [t + before, t + after) do not exist
            start, size = before, after - before
        else:  # fold: wall times [t + after, t + before) happen twice
            start, size = after, before - after
        shifted = t + start + size // 2
        lo, hi = t - 1440, t + 1440  # two days around the transition
        minutes = walk(zone, lo - 180, hi)
        for shape in shapes_for(shifted):
            got = [epoch_minutes(o) for o in occ(shape.expr, name, instant - DAY, instant + DAY)]
            want = oracle(minutes, shape, lo, hi)
            assert got == want, (name, instant, shape.label, shape.expr)
            assert len(set(got)) == len(got)


def test_oracle_zones_cover_the_brief() -> None:
    assert len(ORACLE_ZONES) >= 20
    assert len(set(ORACLE_ZONES)) == len(ORACLE_ZONES)
    # hemispheres, half-hour shift, abolished/reinstated DST are all present
    assert {"Australia/Lord_Howe", "America/Mexico_City", "Africa/Cairo", "Asia/Tehran"} <= set(ORACLE_ZONES)
    last_mexico = find_transitions(ZoneInfo("America/Mexico_City"), z(2020, 1, 1), z(2036, 1, 1))[-1][0]
    assert last_mexico.date().year == 2022
    first_cairo = find_transitions(ZoneInfo("Africa/Cairo"), z(2020, 1, 1), z(2036, 1, 1))[0][0]
    assert first_cairo.date().year == 2023


# --------------------------------------------------------------------------------------------------
# occurrences / next_occurrence basics


def test_bounds_are_exclusive_then_inclusive() -> None:
    got = occ("0 * * * *", "UTC", z(2026, 1, 1, 0), z(2026, 1, 1, 3))
    assert got == [z(2026, 1, 1, 1), z(2026, 1, 1, 2), z(2026, 1, 1, 3)]
    assert occ("0 * * * *", "UTC", z(2026, 1, 1, 3), z(2026, 1, 1, 3)) == []
    assert occ("0 * * * *", "UTC", z(2026, 1, 1, 3), z(2026, 1, 1, 1)) == []
    # sub-second bounds
    just_before = z(2026, 1, 1, 0, 59, 59) + timedelta(microseconds=999_999)
    got = occ("0 * * * *", "UTC", just_before, z(2026, 1, 1, 1))
    assert got == [z(2026, 1, 1, 1)]


def test_next_occurrence_is_strictly_after() -> None:
    assert next_occurrence("0 9 * * *", BERLIN, z(2026, 1, 5, 8)) == z(2026, 1, 6, 8)
    assert next_occurrence("0 9 * * *", BERLIN, z(2026, 1, 5, 7, 59, 59)) == z(2026, 1, 5, 8)
    assert next_occurrence("0 0 29 2 *", "UTC", z(2026, 1, 1)) == z(2028, 2, 29)  # sparse: skips ahead
    assert next_occurrence("30 2 * * *", BERLIN, z(2026, 3, 29, 0)) == z(2026, 3, 29, 1)


def test_aware_inputs_in_any_zone_and_zone_objects() -> None:
    plus5 = timezone(timedelta(hours=5))
    after = datetime(2026, 1, 1, 5, 0, tzinfo=plus5)  # = 00:00Z
    assert next_occurrence("0 * * * *", ZoneInfo("UTC"), after) == z(2026, 1, 1, 1)
    assert next_occurrence("0 9 * * *", timezone(timedelta(hours=2)), z(2026, 1, 1)) == z(2026, 1, 1, 7)


def test_six_fields_means_seconds_last() -> None:
    got = occ("* * * * * 30", "UTC", z(2026, 1, 1), z(2026, 1, 1, 0, 3))
    assert got == [z(2026, 1, 1, 0, 0, 30), z(2026, 1, 1, 0, 1, 30), z(2026, 1, 1, 0, 2, 30)]
    assert len(occ("*/10 * * * * *", "UTC", z(2026, 1, 1), z(2026, 1, 1, 0, 0, 59))) == 59


def test_per_second_schedule_across_fall_back_repeats_the_hour() -> None:
    got = occ("0 * * * * 0", NEW_YORK, z(2026, 11, 1, 4, 59, 30), z(2026, 11, 1, 7, 0, 30))
    assert got == [z(2026, 11, 1, 5), z(2026, 11, 1, 6), z(2026, 11, 1, 7)]
    got = occ("* * * * * *", NEW_YORK, z(2026, 11, 1, 5, 59, 58), z(2026, 11, 1, 6, 0, 1))
    assert got == [z(2026, 11, 1, 5, 59, 59), z(2026, 11, 1, 6), z(2026, 11, 1, 6, 0, 1)]


def test_fixed_hour_gap_collapses_to_one_occurrence() -> None:
    # every 15 minutes of the nonexistent hour, and a list that also names 03:00: one firing at 03:00 CEST
    assert occ("*/15 2 * * *", BERLIN, z(2026, 3, 28, 23), z(2026, 3, 29, 22)) == [z(2026, 3, 29, 1)]
    assert occ("0 2,3 * * *", BERLIN, z(2026, 3, 28, 23), z(2026, 3, 29, 22)) == [z(2026, 3, 29, 1)]
    # a fixed range fires once per wall hour on fall-back
    got = occ("0 1-3 * * *", BERLIN, z(2026, 10, 24, 22), z(2026, 10, 25, 4))
    assert got == [z(2026, 10, 24, 23), z(2026, 10, 25, 0), z(2026, 10, 25, 2)]  # 01 CEST, 02 CEST, 03 CET


@pytest.mark.parametrize(
    ("expr", "wildcard"),
    [
        ("* * * * *", True),
        ("0 * * * *", True),
        ("*/15 * * * *", True),
        ("0 */2 * * *", True),
        ("@hourly", True),
        ("* * * * * *", True),
        ("30 2 * * *", False),
        ("0 9 * * 1", False),
        ("0 8,20 * * *", False),
        ("0 9-17 * * *", False),
        ("0 1-23/2 * * *", False),
        ("@daily", False),
        ("@WEEKLY", False),
    ],
)
def test_hour_field_classification(expr: str, wildcard: bool) -> None:
    assert is_wildcard_hour(expr) is wildcard


CROSS_CHECK_EXPRESSIONS = [
    "* * * * *", "*/7 * * * *", "0 9-17/2 * * 1-5", "15,45 */3 * * *", "0 0 L * *", "30 8 15W * *",
    "0 9 * * mon#2", "0 12 1,15 * 5", "5 4 * * sun", "0 0 29 2 *", "59 23 31 * *", "0 0 * * 7",
    "@hourly", "@weekly", "@monthly", "* * * * * */10", "59 23 * * * 30", "0 0 ? * 1", "1-5 0 1 jan-mar *",
]


@pytest.mark.parametrize("expr", CROSS_CHECK_EXPRESSIONS)
def test_wall_enumeration_agrees_with_croniter(expr: str) -> None:
    """The engine's wall-time enumeration equals croniter's own get_next/get_prev on naive times."""
    rng = random.Random(expr)
    spec = parsing._compile(expr)
    walls = engine._Walls(spec)
    reference = croniter(spec.expr, datetime(2000, 1, 1))
    epoch = datetime(1970, 1, 1)
    for _ in range(40):
        start = rng.randrange(1_700_000_000, 1_900_000_000)
        if rng.random() < 0.3:
            start -= start % 60  # exactly on a minute
        want_next = reference.get_next(datetime, start_time=epoch + timedelta(seconds=start))
        want_prev = reference.get_prev(datetime, start_time=epoch + timedelta(seconds=start))
        assert walls.next(start) == (want_next - epoch) // timedelta(seconds=1), (expr, start)
        assert walls.prev(start) == (want_prev - epoch) // timedelta(seconds=1), (expr, start)
        walls.next(start)
        reference.get_next(datetime, start_time=epoch + timedelta(seconds=start))
        for _ in range(3):  # continuing from the previous result
            want = reference.get_next(datetime)
            assert walls.next() == (want - epoch) // timedelta(seconds=1), (expr, start)
        walls.prev(start)
        reference.get_prev(datetime, start_time=epoch + timedelta(seconds=start))
        for _ in range(3):
            want = reference.get_prev(datetime)
            assert walls.prev() == (want - epoch) // timedelta(seconds=1), (expr, start)


def test_backward_walk_mirrors_forward_walk_across_transitions() -> None:
    for name, centre in [(BERLIN, z(2026, 3, 29, 1)), (BERLIN, z(2026, 10, 25, 1)),
                         (NEW_YORK, z(2026, 11, 1, 6)), ("Australia/Lord_Howe", z(2026, 4, 4, 15)),
                         ("Antarctica/Troll", z(2026, 3, 29, 1))]:
        zone = ZoneInfo(name)
        lo = engine._seconds(centre - DAY, "lo")
        hi = engine._seconds(centre + DAY, "hi")
        for expr in ("30 2 * * *", "* 2 * * *", "0 * * * *", "*/15 * * * *", "0 */2 * * *", "0 0 * * 0"):
            spec = parsing._compile(expr)
            forward = list(engine._forward(spec, zone, lo, hi))
            backward = list(engine._backward(spec, zone, hi, lo))
            assert backward == forward[::-1], (name, expr)


# --------------------------------------------------------------------------------------------------
# due(): catch-up policies, new schedules, always advancing


NOW = z(2026, 6, 15, 12, 0, 30)


def test_per_minute_three_hour_outage_latest_is_one_job() -> None:
    # C17 (1): last fired 3 h ago
    plan = due("* * * * *", BERLIN, last=z(2026, 6, 15, 9, 0), next_at=z(2026, 6, 15, 9, 1), now=NOW)
    assert plan == DuePlan(emit=[z(2026, 6, 15, 12, 0)], skipped=179, next_at=z(2026, 6, 15, 12, 1))
    assert plan.next_at > NOW


def test_default_policy_is_latest() -> None:
    assert CATCH_UP_CHOICES == ("latest", "all", "none")
    plan = due("* * * * *", "UTC", last=z(2026, 6, 15, 9, 0), next_at=None, now=NOW)
    assert plan.emit == [z(2026, 6, 15, 12, 0)]


@pytest.mark.parametrize(
    ("catch_up", "emit", "skipped"),
    [
        ("latest", [z(2026, 6, 15, 12, 0)], 4319),
        ("all", [z(2026, 6, 15, 11, 50) + MINUTE * i for i in range(11)], 4309),
        ("none", [], 4320),
    ],
)
def test_per_minute_three_day_outage(catch_up: str, emit: list[datetime], skipped: int, monkeypatch) -> None:
    monkeypatch.setattr(recurrence, "MAX_COUNTED_OCCURRENCES", 10_000)  # exact counting
    plan = due("* * * * *", NEW_YORK, last=z(2026, 6, 12, 12, 0), next_at=None, now=NOW,
               catch_up=catch_up, limit=11)
    assert plan == DuePlan(emit=emit, skipped=skipped, next_at=z(2026, 6, 15, 12, 1))


def test_per_minute_three_day_outage_counting_is_capped(monkeypatch) -> None:
    monkeypatch.setattr(recurrence, "MAX_COUNTED_OCCURRENCES", 1000)
    plan = due("* * * * *", NEW_YORK, last=z(2026, 6, 12, 12, 0), next_at=None, now=NOW)
    assert plan.emit == [z(2026, 6, 15, 12, 0)]
    assert plan.skipped_is_lower_bound
    assert plan.skipped == recurrence.MAX_COUNTED_OCCURRENCES  # 1001 counted, one emitted
    plan = due("* * * * *", NEW_YORK, last=z(2026, 6, 12, 12, 0), next_at=None, now=NOW,
               catch_up="all", limit=3)
    assert plan.emit == [z(2026, 6, 15, 11, 58), z(2026, 6, 15, 11, 59), z(2026, 6, 15, 12, 0)]
    assert plan.skipped == recurrence.MAX_COUNTED_OCCURRENCES + 1 - 3


@pytest.mark.parametrize(
    ("catch_up", "emit", "skipped"),
    [
        ("latest", [z(2026, 6, 15, 7)], 2),
        ("all", [z(2026, 6, 13, 7), z(2026, 6, 14, 7), z(2026, 6, 15, 7)], 0),
        ("none", [], 3),
    ],
)
def test_daily_three_day_outage(catch_up: str, emit: list[datetime], skipped: int) -> None:
    plan = due("0 9 * * *", BERLIN, last=z(2026, 6, 12, 7), next_at=z(2026, 6, 13, 7), now=NOW,
               catch_up=catch_up, limit=10)
    assert plan == DuePlan(emit=emit, skipped=skipped, next_at=z(2026, 6, 16, 7))


def test_all_keeps_the_newest_when_over_limit() -> None:
    plan = due("0 9 * * *", BERLIN, last=z(2026, 6, 1, 7), next_at=None, now=NOW, catch_up="all", limit=2)
    assert plan.emit == [z(2026, 6, 14, 7), z(2026, 6, 15, 7)]
    assert plan.skipped == 12


def test_none_emits_when_nothing_was_missed() -> None:
    plan = due("0 9 * * *", BERLIN, last=z(2026, 6, 14, 7), next_at=z(2026, 6, 15, 7),
               now=z(2026, 6, 15, 7, 0, 2), catch_up="none")
    assert plan == DuePlan(emit=[z(2026, 6, 15, 7)], skipped=0, next_at=z(2026, 6, 16, 7))


def test_new_schedule_emits_nothing_from_the_past() -> None:
    plan = due("0 9 * * *", BERLIN, last=None, next_at=None, now=NOW)
    assert plan == DuePlan(emit=[], skipped=0, next_at=z(2026, 6, 16, 7))
    plan = due("* * * * *", BERLIN, last=None, next_at=None, now=z(2026, 6, 15, 12))
    assert plan == DuePlan(emit=[], skipped=0, next_at=z(2026, 6, 15, 12, 1))


def test_new_schedule_with_stored_next_at_that_is_due() -> None:
    plan = due("0 9 * * *", BERLIN, last=None, next_at=z(2026, 6, 15, 7), now=NOW)
    assert plan == DuePlan(emit=[z(2026, 6, 15, 7)], skipped=0, next_at=z(2026, 6, 16, 7))
    # an occurrence exactly at now is due
    plan = due("0 9 * * *", BERLIN, last=None, next_at=z(2026, 6, 15, 7), now=z(2026, 6, 15, 7))
    assert plan.emit == [z(2026, 6, 15, 7)]
    assert plan.next_at == z(2026, 6, 16, 7)


def test_next_at_is_a_floor_so_a_zone_change_does_not_backfill() -> None:
    # C17 (2): daily 09:00 schedule moved from UTC to New York; the row's next_at is recomputed forward.
    last = z(2026, 6, 14, 9)  # fired in the old zone
    now = z(2026, 6, 15, 10)
    recomputed = next_occurrence("0 9 * * *", NEW_YORK, now)
    assert recomputed == z(2026, 6, 15, 13)
    for policy in CATCH_UP_CHOICES:
        plan = due("0 9 * * *", NEW_YORK, last=last, next_at=recomputed, now=now, catch_up=policy)
        assert plan == DuePlan(emit=[], skipped=0, next_at=recomputed)
    # a future floor is respected by next_at too
    plan = due("0 * * * *", "UTC", last=None, next_at=z(2026, 6, 20, 0, 30), now=now)
    assert plan == DuePlan(emit=[], skipped=0, next_at=z(2026, 6, 20, 1))


def test_per_second_three_day_outage_is_fast() -> None:
    start = time.perf_counter()
    now = z(2026, 3, 30, 12, 0, 0, 500)
    plan = due("* * * * * *", BERLIN, last=z(2026, 3, 27, 12), next_at=None, now=now)
    elapsed = time.perf_counter() - start
    assert plan.emit == [z(2026, 3, 30, 12)]
    assert plan.next_at == z(2026, 3, 30, 12, 0, 1)
    assert plan.skipped_is_lower_bound and plan.skipped >= recurrence.MAX_COUNTED_OCCURRENCES
    start = time.perf_counter()
    plan = due("* * * * * *", BERLIN, last=z(2026, 3, 27, 12), next_at=None, now=z(2026, 3, 30, 12),
               catch_up="all", limit=50)
    elapsed = max(elapsed, time.perf_counter() - start)
    assert plan.emit == [z(2026, 3, 30, 11, 59, 11) + timedelta(seconds=i) for i in range(50)]
    assert elapsed < 1.0, elapsed


@pytest.mark.parametrize("expr", ["30 2 * * *", "* 2 * * *", "0 * * * *", "*/15 * * * *", "0 */2 * * *"])
@pytest.mark.parametrize(("tz", "centre"), [(BERLIN, z(2026, 3, 29, 1)), (NEW_YORK, z(2026, 11, 1, 6))])
def test_capped_catch_up_emits_the_exact_newest(expr: str, tz: str, centre: datetime, monkeypatch) -> None:
    monkeypatch.setattr(recurrence, "MAX_COUNTED_OCCURRENCES", 3)
    last, now = centre - DAY, centre + timedelta(hours=2)
    expected = occ(expr, tz, last, now)
    plan = due(expr, tz, last=last, next_at=None, now=now, catch_up="all", limit=4)
    assert plan.emit == expected[-4:]
    assert plan.skipped_is_lower_bound == (len(expected) > 4)
    assert plan.next_at == next_occurrence(expr, tz, now)


@pytest.mark.parametrize("policy", CATCH_UP_CHOICES)
@pytest.mark.parametrize(("expr", "tz"), [("*/15 * * * *", NEW_YORK), ("30 1 * * *", NEW_YORK),
                                          ("0 */2 * * *", BERLIN), ("30 2 * * *", BERLIN)])
def test_scheduler_loop_always_advances_and_never_repeats(expr: str, tz: str, policy: str) -> None:
    rng = random.Random(f"{expr}{tz}{policy}")
    now = z(2026, 3, 22) if tz == BERLIN else z(2026, 10, 25)
    end = now + timedelta(days=14)  # spans a transition (Berlin spring, New York autumn)
    last: datetime | None = None
    next_at: datetime | None = None
    emitted: list[datetime] = []
    ticks = 0
    while now < end:
        plan = due(expr, tz, last=last, next_at=next_at, now=now, catch_up=policy, limit=1000)
        assert plan.next_at > now
        assert next_at is None or plan.next_at >= next_at  # never moves backwards
        assert all(e <= now for e in plan.emit)
        emitted.extend(plan.emit)
        last = plan.emit[-1] if plan.emit else last
        next_at = plan.next_at
        # mostly tick right after the next occurrence, sometimes sleep through several
        now = plan.next_at + timedelta(seconds=rng.choice([0, 1, 7, 59]))
        if rng.random() < 0.1:
            now += timedelta(hours=rng.choice([1, 5, 30]))
        ticks += 1
    assert emitted == sorted(set(emitted))
    if policy == "all":  # with a generous limit nothing is ever lost
        assert emitted == occ(expr, tz, emitted[0] - timedelta(seconds=1), emitted[-1])
    assert ticks > 5


def test_due_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="catch_up"):
        due("* * * * *", "UTC", last=None, next_at=None, now=NOW, catch_up="sometimes")
    with pytest.raises(ValueError, match="limit"):
        due("* * * * *", "UTC", last=None, next_at=None, now=NOW, catch_up="all", limit=0)
    with pytest.raises(ValueError, match="naive"):
        due("* * * * *", "UTC", last=None, next_at=None, now=datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="naive"):
        due("* * * * *", "UTC", last=datetime(2026, 1, 1), next_at=None, now=NOW)
    with pytest.raises(InvalidCron):
        due("61 * * * *", "UTC", last=None, next_at=None, now=NOW)
    with pytest.raises(InvalidTimezone):
        due("* * * * *", "Mars/Olympus", last=None, next_at=None, now=NOW)


# --------------------------------------------------------------------------------------------------
# Validation


@pytest.mark.parametrize(
    ("expr", "reason"),
    [
        ("61 * * * *", "out of range"),
        ("0 24 * * *", "out of range"),
        ("* * *", "3 field(s)"),
        ("", "empty"),
        ("   ", "empty"),
        ("* * * * * * *", "7 field(s)"),
        ("0 0 1 1 * 0 2030 extra", "8 field(s)"),
        ("garbage", "1 field(s)"),
        ("*/0 * * * *", "step"),
        ("1,,2 * * * *", "invalid"),
        ("0 0 30 2 *", "never matches"),
        ("H * * * *", "hashed"),
        ("R * * * *", "random"),
        ("@reboot", "alias"),
        ("0 9 * * lundi", "invalid"),
        ("0 9 * * 1\u00a0", "non-ASCII"),
    ],
)
def test_invalid_cron_names_the_expression_and_the_reason(expr: str, reason: str) -> None:
    with pytest.raises(InvalidCron) as info:
        validate_cron(expr)
    assert repr(expr) in str(info.value)
    assert reason in str(info.value)
    assert isinstance(info.value, ValueError)


def test_invalid_cron_non_string() -> None:
    with pytest.raises(InvalidCron, match="string"):
        validate_cron(5)  # type: ignore[arg-type]
    with pytest.raises(InvalidCron, match="string"):
        validate_cron(["* * * * *"])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "expr",
    ["* * * * *", "*/15 * * * *", "0 9 * * 1-5", "0 9 * * mon#2", "0 0 L * *", "0 0 15W * *",
     "@daily", "@hourly", "* * * * * 30", "  0 9 * * *  ", "0 0 29 2 *"],
)
def test_valid_cron(expr: str) -> None:
    assert validate_cron(expr) is None


def test_invalid_cron_is_raised_eagerly_by_occurrences() -> None:
    with pytest.raises(InvalidCron, match="'61 \\* \\* \\* \\*'"):
        occurrences("61 * * * *", "UTC", z(2026, 1, 1), z(2026, 1, 2))


@pytest.mark.parametrize("name", ["Mars/Olympus", "", "../etc/passwd", "/etc/localtime", "Europe", "utc"])
def test_invalid_timezone_names_the_zone(name: str) -> None:
    with pytest.raises(InvalidTimezone) as info:
        validate_timezone(name)
    assert repr(name) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_invalid_timezone_is_raised_eagerly() -> None:
    with pytest.raises(InvalidTimezone, match="Mars/Olympus"):
        occurrences("* * * * *", "Mars/Olympus", z(2026, 1, 1), z(2026, 1, 2))
    with pytest.raises(InvalidTimezone, match="Mars/Olympus"):
        next_occurrence("* * * * *", "Mars/Olympus", z(2026, 1, 1))
    with pytest.raises(InvalidTimezone):
        validate_timezone(None)  # type: ignore[arg-type]


def test_valid_timezone() -> None:
    assert validate_timezone("Europe/Berlin") == ZoneInfo("Europe/Berlin")
    assert validate_timezone("UTC") == ZoneInfo("UTC")


def test_naive_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="after must be an aware datetime"):
        occurrences("* * * * *", "UTC", datetime(2026, 1, 1), z(2026, 1, 2))
    with pytest.raises(ValueError, match="until must be an aware datetime"):
        occurrences("* * * * *", "UTC", z(2026, 1, 1), datetime(2026, 1, 2))
    with pytest.raises(ValueError, match="naive"):
        next_occurrence("* * * * *", "UTC", datetime(2026, 1, 1))
