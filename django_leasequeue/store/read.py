"""Monitoring's read-only queries: the health snapshot (queues, processes, workflows), the lease
report, and one job by primary key.

Every statement here only reads: plain ``SELECT``, no locks and no writes (a test in
``tests/test_architecture.py`` checks it). The health statements run through :func:`read_cursor`,
which shares one REPEATABLE READ snapshot between them and turns JIT compilation off.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from django.db import connections, transaction

from ..models import Dependency, Job, Schedule, Workflow
from ._db import (
    _JOB_COLUMN_LIST,
    CLOCK,
    JOB_TABLE,
    NEVER_SWEPT,
    PROCESS_TABLE,
    QUEUE_TABLE,
    STAT_TABLE,
    SWEEP_TABLE,
    _jobs_from_rows,
    _run,
    db_alias,
)
from .history import history_get

# Queue figures in one statement, so every count is from the same snapshot and the same clock
# reading. Each CTE's WHERE names exactly one status (or the finished ones), so PostgreSQL can
# answer it from the matching partial index instead of the whole table:
#   ready  -> leasequeue_job_ready (queue, priority, run_at, id) WHERE status = 'ready'
#   leased -> leasequeue_job_leased WHERE status = 'leased' (few rows: running jobs)
#   waiting -> leasequeue_job_waiting (queue) WHERE status = 'waiting' (dependencies not finished)
#   dead -> leasequeue_job_dead (queue, finished_at) WHERE status = 'dead' (index-only)
# The done and dead counts of the recent windows come from the chart counters (leasequeue_job_stat,
# store/stats.py), not from the finished rows: a replayed dead letter is no longer dead, and
# counting rows would lower "dead in the last 5 minutes" after the fact; the counters also cost the
# same at any throughput. They are counted in whole buckets: the minutes (hours, past the last
# hour) that started within the window (now - w, now], the current one included, the same buckets
# as the console's charts (the last hour is the 60 bars of the minute chart).
QUEUE_STATS = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
ready AS (
    SELECT j.queue,
           count(*) FILTER (WHERE j.run_at <= c.now) AS ready_due,
           count(*) FILTER (WHERE j.run_at > c.now) AS scheduled,
           min(j.run_at) FILTER (WHERE j.run_at <= c.now) AS oldest_due
    FROM {JOB_TABLE} j, clock c
    WHERE j.status = 'ready' AND (%(queues)s::text[] IS NULL OR j.queue = ANY(%(queues)s::text[]))
    GROUP BY j.queue
),
leased AS (
    SELECT j.queue, count(*) AS leased, count(*) FILTER (WHERE j.leased_until < c.now) AS expired
    FROM {JOB_TABLE} j, clock c
    WHERE j.status = 'leased' AND (%(queues)s::text[] IS NULL OR j.queue = ANY(%(queues)s::text[]))
    GROUP BY j.queue
),
waiting AS (
    SELECT j.queue, count(*) AS waiting
    FROM {JOB_TABLE} j
    WHERE j.status = 'waiting' AND (%(queues)s::text[] IS NULL OR j.queue = ANY(%(queues)s::text[]))
    GROUP BY j.queue
),
dead AS (
    SELECT j.queue, count(*) AS dead
    FROM {JOB_TABLE} j
    WHERE j.status = 'dead' AND (%(queues)s::text[] IS NULL OR j.queue = ANY(%(queues)s::text[]))
    GROUP BY j.queue
),
recent AS (
    SELECT s.queue,
           sum(s.done) FILTER (WHERE s.bucket > c.now - make_interval(secs => %(short)s)) AS done_short,
           sum(s.dead) FILTER (WHERE s.bucket > c.now - make_interval(secs => %(short)s)) AS dead_short,
           sum(s.done) FILTER (WHERE s.bucket > c.now - make_interval(secs => %(long)s)) AS done_long,
           sum(s.dead) FILTER (WHERE s.bucket > c.now - make_interval(secs => %(long)s)) AS dead_long
    FROM {STAT_TABLE} s, clock c
    WHERE s.bucket > c.now - make_interval(secs => %(widest)s) AND s.bucket <= c.now
      AND (%(queues)s::text[] IS NULL OR s.queue = ANY(%(queues)s::text[]))
    GROUP BY s.queue
),
names AS (
    SELECT queue FROM ready UNION SELECT queue FROM leased UNION SELECT queue FROM dead
    UNION SELECT queue FROM waiting UNION SELECT queue FROM recent
    UNION SELECT name FROM {QUEUE_TABLE} WHERE %(queues)s::text[] IS NULL OR name = ANY(%(queues)s::text[])
    UNION SELECT unnest(%(always)s::text[])
)
SELECT c.now, n.queue,
       coalesce(r.ready_due, 0), coalesce(r.scheduled, 0), coalesce(l.leased, 0), coalesce(d.dead, 0),
       coalesce(greatest(extract(epoch FROM c.now - r.oldest_due), 0), 0)::float8,
       coalesce(x.done_short, 0)::bigint, coalesce(x.dead_short, 0)::bigint, coalesce(x.done_long, 0)::bigint,
       coalesce(x.dead_long, 0)::bigint,
       coalesce(q.paused, false), coalesce(l.expired, 0), coalesce(w.waiting, 0), sw.age, sw.tick
FROM clock c
-- Seconds since any process last swept expired leases (workers sweep too, unless --no-reaper),
-- by the real clock the sweep stamps it with; null: no sweep ever ran (no row, or the NEVER_SWEPT
-- a scheduler's tick writes into a row no sweep has written yet). And the last scheduler tick
-- (database clock), which outlives the scheduler's process row.
LEFT JOIN (SELECT CASE WHEN last_sweep_at <> {NEVER_SWEPT}
                       THEN greatest(extract(epoch FROM clock_timestamp() - last_sweep_at), 0)::float8 END AS age,
                  scheduler_tick_at AS tick
           FROM {SWEEP_TABLE} WHERE id = 1) sw ON true
LEFT JOIN names n ON true
LEFT JOIN ready r ON r.queue = n.queue
LEFT JOIN leased l ON l.queue = n.queue
LEFT JOIN dead d ON d.queue = n.queue
LEFT JOIN waiting w ON w.queue = n.queue
LEFT JOIN recent x ON x.queue = n.queue
LEFT JOIN {QUEUE_TABLE} q ON q.name = n.queue
ORDER BY n.queue
"""

