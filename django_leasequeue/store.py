"""The only module that claims, leases or changes the state of jobs.

Every statement that locks a job row or moves it between states is a named module-level constant
here, with a comment saying why it is shaped the way it is (the layout follows Procrastinate's
``queries.sql`` and River's rule that no ad-hoc SQL lives outside the query layer; a test in
``tests/test_architecture.py`` enforces it).

Rules every statement follows (DESIGN.md section 3):

* **Database time only.** Each statement reads the clock once, as ``coalesce(<now>,
  leasequeue_now())``: callers may pass an explicit aware ``now`` (tests), otherwise the database's
  statement clock is used. ``leasequeue_now()`` is ``clock_timestamp()`` plus an optional
  per-session offset (``SET leasequeue.clock_offset = '1 hour'``), never ``now()``, which is frozen
  for a whole transaction.
* **Fenced writes.** After a claim, every write by a worker (renew, complete, fail, snooze,
  release) is ``... WHERE id = ? AND lease_version = ? AND status = 'leased'``; a row that does not
  come back means the lease was lost, and the caller discards its outcome.
* **Claims are one statement**: a ``MATERIALIZED`` CTE picks due ready rows with ``FOR UPDATE SKIP
  LOCKED`` and ``LIMIT``; the outer UPDATE leases them, increments ``attempts`` and the fencing token
  ``lease_version``. The CTE is an optimisation fence so that the planner cannot turn the LIMIT
  subquery into a nested loop that updates more rows than asked for (Oban #652).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections, router

from .models import Job, WorkerProcess

JOB_TABLE = Job._meta.db_table
PROCESS_TABLE = WorkerProcess._meta.db_table

# The statement clock, optionally overridden by the caller (tests pass an aware datetime).
CLOCK = "SELECT coalesce(%(now)s::timestamptz, leasequeue_now()) AS now"


def db_alias() -> str:
    """Return the database alias that holds the job table (through the database routers)."""
    return router.db_for_write(Job)


def _cursor(alias: str | None = None):
    return connections[alias or db_alias()].cursor()


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def db_now(alias: str | None = None) -> datetime:
    """Return the database statement clock (``leasequeue_now()``) as an aware datetime."""
    with _cursor(alias) as cur:
        cur.execute("SELECT leasequeue_now()")
        return cur.fetchone()[0]


# ---------------------------------------------------------------------------------------------
# Insert
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NewJob:
    """A validated job to insert. JSON fields are already-encoded strings.

    ``run_at`` None means "now + delay seconds" by the database clock.
    """

    task: str
    queue: str
    priority: int
    args_json: str
    kwargs_json: str
    max_attempts: int
    run_at: datetime | None = None
    delay: float = 0.0
    lease_seconds: float | None = None
    unique_key: str | None = None
    unique_scope: str = "retained"
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    schedule_id: int | None = None
    occurrence_at: datetime | None = None


_JOB_COLUMNS = [f.column for f in Job._meta.concrete_fields]
_RETURNING = ", ".join(f"ins.{c}" for c in _JOB_COLUMNS)

# Insert many jobs in one statement (unnest of parallel arrays), skipping unique-key conflicts.
# ``ON CONFLICT DO NOTHING`` (no target) covers both partial unique indexes and never raises, so
# the caller's transaction survives a duplicate; when the conflicting row belongs to a concurrent
# uncommitted transaction PostgreSQL waits for it, so a rolled-back racer never blocks the survivor.
# One NOTIFY per distinct due queue: PostgreSQL also folds identical notifications within a
# transaction, so a bulk enqueue sends a handful, not one per job; the payload is only the queue
# name, far below the 8000-byte limit.
JOB_INSERT = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
ins AS (
    INSERT INTO {JOB_TABLE} (
        task, queue, priority, status, args, kwargs, run_at, attempts, max_attempts, lease_seconds,
        leased_by, lease_version, unique_key, unique_scope, concurrency_key, concurrency_limit,
        cancel_requested, snoozes, schedule_id, occurrence_at, errors, history, created_at
    )
    SELECT t.task, t.queue, t.priority, 'ready', t.args::jsonb, t.kwargs::jsonb,
           coalesce(t.run_at, clock.now + make_interval(secs => t.delay)), 0, t.max_attempts,
           t.lease_seconds, '', 0, t.unique_key, t.unique_scope, t.concurrency_key,
           t.concurrency_limit, false, 0, t.schedule_id, t.occurrence_at, '[]'::jsonb, '[]'::jsonb,
           clock.now
    FROM clock, unnest(
        %(task)s::text[], %(queue)s::text[], %(priority)s::smallint[], %(args)s::text[],
        %(kwargs)s::text[], %(run_at)s::timestamptz[], %(delay)s::float8[], %(max_attempts)s::int[],
        %(lease_seconds)s::float8[], %(unique_key)s::text[], %(unique_scope)s::text[],
        %(concurrency_key)s::text[], %(concurrency_limit)s::int[], %(schedule_id)s::bigint[],
        %(occurrence_at)s::timestamptz[]
    ) AS t(task, queue, priority, args, kwargs, run_at, delay, max_attempts, lease_seconds,
           unique_key, unique_scope, concurrency_key, concurrency_limit, schedule_id, occurrence_at)
    ON CONFLICT DO NOTHING
    RETURNING *
),
woken AS (
    SELECT pg_notify(%(channel)s, q.queue)
    FROM (SELECT DISTINCT ins.queue FROM ins, clock WHERE ins.run_at <= clock.now) AS q
    WHERE %(notify)s
)
SELECT {_RETURNING}, (SELECT count(*) FROM woken) AS woken FROM ins
"""


