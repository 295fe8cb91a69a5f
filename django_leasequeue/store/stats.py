"""The outcome counters behind the console's charts (``leasequeue_job_stat``, kept by the trigger
of migration 0015): the reaper's fold and roll-up, and the read-only series and latency queries.

A read sums the rows of a window whatever their span and shard: the fold moves counts between rows
in one statement, so each event is in exactly one row at any time and a sum never counts one twice
or misses one. The reads touch this small table only, never the job table.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..models import STAT_BOUNDS
from ._db import CLOCK, STAT_TABLE, _run

#: The advisory lock (one bigint key) that one reaper holds while it folds; another reaper skips
#: the fold for that sweep instead of waiting.
STAT_FOLD_LOCK = 0x6C71_7374  # "lqst"

# Fold and roll up, one statement, under a try-lock (two reapers: one folds, the other skips):
# * minute rows of past minutes (older than 2 minutes, which no worker writes any more) move from
#   the writers' shards into shard 0;
# * whole hours of minute rows older than 61 minutes become hour rows (the minute chart shows the
#   last 60 minutes), whole days of hour rows older than 25 hours become day rows (the hourly chart
#   shows the last 24 hours);
# * days older than the retention are deleted.
# A row goes straight to its coarsest span, so no row the INSERT adds to is one the DELETE removes
# (a day's rows all go to days, or all are dropped; an hour's rows all go to hours or all to days).
# The rows are locked in key order, the order in which the trigger's upserts take them; a row a
# writer still holds (a fenced_atomic() transaction not yet committed) is skipped until a later sweep.
# The histograms are bigint arrays of len(STAT_BOUNDS) + 1 counts (JobStat): summed over rows and
# added on conflict element by element, in plain expressions (no function call per row).
_SLOTS = range(1, len(STAT_BOUNDS) + 2)


def _summed(column: str) -> str:
    return "ARRAY[" + ", ".join(f"sum({column}[{i}])" for i in _SLOTS) + "]::bigint[]"


def _added(column: str) -> str:
    return "ARRAY[" + ", ".join(f"s.{column}[{i}] + EXCLUDED.{column}[{i}]" for i in _SLOTS) + "]::bigint[]"


# The span a row belongs in now (NULL: past the retention), over the cut-offs of STAT_FOLD's ``cut``.
_TO_SPAN = ("CASE WHEN s.bucket < cut.kept_from THEN NULL "
            "WHEN s.bucket < cut.days_before THEN 86400 "
            "WHEN s.bucket < cut.hours_before THEN greatest(s.span, 3600) "
            "ELSE s.span END")
STAT_FOLD = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
lock AS MATERIALIZED (SELECT pg_try_advisory_xact_lock({STAT_FOLD_LOCK}) AS held),
cut AS MATERIALIZED (
    SELECT to_timestamp(floor(extract(epoch FROM now) / 60) * 60 - 120) AS shards_before,
           to_timestamp(floor(extract(epoch FROM now - interval '61 minutes') / 3600) * 3600) AS hours_before,
           to_timestamp(floor(extract(epoch FROM now - interval '25 hours') / 86400) * 86400) AS days_before,
           to_timestamp(floor((extract(epoch FROM now) - %(retention)s) / 86400) * 86400) AS kept_from
    FROM clock
),
planned AS MATERIALIZED (
    SELECT s.id, {_TO_SPAN} AS to_span
    FROM {STAT_TABLE} s, cut, lock
    WHERE lock.held
      AND ({_TO_SPAN} IS DISTINCT FROM s.span OR (s.shard <> 0 AND s.bucket < cut.shards_before))
    ORDER BY s.span, s.bucket, s.queue, s.task, s.shard
    FOR UPDATE OF s SKIP LOCKED
),
moved AS (
    DELETE FROM {STAT_TABLE} s USING planned p WHERE s.id = p.id
    RETURNING p.to_span, s.*
),
added AS (
    INSERT INTO {STAT_TABLE} AS s
        (bucket, span, queue, task, shard, started, done, failed, dead, cancelled,
         wait_sum, wait_hist, run_sum, run_hist)
    SELECT to_timestamp(floor(extract(epoch FROM m.bucket) / m.to_span) * m.to_span), m.to_span, m.queue, m.task, 0,
           sum(m.started), sum(m.done), sum(m.failed), sum(m.dead), sum(m.cancelled),
           sum(m.wait_sum), {_summed("m.wait_hist")}, sum(m.run_sum), {_summed("m.run_hist")}
    FROM moved m WHERE m.to_span IS NOT NULL
    GROUP BY 1, 2, 3, 4
    ORDER BY 2, 1, 3, 4
    ON CONFLICT (span, bucket, queue, task, shard) DO UPDATE
    SET started = s.started + EXCLUDED.started, done = s.done + EXCLUDED.done,
        failed = s.failed + EXCLUDED.failed, dead = s.dead + EXCLUDED.dead,
        cancelled = s.cancelled + EXCLUDED.cancelled,
        wait_sum = s.wait_sum + EXCLUDED.wait_sum, wait_hist = {_added("wait_hist")},
        run_sum = s.run_sum + EXCLUDED.run_sum, run_hist = {_added("run_hist")}
    RETURNING 1
)
SELECT (SELECT held FROM lock), (SELECT count(*) FROM moved), (SELECT count(*) FROM moved WHERE to_span IS NULL),
       (SELECT count(*) FROM added)
"""