# The process registry is small (stale rows are pruned); "alive" is judged in Python against the
# clock reading of QUEUE_STATS so both statements agree on "now".
# Stuck handlers come from the job rows, not from the worker's memory (monitoring runs in another
# process): a leased job whose history has a ``timed_out`` entry for its current fencing token is
# a handler past its task's timeout that is still running (thread mode cannot stop it). Only the
# few leased rows are read (leasequeue_job_leased).
TIMED_OUT_NOW = "e->>'event' = 'timed_out' AND e->>'token' = j.lease_version::text"
PROCESSES = f"""
SELECT p.id, p.kind, p.host, p.pid, p.queues, p.concurrency, p.started_at, p.last_heartbeat_at, p.last_tick_at,
       coalesce(s.stuck, 0), s.since, p.reaps
FROM {PROCESS_TABLE} p
LEFT JOIN LATERAL (
    SELECT count(*) AS stuck, min((e->>'at')::timestamptz) AS since
    FROM {JOB_TABLE} j, jsonb_array_elements(j.history) e
    WHERE j.status = 'leased' AND j.leased_by = p.id
      AND {TIMED_OUT_NOW}
) s ON true
ORDER BY p.kind, p.id
"""

# Per task over a window: runtime percentiles of done jobs (finished_at - attempted_at: the
# successful attempt only, from its claim to its completion, by database time), outcomes, lease
# losses (the reaper's LeaseExpired error entries) and fence rejections (the lease_lost notes a
# still-running worker leaves in the job's history, see ``lease.job_note_lease_lost``). The rows are
# the jobs finished in the window (leasequeue_job_finished) plus the leased ones
# (leasequeue_job_leased); jobs waiting for a retry are counted once they finish.
_LEASE_ROW = f"""
    SELECT j.task, j.status,
           CASE WHEN j.status = 'done' AND j.attempted_at IS NOT NULL
                THEN extract(epoch FROM j.finished_at - j.attempted_at)::float8 END AS secs,
           CASE WHEN j.errors = '[]'::jsonb THEN 0 ELSE (
               SELECT count(*) FROM jsonb_array_elements(j.errors) AS e
               WHERE e->>'type' = 'LeaseExpired' AND (e->>'at')::timestamptz > c.since) END AS expired,
           CASE WHEN j.history = '[]'::jsonb THEN 0 ELSE (
               SELECT count(*) FROM jsonb_array_elements(j.history) AS h
               WHERE h->>'event' = 'lease_lost' AND (h->>'at')::timestamptz > c.since) END AS rejected,
           CASE WHEN j.history = '[]'::jsonb THEN 0 ELSE (
               SELECT count(*) FROM jsonb_array_elements(j.history) AS h
               WHERE h->>'event' = 'lease_lost' AND (h->>'at')::timestamptz > c.since
                 AND NOT coalesce((h->>'timed_out')::boolean, false)) END AS healthy
    FROM {JOB_TABLE} j, clock c
"""
LEASE_REPORT = f"""
WITH clock AS MATERIALIZED (
    SELECT now, now - make_interval(secs => %(window)s) AS since
    FROM ({CLOCK}) AS t
),
recent AS (
    {_LEASE_ROW}
    WHERE j.status IN ('done', 'dead') AND j.finished_at > c.since AND j.finished_at <= c.now
      AND (%(tasks)s::text[] IS NULL OR j.task = ANY(%(tasks)s::text[]))
    UNION ALL
    {_LEASE_ROW}
    WHERE j.status = 'leased' AND (%(tasks)s::text[] IS NULL OR j.task = ANY(%(tasks)s::text[]))
)
SELECT task, count(*) FILTER (WHERE status = 'done'), count(*) FILTER (WHERE status = 'dead'),
       percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY secs), max(secs),
       sum(expired)::bigint, sum(rejected)::bigint, sum(healthy)::bigint
FROM recent
GROUP BY task
ORDER BY task
"""