def job_insert(jobs: Sequence[NewJob], *, notify: bool, channel: str, now: datetime | None = None,
               alias: str | None = None) -> list[Job]:
    """Insert jobs in the caller's transaction; return the inserted rows as :class:`Job` objects.

    Jobs whose unique key is already taken are skipped (not returned). A NOTIFY on ``channel`` with
    the queue name is sent for due queues when ``notify`` is true (delivered at commit).
    """
    if not jobs:
        return []
    alias = alias or db_alias()
    params = {
        "now": now,
        "notify": notify,
        "channel": channel,
        "task": [j.task for j in jobs],
        "queue": [j.queue for j in jobs],
        "priority": [j.priority for j in jobs],
        "args": [j.args_json for j in jobs],
        "kwargs": [j.kwargs_json for j in jobs],
        "run_at": [j.run_at for j in jobs],
        "delay": [float(j.delay) for j in jobs],
        "max_attempts": [j.max_attempts for j in jobs],
        "lease_seconds": [j.lease_seconds for j in jobs],
        "unique_key": [j.unique_key for j in jobs],
        "unique_scope": [j.unique_scope for j in jobs],
        "concurrency_key": [j.concurrency_key for j in jobs],
        "concurrency_limit": [j.concurrency_limit for j in jobs],
        "schedule_id": [j.schedule_id for j in jobs],
        "occurrence_at": [j.occurrence_at for j in jobs],
    }
    with _cursor(alias) as cur:
        cur.execute(JOB_INSERT, params)
        rows = cur.fetchall()
    return _jobs_from_rows(rows, alias)


def _jobs_from_rows(rows: Sequence[Sequence[Any]], alias: str) -> list[Job]:
    """Build Job instances from raw rows in ``_JOB_COLUMNS`` order, through the fields' own
    ``from_db_value`` converters (a raw cursor returns JSON columns as text, as Django's
    PostgreSQL backend leaves jsonb decoding to JSONField)."""
    fields = Job._meta.concrete_fields
    names = [f.attname for f in fields]
    connection = connections[alias]
    converters = [(i, f.from_db_value) for i, f in enumerate(fields) if hasattr(f, "from_db_value")]
    jobs = []
    for row in rows:
        values = list(row[: len(names)])
        for i, convert in converters:
            values[i] = convert(values[i], None, connection)
        jobs.append(Job.from_db(alias, names, values))
    return jobs


def job_get_by_unique_key(key: str, scope: str, alias: str | None = None) -> Job | None:
    """Return the job that holds ``key`` in ``scope`` (active scope: a ready or leased job), or None."""
    qs = Job.objects.using(alias or db_alias()).filter(unique_key=key, unique_scope=scope)
    if scope == "active":
        qs = qs.filter(status__in=["ready", "leased"])
    return qs.order_by("-id").first()


# ---------------------------------------------------------------------------------------------
# Claim and lease
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimedJob:
    """A job leased by a worker. ``lease_version`` is the fencing token for every later write."""

    id: int
    task: str
    queue: str
    args: list
    kwargs: dict
    attempts: int
    max_attempts: int
    lease_version: int
    leased_until: datetime
    lease_seconds: float
    claimed_at: datetime
    priority: int = 0
    # For the Django tasks backend, which reports them at the start of each attempt: enqueue time,
    # first claim time, and the number of failed attempts recorded so far.
    created_at: datetime | None = None
    started_at: datetime | None = None
    error_count: int = 0


