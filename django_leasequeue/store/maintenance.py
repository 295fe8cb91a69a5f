"""Maintenance: the reaper's sweep (expired leases and the sweep record), pruning finished jobs,
the process registry, and dead-lettering jobs of tasks no live worker knows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from ..exceptions import UnknownTask
from ..models import RateKeyState
from ._db import (
    CLOCK,
    CLOCK_WAKING,
    JOB_TABLE,
    NEVER_SWEPT,
    PROCESS_TABLE,
    SWEEP_TABLE,
    TOKEN_MAX,
    _dumps,
    _notify_channel,
    _run,
    db_alias,
)
from .workflows import DEPENDENCY_TABLE, WORKFLOW_TABLE

# Return expired leases (leased_until passed, by database time) to ready, or to dead when the
# attempts are exhausted, recording "lease expired" as the attempt's error and bumping the token.
# SKIP LOCKED lets several reapers run at once; the re-check in the outer WHERE makes the update a
# compare-and-set, so a worker that completed in between wins. A job whose cancel was
# requested ends cancelled: its worker died before it could honour the request.
#
# The clock alone does not decide: an outage (or a restart) of the database hits every process at
# once, and when it ends every lease has run out although no holder died. Each sweep records its
# time in the one-row sweep table, by the real clock (clock_timestamp(): not the test-adjustable
# leasequeue_now(), and immune to a caller's now=). A sweep that finds the previous one older than
# %(silence)s seconds (twice the reaper interval) concludes that no reaper could reach the database
# meanwhile and records the database as resumed now. For one lease period (the job's own) after
# that, expired leases are left to their holders, whose heartbeats and completions, fenced on the
# token rather than the clock, still succeed; a holder that really died is reaped one lease later.
# The row lock serialises concurrent sweeps on the same decision. The record must not outrun the
# clock: greatest() keeps the latest of two racing sweeps, but a recorded sweep (or resumption)
# more than the silence ahead of the clock means the database clock was set back (it ran ahead, or
# a failover reached a server whose clock is behind). Kept, it would stop every reaper from taking
# back any expired lease until the clock caught up (for as long as the clock was wrong), and hide
# every silence meanwhile; so the record starts again from the present clock, as after an outage
# (expired leases wait one lease for their holders, then a dead holder's jobs are recovered).
JOB_REAP = f"""
WITH clock AS MATERIALIZED ({CLOCK_WAKING}),
sweep AS MATERIALIZED (
    INSERT INTO {SWEEP_TABLE} AS s (id, last_sweep_at, resumed_at) VALUES (1, clock_timestamp(), NULL)
    ON CONFLICT (id) DO UPDATE SET
        resumed_at = CASE WHEN s.last_sweep_at = {NEVER_SWEPT} THEN s.resumed_at  -- no sweep yet: the first one
                          WHEN s.last_sweep_at < EXCLUDED.last_sweep_at - make_interval(secs => %(silence)s::float8)
                            OR s.last_sweep_at > EXCLUDED.last_sweep_at + make_interval(secs => %(silence)s::float8)
                          THEN EXCLUDED.last_sweep_at
                          WHEN s.resumed_at > EXCLUDED.last_sweep_at THEN EXCLUDED.last_sweep_at
                          ELSE s.resumed_at END,
        last_sweep_at = CASE WHEN s.last_sweep_at > EXCLUDED.last_sweep_at
                                                    + make_interval(secs => coalesce(%(silence)s::float8, 1))
                             THEN EXCLUDED.last_sweep_at
                             ELSE greatest(s.last_sweep_at, EXCLUDED.last_sweep_at) END
    RETURNING s.last_sweep_at, s.resumed_at
),
expired AS MATERIALIZED (
    SELECT j.id FROM {JOB_TABLE} j, clock, sweep
    WHERE j.status = 'leased' AND j.leased_until < clock.now
      AND (sweep.resumed_at IS NULL OR sweep.last_sweep_at
           >= sweep.resumed_at + make_interval(secs => coalesce(j.lease_seconds, %(lease)s::float8)))
    ORDER BY j.id
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE {JOB_TABLE} j
SET status = CASE WHEN j.cancel_requested THEN 'cancelled'
                  WHEN j.attempts >= j.max_attempts OR j.lease_version >= {TOKEN_MAX - 2} THEN 'dead'
                  ELSE 'ready' END,
    run_at = clock.now,
    finished_at = CASE WHEN j.cancel_requested OR j.attempts >= j.max_attempts OR j.lease_version >= {TOKEN_MAX - 2}
                       THEN clock.now ELSE NULL END,
    lease_version = least(j.lease_version + 1, {TOKEN_MAX}),
    leased_until = NULL,
    errors = j.errors || jsonb_build_array(jsonb_build_object(
        'attempt', j.attempts, 'type', 'LeaseExpired',
        'message', 'lease expired: the worker died, or was frozen or cut off from the database past its lease',
        'traceback', '', 'worker', j.leased_by, 'at', clock.now))
FROM expired, clock
WHERE j.id = expired.id AND j.status = 'leased' AND j.leased_until < clock.now
RETURNING j.id, j.task, j.queue, j.status, j.attempts, j.lease_version
"""


@dataclass(frozen=True)
class Reaped:
    """A job whose expired lease was taken back by the reaper."""

    id: int
    task: str
    queue: str
    status: str
    attempts: int
    lease_version: int


def job_reap_expired(*, limit: int = 500, now: datetime | None = None, silence: float | None = 10.0,
                     lease: float = 30.0, alias: str | None = None) -> list[Reaped]:
    """Take back up to ``limit`` expired leases; return what was reaped (status ready, dead or cancelled).

    Args:
        limit: most jobs taken back by this statement.
        now: the database time to judge expiry by (aware datetime; None: ``leasequeue_now()``).
        silence: seconds without any sweep after which the database is taken to have been
            unreachable for everyone; expired leases are then left to their holders for one lease
            period (the job's ``lease_seconds``) from the sweep that noticed it. None: a one-off
            sweep, which has no cadence to measure a silence by: it never declares an outage
            itself, but honours the window a periodic sweep recorded (else the clock decides).
        lease: seconds, the lease of jobs whose ``lease_seconds`` is null (the worker default).
    """
    params = {"now": now, "limit": limit, "silence": None if silence is None else float(silence),
              "lease": float(lease), "wake": _notify_channel()}
    return [Reaped(*r) for r in _run(JOB_REAP, params, alias=alias).rows]


# What keeps a finished job past retention (JOB_PRUNE below). A cancelled dependent counts: one
# cancelled while it waited reads its dependencies' results when it is replayed (it is pruned in
# its own time, and its dependencies after it).
_STILL_READ = f"""NOT EXISTS (SELECT 1 FROM {WORKFLOW_TABLE} w WHERE w.id = j.workflow_id AND w.finished_at IS NULL)
      AND NOT (j.has_dependents AND EXISTS (
          SELECT 1 FROM {DEPENDENCY_TABLE} d JOIN {JOB_TABLE} dj ON dj.id = d.job_id
          WHERE d.depends_on_id = j.id AND dj.status IN ('waiting', 'cancelled')))"""


def _oldest_finished(status: str) -> str:
    """The first ``%(limit)s`` rows of ``status`` from the pruner's place on, past retention and no
    longer read, in index order (see JOB_PRUNE)."""
    return f"""SELECT j.id, j.finished_at, j.ctid FROM {JOB_TABLE} j
        WHERE j.status = '{status}'
          AND (j.finished_at, j.id) >= ((SELECT coalesce(from_at, '-infinity') FROM place),
                                        (SELECT coalesce(from_id, 0) FROM place))
          AND j.finished_at < (SELECT now FROM clock) - make_interval(secs => %(age)s)
          AND {_STILL_READ}
        ORDER BY j.finished_at, j.id
        LIMIT %(limit)s"""


# Delete finished jobs past their retention, a small batch at a time so that no statement holds
# many row locks or bloats one transaction. Dead jobs are kept until replayed or deleted.
# One subquery per status, each ordered by (finished_at, id) with the cutoff as a scalar subquery
# (a parameter, not a join with the clock): PostgreSQL then walks leasequeue_job_finished
# (status, finished_at, id) in order and stops at the cutoff. A single "status IN (...) AND
# finished_at < clock.now - age" is planned as a sequential scan of the whole table, every batch.
#
# Keyset: each batch starts at the (finished_at, id) of the first row the previous batch deleted
# (the pruner's place, below), a row comparison that is the index scan's start condition.
# Starting from the oldest finished row instead made every batch walk the index entries of every
# row the earlier batches had deleted (and visit their heap tuples, as long as they were not yet
# marked dead in the index) until vacuum removed them: a cost that grew with every batch since the
# last vacuum. Starting at the previous batch's first row, rather than after its last, walks that
# one batch's entries once more, which marks them dead in the index (when no older snapshot still
# needs the rows): a later walk over them, the next full pass, then reads index pages and no heap
# tuple. The id in the index makes the position exact inside a run of rows finished at the same
# instant (a bulk cancel, a completion batch). The two statuses are merged in (finished_at, id)
# order before the limit, so every row before the place was either deleted or passed over; only
# the rows picked are then locked (by their ctid, as found: no second walk of the primary key),
# SKIP LOCKED, and deleted.
#
# Passed over are the rows kept past retention (_STILL_READ: a member of an unfinished workflow, a
# job another job still reads), rows locked by someone else at that moment (SKIP LOCKED), and rows
# that arrived behind the place (finished_at set by a clock that was set back, or an injected
# now). They are found by a full pass: every ``full_pass_every`` seconds the pass starts again
# from the oldest finished row, which walks once whatever vacuum has not removed yet, and deletes
# what is no longer read. The statement decides (the sweep CTE); JOB_PRUNE_SAVE records the pass.
#
# Where the place lives: in the one-row sweep record, not in the memory of the pruning process.
# The pruner is one elected worker or runreaper (reaper.ReaperService.maintain), and the election
# moves when that process is SIGKILLed or stops, or runreaper --once runs from cron, a new process
# each time: a place kept in memory would be lost at each of those, and the next pruner would walk
# the whole dead region again, which is the cost this avoids. In the table, a newly elected pruner
# continues where the last one stopped. The place is written by a statement of its own after the
# batch (JOB_PRUNE_SAVE), so the sweep row, which every reaper's sweep locks, is held only for that
# small statement; a place that stays behind (a crash in between) only costs a re-walk of one
# batch, and one too far ahead is impossible: it only ever moves to a row a batch deleted.
#
# A finished job stays while something still reads it: a member of an unfinished workflow (its
# callback collects the members' results when the last one settles) and a dependency of a job
# that still waits, or was cancelled (its release, or its replay, reads its dependencies'
# results). The edges of deleted jobs go in the same statement; it returns the workflows the
# deleted jobs belonged to, for JOB_PRUNE_WORKFLOWS, then the statement's clock, the pass it read,
# whether it began a new one and the first row it deleted, for JOB_PRUNE_SAVE.
JOB_PRUNE = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
sweep AS MATERIALIZED (
    SELECT s.prune_from_finished_at, s.prune_from_id, s.prune_pass_started_at AS pass_at,
           -- A new pass: none recorded yet, the recorded one began a full-pass interval ago or
           -- more, or after this clock (the clock was set back, or a caller's now= is earlier).
           s.prune_pass_started_at IS NULL OR s.prune_pass_started_at > clock.now
           OR s.prune_pass_started_at <= clock.now - make_interval(secs => %(every)s) AS restart
    FROM clock LEFT JOIN {SWEEP_TABLE} s ON s.id = 1
),
place AS MATERIALIZED (
    SELECT CASE WHEN restart THEN NULL ELSE prune_from_finished_at END AS from_at,
           CASE WHEN restart THEN NULL ELSE prune_from_id END AS from_id
    FROM sweep
),
candidates AS MATERIALIZED (
    SELECT u.ctid FROM (
        SELECT * FROM ({_oldest_finished("done")}) AS d
        UNION ALL
        SELECT * FROM ({_oldest_finished("cancelled")}) AS c
    ) AS u
    ORDER BY u.finished_at, u.id
    LIMIT %(limit)s
),
picked AS MATERIALIZED (
    SELECT j.ctid FROM {JOB_TABLE} j
    WHERE j.ctid = ANY(ARRAY(SELECT ctid FROM candidates)) AND j.status IN ('done', 'cancelled')
    FOR UPDATE OF j SKIP LOCKED
),
deleted AS (
    DELETE FROM {JOB_TABLE} gone
    WHERE gone.ctid = ANY(ARRAY(SELECT ctid FROM picked))
    RETURNING gone.id, gone.workflow_id, gone.finished_at
),
edges_in AS (
    DELETE FROM {DEPENDENCY_TABLE} d WHERE d.job_id IN (SELECT id FROM deleted)
),
edges_out AS (
    DELETE FROM {DEPENDENCY_TABLE} d WHERE d.depends_on_id IN (SELECT id FROM deleted)
),
first AS MATERIALIZED (
    SELECT finished_at, id FROM deleted ORDER BY finished_at, id LIMIT 1
)
SELECT (SELECT count(*) FROM deleted),
       (SELECT coalesce(array_agg(DISTINCT workflow_id) FILTER (WHERE workflow_id IS NOT NULL), '{{}}') FROM deleted),
       (SELECT now FROM clock), (SELECT pass_at FROM sweep), (SELECT restart FROM sweep),
       (SELECT finished_at FROM first), (SELECT id FROM first)
"""

# The finished workflows among those JOB_PRUNE just touched that have no job left (a second
# statement: the first one's own deletions are invisible to it). A dead member, never pruned,
# keeps its workflow row, so that a replay still finds the counters it moves.
JOB_PRUNE_WORKFLOWS = f"""
DELETE FROM {WORKFLOW_TABLE} w
WHERE w.id = ANY(%(ids)s::bigint[]) AND w.finished_at IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM {JOB_TABLE} j WHERE j.workflow_id = w.id)
"""

# Record the pruner's place after a batch (see JOB_PRUNE): the pass that began at %(pass_at)s, and
# the first row the batch deleted. Only if the pass is still the one the batch read (%(pass_read)s):
# when another pruner started a new pass meanwhile, its place stands. Within a pass the place only
# moves forward (two pruners at once: the furthest wins; the rows before it that the other one had
# locked, it deleted). A new pass (%(restart)s: the batch began at the oldest row) sets the place
# outright, to the batch's first row (NULL, the start, when it deleted nothing). Before
# any sweep the row does not exist: it is created with last_sweep_at = NEVER_SWEPT, as a
# scheduler's tick does.
def _place_save_sql(walker: str) -> str:
    """The statement that saves the place of a keyset walker over finished jobs (``prune``: the
    retention pruner; ``history``: the history mover) in the sweep record's columns
    ``<walker>_pass_started_at``, ``<walker>_from_finished_at`` and ``<walker>_from_id``, by the
    rules above. Parameters: ``restart``, ``pass_read``, ``pass_at``, ``from_at``, ``from_id``."""
    moves = (f"%(restart)s OR s.{walker}_from_finished_at IS NULL OR (EXCLUDED.{walker}_from_finished_at, "
             f"EXCLUDED.{walker}_from_id) > (s.{walker}_from_finished_at, s.{walker}_from_id)")
    return f"""
INSERT INTO {SWEEP_TABLE} AS s
    (id, last_sweep_at, {walker}_pass_started_at, {walker}_from_finished_at, {walker}_from_id)
VALUES (1, {NEVER_SWEPT}, %(pass_at)s, %(from_at)s, %(from_id)s)
ON CONFLICT (id) DO UPDATE SET
    {walker}_pass_started_at = EXCLUDED.{walker}_pass_started_at,
    {walker}_from_finished_at = CASE WHEN {moves} THEN EXCLUDED.{walker}_from_finished_at
                                  ELSE s.{walker}_from_finished_at END,
    {walker}_from_id = CASE WHEN {moves} THEN EXCLUDED.{walker}_from_id ELSE s.{walker}_from_id END
WHERE s.{walker}_pass_started_at IS NOT DISTINCT FROM %(pass_read)s
"""


JOB_PRUNE_SAVE = _place_save_sql("prune")

#: Seconds between two full passes of the retention pruner (see ``JOB_PRUNE``): how long a finished
#: job that was kept past retention may stay after it is no longer read.
PRUNE_FULL_PASS_EVERY = 3600.0


def job_prune(*, older_than: float, limit: int = 1000, now: datetime | None = None,
              full_pass_every: float = PRUNE_FULL_PASS_EVERY, alias: str | None = None) -> int:
    """Delete up to ``limit`` done/cancelled jobs finished more than ``older_than`` seconds ago,
    with their dependency edges, then the finished workflows they belonged to that have no job
    left.

    Kept past retention: a member of an unfinished workflow, and a job another job still waits
    on or was cancelled while waiting on (both are read when that workflow or dependent settles,
    or the dependent is replayed).

    Each call continues from the first row the previous call deleted, whichever process made it
    (the place is kept in the sweep record), so a batch walks the entries of one earlier batch at
    most, not of every row deleted since the last vacuum; every ``full_pass_every`` seconds a pass
    starts again from the oldest finished row, which deletes the jobs that were kept and are no
    longer read (see ``JOB_PRUNE``).

    Args:
        older_than: retention in seconds.
        limit: at most this many jobs per call.
        now: aware datetime instead of the database clock (tests).
        full_pass_every: seconds between two passes from the oldest finished row.
        alias: database alias; default the job table's.

    Returns:
        The number of jobs deleted (call again while it equals ``limit``).
    """
    deleted, workflows, clock_now, pass_read, restart, first_at, first_id = _run(
        JOB_PRUNE, {"now": now, "age": float(older_than), "limit": limit, "every": float(full_pass_every)},
        alias=alias).one()
    if workflows:
        _run(JOB_PRUNE_WORKFLOWS, {"ids": list(workflows)}, alias=alias)
    if restart or first_at is not None:
        _run(JOB_PRUNE_SAVE, {"restart": restart, "pass_read": pass_read,
                              "pass_at": clock_now if restart else pass_read,
                              "from_at": first_at, "from_id": first_id}, alias=alias)
    return int(deleted)


PROCESS_UPSERT = f"""
WITH clock AS MATERIALIZED ({CLOCK})
INSERT INTO {PROCESS_TABLE} (id, kind, host, pid, queues, concurrency, tasks, reaps, started_at, last_heartbeat_at)
SELECT %(id)s, %(kind)s, %(host)s, %(pid)s, %(queues)s::jsonb, %(concurrency)s, %(tasks)s::jsonb, %(reaps)s,
       clock.now, clock.now
FROM clock
ON CONFLICT (id) DO UPDATE SET kind = EXCLUDED.kind, host = EXCLUDED.host, pid = EXCLUDED.pid,
    queues = EXCLUDED.queues, concurrency = EXCLUDED.concurrency, tasks = EXCLUDED.tasks, reaps = EXCLUDED.reaps,
    started_at = EXCLUDED.started_at, last_heartbeat_at = EXCLUDED.last_heartbeat_at
"""

# A tick (%(tick)s) is also stamped on the one-row sweep table (scheduler_tick_at, the same clock
# reading as the row's last_tick_at): the process row is deleted when the scheduler stops and pruned
# when it dies, and monitoring must still say how long ago the last tick was. In the same statement
# so both stamps agree and a tick costs no extra round trip; a plain heartbeat (tick false) inserts
# nothing and takes no lock on that row. Before any sweep the row does not exist: it is created
# with last_sweep_at = NEVER_SWEPT, which every reader of last_sweep_at takes as "never swept" (the
# reaper's sweep as its first, the health snapshot as no sweep), because a real time there would
# claim a sweep that never happened.
PROCESS_HEARTBEAT = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
tick AS (
    INSERT INTO {SWEEP_TABLE} AS s (id, last_sweep_at, scheduler_tick_at)
    SELECT 1, {NEVER_SWEPT}, clock.now FROM clock WHERE %(tick)s
    ON CONFLICT (id) DO UPDATE SET scheduler_tick_at = EXCLUDED.scheduler_tick_at
)
UPDATE {PROCESS_TABLE} p SET last_heartbeat_at = clock.now,
    last_tick_at = CASE WHEN %(tick)s THEN clock.now ELSE p.last_tick_at END
FROM clock WHERE p.id = %(id)s
"""


def process_register(*, process_id: str, kind: str, host: str, pid: int, queues: Sequence[str] | None,
                     concurrency: int, tasks: Sequence[str] | None = None, reaps: bool = False,
                     now: datetime | None = None, alias: str | None = None) -> None:
    """Register (or re-register) a running worker/scheduler/reaper process.

    Args:
        queues: the queues it serves, or None for every queue (stored as ``["*"]``).
        concurrency: its handler threads (0 for a scheduler or reaper).
        tasks: the task names a worker can run (it claims only those); None: not recorded, which
            counts as knowing every task (:func:`job_dead_letter_unknown_tasks`).
        reaps: it runs the reaper's sweep (runreaper, a worker without ``--no-reaper``).
        now: aware datetime instead of the database clock (tests); also the registration time.
    """
    _run(PROCESS_UPSERT, {"now": now, "id": process_id, "kind": kind, "host": host, "pid": pid,
                                     "queues": _dumps(list(queues) if queues is not None else ["*"]),
                                     "concurrency": concurrency,
                                     "tasks": _dumps(sorted(tasks)) if tasks is not None else None,
                                     "reaps": bool(reaps)}, alias=alias)


def process_heartbeat(process_id: str, *, tick: bool = False, now: datetime | None = None,
                      alias: str | None = None) -> bool:
    """Touch a process row's heartbeat; False if the row was pruned.

    Args:
        process_id: the row's id (``host:pid:name``).
        tick: also record a scheduler tick: the row's ``last_tick_at`` and the sweep record's
            ``scheduler_tick_at``, which outlives the row (written even when the row is gone).
        now: aware datetime instead of the database clock (tests).
        alias: database alias; default the job table's.

    Returns:
        True when the process row was touched.
    """
    touched: int = _run(PROCESS_HEARTBEAT, {"now": now, "id": process_id, "tick": tick}, alias=alias).rowcount
    return touched == 1


def process_deregister(process_id: str, *, alias: str | None = None) -> None:
    """Remove a process row on clean exit."""
    _run(f"DELETE FROM {PROCESS_TABLE} WHERE id = %s", [process_id], alias=alias)


# The election of the one process that runs the periodic maintenance (pruning finished jobs,
# stale process rows and rate logs, folding the chart counters) when no runreaper is split out.
# The lease is the process row itself: a row counts while its heartbeat is within %(alive)s
# seconds (PROCESS_ALIVE_WITHIN), so a SIGKILLed or frozen holder loses the election once its
# heartbeat ages out, and a clean stop (the row deleted) hands it over at the next sweep. A row
# rather than a session advisory lock: through PgBouncer in transaction mode a session lock stays
# on a server connection another client may get. Only processes that reap are candidates, a
# runreaper first (it always maintains, so workers step aside while one lives), then the oldest
# registration, id breaking ties: every process reads the same winner from the same rows.
PROCESS_MAINTAINER = f"""
WITH clock AS MATERIALIZED ({CLOCK})
SELECT p.id FROM {PROCESS_TABLE} p, clock
WHERE p.reaps AND p.last_heartbeat_at >= clock.now - make_interval(secs => %(alive)s)
ORDER BY (p.kind = 'reaper') DESC, p.started_at, p.id
LIMIT 1
"""


def process_maintainer(*, alive_within: float, now: datetime | None = None, alias: str | None = None) -> str | None:
    """Return the id of the process elected to run the periodic maintenance, or None.

    The elected process is the live reaping process (heartbeat within ``alive_within``) of kind
    ``reaper`` if any, else the one registered first (then the smallest id). See
    ``PROCESS_MAINTAINER``.

    Args:
        alive_within: seconds (``PROCESS_ALIVE_WITHIN``); an older heartbeat does not count.
        now: aware datetime instead of the database clock (tests).
        alias: database alias; default the job table's.

    Returns:
        The elected process id (``host:pid:name``), or None when no live process reaps.
    """
    rows = _run(PROCESS_MAINTAINER, {"now": now, "alive": float(alive_within)}, alias=alias).rows
    return str(rows[0][0]) if rows else None


PROCESS_PRUNE = f"""
WITH clock AS MATERIALIZED ({CLOCK})
DELETE FROM {PROCESS_TABLE} p USING clock
WHERE p.last_heartbeat_at < clock.now - make_interval(secs => %(age)s)
"""


def process_prune(*, older_than: float, now: datetime | None = None, alias: str | None = None) -> int:
    """Delete process rows whose heartbeat is older than ``older_than`` seconds; return the count."""
    deleted: int = _run(PROCESS_PRUNE, {"now": now, "age": float(older_than)}, alias=alias).rowcount
    return deleted


# Rolling deploys: dead-letter the due ready jobs whose task no live worker serving their queue
# knows, judged from the process registry (each worker records its task names at registration and
# claims only those, see _TASKS_FILTER). A job is dead-lettered only when, for its queue:
#   * at least one live worker (heartbeat within %(alive)s seconds) serves it: with none, nobody
#     can judge, and the job waits;
#   * no live worker serving it knows the task, and none has an unrecorded task list (NULL: a
#     worker of an older version, which may know it);
#   * the oldest of those workers registered %(grace)s seconds ago or more, and the job has been
#     due (greatest of created_at and run_at) that long: a newer worker has had the grace to
#     start and take it.
# Unknown jobs are never claimed, so they collect at the head of their queue in claim order: the
# sweep reads the first %(scan)s due rows of each queue that holds ready jobs through the ready
# index (the queues found by a skip scan of that index, one probe each), not the whole backlog.
# The task name is only compared, never imported. Locked rows (a claim in flight) are skipped; the
# status is re-checked under the lock, so a job claimed meanwhile is left alone.
# Nobody judges for %(alive)s seconds after the database came back from a silence of every reaper
# (the sweep record's resumed_at, real clock): an outage longer than that leaves every worker's row
# stale at once, and the processes beat again one by one, so a worker that knows the task may
# simply not have beaten yet.
JOB_DEAD_LETTER_UNKNOWN = f"""
WITH RECURSIVE clock AS MATERIALIZED ({CLOCK_WAKING}),
live AS MATERIALIZED (
    -- A task list that is not a JSON list (a row written by another program) counts as none
    -- recorded: such a worker may know every task, so its queues are not judged.
    SELECT p.queues, CASE WHEN jsonb_typeof(p.tasks) = 'array' THEN p.tasks END AS tasks, p.started_at
    FROM {PROCESS_TABLE} p, clock
    WHERE p.kind = 'worker' AND p.last_heartbeat_at >= clock.now - make_interval(secs => %(alive)s)
      AND NOT EXISTS (SELECT 1 FROM {SWEEP_TABLE} s
                      WHERE s.resumed_at > clock_timestamp() - make_interval(secs => %(alive)s))
),
ready_queues AS (
    (SELECT j.queue FROM {JOB_TABLE} j WHERE j.status = 'ready' ORDER BY j.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM {JOB_TABLE} j WHERE j.status = 'ready' AND j.queue > r.queue
            ORDER BY j.queue LIMIT 1)
    FROM ready_queues r WHERE r.queue IS NOT NULL
),
served AS MATERIALIZED (
    SELECT r.queue, coalesce(array_agg(DISTINCT t.name) FILTER (WHERE t.name IS NOT NULL), '{{}}') AS known
    FROM ready_queues r
    JOIN live w ON w.queues ? r.queue OR w.queues ? '*'
    LEFT JOIN LATERAL jsonb_array_elements_text(w.tasks) AS t(name) ON true
    WHERE r.queue IS NOT NULL
    GROUP BY r.queue
    HAVING bool_and(w.tasks IS NOT NULL)
       AND min(w.started_at) <= (SELECT now FROM clock) - make_interval(secs => %(grace)s)
),
picked AS MATERIALIZED (
    SELECT h.id, s.queue
    FROM served s, clock
    CROSS JOIN LATERAL (
        SELECT j.id, j.task, j.created_at, j.run_at FROM {JOB_TABLE} j
        WHERE j.status = 'ready' AND j.queue = s.queue AND j.run_at <= clock.now
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT %(scan)s
    ) AS h
    WHERE h.task <> ALL(s.known)
      AND greatest(h.created_at, h.run_at) <= clock.now - make_interval(secs => %(grace)s)
),
locked AS MATERIALIZED (
    SELECT j.id FROM {JOB_TABLE} j
    WHERE j.id = ANY(ARRAY(SELECT picked.id FROM picked)) AND j.status = 'ready'
    ORDER BY j.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {JOB_TABLE} j
SET status = 'dead', finished_at = clock.now,
    errors = j.errors || jsonb_build_array(jsonb_build_object(
        'attempt', j.attempts, 'type', %(type)s::text,
        'message', format('no task is registered as %%L in any live worker serving queue %%L for %%s seconds '
                          '(only registered tasks run; a task name read from a job is never imported). '
                          'Register the task in the workers of this queue, then replay the job.',
                          j.task, j.queue, %(grace)s::float8),
        'traceback', '', 'worker', %(worker)s::text, 'at', clock.now))
FROM locked, clock
WHERE j.id = locked.id AND j.status = 'ready'
RETURNING j.id, j.task, j.queue, j.attempts, j.lease_version
"""


@dataclass(frozen=True)
class DeadLettered:
    """A job dead-lettered by :func:`job_dead_letter_unknown_tasks` (not leased when it was)."""

    id: int
    task: str
    queue: str
    attempts: int
    lease_version: int


def job_dead_letter_unknown_tasks(*, grace: float, alive_within: float, by: str, limit: int = 500,
                                  scan: int = 100, now: datetime | None = None,
                                  alias: str | None = None) -> list[DeadLettered]:
    """Dead-letter due ready jobs whose task no live worker serving their queue has known for ``grace``.

    See ``JOB_DEAD_LETTER_UNKNOWN`` for the exact rule. The error recorded has the type
    ``django_leasequeue.exceptions.UnknownTask``; the job keeps its attempts (none was spent).

    Args:
        grace: seconds (``UNKNOWN_TASK_GRACE``) the job must have been due, and the queue's oldest
            live worker registered, before the job is judged.
        alive_within: seconds; a worker row whose heartbeat is older does not count (``PROCESS_ALIVE_WITHIN``).
        by: the sweeping process id, recorded as the error's ``worker``.
        limit: maximum number of jobs dead-lettered by this call.
        scan: due rows read at the head of each queue, in claim order.
        now: aware datetime instead of the database clock (tests).

    Returns:
        The jobs dead-lettered (their id, task, queue, attempts and fencing token).
    """
    params = {"now": now, "grace": float(grace), "alive": float(alive_within), "worker": by, "limit": int(limit),
              "scan": int(scan), "type": f"{UnknownTask.__module__}.{UnknownTask.__qualname__}",
              "wake": _notify_channel()}
    return [DeadLettered(*r) for r in _run(JOB_DEAD_LETTER_UNKNOWN, params, alias=alias).rows]


_RATE_KEY_TABLE = RateKeyState._meta.db_table

# Delete the per-key rate logs whose latest logged claim has left its window (nothing in them can
# hold back a claim any more). The claim re-creates a key's row at its next admission.
RATE_KEY_PRUNE = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
old AS (
    SELECT r.key FROM {_RATE_KEY_TABLE} r, clock WHERE r.expires_at < clock.now
    ORDER BY r.expires_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
)
DELETE FROM {_RATE_KEY_TABLE} r USING old WHERE r.key = old.key
"""


def rate_key_prune(*, limit: int = 10_000, now: datetime | None = None, alias: str | None = None) -> int:
    """Delete up to ``limit`` per-key rate logs that no longer hold back any claim (their window
    has passed; rows locked by a claim right now are left for the next sweep).

    Args:
        limit: rows to delete at most in this call.
        now: aware datetime instead of the database clock (tests).

    Returns:
        The number of rows deleted.
    """
    return _run(RATE_KEY_PRUNE, {"now": now, "limit": limit}, alias=alias or db_alias()).rowcount