_WORKFLOW_TABLE = Workflow._meta.db_table
_DEPENDENCY_TABLE = Dependency._meta.db_table

# The workflows that stopped making progress, in one row. A workflow is unfinished while
# finished_at is null (an open batch included: nobody has closed it), and stuck when it is
# unfinished and its progressed_at (set by the settle trigger when a member or callback settles,
# by adding members and by closing; never null, created_at is its first value) is older than the
# threshold by the snapshot's clock. An open batch nobody adds to or closes is therefore stuck
# like a chain whose dead step nobody replays: both are work that silently stopped. Both counts
# and the oldest stuck row come from the partial index leasequeue_workflow_active (progressed_at)
# WHERE finished_at IS NULL: finished workflows, however many are kept, are never read.
# For the oldest stuck workflow only, the LATERAL names the likely cause: the lowest-id dead or
# cancelled job that holds one of its waiting jobs (an unresolved dependency edge), or a failed
# member holding its waiting on_success callback once no member is pending (the hold policy).
# It reads that workflow's jobs through leasequeue_job_workflow and their edges through the
# edge index, and does nothing when no workflow is stuck (o.id is null). snapshot_rows() passes
# QUEUE_STATS's clock reading as now, so both statements judge by the same instant.
WORKFLOW_STATS = f"""
WITH clock AS MATERIALIZED (
    SELECT now, now - make_interval(secs => %(stuck_after)s) AS cutoff FROM ({CLOCK}) AS t
),
active AS (
    SELECT count(*) AS unfinished, count(*) FILTER (WHERE w.progressed_at < c.cutoff) AS stuck
    FROM {_WORKFLOW_TABLE} w, clock c
    WHERE w.finished_at IS NULL
),
oldest AS (
    SELECT w.id, w.kind, w.name, w.progressed_at, w.closed_at, w.members, w.members_pending, w.on_success_id
    FROM {_WORKFLOW_TABLE} w, clock c
    WHERE w.finished_at IS NULL AND w.progressed_at < c.cutoff
    ORDER BY w.progressed_at, w.id
    LIMIT 1
)
SELECT a.unfinished, a.stuck, o.id, o.kind, o.name,
       greatest(extract(epoch FROM c.now - o.progressed_at), 0)::float8, o.closed_at IS NULL,
       o.members, o.members_pending, b.id, b.status
FROM clock c
CROSS JOIN active a
LEFT JOIN oldest o ON true
LEFT JOIN LATERAL (
    SELECT h.id, h.status FROM (
        SELECT p.id, p.status
        FROM {JOB_TABLE} x
        JOIN {_DEPENDENCY_TABLE} d ON d.job_id = x.id AND NOT d.resolved
        JOIN {JOB_TABLE} p ON p.id = d.depends_on_id AND p.status IN ('dead', 'cancelled')
        WHERE x.workflow_id = o.id AND x.status = 'waiting'
        UNION ALL
        SELECT m.id, m.status
        FROM {JOB_TABLE} m
        WHERE m.workflow_id = o.id AND m.workflow_role = 'member' AND m.status IN ('dead', 'cancelled')
          AND o.members_pending = 0 AND o.closed_at IS NOT NULL
          AND EXISTS (SELECT 1 FROM {JOB_TABLE} cb WHERE cb.id = o.on_success_id AND cb.status = 'waiting')
    ) h
    ORDER BY h.id
    LIMIT 1
) b ON true
"""