_CLAIM_RETURNING = """
RETURNING j.id, j.task, j.queue, j.args, j.kwargs, j.attempts, j.max_attempts, j.lease_version,
          j.leased_until, coalesce(j.lease_seconds, %(lease)s), clock.now, j.priority,
          j.created_at, j.started_at, jsonb_array_length(j.errors)
"""

# Claim up to %(limit)s due jobs from the listed queues. The LATERAL subquery runs once per queue
# so each walks the partial index leasequeue_job_ready (queue, priority DESC, run_at, id) in order
# and stops after LIMIT rows; the outer ORDER BY/LIMIT merges the queues. A queue's surplus rows are
# locked only until this statement commits. Paused queues are filtered out before any row is read.
JOB_CLAIM = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
picked AS MATERIALIZED (
    SELECT c.id
    FROM clock,
         (SELECT u.name FROM unnest(%(queues)s::text[]) AS u(name)
          WHERE NOT EXISTS (SELECT 1 FROM leasequeue_queue p WHERE p.name = u.name AND p.paused)) AS q
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_at
        FROM {JOB_TABLE} j
        WHERE j.status = 'ready' AND j.queue = q.name AND j.run_at <= clock.now
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c
    ORDER BY c.priority DESC, c.run_at, c.id
    LIMIT %(limit)s
)
UPDATE {JOB_TABLE} j
SET status = 'leased',
    attempts = j.attempts + 1,
    lease_version = j.lease_version + 1,
    leased_until = clock.now + make_interval(secs => coalesce(j.lease_seconds, %(lease)s)),
    leased_by = %(worker)s,
    started_at = coalesce(j.started_at, clock.now),
    attempted_at = clock.now
FROM picked, clock
WHERE j.id = picked.id
{_CLAIM_RETURNING}
"""

# The same claim over every queue (``runworker --queues '*'``). Without a queue to lead the index,
# PostgreSQL sorts the due ready rows; prefer naming queues on large backlogs.
JOB_CLAIM_ANY_QUEUE = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
picked AS MATERIALIZED (
    SELECT j.id
    FROM {JOB_TABLE} j, clock
    WHERE j.status = 'ready' AND j.run_at <= clock.now
      AND NOT EXISTS (SELECT 1 FROM leasequeue_queue p WHERE p.name = j.queue AND p.paused)
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE {JOB_TABLE} j
SET status = 'leased',
    attempts = j.attempts + 1,
    lease_version = j.lease_version + 1,
    leased_until = clock.now + make_interval(secs => coalesce(j.lease_seconds, %(lease)s)),
    leased_by = %(worker)s,
    started_at = coalesce(j.started_at, clock.now),
    attempted_at = clock.now
FROM picked, clock
WHERE j.id = picked.id
{_CLAIM_RETURNING}
"""


def job_claim(*, queues: Sequence[str] | None, limit: int, worker_id: str, lease: float,
              now: datetime | None = None, alias: str | None = None) -> list[ClaimedJob]:
    """Lease up to ``limit`` due ready jobs in one statement.

    Args:
        queues: queue names to claim from, or None for every queue.
        limit: maximum number of jobs (the worker's free threads).
        worker_id: recorded in ``leased_by`` (host:pid:name).
        lease: default lease length in seconds, for jobs without their own ``lease_seconds``.
        now: aware datetime to use instead of the database clock (tests).

    Returns:
        The claimed jobs, in claim order (priority descending, then run_at, then id).
    """
    if limit <= 0:
        return []
    params = {"now": now, "limit": limit, "worker": worker_id, "lease": float(lease),
              "queues": list(queues) if queues is not None else None}
    sql = JOB_CLAIM if queues is not None else JOB_CLAIM_ANY_QUEUE
    with _cursor(alias) as cur:
        cur.execute(sql, params)
        rows = cur.fetchall()
    return [
        ClaimedJob(id=r[0], task=r[1], queue=r[2], args=_load(r[3]), kwargs=_load(r[4]), attempts=r[5],
                   max_attempts=r[6], lease_version=r[7], leased_until=r[8], lease_seconds=float(r[9]),
                   claimed_at=r[10], priority=r[11], created_at=r[12], started_at=r[13], error_count=r[14])
        for r in rows
    ]


