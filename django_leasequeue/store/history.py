"""Time-partitioned history (``LEASEQUEUE["HISTORY"]``, off by default; docs/howto/history.md).

Done jobs move, a batch per statement, from the hot table ``leasequeue_job`` into
``leasequeue_job_history``, a table range-partitioned on ``finished_at`` (one partition per hour
or per day, created ahead by the maintenance). Retention of the moved jobs is then a DROP of a
whole partition instead of a DELETE per row: no dead tuples, no index entries to walk, no vacuum.
The hot table keeps only what the queue works on (ready, waiting and leased jobs), the finished
jobs something may still write or look up by key (below), and the done jobs of the last
``HISTORY_MOVE_AFTER`` seconds: its heap and indexes stay bounded by the traffic of that window,
whatever has passed through.

What stays in the hot table, and why (the ordinary pruner deletes it at ``RETENTION``):

* dead and cancelled jobs: an operator replays them from the admin, and a dead job may hold its
  sequence; only ``done`` jobs move;
* a job with a ``retained`` unique key: the key must keep refusing duplicates while the job
  exists, and the unique index that enforces it is the hot table's;
* a member of a workflow, a job other jobs depend on, and a job with dependency edges of its own:
  the workflow's counters, results and callbacks, and the edges, read them in the hot table.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import connections, transaction

from ..models import Job
from ._db import _JOB_COLUMN_LIST, JOB_TABLE, SWEEP_TABLE, _jobs_from_rows, _run, db_alias, db_now
from .maintenance import PRUNE_FULL_PASS_EVERY, _place_save_sql
from .workflows import DEPENDENCY_TABLE

#: The partitioned parent (migration 0020).
HISTORY_TABLE = "leasequeue_job_history"

#: The partition sizes ``LEASEQUEUE["HISTORY"]`` accepts.
HISTORY_PERIODS: dict[str, timedelta] = {"hour": timedelta(hours=1), "day": timedelta(days=1)}

#: Partitions created ahead of the one that holds the current time, so that a job finishing right
#: after a period begins has its partition even when the maintenance has not run for a while.
PARTITIONS_AHEAD = 2

# How long the maintenance waits for the history table's lock when it creates or drops a
# partition (both take an ACCESS EXCLUSIVE lock on the parent for a moment). A reader holding the
# parent longer (a long report) makes that step fail and wait for the next maintenance, rather
# than queue every later reader and mover behind it.
PARTITION_LOCK_TIMEOUT = "5s"

# Our partitions are named after the start of their period, UTC: leasequeue_job_history_p20261207
# (a day) or leasequeue_job_history_p2026120719 (an hour). Other tables attached by hand are left
# alone: neither counted as coverage nor dropped.
_NAME = re.compile(rf"^{HISTORY_TABLE}_p(\d{{8}})(\d{{2}})?$")

_PARTITIONS = f"""
SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = '{HISTORY_TABLE}'::regclass
"""

# Serialises the partition changes of two maintenances (a runreaper --once from cron beside the
# elected worker): CREATE TABLE IF NOT EXISTS is not safe against a concurrent creator.
_LOCK = f"SELECT pg_advisory_xact_lock(hashtext('{HISTORY_TABLE}'))"


@dataclass(frozen=True, order=True)
class HistoryPartition:
    """One partition of the history table: rows with ``lower <= finished_at < upper``."""

    lower: datetime
    upper: datetime
    name: str


def _partition_of(name: str) -> HistoryPartition | None:
    match = _NAME.match(name)
    if match is None:
        return None
    day, hour = match.groups()
    lower = datetime.strptime(day, "%Y%m%d").replace(tzinfo=UTC)
    if hour is None:
        return HistoryPartition(lower, lower + HISTORY_PERIODS["day"], name)
    lower += timedelta(hours=int(hour))
    return HistoryPartition(lower, lower + HISTORY_PERIODS["hour"], name)


def _period_start(at: datetime, period: str) -> datetime:
    at = at.astimezone(UTC)
    if period == "day":
        return at.replace(hour=0, minute=0, second=0, microsecond=0)
    return at.replace(minute=0, second=0, microsecond=0)


def _partition_name(lower: datetime, period: str) -> str:
    return f"{HISTORY_TABLE}_p{lower.strftime('%Y%m%d%H' if period == 'hour' else '%Y%m%d')}"


def history_partitions(*, alias: str | None = None) -> list[HistoryPartition]:
    """The partitions of the history table this package made, oldest first.

    Args:
        alias: database alias; default the job table's.

    Returns:
        One :class:`HistoryPartition` per partition named by this package (others are ignored).
    """
    found = (_partition_of(str(r[0])) for r in _run(_PARTITIONS, alias=alias).rows)
    return sorted(p for p in found if p is not None)


def _period_of(period: str) -> timedelta:
    try:
        return HISTORY_PERIODS[period]
    except KeyError:
        raise ValueError(f"history period must be one of {sorted(HISTORY_PERIODS)}, got {period!r}") from None


def history_ensure_partitions(period: str, *, back: float | None, ahead: int = PARTITIONS_AHEAD,
                              now: datetime | None = None, alias: str | None = None) -> list[str]:
    """Create the missing partitions from the one holding ``now - back`` to ``ahead`` periods
    after the one holding ``now``.

    A period that overlaps a partition already there (made with the other period size, before a
    change of ``HISTORY``) is not created; :func:`history_move` moves only into covered time.

    Args:
        period: ``"hour"`` or ``"day"``.
        back: seconds before ``now`` to cover (``RETENTION``: the jobs finished since then may
            still be moved); None: from the current period.
        ahead: periods after the current one.
        now: aware datetime instead of the database clock (tests).
        alias: database alias; default the job table's.

    Returns:
        The names of the partitions created.

    Raises:
        ValueError: ``period`` is not ``"hour"`` or ``"day"``, or ``ahead`` below 0.
        django.db.OperationalError: the history table stayed locked longer than
            :data:`PARTITION_LOCK_TIMEOUT` (nothing created; the next maintenance tries again).
    """
    step = _period_of(period)
    if ahead < 0:
        raise ValueError(f"ahead must be 0 or more periods, got {ahead!r}")
    alias = alias or db_alias()
    now = now or db_now(alias)
    first = _period_start(now - timedelta(seconds=back) if back is not None else now, period)
    last = _period_start(now, period) + ahead * step
    created: list[str] = []
    with transaction.atomic(using=alias), connections[alias].cursor() as cur:
        cur.execute(_LOCK)
        cur.execute(f"SET LOCAL lock_timeout = '{PARTITION_LOCK_TIMEOUT}'")
        existing = history_partitions(alias=alias)
        lower = first
        while lower <= last:
            upper = lower + step
            if not any(p.lower < upper and lower < p.upper for p in existing):
                name = _partition_name(lower, period)
                # Bounds written as literals (computed here, UTC ISO 8601): DDL takes no bound
                # parameters when the connection binds server-side.
                cur.execute(f"CREATE TABLE {name} PARTITION OF {HISTORY_TABLE} FOR VALUES "
                            f"FROM ('{lower.isoformat()}') TO ('{upper.isoformat()}')")
                created.append(name)
            lower = upper
    return created


def history_drop_partitions(*, older_than: float, now: datetime | None = None,
                            alias: str | None = None) -> list[str]:
    """Detach and drop the partitions whose every row finished more than ``older_than`` seconds
    ago (their upper bound is at or before ``now - older_than``).

    Args:
        older_than: seconds (``RETENTION``).
        now: aware datetime instead of the database clock (tests).
        alias: database alias; default the job table's.

    Returns:
        The names of the partitions dropped, oldest first.

    Raises:
        ValueError: ``older_than`` below 0.
        django.db.OperationalError: the history table stayed locked longer than
            :data:`PARTITION_LOCK_TIMEOUT` (nothing dropped; the next maintenance tries again).
    """
    if not older_than >= 0:
        raise ValueError(f"older_than must be 0 or more seconds, got {older_than!r}")
    alias = alias or db_alias()
    now = now or db_now(alias)
    cutoff = now - timedelta(seconds=older_than)
    dropped: list[str] = []
    with transaction.atomic(using=alias), connections[alias].cursor() as cur:
        cur.execute(_LOCK)
        cur.execute(f"SET LOCAL lock_timeout = '{PARTITION_LOCK_TIMEOUT}'")
        for part in history_partitions(alias=alias):
            if part.upper <= cutoff:
                # Detach, then drop, in this transaction: the parent is locked (ACCESS EXCLUSIVE)
                # for these two catalog changes only; no row is read or deleted one by one.
                cur.execute(f"ALTER TABLE {HISTORY_TABLE} DETACH PARTITION {part.name}")
                cur.execute(f"DROP TABLE {part.name}")
                dropped.append(part.name)
    return dropped


def history_window(partitions: Sequence[HistoryPartition], *, now: datetime, after: float,
                   retention: float | None) -> tuple[datetime, datetime] | None:
    """The finish times a move may take: ``[lower, upper)`` inside one unbroken run of
    partitions, with ``upper`` at most ``now - after`` and ``lower`` at least ``now - retention``
    (older jobs are the pruner's: their partition may be dropped at any moment).

    Args:
        partitions: the history table's partitions (:func:`history_partitions`).
        now: the database time (aware datetime).
        after: seconds a done job stays in the hot table (``HISTORY_MOVE_AFTER``).
        retention: seconds (``RETENTION``), or None (kept for ever).

    Returns:
        The window, or None when no partition holds ``now - after``.
    """
    newest = now - timedelta(seconds=after)
    runs: list[list[datetime]] = []
    for part in sorted(partitions):
        if runs and runs[-1][1] == part.lower:
            runs[-1][1] = part.upper
        else:
            runs.append([part.lower, part.upper])
    for lower, upper in runs:
        if lower <= newest < upper:
            if retention is not None:
                lower = max(lower, now - timedelta(seconds=retention))
            return (lower, newest) if lower < newest else None
    return None


# Which done jobs may leave the hot table (the module docstring says why the others stay). Each
# test reads the candidate row itself, but for the edges: one probe of the dependency table's
# (job_id, depends_on_id) unique index.
_MOVABLE = f"""NOT (j.unique_key IS NOT NULL AND j.unique_scope = 'retained')
      AND j.workflow_id IS NULL AND NOT j.has_dependents
      AND NOT EXISTS (SELECT 1 FROM {DEPENDENCY_TABLE} d WHERE d.job_id = j.id)"""

_HISTORY_COLUMNS = _JOB_COLUMN_LIST
_MOVED_COLUMNS = ", ".join(f"g.{c}" for c in _JOB_COLUMN_LIST.split(", "))

# Move up to %(limit)s done jobs finished in [%(from_at)s, %(upper)s) (from the row (from_at,
# from_id) on) into the history table, in one statement: the DELETE's RETURNING feeds the INSERT,
# so a job is either still in the hot table or in history, never both or neither, whatever
# commits or aborts (an INSERT that finds no partition for a row fails the whole statement, and
# nothing moves).
#
# The candidates are read like the pruner's (store.JOB_PRUNE): an ordered walk of
# leasequeue_job_finished (status, finished_at, id) from the keyset start, stopping at the upper
# bound; only the rows picked are then locked, by the ctid found (no second walk of the primary
# key), SKIP LOCKED, with the status re-checked under the lock. A row changed since it was read
# has a new ctid, and the lock's re-check of "ctid = ANY(...)" on the new version fails, so it is
# passed over: an operator's edit, a late result or a replay is never overwritten by an old copy.
# The statement returns the count and the first row moved: the next batch starts there (see
# JOB_PRUNE for why at its first row rather than after its last).
HISTORY_MOVE = f"""
WITH candidates AS MATERIALIZED (
    SELECT j.ctid FROM {JOB_TABLE} j
    WHERE j.status = 'done'
      AND (j.finished_at, j.id) >= (%(from_at)s::timestamptz, %(from_id)s::bigint)
      AND j.finished_at < %(upper)s::timestamptz
      AND {_MOVABLE}
    ORDER BY j.finished_at, j.id
    LIMIT %(limit)s
),
picked AS MATERIALIZED (
    SELECT j.ctid FROM {JOB_TABLE} j
    WHERE j.ctid = ANY(ARRAY(SELECT ctid FROM candidates)) AND j.status = 'done'
    FOR UPDATE OF j SKIP LOCKED
),
moved AS (
    DELETE FROM {JOB_TABLE} g WHERE g.ctid = ANY(ARRAY(SELECT ctid FROM picked))
    RETURNING {_MOVED_COLUMNS}
),
stored AS (
    INSERT INTO {HISTORY_TABLE} ({_HISTORY_COLUMNS}) SELECT {_HISTORY_COLUMNS} FROM moved
    RETURNING finished_at, id
),
first AS MATERIALIZED (
    SELECT finished_at, id FROM stored ORDER BY finished_at, id LIMIT 1
)
SELECT (SELECT count(*) FROM stored), (SELECT finished_at FROM first), (SELECT id FROM first)
"""


@dataclass(frozen=True)
class Moved:
    """What one :func:`history_move` statement did."""

    #: Jobs moved into the history table.
    count: int
    #: The first job moved, in (finished_at, id) order (None when none moved): the next batch's start.
    first_at: datetime | None
    first_id: int | None


def history_move(*, lower: datetime, upper: datetime, from_id: int = 0, limit: int = 1000,
                 alias: str | None = None) -> Moved:
    """Move up to ``limit`` done jobs finished in ``[lower, upper)`` from the hot table into the
    history table, in (finished_at, id) order from the row ``(lower, from_id)`` on.

    Only jobs nothing still reads in the hot table move (see the module docstring). The time
    range must lie in the history table's partitions (:func:`history_window`), else the
    statement fails and moves nothing.

    Args:
        lower: aware datetime; the earliest finish time (with ``from_id``, the keyset start).
        upper: aware datetime; jobs finished at or after it stay.
        from_id: the smallest id taken at finish time ``lower`` (the previous batch's first row).
        limit: most jobs moved by this statement.
        alias: database alias; default the job table's.

    Returns:
        A :class:`Moved`: the count and the first job moved.

    Raises:
        ValueError: ``limit`` below 1.
    """
    if limit < 1:
        raise ValueError(f"limit must be 1 or more, got {limit!r}")
    count, first_at, first_id = _run(HISTORY_MOVE, {"from_at": lower, "from_id": from_id, "upper": upper,
                                                    "limit": limit}, alias=alias).one()
    return Moved(int(count), first_at, first_id)


# The mover's place, kept in the one-row sweep record like the pruner's (store.JOB_PRUNE_SAVE, and
# see JOB_PRUNE for why there and not in the process): the pass it belongs to, and the first row
# the last batch moved. A maintenance continues from it, so it does not walk again the index
# entries of what earlier maintenances moved (until vacuum removes them) nor the done jobs that
# stay (a retained unique key, a workflow member), which may be many. Rows passed over (locked at
# that moment, finished behind the place by a clock set back) are found by the next pass, which
# starts at the bottom of the window every PRUNE_FULL_PASS_EVERY seconds.
HISTORY_PLACE = f"""
SELECT history_pass_started_at, history_from_finished_at, history_from_id FROM {SWEEP_TABLE} WHERE id = 1
"""

# Within a pass the place only moves forward (two maintenances at once: the furthest wins); a new
# pass (%(restart)s) sets it outright, NULL (the bottom) when it moved nothing. Only if the pass is
# still the one the maintenance read (%(pass_read)s): when another one began a new pass
# meanwhile, its place stands. Before any sweep the row does not exist: it is created "never swept".
HISTORY_PLACE_SAVE = _place_save_sql("history")


@dataclass(frozen=True)
class HistoryRun:
    """What one :func:`history_maintain` did."""

    created: list[str]
    moved: int
    dropped: list[str]


def _move_window(lower: datetime, upper: datetime, batch: int, *, start: tuple[datetime, int],
                 alias: str) -> tuple[int, tuple[datetime, int] | None]:
    """Move batches from ``start`` until one comes back short; the count and the first row of the
    last batch that moved any (the next start), or None when none moved."""
    moved, place = 0, None
    at, from_id = start
    while True:
        step = history_move(lower=at, upper=upper, from_id=from_id, limit=batch, alias=alias)
        moved += step.count
        if step.first_at is None or step.first_id is None:
            return moved, place
        place = (step.first_at, step.first_id)
        if step.count < batch:
            return moved, place
        at, from_id = place


def history_maintain(period: str, *, move_after: float, retention: float | None, batch: int = 1000,
                     full_pass_every: float = PRUNE_FULL_PASS_EVERY, now: datetime | None = None,
                     alias: str | None = None) -> HistoryRun:
    """One maintenance of the history: create the partitions ahead (and back to ``RETENTION``),
    move every movable done job finished more than ``move_after`` seconds ago, a batch per
    statement, then drop the partitions past ``retention``.

    The move continues from the place the last maintenance recorded in the sweep record
    (whichever process ran it); every ``full_pass_every`` seconds a pass starts again from the
    bottom of the window, which moves the jobs passed over since.

    Args:
        period: ``"hour"`` or ``"day"`` (``HISTORY``).
        move_after: seconds a done job stays in the hot table (``HISTORY_MOVE_AFTER``).
        retention: seconds (``RETENTION``); None: partitions are never dropped.
        batch: jobs per move statement (``PRUNE_BATCH``).
        full_pass_every: seconds between two passes from the bottom of the window.
        now: aware datetime instead of the database clock (tests).
        alias: database alias; default the job table's.

    Returns:
        A :class:`HistoryRun`: partitions created and dropped, jobs moved.

    Raises:
        ValueError: ``period`` is not ``"hour"`` or ``"day"``.
        django.db.DatabaseError: a partition could not be created or dropped (the history table
            locked past :data:`PARTITION_LOCK_TIMEOUT`, a partition attached by hand where ours
            goes), or a moved row found no partition: that step changed nothing.
    """
    alias = alias or db_alias()
    now = now or db_now(alias)
    created = history_ensure_partitions(period, back=retention, now=now, alias=alias)
    moved = 0
    window = history_window(history_partitions(alias=alias), now=now, after=move_after, retention=retention)
    if window is not None:
        lower, upper = window
        pass_read, from_at, from_id = _run(HISTORY_PLACE, alias=alias).one() or (None, None, None)
        restart = (pass_read is None or pass_read > now
                   or pass_read <= now - timedelta(seconds=full_pass_every))
        start = (lower, 0)
        if not restart and from_at is not None and from_id is not None and (from_at, from_id) > start:
            start = (from_at, int(from_id))
        moved, place = _move_window(lower, upper, batch, start=start, alias=alias)
        if restart or place is not None:
            _run(HISTORY_PLACE_SAVE, {"restart": restart, "pass_read": pass_read,
                                      "pass_at": now if restart else pass_read,
                                      "from_at": place[0] if place else None,
                                      "from_id": place[1] if place else None}, alias=alias)
    dropped = history_drop_partitions(older_than=retention, now=now, alias=alias) if retention is not None else []
    return HistoryRun(created, moved, dropped)


# A moved job by id: the history table's index on id, one probe per partition. Read only after
# the hot table had no such job (store.job_get), so the common lookups cost nothing more.
HISTORY_GET = f"SELECT {_HISTORY_COLUMNS} FROM {HISTORY_TABLE} WHERE id = %(id)s LIMIT 1"


def history_get(job_id: int, *, alias: str | None = None) -> Job | None:
    """Return the moved job ``job_id`` from the history table as a :class:`Job` (read only), or None.

    Args:
        job_id: the job's id.
        alias: database alias; default the job table's.
    """
    alias = alias or db_alias()
    jobs = _jobs_from_rows(_run(HISTORY_GET, {"id": job_id}, alias=alias).rows, alias)
    return jobs[0] if jobs else None


# A late result (store.job_set_result) for a done job that has moved meanwhile: the same fence as
# in the job table (the token and 'done'). A moved job is in no workflow and has no dependents
# (they stay in the job table), so none of JOB_SET_RESULT's notes about released dependents apply.
# Read only after the job table had no such row: a mover that was deleting it has committed by
# then (the job table's UPDATE waited for its lock), and this statement's snapshot sees the row in
# the history.
HISTORY_SET_RESULT = f"""
UPDATE {HISTORY_TABLE} SET result = %(result)s::jsonb
WHERE id = %(id)s AND lease_version = %(version)s AND status = 'done'
"""


def history_set_result(job_id: int, version: int, result_json: str, *, alias: str | None = None) -> bool:
    """Record ``result_json`` as the result of the moved job ``job_id``, done under token ``version``.

    Returns:
        True when written; False when the history has no such job done under that token.
    """
    written: int = _run(HISTORY_SET_RESULT, {"id": job_id, "version": version, "result": result_json},
                        alias=alias).rowcount
    return written == 1