@contextmanager
def read_cursor(alias: str) -> Iterator[Any]:
    """Yield a cursor on ``alias`` in a read-only transaction with JIT compilation off.

    JIT is off because these statements run often and briefly: on large tables the planner's
    estimates cross ``jit_above_cost`` and compiling costs more than running (seconds against a
    tenth of one for the lease report on 1,000,000 rows). Outside a caller's transaction the
    statements also share one REPEATABLE READ snapshot, so the figures agree with each other.
    Inside a caller's transaction (a savepoint) the previous JIT setting is restored afterwards.
    """
    conn = connections[alias]
    nested = conn.in_atomic_block
    with transaction.atomic(using=alias), conn.cursor() as cur:
        if nested:
            cur.execute("SELECT current_setting('jit'), set_config('jit', 'off', true)")
            previous = cur.fetchone()[0]
            yield cur
            cur.execute("SELECT set_config('jit', %s, true)", [previous])
        else:
            # Two statements, not one string: with server-side binding psycopg cannot run both.
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            cur.execute("SET LOCAL jit = off")
            yield cur


def snapshot_rows(params: Mapping[str, Any], *, alias: str | None = None) -> tuple[list[Any], list[Any], Any, float]:
    """Run the three statements of a health snapshot in one read-only snapshot.

    Args:
        params: the statements' parameters: ``now`` (aware datetime or None), ``queues`` (names or
            None), ``always`` (names reported even without jobs), ``short``, ``long`` and ``widest``
            (window seconds) for ``QUEUE_STATS``; ``stuck_after`` (seconds without progress after
            which an unfinished workflow is stuck) for ``WORKFLOW_STATS``.
        alias: database alias; default the job table's.

    Returns:
        ``(QUEUE_STATS rows, PROCESSES rows, the one WORKFLOW_STATS row, seconds the statements took)``.
    """
    with read_cursor(alias or db_alias()) as cur:
        started = time.perf_counter()
        cur.execute(QUEUE_STATS, params)
        rows = cur.fetchall()
        cur.execute(PROCESSES)
        process_rows = cur.fetchall()
        # The queue figures' clock reading, so that every figure of the snapshot refers to one now.
        cur.execute(WORKFLOW_STATS, {**params, "now": rows[0][0]})
        workflow_row = cur.fetchone()
    return rows, process_rows, workflow_row, time.perf_counter() - started


def lease_report_rows(params: Mapping[str, Any], *, alias: str | None = None) -> list[Any]:
    """Run ``LEASE_REPORT`` (parameters ``now``, ``window`` seconds, ``tasks`` names or None) in a
    read-only snapshot; return its rows (one per task, by name)."""
    with read_cursor(alias or db_alias()) as cur:
        cur.execute(LEASE_REPORT, params)
        rows: list[Any] = cur.fetchall()
    return rows



# Read one job by primary key (no lock): the tasks backend's get_result and the start of each
# framework-task attempt. Plain SQL rather than the ORM because the ORM's query compiler, not
# the database, would be most of the cost of an attempt.
JOB_GET = f"SELECT {_JOB_COLUMN_LIST} FROM {JOB_TABLE} WHERE id = %(id)s"


def job_get(job_id: int, *, alias: str | None = None) -> Job | None:
    """Return the job ``job_id`` as a :class:`Job` (read only, not locked), or None.

    A done job moved into the time-partitioned history (``LEASEQUEUE["HISTORY"]``) is found there
    (a second statement, only when the hot table has no such job), so its result stays readable
    until its partition is dropped.
    """
    alias = alias or db_alias()
    jobs = _jobs_from_rows(_run(JOB_GET, {"id": job_id}, alias=alias).rows, alias)
    return jobs[0] if jobs else history_get(job_id, alias=alias)


# -- The workers page -------------------------------------------------------------------------
# Every leased job with what the page shows of it, in one statement: the rows come from the small
# partial index leasequeue_job_leased (only running jobs), numbered per holder so that at most
# %(limit)s rows per holder are returned, each carrying its holder's total. ``timed_out`` is the
# rule of PROCESSES above: a ``timed_out`` history entry for the job's current fencing token (its
# handler is past its task's timeout and still running). Holders need not be registered: a job
# leased by a process whose row was pruned is returned too (its lease is usually expired).
RUNNING_JOBS = f"""
WITH held AS (
    SELECT j.id, j.task, j.queue, j.attempts, j.max_attempts, j.leased_by, j.leased_until, j.attempted_at,
           row_number() OVER (PARTITION BY j.leased_by ORDER BY j.attempted_at, j.id) AS n,
           count(*) OVER (PARTITION BY j.leased_by) AS total,
           (j.history <> '[]'::jsonb AND EXISTS (
               SELECT 1 FROM jsonb_array_elements(j.history) e WHERE {TIMED_OUT_NOW})) AS timed_out
    FROM {JOB_TABLE} j
    WHERE j.status = 'leased'
)
SELECT h.leased_by, h.id, h.task, h.queue, h.attempts, h.max_attempts, h.leased_until, h.attempted_at, h.total,
       h.timed_out
FROM held h
WHERE h.n <= %(limit)s
ORDER BY h.leased_by, h.n
"""