def _load(value: Any) -> Any:
    return json.loads(value) if isinstance(value, (str, bytes)) else value


# Extend the leases of many jobs at once. Only leased_until changes, and leased_until is in no
# index, so with the table's fillfactor these are HOT updates. Returns the rows still held, with
# their cancel flag (the heartbeat is how a running handler learns of a cancel request).
JOB_RENEW = f"""
WITH clock AS MATERIALIZED ({CLOCK})
UPDATE {JOB_TABLE} j
SET leased_until = clock.now + make_interval(secs => d.secs)
FROM clock, unnest(%(ids)s::bigint[], %(versions)s::bigint[], %(secs)s::float8[]) AS d(id, version, secs)
WHERE j.id = d.id AND j.lease_version = d.version AND j.status = 'leased'
RETURNING j.id, j.leased_until, j.cancel_requested
"""


@dataclass(frozen=True)
class Renewal:
    """Outcome of a lease renewal for one held job."""

    id: int
    leased_until: datetime
    cancel_requested: bool


def job_renew(leases: Iterable[tuple[int, int, float]], *, now: datetime | None = None,
              alias: str | None = None) -> dict[int, Renewal]:
    """Renew leases given as ``(job id, lease_version, lease seconds)``.

    Returns:
        The renewals by job id. A job missing from the result has lost its lease (reaped,
        released, cancelled or claimed again): its worker must stop and discard its outcome.
    """
    leases = list(leases)
    if not leases:
        return {}
    params = {"now": now, "ids": [x[0] for x in leases], "versions": [x[1] for x in leases],
              "secs": [float(x[2]) for x in leases]}
    with _cursor(alias) as cur:
        cur.execute(JOB_RENEW, params)
        return {r[0]: Renewal(r[0], r[1], r[2]) for r in cur.fetchall()}


# Mark many jobs done in one fenced statement (per row: id, token and status must still match, so
# a stale token updates nothing for that row while the others complete).
JOB_COMPLETE = f"""
WITH clock AS MATERIALIZED ({CLOCK})
UPDATE {JOB_TABLE} j
SET status = 'done', finished_at = clock.now, result = d.result::jsonb, leased_until = NULL
FROM clock, unnest(%(ids)s::bigint[], %(versions)s::bigint[], %(results)s::text[]) AS d(id, version, result)
WHERE j.id = d.id AND j.lease_version = d.version AND j.status = 'leased'
RETURNING j.id
"""


def job_complete(items: Iterable[tuple[int, int, str | None]], *, now: datetime | None = None,
                 alias: str | None = None) -> set[int]:
    """Mark jobs done, given ``(job id, lease_version, result JSON text or None)``.

    Returns:
        The ids that were completed; the others had lost their lease and were left untouched.
    """
    items = list(items)
    if not items:
        return set()
    params = {"now": now, "ids": [x[0] for x in items], "versions": [x[1] for x in items],
              "results": [x[2] for x in items]}
    with _cursor(alias) as cur:
        cur.execute(JOB_COMPLETE, params)
        return {r[0] for r in cur.fetchall()}


# Lock the job row if, and only if, the caller still holds the lease. Used by fenced_atomic():
# the row lock is held to the end of the caller's transaction, so no reaper, release or claim
# can change the token between this check and the commit of the handler's own rows.
JOB_LOCK_FENCED = f"""
SELECT id FROM {JOB_TABLE}
WHERE id = %(id)s AND lease_version = %(version)s AND status = 'leased'
FOR UPDATE
"""


def job_lock_fenced(job_id: int, version: int, *, alias: str | None = None) -> bool:
    """Lock the job row inside the current transaction if ``version`` is still its token.

    Returns:
        True when the lease is held (the row stays locked until the transaction ends).
    """
    with _cursor(alias) as cur:
        cur.execute(JOB_LOCK_FENCED, {"id": job_id, "version": version})
        return cur.fetchone() is not None


