"""The scheduler's statements, and the lock ``Schedule.save()`` takes.

Correctness of "one job per occurrence" comes from the jobs' unique key (``enqueue.JOB_INSERT``'s
ON CONFLICT DO NOTHING); the row lock of ``SCHEDULE_LOCK_DUE`` only stops two schedulers from
doing the same work twice, and the monotonic advance keeps a stale scheduler from moving a
schedule back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ._db import CLOCK, JOB_TABLE, SCHEDULE_TABLE, _dumps, _load, _run

# ---------------------------------------------------------------------------------------------
# The scheduler's writes. Correctness of "one job per occurrence" comes from the jobs' unique key
# (JOB_INSERT's ON CONFLICT DO NOTHING); the row lock below only stops two schedulers from doing
# the same work twice, and the monotonic advance keeps a stale scheduler from moving a schedule back.

_SCHEDULE_COLUMNS = """s.id, s.name, s.task, s.args, s.kwargs, s.cron, s.timezone, s.queue, s.priority,
       s.catch_up, s.catch_up_limit, s.last_occurrence_at, s.next_occurrence_at, s.when_paused"""


@dataclass(frozen=True)
class ScheduleRow:
    """A schedule as the scheduler reads it (locked, inside the caller's transaction)."""

    id: int
    name: str
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    cron: str
    timezone: str
    queue: str
    priority: int
    catch_up: str
    catch_up_limit: int
    last_occurrence_at: datetime | None
    next_occurrence_at: datetime | None
    when_paused: str = "latest"


# Lock up to %(limit)s enabled schedules that are due (stored next occurrence at or before now, or
# not computed yet). SKIP LOCKED: a schedule another scheduler is working on is left to it. In READ
# COMMITTED a row updated by a scheduler that committed after this statement's snapshot is
# re-checked against the WHERE clause on its newest version, so an advanced schedule drops out.
# ``exclude`` holds the ids this tick already handled (a schedule that failed stays due).
SCHEDULE_LOCK_DUE = f"""
WITH clock AS MATERIALIZED ({CLOCK})
SELECT {_SCHEDULE_COLUMNS}
FROM {SCHEDULE_TABLE} s, clock
WHERE s.enabled
  AND (s.next_occurrence_at IS NULL OR s.next_occurrence_at <= clock.now)
  AND NOT (s.id = ANY(%(exclude)s::bigint[]))
ORDER BY s.next_occurrence_at NULLS FIRST, s.id
LIMIT %(limit)s
FOR UPDATE OF s SKIP LOCKED
"""


def schedule_lock_due(*, limit: int = 100, exclude: Sequence[int] = (), now: datetime | None = None,
                      alias: str | None = None) -> list[ScheduleRow]:
    """Lock due enabled schedules for the rest of the caller's transaction (``FOR UPDATE SKIP LOCKED``).

    Must run inside ``transaction.atomic``: the locks are held until it ends.

    Args:
        limit: maximum number of schedules returned.
        exclude: schedule ids to leave out (already handled by this tick).
        now: aware datetime to compare ``next_occurrence_at`` with; None: the database clock.

    Returns:
        The locked schedules, earliest stored next occurrence first (not yet computed ones first).
    """
    rows = _run(SCHEDULE_LOCK_DUE, {"now": now, "limit": limit, "exclude": list(exclude)}, alias=alias).rows
    return [
        ScheduleRow(id=r[0], name=r[1], task=r[2], args=_load(r[3]), kwargs=_load(r[4]), cron=r[5],
                    timezone=r[6], queue=r[7], priority=r[8], catch_up=r[9], catch_up_limit=r[10],
                    last_occurrence_at=r[11], next_occurrence_at=r[12], when_paused=r[13])
        for r in rows
    ]


# Advance schedules after their occurrences were inserted (same transaction), many in one
# statement. Monotonic: a scheduler that worked from a stale read can never move last/next
# occurrence backwards. The compare on cron and timezone makes it a compare-and-set against an
# edit that slipped in: then the edit's own recomputed next occurrence stands (the jobs already
# inserted were due under the old definition).
SCHEDULE_ADVANCE = f"""
UPDATE {SCHEDULE_TABLE} s
SET last_occurrence_at = CASE WHEN d.last IS NULL THEN s.last_occurrence_at
                              ELSE greatest(s.last_occurrence_at, d.last) END,
    next_occurrence_at = greatest(s.next_occurrence_at, d.next),
    skipped_occurrences = s.skipped_occurrences + d.skipped
FROM unnest(%(id)s::bigint[], %(last)s::timestamptz[], %(next)s::timestamptz[], %(skipped)s::bigint[],
            %(cron)s::text[], %(timezone)s::text[]) AS d(id, last, next, skipped, cron, timezone)
WHERE s.id = d.id AND s.cron = d.cron AND s.timezone = d.timezone AND s.enabled
RETURNING s.id
"""


@dataclass(frozen=True)
class ScheduleAdvance:
    """One schedule's tick outcome, for :func:`schedule_advance`.

    ``last``: aware datetime of the newest occurrence emitted, or None (none emitted). ``next_at``:
    aware datetime of the next occurrence to wait for. ``skipped``: due occurrences not emitted
    (catch-up policy), added to the counter. ``cron``, ``timezone``: the definition the plan was
    computed from; a schedule edited (or disabled) meanwhile is not written.
    """

    schedule_id: int
    last: datetime | None
    next_at: datetime
    skipped: int
    cron: str
    timezone: str


def schedule_advance(items: Sequence[ScheduleAdvance], *, alias: str | None = None) -> set[int]:
    """Record the outcome of a tick for many schedules in one statement.

    Returns:
        The ids of the schedules advanced (the others were edited or disabled meanwhile).
    """
    if not items:
        return set()
    params: dict[str, Any] = {"id": [i.schedule_id for i in items], "last": [i.last for i in items],
              "next": [i.next_at for i in items], "skipped": [int(i.skipped) for i in items],
              "cron": [i.cron for i in items], "timezone": [i.timezone for i in items]}
    return {r[0] for r in _run(SCHEDULE_ADVANCE, params, alias=alias).rows}


# A paused target queue under when_paused="latest": keep only the newest pending job of each
# (schedule, queue) and cancel the older ones, with a "coalesced" history entry naming the kept
# occurrence. "Pending" is ready with no attempt spent or refunded (attempts = 0, interruptions =
# 0): a job that ran, or waits for its retry, is never superseded. Occurrence jobs only (a "run
# now" job has no occurrence). The newest is computed over all pending rows, not "older than what
# this tick inserted", so a stale scheduler that inserted an older occurrence after a newer one
# cancels its own job: at most one stays whatever the interleaving. Each cancelled row keeps its
# unique key (retained scope), so the occurrence is never emitted again. Rows are locked in id
# order and re-checked after a lock wait (the UPDATE's status filter).
JOB_COALESCE = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
pending AS MATERIALIZED (
    SELECT j.id, j.occurrence_at,
           max(j.occurrence_at) OVER (PARTITION BY j.schedule_id, j.queue) AS kept_at
    FROM {JOB_TABLE} j
    JOIN unnest(%(schedule)s::bigint[], %(queue)s::text[]) AS t(schedule_id, queue)
      ON j.schedule_id = t.schedule_id AND j.queue = t.queue
    WHERE j.status = 'ready' AND j.attempts = 0 AND j.interruptions = 0 AND j.occurrence_at IS NOT NULL
),
target AS MATERIALIZED (
    SELECT j.id FROM {JOB_TABLE} j JOIN pending p ON p.id = j.id
    WHERE p.occurrence_at < p.kept_at
    ORDER BY j.id
    FOR UPDATE OF j
)
UPDATE {JOB_TABLE} j
SET status = 'cancelled', finished_at = clock.now,
    history = j.history || jsonb_build_array(jsonb_build_object(
        'event', 'coalesced', 'by', 'scheduler', 'at', clock.now, 'kept_occurrence', p.kept_at))
FROM target, pending p, clock
WHERE j.id = target.id AND p.id = j.id AND j.status = 'ready' AND j.attempts = 0 AND j.interruptions = 0
RETURNING j.id, j.schedule_id, j.queue, j.occurrence_at, p.kept_at
"""


@dataclass(frozen=True)
class CoalescedJob:
    """A pending job that :func:`job_coalesce` cancelled in favour of a later occurrence.

    ``occurrence_at`` is its own occurrence, ``kept_at`` the occurrence whose job stays pending
    (aware datetimes).
    """

    job_id: int
    schedule_id: int
    queue: str
    occurrence_at: datetime
    kept_at: datetime


def job_coalesce(targets: Sequence[tuple[int, str]], *, now: datetime | None = None,
                 alias: str | None = None) -> list[CoalescedJob]:
    """Cancel every pending occurrence job but the newest, per (schedule id, queue), in one statement.

    Args:
        targets: ``(schedule id, queue name)`` pairs whose queue is paused.
        now: aware datetime for ``finished_at`` and the history entry; None: the database clock.

    Returns:
        The jobs cancelled, in id order (none when each pair has one pending job or none).
    """
    if not targets:
        return []
    params = {"now": now, "schedule": [t[0] for t in targets], "queue": [t[1] for t in targets]}
    rows = sorted(_run(JOB_COALESCE, params, alias=alias).rows)
    return [CoalescedJob(job_id=r[0], schedule_id=r[1], queue=r[2], occurrence_at=r[3], kept_at=r[4]) for r in rows]


# Add to a schedule's record of the occurrences its paused queue cost it: the two counters, and
# the bounded log an operator reads in the admin (the newest %(keep)s entries, oldest first).
# Written whatever the schedule's definition is now: the jobs were cancelled or the occurrences
# skipped either way.
SCHEDULE_RECORD_PAUSED = f"""
UPDATE {SCHEDULE_TABLE} s
SET paused_skipped = s.paused_skipped + d.skipped,
    paused_coalesced = s.paused_coalesced + d.coalesced,
    paused_log = (
        SELECT coalesce(jsonb_agg(x.e ORDER BY x.n), '[]'::jsonb)
        FROM (SELECT a.e, a.n
              FROM jsonb_array_elements(s.paused_log || d.entries::jsonb) WITH ORDINALITY AS a(e, n)
              ORDER BY a.n DESC LIMIT %(keep)s) x)
FROM unnest(%(id)s::bigint[], %(skipped)s::bigint[], %(coalesced)s::bigint[], %(entries)s::text[])
     AS d(id, skipped, coalesced, entries)
WHERE s.id = d.id
RETURNING s.id
"""


@dataclass(frozen=True)
class PausedRecord:
    """What a tick did to one schedule because its queue was paused, for :func:`schedule_record_paused`.

    ``skipped``: occurrences not emitted (``when_paused="skip"``). ``coalesced``: occurrences whose
    job was superseded or never inserted (``when_paused="latest"``). ``entries``: one JSON object
    per such occurrence (``occurrence``, ``action``, ``queue``, ``job``, ``kept``, ``at``).
    """

    schedule_id: int
    skipped: int
    coalesced: int
    entries: list[dict[str, Any]]


def schedule_record_paused(items: Sequence[PausedRecord], *, keep: int = 20, alias: str | None = None) -> set[int]:
    """Add skipped and coalesced occurrences to their schedules' counters and logs, in one statement.

    Args:
        items: one :class:`PausedRecord` per schedule (ids distinct).
        keep: entries each ``paused_log`` keeps (the newest).

    Returns:
        The ids of the schedules written (a schedule deleted meanwhile is not).
    """
    if not items:
        return set()
    params: dict[str, Any] = {"id": [i.schedule_id for i in items], "skipped": [i.skipped for i in items],
                              "coalesced": [i.coalesced for i in items],
                              "entries": [_dumps(i.entries) for i in items], "keep": keep}
    return {r[0] for r in _run(SCHEDULE_RECORD_PAUSED, params, alias=alias).rows}


# Schedule.save() of an existing schedule: lock its row for the rest of the caller's transaction and
# read what the save needs to decide (the definition it may change and the scheduler's bookkeeping,
# which the save never writes back from its copy). A scheduler tick holding the row makes the save
# wait; a tick arriving during the save skips the row (SKIP LOCKED) and takes it on its next pass.
SCHEDULE_LOCK_FOR_SAVE = f"""
SELECT s.cron, s.timezone, s.enabled, s.last_occurrence_at, s.next_occurrence_at, s.skipped_occurrences,
       s.paused_skipped, s.paused_coalesced, s.paused_log
FROM {SCHEDULE_TABLE} s
WHERE s.id = %(id)s
FOR UPDATE
"""


def schedule_lock_for_save(schedule_id: int, *, alias: str | None = None) -> dict[str, Any] | None:
    """Lock one schedule row inside the caller's transaction (``FOR UPDATE``) and read it.

    Args:
        schedule_id: the schedule's primary key.

    Returns:
        ``cron``, ``timezone``, ``enabled``, ``last_occurrence_at``, ``next_occurrence_at`` (aware
        datetimes or None), ``skipped_occurrences``, ``paused_skipped``, ``paused_coalesced`` and
        ``paused_log`` (a list); None when no such row exists.
    """
    row = _run(SCHEDULE_LOCK_FOR_SAVE, {"id": schedule_id}, alias=alias).one()
    if row is None:
        return None
    keys = ("cron", "timezone", "enabled", "last_occurrence_at", "next_occurrence_at", "skipped_occurrences",
            "paused_skipped", "paused_coalesced", "paused_log")
    values = dict(zip(keys, row, strict=True))
    values["paused_log"] = _load(values["paused_log"])
    return values


# When the scheduler should wake up next: the earliest stored next occurrence of an enabled
# schedule (and whether some schedule has none yet, i.e. is due at once).
SCHEDULE_NEXT_DUE = f"""
SELECT bool_or(s.next_occurrence_at IS NULL), min(s.next_occurrence_at)
FROM {SCHEDULE_TABLE} s
WHERE s.enabled AND NOT (s.id = ANY(%(exclude)s::bigint[]))
"""


def schedule_next_due(*, exclude: Sequence[int] = (), alias: str | None = None) -> tuple[bool, datetime | None]:
    """Return ``(some enabled schedule has no next occurrence yet, earliest next occurrence or None)``,
    ignoring the schedule ids in ``exclude``."""
    pending, earliest = _run(SCHEDULE_NEXT_DUE, {"exclude": list(exclude)}, alias=alias).rows[0]
    return bool(pending), earliest


@dataclass(frozen=True)
class ScheduleDefinition:
    """A validated schedule declared in ``LEASEQUEUE_SCHEDULES``; JSON fields already encoded.

    ``next_at`` is the first occurrence after the sync's time under this definition: stored when
    the row is created, re-enabled, or its cron or time zone changes.
    """

    name: str
    task: str
    args_json: str
    kwargs_json: str
    cron: str
    timezone: str
    queue: str
    priority: int
    enabled: bool
    catch_up: str
    catch_up_limit: int
    next_at: datetime | None
    when_paused: str = "latest"


SCHEDULE_SOURCES = f"SELECT name, source FROM {SCHEDULE_TABLE} WHERE name = ANY(%(names)s::text[])"

# Upsert settings-defined schedules by name. Settings own every field they declare; the
# scheduler's bookkeeping (last occurrence, skipped count) is kept, so a re-sync never re-emits an
# occurrence (the row, hence the jobs' unique keys, stay the same). The next occurrence is replaced
# only when the cron expression or zone changed or the schedule is (re-)enabled, so a change takes
# effect from the next occurrence under the new definition and never back-fills; disabled: NULL.
# Rows whose settings did not change are not rewritten (the WHERE of DO UPDATE).
SCHEDULE_UPSERT_SETTINGS = f"""
WITH clock AS MATERIALIZED ({CLOCK})
INSERT INTO {SCHEDULE_TABLE} AS s (
    name, task, args, kwargs, cron, timezone, queue, priority, enabled, catch_up, catch_up_limit,
    last_occurrence_at, next_occurrence_at, skipped_occurrences, source, created_at, updated_at, when_paused
)
SELECT t.name, t.task, t.args::jsonb, t.kwargs::jsonb, t.cron, t.timezone, t.queue, t.priority, t.enabled,
       t.catch_up, t.catch_up_limit, NULL, CASE WHEN t.enabled THEN t.next_at END, 0, 'settings',
       clock.now, clock.now, t.when_paused
FROM clock, unnest(
    %(name)s::text[], %(task)s::text[], %(args)s::text[], %(kwargs)s::text[], %(cron)s::text[],
    %(timezone)s::text[], %(queue)s::text[], %(priority)s::smallint[], %(enabled)s::boolean[],
    %(catch_up)s::text[], %(catch_up_limit)s::int[], %(next_at)s::timestamptz[], %(when_paused)s::text[]
) AS t(name, task, args, kwargs, cron, timezone, queue, priority, enabled, catch_up, catch_up_limit, next_at,
       when_paused)
ON CONFLICT (name) DO UPDATE SET
    task = EXCLUDED.task, args = EXCLUDED.args, kwargs = EXCLUDED.kwargs, cron = EXCLUDED.cron,
    timezone = EXCLUDED.timezone, queue = EXCLUDED.queue, priority = EXCLUDED.priority,
    enabled = EXCLUDED.enabled, catch_up = EXCLUDED.catch_up, catch_up_limit = EXCLUDED.catch_up_limit,
    when_paused = EXCLUDED.when_paused, source = 'settings', updated_at = EXCLUDED.updated_at,
    next_occurrence_at = CASE
        WHEN NOT EXCLUDED.enabled THEN NULL
        WHEN s.cron IS DISTINCT FROM EXCLUDED.cron OR s.timezone IS DISTINCT FROM EXCLUDED.timezone
             OR NOT s.enabled THEN EXCLUDED.next_occurrence_at
        ELSE s.next_occurrence_at END
WHERE (s.task, s.args, s.kwargs, s.cron, s.timezone, s.queue, s.priority, s.enabled, s.catch_up,
       s.catch_up_limit, s.when_paused, s.source)
      IS DISTINCT FROM
      (EXCLUDED.task, EXCLUDED.args, EXCLUDED.kwargs, EXCLUDED.cron, EXCLUDED.timezone, EXCLUDED.queue,
       EXCLUDED.priority, EXCLUDED.enabled, EXCLUDED.catch_up, EXCLUDED.catch_up_limit, EXCLUDED.when_paused,
       'settings')
RETURNING s.name
"""

# A settings-owned schedule that is no longer declared is disabled, not deleted: its jobs and
# history stay, and declaring it again re-enables the same row (no occurrence is emitted twice).
SCHEDULE_DISABLE_UNDECLARED = f"""
WITH clock AS MATERIALIZED ({CLOCK})
UPDATE {SCHEDULE_TABLE} s
SET enabled = false, next_occurrence_at = NULL, updated_at = clock.now
FROM clock
WHERE s.source = 'settings' AND s.enabled AND NOT (s.name = ANY(%(names)s::text[]))
RETURNING s.name
"""


@dataclass(frozen=True)
class ScheduleSync:
    """What a settings sync changed (schedule names)."""

    created: list[str]
    updated: list[str]
    unchanged: list[str]
    disabled: list[str]
    taken_over: list[str]


def schedule_sync_settings(definitions: Sequence[ScheduleDefinition], *, now: datetime | None = None,
                           alias: str | None = None) -> ScheduleSync:
    """Write settings-defined schedules into the table (call inside ``transaction.atomic``).

    Creates missing ones, updates changed ones (taking over an admin-created schedule of the same
    name: settings win), and disables settings-owned schedules that are no longer declared.

    Returns:
        A :class:`ScheduleSync` listing the names per outcome.
    """
    names = [d.name for d in definitions]
    params = {
        "now": now, "names": names, "name": names,
        "task": [d.task for d in definitions], "args": [d.args_json for d in definitions],
        "kwargs": [d.kwargs_json for d in definitions], "cron": [d.cron for d in definitions],
        "timezone": [d.timezone for d in definitions], "queue": [d.queue for d in definitions],
        "priority": [d.priority for d in definitions], "enabled": [d.enabled for d in definitions],
        "catch_up": [d.catch_up for d in definitions],
        "catch_up_limit": [d.catch_up_limit for d in definitions],
        "next_at": [d.next_at for d in definitions],
        "when_paused": [d.when_paused for d in definitions],
    }
    existing = dict(_run(SCHEDULE_SOURCES, params, alias=alias).rows)
    written: list[str] = []
    if definitions:
        written = [r[0] for r in _run(SCHEDULE_UPSERT_SETTINGS, params, alias=alias).rows]
    disabled = sorted(r[0] for r in _run(SCHEDULE_DISABLE_UNDECLARED, params, alias=alias).rows)
    return ScheduleSync(
        created=sorted(n for n in written if n not in existing),
        updated=sorted(n for n in written if n in existing),
        unchanged=sorted(n for n in names if n not in written),
        disabled=disabled,
        taken_over=sorted(n for n in written if existing.get(n, "settings") != "settings"),
    )