@dataclass(frozen=True)
class StatFold:
    """Outcome of :func:`stat_fold`.

    Attributes:
        locked (bool): this call held the fold lock (False: another reaper was folding; nothing done).
        moved (int): counter rows taken out (folded, rolled up or expired).
        expired (int): of those, rows deleted as older than the retention.
        written (int): counter rows written (added to or created).
    """

    locked: bool
    moved: int
    expired: int
    written: int


def stat_fold(*, retention: float, now: datetime | None = None, alias: str | None = None) -> StatFold:
    """Fold writers' shards into shard 0, roll minute rows into hours and hours into days, and
    delete days older than ``retention``, in one statement.

    Args:
        retention: seconds of counters to keep (``STATS_RETENTION``; whole days are kept).
        now: aware datetime instead of the database clock (tests).

    Returns:
        :class:`StatFold`.
    """
    held, moved, expired, written = _run(STAT_FOLD, {"now": now, "retention": float(retention)},
                                         alias=alias).rows[0]
    return StatFold(bool(held), int(moved), int(expired), int(written))


# Outcome counts per bucket of ``span`` seconds, from ``since`` on, optionally for one queue: every
# row of a span up to ``span`` is mapped to the bucket that holds its start (UTC epoch bins).
STAT_SERIES = f"""
SELECT to_timestamp(floor(extract(epoch FROM s.bucket) / %(span)s) * %(span)s) AS b,
       sum(s.started), sum(s.done), sum(s.failed), sum(s.dead), sum(s.cancelled)
FROM {STAT_TABLE} s
WHERE s.bucket >= %(since)s AND s.span <= %(span)s AND (%(queue)s::text IS NULL OR s.queue = %(queue)s)
GROUP BY 1 ORDER BY 1
"""


@dataclass(frozen=True)
class StatPoint:
    """Outcome counts of one bucket (see :class:`~django_leasequeue.models.JobStat`)."""

    bucket: datetime
    started: int
    done: int
    failed: int
    dead: int
    cancelled: int


def stat_series(*, span: int, since: datetime, queue: str | None = None,
                alias: str | None = None) -> list[StatPoint]:
    """Outcome counts per bucket of ``span`` seconds from ``since`` (an aware datetime at a bucket
    start) on; buckets without events are absent.

    Args:
        span: 60, 3600 or 86400.
        since: aware datetime, the first bucket's start.
        queue: one queue's counts; None: all queues.

    Returns:
        :class:`StatPoint` list in bucket order.
    """
    rows = _run(STAT_SERIES, {"span": int(span), "since": since, "queue": queue}, alias=alias).rows
    return [StatPoint(r[0], int(r[1]), int(r[2]), int(r[3]), int(r[4]), int(r[5])) for r in rows]


# Totals and merged histograms per queue and task from ``since`` on (any span): one hash aggregate.
STAT_LATENCY = f"""
SELECT s.queue, s.task, sum(s.started), sum(s.done), sum(s.failed), sum(s.dead), sum(s.cancelled),
       sum(s.wait_sum), {_summed("s.wait_hist")}, sum(s.run_sum), {_summed("s.run_hist")}
FROM {STAT_TABLE} s
WHERE s.bucket >= %(since)s AND (%(queue)s::text IS NULL OR s.queue = %(queue)s)
GROUP BY 1, 2 ORDER BY 1, 2
"""


@dataclass(frozen=True)
class StatTotals:
    """Totals of one queue and task over a window, with the wait and run histograms
    (``{bucket index: count}`` over :data:`~django_leasequeue.models.STAT_BOUNDS`)."""

    queue: str
    task: str
    started: int
    done: int
    failed: int
    dead: int
    cancelled: int
    wait_sum: float
    wait_hist: dict[int, int]
    run_sum: float
    run_hist: dict[int, int]


def _hist(sums: list[Any]) -> dict[int, int]:
    """The summed histogram of STAT_LATENCY as a sparse one, ``{index: count}`` (empty buckets left out)."""
    return {i: int(n) for i, n in enumerate(sums) if n}


def stat_totals(*, since: datetime, queue: str | None = None, alias: str | None = None) -> list[StatTotals]:
    """Totals per queue and task from ``since`` (an aware datetime) on, with merged histograms.

    Args:
        since: aware datetime; rows whose bucket starts at or after it count.
        queue: one queue; None: all queues.

    Returns:
        :class:`StatTotals` list ordered by queue, then task.
    """
    rows = _run(STAT_LATENCY, {"since": since, "queue": queue}, alias=alias).rows
    return [StatTotals(r[0], r[1], int(r[2]), int(r[3]), int(r[4]), int(r[5]), int(r[6]), float(r[7]),
                       _hist(r[8]), float(r[9]), _hist(r[10])) for r in rows]