# Record a failed attempt: retry after ``delay`` seconds (database time), or dead-letter the job
# when its attempts are exhausted or no delay is given (a non-retryable failure). The error entry
# gets the database time appended. Fenced like every other worker write.
JOB_FAIL = f"""
WITH clock AS MATERIALIZED ({CLOCK})
UPDATE {JOB_TABLE} j
SET status = CASE WHEN %(delay)s::float8 IS NULL OR j.attempts >= j.max_attempts
                  THEN 'dead' ELSE 'ready' END,
    run_at = CASE WHEN %(delay)s::float8 IS NULL OR j.attempts >= j.max_attempts
                  THEN j.run_at ELSE clock.now + make_interval(secs => %(delay)s::float8) END,
    finished_at = CASE WHEN %(delay)s::float8 IS NULL OR j.attempts >= j.max_attempts
                       THEN clock.now ELSE NULL END,
    leased_until = NULL,
    errors = j.errors || jsonb_build_array(%(error)s::jsonb || jsonb_build_object('at', clock.now))
FROM clock
WHERE j.id = %(id)s AND j.lease_version = %(version)s AND j.status = 'leased'
RETURNING j.status, j.run_at
"""


def job_fail(job_id: int, version: int, error: dict[str, Any], *, retry_delay: float | None,
             now: datetime | None = None, alias: str | None = None) -> tuple[str, datetime] | None:
    """Record a failed attempt and either schedule a retry or dead-letter the job.

    Args:
        error: JSON-able dict (attempt, type, message, traceback, worker); ``at`` is added.
        retry_delay: seconds until the retry, or None to dead-letter at once (non-retryable).

    Returns:
        ``(new status, run_at)``, or None when the lease was lost (nothing was written).
    """
    params = {"now": now, "id": job_id, "version": version, "error": _dumps(error),
              "delay": None if retry_delay is None else float(retry_delay)}
    with _cursor(alias) as cur:
        cur.execute(JOB_FAIL, params)
        row = cur.fetchone()
    return (row[0], row[1]) if row else None


# Snooze: the handler asked to run again later. The job returns to ready at now + seconds and the
# claim's attempt is given back (attempts - 1), so snoozes never exhaust max_attempts; the snoozes
# counter caps runaway snoozing instead: past max_snoozes the job is dead-lettered.
JOB_SNOOZE = f"""
WITH clock AS MATERIALIZED ({CLOCK})
UPDATE {JOB_TABLE} j
SET status = CASE WHEN j.snoozes >= %(max_snoozes)s THEN 'dead' ELSE 'ready' END,
    run_at = clock.now + make_interval(secs => %(seconds)s::float8),
    finished_at = CASE WHEN j.snoozes >= %(max_snoozes)s THEN clock.now ELSE NULL END,
    attempts = CASE WHEN j.snoozes >= %(max_snoozes)s THEN j.attempts ELSE greatest(j.attempts - 1, 0) END,
    snoozes = j.snoozes + 1,
    leased_until = NULL,
    errors = CASE WHEN j.snoozes >= %(max_snoozes)s
             THEN j.errors || jsonb_build_array(jsonb_build_object(
                 'attempt', j.attempts, 'type', 'SnoozeLimitExceeded',
                 'message', 'snoozed more than ' || %(max_snoozes)s || ' times', 'traceback', '',
                 'worker', j.leased_by, 'at', clock.now))
             ELSE j.errors END
FROM clock
WHERE j.id = %(id)s AND j.lease_version = %(version)s AND j.status = 'leased'
RETURNING j.status
"""


def job_snooze(job_id: int, version: int, seconds: float, *, max_snoozes: int, now: datetime | None = None,
               alias: str | None = None) -> str | None:
    """Put a leased job back to ready in ``seconds`` without counting a failed attempt.

    Returns:
        The new status (``ready``, or ``dead`` past ``max_snoozes``), or None if the lease was lost.
    """
    with _cursor(alias) as cur:
        cur.execute(JOB_SNOOZE, {"now": now, "id": job_id, "version": version, "seconds": float(seconds),
                                 "max_snoozes": max_snoozes})
        row = cur.fetchone()
    return row[0] if row else None


# A running handler acknowledged a cancel request (raised JobCancelled): end the job cancelled.
JOB_CANCEL_LEASED = f"""
WITH clock AS MATERIALIZED ({CLOCK})
UPDATE {JOB_TABLE} j
SET status = 'cancelled', finished_at = clock.now, leased_until = NULL
FROM clock
WHERE j.id = %(id)s AND j.lease_version = %(version)s AND j.status = 'leased'
RETURNING j.id
"""


