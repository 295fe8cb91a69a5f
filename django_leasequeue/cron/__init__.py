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

from .parsing import InvalidCron, InvalidTimezone, is_wildcard_hour, validate_cron, validate_timezone
from .recurrence import (
    CATCH_UP_CHOICES,
    DEFAULT_CATCH_UP,
    DEFAULT_CATCH_UP_LIMIT,
    MAX_COUNTED_OCCURRENCES,
    DuePlan,
    due,
    next_occurrence,
    occurrences,
)

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