def workers_page_rows(*, limit: int, now: Any = None,
                      alias: str | None = None) -> tuple[Any, list[Any], list[Any]]:
    """Read what the admin's workers page shows, in one read-only snapshot (three statements).

    Args:
        limit: at most this many running jobs per holding process (the rest are only counted).
        now: aware datetime to judge by instead of the database clock (tests).
        alias: database alias; default the job table's.

    Returns:
        ``(now, PROCESSES rows, RUNNING_JOBS rows)``: the database clock reading (or ``now``), the
        process registry with each process's stuck handlers, and the leased jobs (``leased_by``,
        id, task, queue, attempts, max_attempts, leased_until, attempted_at, the holder's total
        of leased jobs, timed_out), by holder then claim time.
    """
    with read_cursor(alias or db_alias()) as cur:
        cur.execute(CLOCK, {"now": now})
        clock_now = cur.fetchone()[0]
        cur.execute(PROCESSES)
        process_rows = cur.fetchall()
        cur.execute(RUNNING_JOBS, {"limit": int(limit)})
        job_rows = cur.fetchall()
    return clock_now, process_rows, job_rows


# -- The queue page ---------------------------------------------------------------------------
# One queue's operator state (paused, by whom and since when, claims cut short by its rate limit):
# a primary-key read of the small queue table; no row means the queue was never paused or limited.
QUEUE_STATE_ONE = f"""
SELECT q.paused, q.paused_at, q.paused_by, q.throttled_total FROM {QUEUE_TABLE} q WHERE q.name = %(name)s
"""

# The largest groups of one queue's dead letters by task and error type (as Dead letters groups
# them, so a group's links select exactly its jobs), with the newest one's message (its first line,
# cut to 200 characters) and death. The dead rows come from leasequeue_job_dead (queue, finished_at)
# WHERE status = 'dead': the same dead rows the dashboard's QUEUE_STATS counts, never the done rows.
QUEUE_TOP_ERRORS = f"""
SELECT j.task, j.errors -> -1 ->> 'type' AS kind,
       (array_agg(left(split_part(coalesce(j.errors -> -1 ->> 'message', ''), E'\\n', 1), 200)
                  ORDER BY j.finished_at DESC NULLS LAST, j.id DESC))[1] AS message,
       count(*) AS n, max(j.finished_at) AS newest
FROM {JOB_TABLE} j
WHERE j.status = 'dead' AND j.queue = %(name)s
GROUP BY 1, 2
ORDER BY n DESC, newest DESC, 1, 2
LIMIT %(limit)s
"""


def queue_page_rows(name: str, *, limit: int = 10, alias: str | None = None) -> tuple[Any, list[Any]]:
    """Read the queue page's own figures in one read-only snapshot (two statements).

    Args:
        name: the queue name.
        limit: error groups returned (the largest); 0 skips their statement (a live poll).
        alias: database alias; default the job table's.

    Returns:
        ``(the QUEUE_STATE_ONE row (paused, paused_at, paused_by, throttled_total) or None,
        QUEUE_TOP_ERRORS rows (task, error type or None, first line of the message, count, newest
        death as an aware datetime), largest first)``.
    """
    with read_cursor(alias or db_alias()) as cur:
        cur.execute(QUEUE_STATE_ONE, {"name": name})
        state = cur.fetchone()
        errors: list[Any] = []
        if limit > 0:
            cur.execute(QUEUE_TOP_ERRORS, {"name": name, "limit": int(limit)})
            errors = cur.fetchall()
    return state, errors


def queue_schedules(name: str, *, alias: str | None = None) -> list[Schedule]:
    """The schedules that enqueue into queue ``name``, by name (one read of the schedule table).

    Args:
        name: the queue name.
        alias: database alias; default the job table's.

    Returns:
        :class:`~django_leasequeue.models.Schedule` rows, enabled or not.
    """
    return list(Schedule.objects.using(alias or db_alias()).filter(queue=name).order_by("name"))