def job_cancel_leased(job_id: int, version: int, *, now: datetime | None = None,
                      alias: str | None = None) -> bool:
    """Mark a leased job cancelled by its own worker (fenced). Returns False if the lease was lost."""
    with _cursor(alias) as cur:
        cur.execute(JOB_CANCEL_LEASED, {"now": now, "id": job_id, "version": version})
        return cur.fetchone() is not None


# Give leases back without counting a failed attempt (graceful shutdown): the job is due at once
# and its token is bumped so that a late write by the releasing worker is refused.
JOB_RELEASE = f"""
WITH clock AS MATERIALIZED ({CLOCK})
UPDATE {JOB_TABLE} j
SET status = 'ready', run_at = clock.now, leased_until = NULL,
    attempts = greatest(j.attempts - 1, 0), lease_version = j.lease_version + 1,
    history = j.history || jsonb_build_array(jsonb_build_object(
        'event', 'released', 'reason', %(reason)s::text, 'worker', j.leased_by, 'at', clock.now))
FROM clock, unnest(%(ids)s::bigint[], %(versions)s::bigint[]) AS d(id, version)
WHERE j.id = d.id AND j.lease_version = d.version AND j.status = 'leased'
RETURNING j.id
"""


def job_release(leases: Iterable[tuple[int, int]], *, reason: str = "worker shutdown",
                now: datetime | None = None, alias: str | None = None) -> set[int]:
    """Return held jobs to ``ready`` at once, given ``(job id, lease_version)``; not a failed attempt.

    Returns:
        The ids released.
    """
    leases = list(leases)
    if not leases:
        return set()
    params = {"now": now, "reason": reason, "ids": [x[0] for x in leases], "versions": [x[1] for x in leases]}
    with _cursor(alias) as cur:
        cur.execute(JOB_RELEASE, params)
        return {r[0] for r in cur.fetchall()}


# Return expired leases (leased_until passed, by database time) to ready, or to dead when the
# attempts are exhausted, recording "lease expired" as the attempt's error and bumping the token.
# SKIP LOCKED lets several reapers run at once; the re-check in the outer WHERE makes the update a
# compare-and-set, so a worker that completed in between wins (River #1302).
JOB_REAP = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
expired AS MATERIALIZED (
    SELECT j.id FROM {JOB_TABLE} j, clock
    WHERE j.status = 'leased' AND j.leased_until < clock.now
    ORDER BY j.id
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE {JOB_TABLE} j
SET status = CASE WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'ready' END,
    run_at = clock.now,
    finished_at = CASE WHEN j.attempts >= j.max_attempts THEN clock.now ELSE NULL END,
    lease_version = j.lease_version + 1,
    leased_until = NULL,
    errors = j.errors || jsonb_build_array(jsonb_build_object(
        'attempt', j.attempts, 'type', 'LeaseExpired',
        'message', 'lease expired: the worker died, hung past its timeout or lost the database',
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


def job_reap_expired(*, limit: int = 500, now: datetime | None = None,
                     alias: str | None = None) -> list[Reaped]:
    """Take back up to ``limit`` expired leases; return what was reaped (status ready or dead)."""
    with _cursor(alias) as cur:
        cur.execute(JOB_REAP, {"now": now, "limit": limit})
        return [Reaped(*r) for r in cur.fetchall()]


# Delete finished jobs past their retention, a small batch at a time so that no statement holds
# many row locks or bloats one transaction. Dead jobs are kept until replayed or deleted.
JOB_PRUNE = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
old AS (
    SELECT j.id FROM {JOB_TABLE} j, clock
    WHERE j.status IN ('done', 'cancelled') AND j.finished_at < clock.now - make_interval(secs => %(age)s)
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
)
DELETE FROM {JOB_TABLE} j USING old WHERE j.id = old.id
"""


def job_prune(*, older_than: float, limit: int = 1000, now: datetime | None = None,
              alias: str | None = None) -> int:
    """Delete up to ``limit`` done/cancelled jobs finished more than ``older_than`` seconds ago.

    Returns:
        The number of rows deleted (call again while it equals ``limit``).
    """
    with _cursor(alias) as cur:
        cur.execute(JOB_PRUNE, {"now": now, "age": float(older_than), "limit": limit})
        return cur.rowcount


# ---------------------------------------------------------------------------------------------
# Process registry
# ---------------------------------------------------------------------------------------------

PROCESS_UPSERT = f"""
WITH clock AS MATERIALIZED ({CLOCK})
INSERT INTO {PROCESS_TABLE} (id, kind, host, pid, queues, concurrency, started_at, last_heartbeat_at)
SELECT %(id)s, %(kind)s, %(host)s, %(pid)s, %(queues)s::jsonb, %(concurrency)s, clock.now, clock.now FROM clock
ON CONFLICT (id) DO UPDATE SET kind = EXCLUDED.kind, host = EXCLUDED.host, pid = EXCLUDED.pid,
    queues = EXCLUDED.queues, concurrency = EXCLUDED.concurrency,
    started_at = EXCLUDED.started_at, last_heartbeat_at = EXCLUDED.last_heartbeat_at
"""

PROCESS_HEARTBEAT = f"""
WITH clock AS MATERIALIZED ({CLOCK})
UPDATE {PROCESS_TABLE} p SET last_heartbeat_at = clock.now,
    last_tick_at = CASE WHEN %(tick)s THEN clock.now ELSE p.last_tick_at END
FROM clock WHERE p.id = %(id)s
"""


def process_register(*, process_id: str, kind: str, host: str, pid: int, queues: Sequence[str] | None,
                     concurrency: int, now: datetime | None = None, alias: str | None = None) -> None:
    """Register (or re-register) a running worker/scheduler/reaper process."""
    with _cursor(alias) as cur:
        cur.execute(PROCESS_UPSERT, {"now": now, "id": process_id, "kind": kind, "host": host, "pid": pid,
                                     "queues": _dumps(list(queues) if queues is not None else ["*"]),
                                     "concurrency": concurrency})


def process_heartbeat(process_id: str, *, tick: bool = False, now: datetime | None = None,
                      alias: str | None = None) -> bool:
    """Touch a process row's heartbeat (and its scheduler tick when ``tick``); False if it was pruned."""
    with _cursor(alias) as cur:
        cur.execute(PROCESS_HEARTBEAT, {"now": now, "id": process_id, "tick": tick})
        return cur.rowcount == 1


def process_deregister(process_id: str, *, alias: str | None = None) -> None:
    """Remove a process row on clean exit."""
    with _cursor(alias) as cur:
        cur.execute(f"DELETE FROM {PROCESS_TABLE} WHERE id = %s", [process_id])


PROCESS_PRUNE = f"""
WITH clock AS MATERIALIZED ({CLOCK})
DELETE FROM {PROCESS_TABLE} p USING clock
WHERE p.last_heartbeat_at < clock.now - make_interval(secs => %(age)s)
"""


def process_prune(*, older_than: float, now: datetime | None = None, alias: str | None = None) -> int:
    """Delete process rows whose heartbeat is older than ``older_than`` seconds; return the count."""
    with _cursor(alias) as cur:
        cur.execute(PROCESS_PRUNE, {"now": now, "age": float(older_than)})
        return cur.rowcount


# ---- django tasks backend ----

# Store the return value of a job that its handler already completed inside fenced_atomic(): the
# value is known only after that block committed the job as done (with a null result). Fenced on
# the token and on 'done', so it can only fill in the result of the attempt that completed the job;
# a replayed job (ready again, and later done under a newer token) is never overwritten.
JOB_SET_RESULT = f"""
UPDATE {JOB_TABLE} SET result = %(result)s::jsonb
WHERE id = %(id)s AND lease_version = %(version)s AND status = 'done'
"""


def job_set_result(job_id: int, version: int, result_json: str, *, alias: str | None = None) -> bool:
    """Record ``result_json`` (JSON text) as the result of a job done under token ``version``.

    Returns:
        True when written; False when the job is not done under that token (nothing written).
    """
    with _cursor(alias) as cur:
        cur.execute(JOB_SET_RESULT, {"id": job_id, "version": version, "result": result_json})
        return cur.rowcount == 1


# Read one job by primary key (no lock): the tasks backend's get_result and the start of each
# framework-task attempt. Plain SQL rather than the ORM because the query compiler, not the
# database, was most of the cost of an attempt.
JOB_GET = f"SELECT {', '.join(_JOB_COLUMNS)} FROM {JOB_TABLE} WHERE id = %(id)s"


def job_get(job_id: int, *, alias: str | None = None) -> Job | None:
    """Return the job ``job_id`` as a :class:`Job` (read only, not locked), or None."""
    alias = alias or db_alias()
    with _cursor(alias) as cur:
        cur.execute(JOB_GET, {"id": job_id})
        rows = cur.fetchall()
    jobs = _jobs_from_rows(rows, alias)
    return jobs[0] if jobs else None
