"""The only module that claims, leases or changes the state of jobs.

Every statement that locks a job row or moves it between states is a named module-level constant
here, with a comment saying why it is shaped the way it is (the layout follows Procrastinate's
``queries.sql`` and River's rule that no ad-hoc SQL lives outside the query layer; a test in
``tests/test_architecture.py`` enforces it).

Rules every statement follows:

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
* **Flow control is part of the claim** (docs/howto/flow-control.md): every eligibility rule (due,
  ``ready``, queue not paused, concurrency key below its limit, queue rate allowance) is applied
  inside the locked candidate scan, before ``SKIP LOCKED`` and ``LIMIT``, never by claiming and
  then releasing (Oban #1498). A cancel request is honoured by every later write of the lease.
"""

from __future__ import annotations

import json
import logging
import uuid
import zoneinfo
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from django.db import IntegrityError, ProgrammingError, connections, router, transaction
from django.db.backends.utils import CursorWrapper
from psycopg import errors

from .exceptions import NotMigrated, UnknownTask
from .models import Job, QueueState, ReaperSweep, Schedule, WorkerProcess

if TYPE_CHECKING:
    from .conf import RateLimit

logger = logging.getLogger("django_leasequeue.store")

JOB_TABLE = Job._meta.db_table
PROCESS_TABLE = WorkerProcess._meta.db_table
SWEEP_TABLE = ReaperSweep._meta.db_table
QUEUE_TABLE = QueueState._meta.db_table
SCHEDULE_TABLE = Schedule._meta.db_table

# The statement clock, optionally overridden by the caller (tests pass an aware datetime).
CLOCK = "SELECT coalesce(%(now)s::timestamptz, leasequeue_now()) AS now"


def db_alias() -> str:
    """Return the database alias that holds the job table (through the database routers)."""
    return router.db_for_write(Job)


def _cursor(alias: str | None = None) -> CursorWrapper:
    return connections[alias or db_alias()].cursor()


@contextmanager
def _schema_required(alias: str | None) -> Iterator[None]:
    """Turn "relation leasequeue_job / function leasequeue_now() does not exist" into
    :class:`NotMigrated`, which says to run ``migrate`` (the usual first mistake of a new project:
    enqueueing before migrating). Other errors pass unchanged."""
    try:
        yield
    except ProgrammingError as exc:
        if isinstance(exc.__cause__, (errors.UndefinedTable, errors.UndefinedFunction)) and "leasequeue" in str(exc):
            first_line = str(exc).strip().splitlines()[0]
            raise NotMigrated(f"django-leasequeue's tables are missing in database {alias or db_alias()!r} "
                              f"({first_line}): run `manage.py migrate`") from exc
        raise


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def db_now(alias: str | None = None) -> datetime:
    """Return the database statement clock (``leasequeue_now()``) as an aware datetime."""
    with _cursor(alias) as cur:
        cur.execute("SELECT leasequeue_now()")
        now: datetime = cur.fetchone()[0]
        return now


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


_JOB_COLUMNS = [cast(str, f.column) for f in Job._meta.concrete_fields]
_RETURNING = ", ".join(f"ins.{c}" for c in _JOB_COLUMNS)

# The columns every enqueue path writes, in the order of their SELECT lists below.
_INSERT_COLUMNS = ("task, queue, priority, status, args, kwargs, run_at, attempts, max_attempts, lease_seconds, "
                   "leased_by, lease_version, unique_key, unique_scope, concurrency_key, concurrency_limit, "
                   "cancel_requested, snoozes, schedule_id, occurrence_at, errors, history, created_at")

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
        {_INSERT_COLUMNS}
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
    with _schema_required(alias), _cursor(alias) as cur:
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


# ---- fast enqueue (issue 8) ----
# One job: scalar parameters, not the unnest of fifteen one-element arrays, and no CTEs: this plain
# INSERT ... SELECT plans and runs in about half the time (it is a large part of an enqueue). The
# clock is read once, in the FROM subquery; created_at is that reading, so "due" is run_at <=
# created_at, and the NOTIFY (delivered at commit) is sent from RETURNING. RETURNING gives back only
# what the database decided (id, run_at, created_at); the caller builds the Job from what it sent.
JOB_INSERT_ONE = f"""
INSERT INTO {JOB_TABLE} (
    {_INSERT_COLUMNS}
)
SELECT %(task)s, %(queue)s, %(priority)s, 'ready', %(args)s::jsonb, %(kwargs)s::jsonb,
       coalesce(%(run_at)s::timestamptz, clock.now + make_interval(secs => %(delay)s::float8)), 0,
       %(max_attempts)s, %(lease_seconds)s::float8, '', 0, %(unique_key)s, %(unique_scope)s,
       %(concurrency_key)s, %(concurrency_limit)s::int, false, 0, %(schedule_id)s::bigint,
       %(occurrence_at)s::timestamptz, '[]'::jsonb, '[]'::jsonb, clock.now
FROM ({CLOCK}) AS clock
{{on_conflict}}
RETURNING id, run_at, created_at,
          CASE WHEN %(notify)s AND run_at <= created_at THEN pg_notify(%(channel)s, %(queue)s) END
"""
# ON CONFLICT only for jobs with a unique key: without one nothing can conflict (the id comes from
# the sequence), and ON CONFLICT makes every row a speculative insertion (an extra WAL record and a
# probe of every unique index per row).
_ON_CONFLICT = "ON CONFLICT DO NOTHING"
_INSERT_ONE = {unique: JOB_INSERT_ONE.format(on_conflict=_ON_CONFLICT if unique else "") for unique in (False, True)}

_ONE_FIELDS = ("task", "queue", "priority", "run_at", "delay", "max_attempts", "lease_seconds", "unique_key",
               "unique_scope", "concurrency_key", "concurrency_limit", "schedule_id", "occurrence_at")


def job_insert_one(job: NewJob, *, notify: bool, channel: str, now: datetime | None = None,
                   alias: str | None = None) -> Job | None:
    """Insert one job in the caller's transaction (see :func:`job_insert`); return it, or None when
    its unique key is already taken. NOTIFY on ``channel`` with the queue name when it is due."""
    alias = alias or db_alias()
    params = {name: getattr(job, name) for name in _ONE_FIELDS}
    params.update(now=now, notify=notify, channel=channel, args=job.args_json, kwargs=job.kwargs_json,
                  delay=float(job.delay))
    sql = _INSERT_ONE[job.unique_key is not None]
    with _schema_required(alias), _cursor(alias) as cur:
        cur.execute(sql, params)
        row = cur.fetchone()
    if row is None:
        return None
    values = {
        "id": row[0], "task": job.task, "queue": job.queue, "priority": job.priority, "status": "ready",
        "args": _load(job.args_json), "kwargs": _load(job.kwargs_json), "run_at": row[1], "attempts": 0,
        "max_attempts": job.max_attempts, "lease_seconds": job.lease_seconds, "leased_until": None,
        "leased_by": "", "lease_version": 0, "unique_key": job.unique_key, "unique_scope": job.unique_scope,
        "concurrency_key": job.concurrency_key, "concurrency_limit": job.concurrency_limit,
        "cancel_requested": False, "snoozes": 0, "schedule_id": job.schedule_id, "occurrence_at": job.occurrence_at,
        "interruptions": 0,
        "errors": [], "history": [], "result": None, "created_at": row[2], "started_at": None,
        "attempted_at": None, "finished_at": None,
    }
    return Job.from_db(alias, _JOB_ATTNAMES, [values[name] for name in _JOB_ATTNAMES])


_JOB_ATTNAMES = [f.attname for f in Job._meta.concrete_fields]

# Many jobs of one task with the same options (enqueue_many): the arguments travel as ONE JSON
# array per kind (args, kwargs) expanded by jsonb_array_elements, instead of one array parameter
# per column that the client quotes element by element; the order of the list is kept (ids follow
# it). One NOTIFY when the jobs are due. Returns the count and, when asked, the new ids as text.
JOB_INSERT_MANY = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
ins AS (
    INSERT INTO {JOB_TABLE} (
        {_INSERT_COLUMNS}
    )
    SELECT %(task)s, %(queue)s, %(priority)s, 'ready', a.value, coalesce(k.value, '{{{{}}}}'::jsonb),
           coalesce(%(run_at)s::timestamptz, clock.now + make_interval(secs => %(delay)s::float8)), 0,
           %(max_attempts)s, %(lease_seconds)s::float8, '', 0, %(unique_key)s, %(unique_scope)s,
           NULL, NULL, false, 0, NULL, NULL, '[]'::jsonb, '[]'::jsonb, clock.now
    FROM clock,
         jsonb_array_elements(%(args)s::jsonb) WITH ORDINALITY AS a(value, n)
         LEFT JOIN jsonb_array_elements(%(kwargs)s::jsonb) WITH ORDINALITY AS k(value, n) ON k.n = a.n
    ORDER BY a.n
    {{on_conflict}}
    RETURNING id, run_at
),
woken AS (
    SELECT pg_notify(%(channel)s, %(queue)s)
    FROM (SELECT 1 FROM ins, clock WHERE ins.run_at <= clock.now LIMIT 1) AS due
    WHERE %(notify)s
)
SELECT count(*), CASE WHEN %(want_ids)s THEN string_agg(id::text, ',' ORDER BY id) END,
       (SELECT count(*) FROM woken)
FROM ins
"""

_INSERT_MANY = {unique: JOB_INSERT_MANY.format(on_conflict=_ON_CONFLICT if unique else "") for unique in (False, True)}


def job_insert_many(template: NewJob, args_json: str, kwargs_json: str | None, *, notify: bool, channel: str,
                    want_ids: bool = False, now: datetime | None = None,
                    alias: str | None = None) -> tuple[int, list[int]]:
    """Insert jobs that share ``template``'s task and options, one per element of ``args_json``.

    Args:
        template: the shared task, queue, priority, run_at/delay, max_attempts, lease and unique
            key (its own args are ignored; no concurrency key: those differ per job).
        args_json: a JSON array with one array of positional arguments per job.
        kwargs_json: a JSON array of keyword-argument objects, parallel to ``args_json``, or None
            when no job has keyword arguments.
        want_ids: also return the new ids (in insertion order).

    Returns:
        ``(number inserted, ids or [])``; jobs whose unique key is taken are skipped.
    """
    params = {name: getattr(template, name) for name in _ONE_FIELDS if name not in (
        "concurrency_key", "concurrency_limit", "schedule_id", "occurrence_at")}
    params.update(now=now, notify=notify, channel=channel, args=args_json, kwargs=kwargs_json,
                  delay=float(template.delay), want_ids=want_ids)
    sql = _INSERT_MANY[template.unique_key is not None]
    with _schema_required(alias), _cursor(alias) as cur:
        cur.execute(sql, params)
        count, ids, _ = cur.fetchone()
    return count, ([int(x) for x in ids.split(",")] if ids else [])


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
    args: list[Any]
    kwargs: dict[str, Any]
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


# Timestamps come back as integer microseconds since the epoch (exact: extract() is numeric since
# PostgreSQL 14): C-level int loads instead of Django's Python-level timestamptz loader (one
# Python call per value, the largest single cost of a claim in a profile of the no-op drain).
_CLAIM_RETURNING = """
RETURNING j.id, j.task, j.queue, j.args, j.kwargs, j.attempts, j.max_attempts, j.lease_version,
          (extract(epoch FROM j.leased_until) * 1000000)::bigint, coalesce(j.lease_seconds, %(lease)s),
          (extract(epoch FROM clock.now) * 1000000)::bigint, j.priority,
          (extract(epoch FROM j.created_at) * 1000000)::bigint, (extract(epoch FROM j.started_at) * 1000000)::bigint,
          jsonb_array_length(j.errors), (extract(epoch FROM j.run_at) * 1000000)::bigint
"""

# Per-key concurrency limits (docs/howto/flow-control.md). A candidate with a concurrency key is
# admitted only if fewer than its concurrency_limit jobs of that key are leased, counting the
# ones this statement already admitted; leasequeue_conc_admit() (migration 0002) serialises the
# claimers of one key with a transaction-scoped advisory lock and counts on a fresh snapshot, so
# two workers claiming at the same instant cannot both take the last slot. The predicate sits in
# the locked candidate scan, before FOR UPDATE SKIP LOCKED and LIMIT (the Oban #1498 lesson): an
# over-limit job is never locked, never counts against the batch, and the scan keeps looking for
# other keys and keyless jobs behind it. Keyless jobs stop at the IS NULL test: no function call.
# %(claim)s is a fresh id per claim call, so admissions from an earlier claim in the same
# transaction are not counted twice. Keys the function found full or busy during this claim are
# listed in the setting leasequeue.conc_closed (prefixed by the claim id), and their rows are
# rejected by the inline strpos() before any function call: the look-ahead past a full key's
# backlog costs about as much as reading the rows (~0.3 us each), not a plpgsql call per row.
# The largest fencing token (migration 0004's leasequeue_job_lease_version_range). Every claim,
# reap, release and replay adds 1, so a row written by hand with a token at (or next to) the bound
# would make that statement refused by the constraint, for every row it writes: the claim of every
# worker, every reaper sweep, a whole release. A claim therefore takes only rows whose token can
# still take the claim and a reap or release (the others stay as they are, for an operator to read),
# and the reaper and the release never go past the bound: such a row is dead-lettered instead.
TOKEN_MAX = 4611686018427387904
_TOKEN_ROOM = f"""
          AND j.lease_version < {TOKEN_MAX - 1}"""

_CONC_ADMIT = _TOKEN_ROOM + """
          AND (j.concurrency_key IS NULL OR j.concurrency_limit IS NULL
               OR (NOT (starts_with(coalesce(current_setting('leasequeue.conc_closed', true), ''), %(claim)s)
                        AND strpos(current_setting('leasequeue.conc_closed', true),
                                   ';' || hashtext(j.concurrency_key)::text || ';') > 0)
                   AND leasequeue_conc_admit(j.concurrency_key, j.concurrency_limit::int, %(claim)s)))"""

# Rolling deploys: a worker passes the task names it has registered and claims only jobs of those
# tasks, so it never leases (and spends an attempt on) a job it could only dead-letter, while a
# newer worker that knows the task runs it. The test sits in the locked candidate scan next to the
# others, before the concurrency admission (a row of another task must not take a key's slot):
# rows of unknown tasks are stepped over like the rows of a full concurrency key, with the index
# leading by queue as before. The name list is a constant of the statement (client-side binding),
# which PostgreSQL hashes once it has 9 or more entries. _TASKS_SLOT marks where the test goes;
# the statements without it (tasks=None: testing helpers) are unchanged.
_TASKS_SLOT = "/*tasks*/"
_TASKS_FILTER = "\n          AND j.task = ANY(%(tasks)s::text[])"

_CLAIM_SET = """
SET status = 'leased',
    attempts = j.attempts + 1,
    lease_version = j.lease_version + 1,
    leased_until = clock.now + make_interval(secs => coalesce(j.lease_seconds, %(lease)s)),
    leased_by = %(worker)s,
    started_at = coalesce(j.started_at, clock.now),
    attempted_at = clock.now
"""

# Claim up to %(limit)s due jobs from the listed queues. The LATERAL subquery runs once per queue
# so each walks the partial index leasequeue_job_ready (queue, priority DESC, run_at, id) in order
# and stops after LIMIT rows; the outer ORDER BY/LIMIT merges the queues. A queue's surplus rows are
# locked only until this statement commits. Paused queues are filtered out before any row is read:
# the queue list is its own MATERIALIZED CTE, because as a plain subquery the planner may apply the
# paused anti-join above the LATERAL, after rows of a paused queue were already locked.
JOB_CLAIM = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
q AS MATERIALIZED (
    SELECT u.name FROM unnest(%(queues)s::text[]) AS u(name)
    WHERE NOT EXISTS (SELECT 1 FROM {QUEUE_TABLE} p WHERE p.name = u.name AND p.paused)
),
picked AS MATERIALIZED (
    SELECT c.id
    FROM clock, q
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_at
        FROM {JOB_TABLE} j
        WHERE j.status = 'ready' AND j.queue = q.name AND j.run_at <= clock.now{_TASKS_SLOT}{_CONC_ADMIT}
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c
    ORDER BY c.priority DESC, c.run_at, c.id
    LIMIT %(limit)s
)
UPDATE {JOB_TABLE} j
{_CLAIM_SET}
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
      AND NOT EXISTS (SELECT 1 FROM {QUEUE_TABLE} p WHERE p.name = j.queue AND p.paused){_TASKS_SLOT}{_CONC_ADMIT}
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE {JOB_TABLE} j
{_CLAIM_SET}
FROM picked, clock
WHERE j.id = picked.id
{_CLAIM_RETURNING}
"""

# ---- flow control: rate-limited claims ----
#
# Queue rate limits (LEASEQUEUE["QUEUES"][name]["rate_limit"] = "N/s|m|h"): at most N claims in
# any window of that length, across all workers. The queue's leasequeue_queue row keeps a sliding
# log of the claims inside the window, as [[epoch seconds, jobs], ...] (one entry per claim
# statement, so at most N entries, usually far fewer). A rated claim is one short transaction:
#
# 1. RATE_LOCK locks the rows of the rate-limited queues it claims from (FOR UPDATE, in name
#    order, so claimers never deadlock). Claimers of one rate-limited queue run one at a time;
#    claims on other queues are not affected.
# 2. JOB_CLAIM_RATED then starts, so its snapshot and its clock are both taken after the lock:
#    it sees the log as the previous holder committed it, and claim times are increasing in lock
#    order. Each queue may take allow = min(limit, N - jobs claimed in [now - window, now]); that
#    allowance is the LIMIT of the queue's locked candidate scan, so no row beyond it is locked.
#    The same statement appends its own claims to the log and drops entries older than the window
#    (the window is closed: a claim exactly `window` seconds after another still counts it).
#    Entries falling in the same 1/RATE_LOG_BUCKETS of the window are merged under the latest of
#    their times, so the log never holds more than about RATE_LOG_BUCKETS + 1 entries however many
#    claims a window sees. Merging only moves claim times later, so a claim is counted for at
#    least as long as the window says (never an extra claim); the price is that a slot frees up
#    to window/RATE_LOG_BUCKETS late (10 ms for "N/s", 0.6 s for "N/m", 36 s for "N/h").
#
# Why a log row and not count(attempted_at) over the jobs: a retried or snoozed job's earlier claim
# would vanish when attempted_at is overwritten (so the count would undercount and let bursts
# through), and an index on (queue, attempted_at) would take a new entry on every state change of
# every job, rate-limited or not, and would need the same per-queue lock anyway. The log row costs
# only rate-limited queues: one small HOT update of a row no index covers the changed columns of.
#
# The statement returns, for a queue whose allowance is used up, the seconds until its oldest
# logged claim leaves the window, so the worker waits exactly that long instead of polling.

# The rate log keeps at most about this many entries per queue (see above).
RATE_LOG_BUCKETS = 100

RATE_LOCK = f"""
SELECT name FROM {QUEUE_TABLE} WHERE name = ANY(%(names)s::text[]) ORDER BY name FOR UPDATE
"""

RATE_ROWS_CREATE = f"""
WITH clock AS MATERIALIZED ({CLOCK})
INSERT INTO {QUEUE_TABLE} (name, paused, paused_at, paused_by, updated_at, rate_log, throttled_total)
SELECT u.name, false, NULL, '', clock.now, '[]'::jsonb, 0 FROM clock, unnest(%(names)s::text[]) AS u(name)
ON CONFLICT (name) DO NOTHING
"""

# Per-queue allowance, from the locked rate row (queues without a rate limit: the whole batch).
_RATE_QUEUES = f"""
q AS MATERIALIZED (
    SELECT u.name, u.rate_n, u.rate_secs,
           CASE WHEN u.rate_n IS NULL THEN %(limit)s
                ELSE greatest(0, least(%(limit)s, u.rate_n - coalesce((
                    SELECT sum((e->>1)::int) FROM jsonb_array_elements(s.rate_log) AS e
                    WHERE (e->>0)::numeric >= extract(epoch FROM clock.now) - u.rate_secs::numeric), 0)))::int
           END AS allow
    FROM clock,
         unnest(%(queues)s::text[], %(rate_n)s::int[], %(rate_secs)s::float8[]) AS u(name, rate_n, rate_secs)
         LEFT JOIN {QUEUE_TABLE} s ON s.name = u.name
    WHERE NOT coalesce(s.paused, false)
)"""

# One queue's locked candidates, at most its allowance.
_RATE_LATERAL = f"""
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_at
        FROM {JOB_TABLE} j
        WHERE j.status = 'ready' AND j.queue = q.name AND j.run_at <= clock.now{_TASKS_SLOT}{_CONC_ADMIT}
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT q.allow
        FOR UPDATE SKIP LOCKED
    ) AS c"""

# Lease the picked rows, append this claim to each rated queue's log, report throttled queues.
_RATE_TAIL = f"""
claimed AS (
    -- id = ANY(ARRAY(...)): inside a CTE the planner otherwise hash-joins picked against a
    -- sequential scan of the whole job table; this probes the primary key per picked id.
    UPDATE {JOB_TABLE} j
    {_CLAIM_SET}
    FROM clock
    WHERE j.id = ANY(ARRAY(SELECT picked.id FROM picked))
    RETURNING j.id, j.task, j.queue, j.args, j.kwargs, j.attempts, j.max_attempts, j.lease_version,
              (extract(epoch FROM j.leased_until) * 1000000)::bigint AS leased_until,
              coalesce(j.lease_seconds, %(lease)s) AS lease_seconds,
              (extract(epoch FROM clock.now) * 1000000)::bigint AS claimed_at,
              j.priority, (extract(epoch FROM j.created_at) * 1000000)::bigint AS created_at,
              (extract(epoch FROM j.started_at) * 1000000)::bigint AS started_at,
              jsonb_array_length(j.errors) AS error_count, (extract(epoch FROM j.run_at) * 1000000)::bigint AS run_at
),
counts AS MATERIALIZED (
    SELECT q.name, q.rate_n, q.rate_secs, q.allow, extract(epoch FROM clock.now) AS now_s,
           (SELECT count(*) FROM claimed WHERE claimed.queue = q.name)::int AS k
    FROM q, clock
    WHERE q.rate_n IS NOT NULL
),
logged AS (
    UPDATE {QUEUE_TABLE} s
    SET rate_log = (
            SELECT coalesce(jsonb_agg(jsonb_build_array(b.t, b.c) ORDER BY b.t), '[]'::jsonb)
            FROM (
                SELECT max(x.t) AS t, sum(x.c)::int AS c
                FROM (
                    SELECT (e->>0)::numeric AS t, (e->>1)::int AS c FROM jsonb_array_elements(s.rate_log) AS e
                    WHERE (e->>0)::numeric >= d.now_s - d.rate_secs::numeric
                    UNION ALL
                    SELECT d.now_s, d.k WHERE d.k > 0
                ) AS x
                GROUP BY floor(x.t / (d.rate_secs::numeric / {RATE_LOG_BUCKETS}))
            ) AS b),
        throttled_total = s.throttled_total + CASE
            WHEN d.allow < %(limit)s AND d.k >= d.allow AND EXISTS (
                SELECT 1 FROM {JOB_TABLE} w, clock
                WHERE w.status = 'ready' AND w.queue = d.name AND w.run_at <= clock.now OFFSET d.k LIMIT 1)
            THEN 1 ELSE 0 END
    FROM counts d
    WHERE s.name = d.name
    RETURNING s.name, d.rate_n, d.rate_secs, d.now_s, d.k, s.rate_log
),
waits AS (
    -- Used up: seconds until the oldest logged claim leaves the window (then >= 1 job may go).
    SELECT coalesce(jsonb_object_agg(l.name, greatest(0.0, (
               SELECT min((e->>0)::numeric) FROM jsonb_array_elements(l.rate_log) AS e)
               + l.rate_secs::numeric - l.now_s)), '{{}}'::jsonb) AS waits
    FROM logged l
    WHERE (SELECT coalesce(sum((e->>1)::int), 0) FROM jsonb_array_elements(l.rate_log) AS e) >= l.rate_n
)
SELECT c.id, c.task, c.queue, c.args, c.kwargs, c.attempts, c.max_attempts, c.lease_version, c.leased_until,
       c.lease_seconds, c.claimed_at, c.priority, c.created_at, c.started_at, c.error_count, c.run_at, waits.waits
FROM waits LEFT JOIN claimed c ON true
"""

# Claim from named queues when some of them are rate-limited (after RATE_LOCK, same transaction).
JOB_CLAIM_RATED = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
{_RATE_QUEUES},
picked AS MATERIALIZED (
    SELECT c.id
    FROM clock, q
    {_RATE_LATERAL}
    ORDER BY c.priority DESC, c.run_at, c.id
    LIMIT %(limit)s
),
{_RATE_TAIL}
"""

# Claim from every queue when some queues are rate-limited: the unlimited queues through the
# any-queue scan, the rate-limited ones through their own allowance, merged in claim order.
JOB_CLAIM_ANY_QUEUE_RATED = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
{_RATE_QUEUES},
unrated AS MATERIALIZED (
    SELECT j.id, j.priority, j.run_at
    FROM {JOB_TABLE} j, clock
    WHERE j.status = 'ready' AND j.run_at <= clock.now AND j.queue <> ALL(%(queues)s::text[])
      AND NOT EXISTS (SELECT 1 FROM {QUEUE_TABLE} p WHERE p.name = j.queue AND p.paused){_TASKS_SLOT}{_CONC_ADMIT}
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
),
rated AS MATERIALIZED (
    SELECT c.id, c.priority, c.run_at
    FROM clock, q
    {_RATE_LATERAL}
),
picked AS MATERIALIZED (
    SELECT p.id FROM (SELECT * FROM unrated UNION ALL SELECT * FROM rated) AS p
    ORDER BY p.priority DESC, p.run_at, p.id
    LIMIT %(limit)s
),
{_RATE_TAIL}
"""


# The claim statements with the task filter in place of _TASKS_SLOT (see above).
_KNOWN_TASKS_CLAIM = {sql: sql.replace(_TASKS_SLOT, _TASKS_FILTER) for sql in
                      (JOB_CLAIM, JOB_CLAIM_ANY_QUEUE, JOB_CLAIM_RATED, JOB_CLAIM_ANY_QUEUE_RATED)}


class ClaimResult(list[ClaimedJob]):
    """The jobs leased by :func:`job_claim` (a list of :class:`ClaimedJob`), plus throttling news.

    Attributes:
        throttled (dict[str, float]): rate-limited queues whose allowance this claim used up, with
            the seconds until one more claim is allowed (the oldest logged claim leaves the window).
        corrupt (list[tuple[int, str, str]]): ``(job id, task, reason)`` of the claimed rows that
            could not be decoded and were dead-lettered as ``CorruptRow`` instead (not in the list).
    """

    def __init__(self, jobs: Iterable[ClaimedJob] = (), throttled: Mapping[str, float] | None = None) -> None:
        super().__init__(jobs)
        self.throttled: dict[str, float] = dict(throttled or {})
        self.corrupt: list[tuple[int, str, str]] = []

    @property
    def throttle_wait(self) -> float | None:
        """Seconds until the first throttled queue may be claimed from again; None if none is throttled."""
        return min(self.throttled.values()) if self.throttled else None


_new = object.__new__
_set = object.__setattr__
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _claim_order(rows: list[Any]) -> list[Any]:
    """Put claimed rows in claim order (priority descending, then run_at, then id; run_at is column
    15, epoch microseconds). UPDATE ... RETURNING gives no order; the worker starts a batch's jobs
    in list order."""
    if len(rows) > 1:
        rows.sort(key=lambda r: (-r[11], r[15], r[0]))
    return rows


def _claimed(r: Sequence[Any]) -> ClaimedJob:
    """Build a ClaimedJob from a ``_CLAIM_RETURNING`` row (timestamps as epoch microseconds)."""
    # The claim path builds one ClaimedJob per job: filling the frozen dataclass's __dict__ at once
    # costs a tenth of its generated __init__ (one object.__setattr__ per field). Same object.
    job: ClaimedJob = _new(ClaimedJob)
    _set(job, "__dict__", {
        "id": r[0], "task": r[1], "queue": r[2], "args": _load(r[3]), "kwargs": _load(r[4]), "attempts": r[5],
        "max_attempts": r[6], "lease_version": r[7], "leased_until": _EPOCH + r[8] * _MICROSECOND,
        "lease_seconds": float(r[9]), "claimed_at": _EPOCH + r[10] * _MICROSECOND, "priority": r[11],
        "created_at": _EPOCH + r[12] * _MICROSECOND,
        "started_at": None if r[13] is None else _EPOCH + r[13] * _MICROSECOND, "error_count": r[14],
    })
    return job


def job_claim(*, queues: Sequence[str] | None, limit: int, worker_id: str, lease: float,
              now: datetime | None = None, alias: str | None = None,
              rate_limits: Mapping[str, RateLimit] | None = None,
              tasks: Sequence[str] | None = None) -> ClaimResult:
    """Lease up to ``limit`` due ready jobs.

    Every eligibility rule is applied inside the locked candidate scan: due, ``ready``, queue not
    paused, the job's concurrency key below its limit (across all workers), and the queue's rate
    limit. Without rate-limited queues this is one statement; with them, one short transaction of
    two statements (see ``RATE_LOCK``).

    Args:
        queues: queue names to claim from, or None for every queue.
        limit: maximum number of jobs (the worker's free threads).
        worker_id: recorded in ``leased_by`` (host:pid:name).
        lease: default lease length in seconds, for jobs without their own ``lease_seconds``.
        now: aware datetime to use instead of the database clock (tests).
        rate_limits: queue name -> :class:`~django_leasequeue.conf.RateLimit`; None means
            ``LEASEQUEUE["QUEUES"]`` rate limits. Every worker must use the same limits.
        tasks: task names to claim (the worker's registered tasks); jobs of other tasks are left
            ``ready`` for a worker that knows them, untouched (no attempt spent). None: every task.

    Returns:
        A :class:`ClaimResult`: the claimed jobs in claim order (priority descending, then run_at,
        then id), and the rate-limited queues this claim used up (``throttled``, ``throttle_wait``).
    """
    if limit <= 0:
        return ClaimResult()
    if rate_limits is None:
        from .conf import get_settings

        rate_limits = get_settings().rate_limits
    alias = alias or db_alias()
    params: dict[str, Any] = {"now": now, "limit": limit, "worker": worker_id, "lease": float(lease),
                              "claim": uuid.uuid4().hex[:16],
                              "queues": list(queues) if queues is not None else None}
    if tasks is not None:
        params["tasks"] = list(tasks)
    rated = sorted(q for q in (rate_limits or {}) if queues is None or q in queues)
    if not rated:
        sql = JOB_CLAIM if queues is not None else JOB_CLAIM_ANY_QUEUE
        if tasks is not None:
            sql = _KNOWN_TASKS_CLAIM[sql]
        with _cursor(alias) as cur:
            cur.execute(sql, params)
            rows = cur.fetchall()
        return _decode_claims(_claim_order(rows), alias, worker_id=worker_id, now=now)
    names = list(queues) if queues is not None else rated
    params["queues"] = names
    params["rate_n"] = [rate_limits[q].limit if q in rate_limits else None for q in names]
    params["rate_secs"] = [float(rate_limits[q].per) if q in rate_limits else None for q in names]
    sql = JOB_CLAIM_RATED if queues is not None else JOB_CLAIM_ANY_QUEUE_RATED
    if tasks is not None:
        sql = _KNOWN_TASKS_CLAIM[sql]
    with transaction.atomic(using=alias), _cursor(alias) as cur:
        cur.execute(RATE_LOCK, {"names": rated})
        if len(cur.fetchall()) < len(rated):
            cur.execute(RATE_ROWS_CREATE, {"names": rated, "now": now})
            cur.execute(RATE_LOCK, {"names": rated})
        cur.execute(sql, params)
        rows = cur.fetchall()
    waits = _load(rows[0][16]) if rows else {}
    return _decode_claims(_claim_order([r for r in rows if r[0] is not None]), alias, worker_id=worker_id, now=now,
                          throttled={k: float(v) for k, v in (waits or {}).items()})


_TIME_FIELDS = ("leased_until", "claimed_at", "created_at", "started_at")


def _connection_zone(alias: str) -> zoneinfo.ZoneInfo | None:
    """The zone claimed times are converted to on ``alias`` (see :func:`_connection_times`), or None
    to keep them aware in UTC."""
    connection = connections[alias]
    if connection.timezone is not None or not connection.timezone_name:
        return None  # USE_TZ = True: aware, as decoded (or no TIME_ZONE to convert to)
    return zoneinfo.ZoneInfo(connection.timezone_name)


def _to_zone(job: ClaimedJob, zone: zoneinfo.ZoneInfo) -> None:
    values = job.__dict__  # frozen dataclass: fill its __dict__ as _claimed() does
    for name in _TIME_FIELDS:
        if values[name] is not None:
            values[name] = values[name].astimezone(zone).replace(tzinfo=None)


def _connection_times(jobs: ClaimResult, alias: str) -> ClaimResult:
    """Give the claim's times (decoded from epoch microseconds as aware UTC) the form of every other
    read on ``alias``: with ``USE_TZ = False`` Django reads timestamptz as naive datetimes in the
    connection's time zone (the ORM, lease renewals), and mixing both would raise TypeError."""
    zone = _connection_zone(alias) if jobs else None
    if zone is not None:
        for job in jobs:
            _to_zone(job, zone)
    return jobs


# Dead-letter a claimed row that cannot be decoded (CorruptRow): fenced on the token the claim just
# gave it, so a row another worker has claimed since is left alone. The row keeps every value as it
# is, for the operator to read in SQL; only the state, the lease and the error list change. errors
# itself may be what is corrupt, so a value that is not an array is replaced, not appended to.
JOB_DEAD_CORRUPT = f"""
WITH clock AS MATERIALIZED ({CLOCK})
UPDATE {JOB_TABLE} j
SET status = 'dead',
    finished_at = clock.now,
    leased_until = NULL,
    errors = CASE WHEN jsonb_typeof(j.errors) = 'array' THEN j.errors ELSE '[]'::jsonb END
             || jsonb_build_array(jsonb_build_object(
                 'attempt', j.attempts, 'type', 'CorruptRow', 'message', %(reason)s::text, 'traceback', '',
                 'worker', %(worker)s::text, 'at', clock.now))
FROM clock
WHERE j.id = %(id)s AND j.lease_version = %(version)s AND j.status = 'leased'
RETURNING j.id
"""


def _decode_claims(rows: Sequence[Sequence[Any]], alias: str, *, worker_id: str, now: datetime | None,
                   throttled: Mapping[str, float] | None = None) -> ClaimResult:
    """Decode claimed rows (in claim order) one at a time into a :class:`ClaimResult`.

    A row that cannot be decoded (a number Python refuses to read back, arguments that are not a
    list and an object, a time outside Python's datetime range: a row written by hand or by an older
    version) is dead-lettered at once with a ``CorruptRow`` error naming the reason, fenced on its
    new token, and left out; the rest of the batch runs. The claim has already committed (or will,
    with the caller's transaction), so raising instead would leave every row of the batch leased
    with no one to run it.
    """
    zone = _connection_zone(alias) if rows else None
    jobs = ClaimResult(throttled=throttled)
    corrupt: list[tuple[int, int, str, str]] = []
    for r in rows:
        try:
            job = _claimed(r)
            if type(job.args) is not list or type(job.kwargs) is not dict:
                raise TypeError(f"args is a JSON {type(job.args).__name__} and kwargs a JSON "
                                f"{type(job.kwargs).__name__}; they must be a list and an object")
            if zone is not None:
                _to_zone(job, zone)
        except Exception as exc:  # noqa: BLE001 - one bad row harms only itself
            corrupt.append((r[0], r[7], str(r[1]),
                            f"job row cannot be decoded: {type(exc).__name__}: {str(exc)[:500]}"))
            continue
        jobs.append(job)
    if corrupt:
        with _cursor(alias) as cur:
            for job_id, version, task, reason in corrupt:
                logger.error("job %s: dead-lettered as CorruptRow: %s", job_id, reason)
                cur.execute(JOB_DEAD_CORRUPT, {"now": now, "id": job_id, "version": version, "reason": reason,
                                               "worker": worker_id})
                if cur.rowcount:
                    jobs.corrupt.append((job_id, task, reason))
    return jobs


def _load(value: Any) -> Any:
    # Django loads jsonb as text; most jobs have no positional or no keyword arguments.
    if value == "[]":
        return []
    if value == "{}":
        return {}
    return json.loads(value) if isinstance(value, (str, bytes)) else value


# Extend the leases of many jobs at once. Only leased_until changes, and leased_until is in no
# index, so with the table's fillfactor these are HOT updates. Returns the rows still held, with
# their cancel flag (the heartbeat is how a running handler learns of a cancel request).
#
# SKIP LOCKED: a row locked by another transaction (this worker's own fenced_atomic(), or a new
# holder's) must not stall the heartbeat thread, which renews every job of the process: one long
# fenced transaction would otherwise let the other jobs' leases expire. A locked row that still
# carries our token in the statement's snapshot is reported as busy (held, not renewed this time).
JOB_RENEW = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
d AS MATERIALIZED (
    SELECT * FROM unnest(%(ids)s::bigint[], %(versions)s::bigint[], %(secs)s::float8[]) AS d(id, version, secs)
),
held AS MATERIALIZED (
    SELECT j.id FROM {JOB_TABLE} j JOIN d ON j.id = d.id
    WHERE j.lease_version = d.version AND j.status = 'leased'
    FOR UPDATE OF j SKIP LOCKED
),
renewed AS (
    UPDATE {JOB_TABLE} j
    SET leased_until = clock.now + make_interval(secs => d.secs)
    FROM held, d, clock
    WHERE j.id = held.id AND d.id = held.id
    RETURNING j.id, j.leased_until, j.cancel_requested
)
SELECT r.id, r.leased_until, r.cancel_requested, false FROM renewed r
UNION ALL
SELECT j.id, j.leased_until, j.cancel_requested, true
FROM {JOB_TABLE} j JOIN d ON j.id = d.id
WHERE j.lease_version = d.version AND j.status = 'leased' AND j.id NOT IN (SELECT id FROM held)
"""


@dataclass(frozen=True)
class Renewal:
    """Outcome of a lease renewal for one held job."""

    id: int
    leased_until: datetime
    cancel_requested: bool
    busy: bool = False  # row locked by another transaction: still ours, not renewed this time


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
        return {r[0]: Renewal(r[0], r[1], r[2], r[3]) for r in cur.fetchall()}


# Mark many jobs done in one fenced statement (per row: id, token and status must still match, so
# a stale token updates nothing for that row while the others complete). A job whose cancel was
# requested while it ran ends ``cancelled`` instead, with no result: the operator's cancel wins
# over a handler that ignored it, and no completion is recorded. Ids and tokens travel as one
# comma-separated text each and the completed ids come back the same way: with Django's
# client-side binding an int[] parameter is quoted element by element in Python, which was most of
# the completer's cost per job. Results are NULL when no job returned a value (unnest pads with NULL).
# With %(durable)s false the statement turns synchronous_commit off for its own transaction only
# (set_config(..., true) is SET LOCAL; the setting is read at commit, before the transaction's
# settings are reset), saving the WAL flush wait: the ASYNC_COMPLETIONS setting. Never the server's
# setting, never for enqueues or claims. A crash may lose the last completions; those jobs run again.
JOB_COMPLETE = f"""
WITH clock AS MATERIALIZED (
    SELECT coalesce(%(now)s::timestamptz, leasequeue_now()) AS now,
           CASE WHEN %(durable)s THEN NULL ELSE set_config('synchronous_commit', 'off', true) END AS sync
),
fin AS (
    UPDATE {JOB_TABLE} j
    SET status = CASE WHEN j.cancel_requested THEN 'cancelled' ELSE 'done' END,
        finished_at = clock.now,
        result = CASE WHEN j.cancel_requested THEN NULL ELSE d.result::jsonb END,
        leased_until = NULL
    FROM clock, unnest(string_to_array(%(ids)s, ',')::bigint[], string_to_array(%(versions)s, ',')::bigint[],
                       %(results)s::text[]) AS d(id, version, result)
    WHERE j.id = d.id AND j.lease_version = d.version AND j.status = 'leased'
    RETURNING j.id, j.status
)
SELECT string_agg(id::text, ',') FILTER (WHERE status = 'done'),
       string_agg(id::text, ',') FILTER (WHERE status = 'cancelled')
FROM fin
"""


class Completed(set[int]):
    """The ids :func:`job_complete` marked ``done`` (a set of int).

    Attributes:
        cancelled (set[int]): ids that ended ``cancelled`` instead, because a cancel was requested
            while their handler ran (the handler's result was discarded).
    """

    def __init__(self, done: Iterable[int] = (), cancelled: Iterable[int] = ()) -> None:
        super().__init__(done)
        self.cancelled: set[int] = set(cancelled)


def job_complete(items: Iterable[tuple[int, int, str | None]], *, now: datetime | None = None,
                 alias: str | None = None, synchronous_commit: bool = True) -> Completed:
    """Mark jobs done, given ``(job id, lease_version, result JSON text or None)``.

    Args:
        synchronous_commit: False commits this statement's transaction without waiting for the
            WAL flush (``ASYNC_COMPLETIONS``; only when the statement is its own transaction, i.e.
            outside ``atomic()``, does that stay limited to the completions).

    Returns:
        A :class:`Completed` set of the ids marked done; ids in its ``cancelled`` attribute ended
        ``cancelled`` (cancel requested); the others had lost their lease and were left untouched.
    """
    items = list(items)
    if not items:
        return Completed()
    results = [x[2] for x in items]
    params = {"now": now, "durable": synchronous_commit, "ids": ",".join([str(x[0]) for x in items]),
              "versions": ",".join([str(x[1]) for x in items]),
              "results": results if any(r is not None for r in results) else None}
    with _cursor(alias) as cur:
        cur.execute(JOB_COMPLETE, params)
        row = cur.fetchone()
    done, cancelled = row if row is not None else (None, None)
    return Completed(map(int, done.split(",")) if done else (), map(int, cancelled.split(",")) if cancelled else ())


# Lock the job row if, and only if, the caller still holds the lease. Used by fenced_atomic():
# the row lock is held to the end of the caller's transaction, so no reaper, release, claim or
# cancel request can change the row between this check and the commit of the handler's own rows.
# FOR UPDATE returns the newest committed version, so a cancel request committed before is seen.
JOB_LOCK_FENCED = f"""
SELECT id, cancel_requested FROM {JOB_TABLE}
WHERE id = %(id)s AND lease_version = %(version)s AND status = 'leased'
FOR UPDATE
"""


def job_lock_fenced(job_id: int, version: int, *, alias: str | None = None) -> bool:
    """Lock the job row inside the current transaction if ``version`` is still its token.

    Returns:
        True when the lease is held (the row stays locked until the transaction ends).
    """
    return job_lock_for_commit(job_id, version, alias=alias) != "lost"


def job_lock_for_commit(job_id: int, version: int, *, alias: str | None = None) -> str:
    """Lock the job row inside the current transaction for a fenced completion.

    Returns:
        ``"held"`` (lease held, no cancel requested; the row stays locked until the transaction
        ends), ``"cancel_requested"`` (lease held but an operator asked to cancel: the caller must
        not commit its work) or ``"lost"`` (the token is stale).
    """
    with _cursor(alias) as cur:
        cur.execute(JOB_LOCK_FENCED, {"id": job_id, "version": version})
        row = cur.fetchone()
    if row is None:
        return "lost"
    return "cancel_requested" if row[1] else "held"


# Record a failed attempt: retry after ``delay`` seconds (database time), or dead-letter the job
# when its attempts are exhausted or no delay is given (a non-retryable failure). The error entry
# gets the database time appended. Fenced like every other worker write. A job whose cancel was
# requested while it ran ends ``cancelled`` (error kept): retrying it would defeat the cancel.
JOB_FAIL = f"""
WITH clock AS MATERIALIZED ({CLOCK})
UPDATE {JOB_TABLE} j
SET status = CASE WHEN j.cancel_requested THEN 'cancelled'
                  WHEN %(delay)s::float8 IS NULL OR j.attempts >= j.max_attempts THEN 'dead'
                  ELSE 'ready' END,
    run_at = CASE WHEN j.cancel_requested OR %(delay)s::float8 IS NULL OR j.attempts >= j.max_attempts
                  THEN j.run_at ELSE clock.now + make_interval(secs => %(delay)s::float8) END,
    finished_at = CASE WHEN j.cancel_requested OR %(delay)s::float8 IS NULL OR j.attempts >= j.max_attempts
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
        ``(new status, run_at)`` (status ``ready``, ``dead``, or ``cancelled`` when a cancel was
        requested), or None when the lease was lost (nothing was written).
    """
    params = {"now": now, "id": job_id, "version": version, "error": _dumps(error),
              "delay": None if retry_delay is None else float(retry_delay)}
    with _cursor(alias) as cur:
        cur.execute(JOB_FAIL, params)
        row = cur.fetchone()
    return (row[0], row[1]) if row else None


# Snooze: the handler asked to run again later. The job returns to ready at now + seconds and the
# claim's attempt is given back (attempts - 1), so snoozes never exhaust max_attempts; the snoozes
# counter caps runaway snoozing instead: the snooze that would exceed max_snoozes dead-letters the
# job (a job may snooze max_snoozes times). A job whose cancel was requested ends cancelled.
JOB_SNOOZE = f"""
WITH clock AS MATERIALIZED ({CLOCK})
UPDATE {JOB_TABLE} j
SET status = CASE WHEN j.cancel_requested THEN 'cancelled'
                  WHEN j.snoozes >= %(max_snoozes)s THEN 'dead' ELSE 'ready' END,
    run_at = CASE WHEN j.cancel_requested OR j.snoozes >= %(max_snoozes)s THEN j.run_at
                  ELSE clock.now + make_interval(secs => %(seconds)s::float8) END,
    finished_at = CASE WHEN j.cancel_requested OR j.snoozes >= %(max_snoozes)s THEN clock.now ELSE NULL END,
    attempts = CASE WHEN j.cancel_requested OR j.snoozes >= %(max_snoozes)s THEN j.attempts
                    ELSE greatest(j.attempts - 1, 0) END,
    snoozes = CASE WHEN j.cancel_requested THEN j.snoozes ELSE j.snoozes + 1 END,
    leased_until = NULL,
    errors = CASE WHEN j.snoozes >= %(max_snoozes)s AND NOT j.cancel_requested
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
        The new status (``ready``; ``dead`` past ``max_snoozes``; ``cancelled`` when a cancel was
        requested), or None if the lease was lost.
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


# Give leases back without counting a failed attempt (graceful shutdown, or a prefetched job that
# no thread started): the job is due at once and its token is bumped so that a late write by the
# releasing worker is refused. A job whose cancel was requested ends cancelled instead of running
# again. Since the claim does not count, a job released from its first claim has no start time
# again (started_at is the first counted claim; attempted_at keeps the latest claim).
# An *interrupted* job (its handler had started: a graceful stop cut it short) counts one more
# interruption; the refund is bounded: a job already interrupted MAX_INTERRUPTIONS times is
# dead-lettered with an ``Interrupted`` error instead (its attempt counts), so a handler that hangs
# without a timeout stops re-running on every deploy. Prefetched jobs never ran: not interrupted.
JOB_RELEASE = f"""
WITH clock AS MATERIALIZED ({CLOCK})
UPDATE {JOB_TABLE} j
SET status = CASE WHEN j.cancel_requested THEN 'cancelled'
                  WHEN (%(interrupted)s AND j.interruptions >= %(max_interruptions)s)
                       OR j.lease_version >= {TOKEN_MAX - 2} THEN 'dead' ELSE 'ready' END,
    finished_at = CASE WHEN j.cancel_requested OR (%(interrupted)s AND j.interruptions >= %(max_interruptions)s)
                            OR j.lease_version >= {TOKEN_MAX - 2}
                       THEN clock.now ELSE NULL END,
    run_at = clock.now, leased_until = NULL,
    started_at = CASE WHEN j.attempts <= 1 AND NOT (%(interrupted)s AND j.interruptions >= %(max_interruptions)s)
                      THEN NULL ELSE j.started_at END,
    attempts = CASE WHEN %(interrupted)s AND j.interruptions >= %(max_interruptions)s THEN j.attempts
                    ELSE greatest(j.attempts - 1, 0) END,
    interruptions = CASE WHEN %(interrupted)s THEN j.interruptions + 1 ELSE j.interruptions END,
    lease_version = least(j.lease_version + 1, {TOKEN_MAX}),
    errors = CASE WHEN j.lease_version >= {TOKEN_MAX - 2} AND NOT j.cancel_requested
             THEN j.errors || jsonb_build_array(jsonb_build_object(
                 'attempt', j.attempts, 'type', 'CorruptRow',
                 'message', 'fencing token ' || j.lease_version || ' at its bound: the job cannot be claimed again',
                 'traceback', '', 'worker', j.leased_by, 'at', clock.now))
             WHEN %(interrupted)s AND j.interruptions >= %(max_interruptions)s AND NOT j.cancel_requested
             THEN j.errors || jsonb_build_array(jsonb_build_object(
                 'attempt', j.attempts, 'type', 'Interrupted',
                 'message', 'interrupted ' || (j.interruptions + 1) || ' times (' || %(reason)s::text
                            || '); MAX_INTERRUPTIONS is ' || %(max_interruptions)s
                            || ': the handler never finished within a graceful stop',
                 'traceback', '', 'worker', j.leased_by, 'at', clock.now))
             ELSE j.errors END,
    history = j.history || jsonb_build_array(jsonb_build_object(
        'event', 'released', 'reason', %(reason)s::text, 'worker', j.leased_by, 'at', clock.now,
        'interrupted', %(interrupted)s::boolean))
FROM clock, unnest(%(ids)s::bigint[], %(versions)s::bigint[]) AS d(id, version)
WHERE j.id = d.id AND j.lease_version = d.version AND j.status = 'leased'
RETURNING j.id, j.status
"""


def job_release(leases: Iterable[tuple[int, int]], *, reason: str = "worker shutdown", interrupted: bool = False,
                max_interruptions: int = 5, now: datetime | None = None, alias: str | None = None) -> Released:
    """Return held jobs to ``ready`` at once, given ``(job id, lease_version)``; not a failed attempt.

    Args:
        leases: ``(job id, lease_version)`` pairs; a pair whose token moved on is skipped.
        reason: recorded in the ``released`` history entry (and the ``Interrupted`` error).
        interrupted: True when the handlers had started (a graceful stop cut them short); False for
            prefetched jobs that never ran, which are released freely.
        max_interruptions: refunds of interrupted attempts a job may get (``MAX_INTERRUPTIONS``);
            an interrupted job already refunded this often is dead-lettered with an ``Interrupted``
            error instead (its attempt counts).

    Returns:
        The ids released (back to ready, or, with ``interrupted``, dead-lettered or cancelled):
        a :class:`Released` set whose ``dead`` attribute holds the dead-lettered ones.
    """
    leases = list(leases)
    if not leases:
        return Released()
    params = {"now": now, "reason": reason, "ids": [x[0] for x in leases], "versions": [x[1] for x in leases],
              "interrupted": bool(interrupted), "max_interruptions": int(max_interruptions)}
    with _cursor(alias) as cur:
        cur.execute(JOB_RELEASE, params)
        rows = cur.fetchall()
    return Released((r[0] for r in rows), dead=(r[0] for r in rows if r[1] == "dead"))


class Released(set[int]):
    """The ids :func:`job_release` gave back; ``dead`` holds those dead-lettered as ``Interrupted``."""

    def __init__(self, ids: Iterable[int] = (), dead: Iterable[int] = ()) -> None:
        super().__init__(ids)
        self.dead: set[int] = set(dead)


# A handler ran past its task's timeout in thread mode: it cannot be stopped, so the worker keeps
# the lease (and renews it) until the thread returns, and this entry marks the attempt as timed
# out meanwhile (fenced on the token, so it names exactly this attempt). Monitoring counts leased
# jobs whose history has such an entry for their current token as "stuck handlers".
JOB_NOTE_TIMED_OUT = f"""
WITH clock AS MATERIALIZED ({CLOCK})
UPDATE {JOB_TABLE} j
SET history = j.history || jsonb_build_array(jsonb_build_object(
    'event', 'timed_out', 'token', j.lease_version, 'attempt', j.attempts, 'worker', %(worker)s::text,
    'timeout', %(timeout)s::float8, 'at', clock.now))
FROM clock
WHERE j.id = %(id)s AND j.lease_version = %(version)s AND j.status = 'leased'
RETURNING j.id
"""


def job_note_timed_out(job_id: int, version: int, *, worker: str, timeout: float, now: datetime | None = None,
                       alias: str | None = None) -> bool:
    """Record that this attempt's handler ran past its task's ``timeout`` (seconds) and is still
    running (a ``timed_out`` history entry, fenced on ``version``). Status and lease are unchanged:
    the worker keeps the job leased until the handler returns.

    Returns:
        True when written; False when the token moved on (the lease was lost) or the job left ``leased``.
    """
    with _cursor(alias) as cur:
        cur.execute(JOB_NOTE_TIMED_OUT, {"now": now, "id": job_id, "version": version, "worker": worker,
                                         "timeout": float(timeout)})
        return cur.fetchone() is not None


# Return expired leases (leased_until passed, by database time) to ready, or to dead when the
# attempts are exhausted, recording "lease expired" as the attempt's error and bumping the token.
# SKIP LOCKED lets several reapers run at once; the re-check in the outer WHERE makes the update a
# compare-and-set, so a worker that completed in between wins (River #1302). A job whose cancel was
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
WITH clock AS MATERIALIZED ({CLOCK}),
sweep AS MATERIALIZED (
    INSERT INTO {SWEEP_TABLE} AS s (id, last_sweep_at, resumed_at) VALUES (1, clock_timestamp(), NULL)
    ON CONFLICT (id) DO UPDATE SET
        resumed_at = CASE WHEN s.last_sweep_at < EXCLUDED.last_sweep_at - make_interval(secs => %(silence)s::float8)
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
    with _cursor(alias) as cur:
        cur.execute(JOB_REAP, {"now": now, "limit": limit, "silence": None if silence is None else float(silence),
                               "lease": float(lease)})
        return [Reaped(*r) for r in cur.fetchall()]


# Delete finished jobs past their retention, a small batch at a time so that no statement holds
# many row locks or bloats one transaction. Dead jobs are kept until replayed or deleted.
# One subquery per status, each ordered by finished_at with the cutoff as a scalar subquery (a
# parameter, not a join with the clock): PostgreSQL then walks leasequeue_job_finished
# (status, finished_at) from the oldest row and stops at the cutoff. The previous single
# "status IN (...) AND finished_at < clock.now - age" form was planned as a sequential scan of the
# whole table, every batch, even with nothing to delete (issue 8: 0.4 ms instead of 114 ms on
# 300,000 rows with nothing due; the gap grows with the table).
JOB_PRUNE = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
done_old AS (
    SELECT j.id FROM {JOB_TABLE} j
    WHERE j.status = 'done' AND j.finished_at < (SELECT now FROM clock) - make_interval(secs => %(age)s)
    ORDER BY j.finished_at
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
),
cancelled_old AS (
    SELECT j.id FROM {JOB_TABLE} j
    WHERE j.status = 'cancelled' AND j.finished_at < (SELECT now FROM clock) - make_interval(secs => %(age)s)
    ORDER BY j.finished_at
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
)
DELETE FROM {JOB_TABLE} j
WHERE j.id IN (SELECT u.id FROM (SELECT id FROM done_old UNION ALL SELECT id FROM cancelled_old) AS u
               LIMIT %(limit)s)
"""


def job_prune(*, older_than: float, limit: int = 1000, now: datetime | None = None,
              alias: str | None = None) -> int:
    """Delete up to ``limit`` done/cancelled jobs finished more than ``older_than`` seconds ago.

    Returns:
        The number of rows deleted (call again while it equals ``limit``).
    """
    with _cursor(alias) as cur:
        cur.execute(JOB_PRUNE, {"now": now, "age": float(older_than), "limit": limit})
        deleted: int = cur.rowcount
        return deleted


# ---------------------------------------------------------------------------------------------
# ---- flow control: cancel requests, pause/resume, flow metrics ----
# (Per-key concurrency limits and queue rate limits live in the claim statements above.)
# ---------------------------------------------------------------------------------------------

# Cancel many jobs in one statement (the admin's Cancel button and bulk action). A ready job is
# cancelled at once; a leased job gets cancel_requested, which its worker learns at the next
# heartbeat (ctx.cancel_requested, ctx.check_cancel() raising JobCancelled), and which makes any
# later completion, failure, snooze, release or reap of that lease end the job cancelled. Setting
# the flag touches no indexed column, so on a leased row it is a HOT update. Rows are locked in id
# order (the ORDER BY sits below FOR UPDATE) so two bulk cancels cannot deadlock each other; a
# row held by a claim or a fenced_atomic() commit is waited for and re-checked after it commits.
JOB_REQUEST_CANCEL = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
target AS MATERIALIZED (
    SELECT j.id FROM {JOB_TABLE} j
    WHERE j.id = ANY(%(ids)s::bigint[])
      AND (j.status = 'ready' OR (j.status = 'leased' AND NOT j.cancel_requested))
    ORDER BY j.id
    FOR UPDATE
),
changed AS (
    UPDATE {JOB_TABLE} j
    SET status = CASE WHEN j.status = 'ready' THEN 'cancelled' ELSE j.status END,
        finished_at = CASE WHEN j.status = 'ready' THEN clock.now ELSE j.finished_at END,
        cancel_requested = (j.status = 'leased'),
        history = j.history || jsonb_build_array(jsonb_build_object(
            'event', CASE WHEN j.status = 'ready' THEN 'cancelled' ELSE 'cancel_requested' END,
            'by', %(by)s::text, 'at', clock.now))
    FROM target, clock
    WHERE j.id = target.id AND (j.status = 'ready' OR (j.status = 'leased' AND NOT j.cancel_requested))
    RETURNING j.status
)
SELECT count(*) FILTER (WHERE status = 'cancelled'), count(*) FILTER (WHERE status = 'leased') FROM changed
"""


@dataclass(frozen=True)
class CancelCounts:
    """Outcome of :func:`job_request_cancel`.

    Attributes:
        cancelled (int): ready jobs cancelled at once.
        requested (int): leased jobs asked to stop (they end ``cancelled`` when their worker next
            writes: check_cancel(), completion, failure, snooze, release or reap).
        unchanged (int): ids already finished, already asked to stop, or unknown.
    """

    cancelled: int
    requested: int
    unchanged: int


def job_request_cancel(ids: Iterable[int], *, by: str = "", now: datetime | None = None,
                       alias: str | None = None) -> CancelCounts:
    """Cancel ready jobs now and ask leased jobs to stop, in one statement (10,000 ids are fine).

    Args:
        ids: job ids (duplicates are ignored).
        by: who asked (recorded in each job's ``history``), e.g. the admin user name.
        now: aware datetime instead of the database clock (tests).

    Returns:
        :class:`CancelCounts`. Jobs already ``done``, ``dead`` or ``cancelled`` are left alone.
    """
    ids = sorted({int(i) for i in ids})
    if not ids:
        return CancelCounts(0, 0, 0)
    with _cursor(alias) as cur:
        cur.execute(JOB_REQUEST_CANCEL, {"now": now, "ids": ids, "by": by})
        cancelled, requested = cur.fetchone()
    return CancelCounts(cancelled, requested, len(ids) - cancelled - requested)


# Pause a queue: claims skip it from the next claim statement on (the claim reads
# leasequeue_queue.paused in SQL, so no worker has to notice anything). Leased jobs run to the end.
QUEUE_PAUSE = f"""
WITH clock AS MATERIALIZED ({CLOCK})
INSERT INTO {QUEUE_TABLE} AS s (name, paused, paused_at, paused_by, updated_at, rate_log, throttled_total)
SELECT %(name)s, true, clock.now, %(by)s, clock.now, '[]'::jsonb, 0 FROM clock
ON CONFLICT (name) DO UPDATE SET paused = true, paused_at = EXCLUDED.paused_at,
    paused_by = EXCLUDED.paused_by, updated_at = EXCLUDED.updated_at
WHERE NOT s.paused
RETURNING s.name
"""

# Resume a queue and wake idle workers at once (NOTIFY with the queue name, delivered at commit).
QUEUE_RESUME = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
resumed AS (
    UPDATE {QUEUE_TABLE} s SET paused = false, paused_at = NULL, paused_by = '', updated_at = clock.now
    FROM clock WHERE s.name = %(name)s AND s.paused
    RETURNING s.name
)
SELECT r.name, pg_notify(%(channel)s, r.name) FROM resumed r
"""


def queue_pause(name: str, *, by: str = "", now: datetime | None = None, alias: str | None = None) -> bool:
    """Pause queue ``name``: no job is claimed from it until :func:`queue_resume`.

    Takes effect at the next claim of every worker (the claim statement filters paused queues);
    jobs already leased run to the end. Works for queues not yet seen (the row is created).

    Args:
        name: queue name.
        by: who paused it (shown by ``manage.py leasequeue_queue list`` and the admin).

    Returns:
        True if the queue was running and is now paused; False if it was already paused.
    """
    with _cursor(alias) as cur:
        cur.execute(QUEUE_PAUSE, {"now": now, "name": name, "by": by})
        return cur.fetchone() is not None


def queue_resume(name: str, *, now: datetime | None = None, alias: str | None = None) -> bool:
    """Resume queue ``name`` and wake the workers that serve it (NOTIFY, at commit).

    Returns:
        True if the queue was paused and now runs again; False if it was not paused.
    """
    from .conf import get_settings

    with _cursor(alias) as cur:
        cur.execute(QUEUE_RESUME, {"now": now, "name": name, "channel": get_settings().notify_channel})
        return cur.fetchone() is not None


@dataclass(frozen=True)
class QueueInfo:
    """One queue as :func:`queue_list` reports it.

    Attributes:
        name (str): the queue name.
        paused (bool): True while paused.
        paused_at (datetime | None): when it was paused (database time).
        paused_by (str): who paused it.
        rate_limit (str | None): the configured ``"N/s|m|h"``.
        throttled_total (int): claims cut short by the rate limit since the row was created.
        ready (int): ready jobs (due or not).
        leased (int): leased jobs.
    """

    name: str
    paused: bool
    paused_at: datetime | None
    paused_by: str
    rate_limit: str | None
    throttled_total: int
    ready: int
    leased: int


QUEUE_LIST = f"""
WITH counts AS (
    SELECT queue AS name, count(*) FILTER (WHERE status = 'ready') AS ready,
           count(*) FILTER (WHERE status = 'leased') AS leased
    FROM {JOB_TABLE} WHERE status IN ('ready', 'leased') GROUP BY queue
),
names AS (
    SELECT name FROM {QUEUE_TABLE} UNION SELECT name FROM counts
    UNION SELECT unnest(%(configured)s::text[])
)
SELECT n.name, coalesce(s.paused, false), s.paused_at, coalesce(s.paused_by, ''),
       coalesce(s.throttled_total, 0), coalesce(c.ready, 0), coalesce(c.leased, 0)
FROM names n LEFT JOIN {QUEUE_TABLE} s ON s.name = n.name LEFT JOIN counts c ON c.name = n.name
ORDER BY n.name
"""


def queue_list(*, alias: str | None = None) -> list[QueueInfo]:
    """Every known queue (configured, with jobs ready/leased, or with a state row), by name.

    Reads the ready/leased counts with one aggregate over the job table: fine for a dashboard or a
    management command, not for a tight loop.
    """
    from .conf import get_settings

    settings = get_settings()
    with _cursor(alias) as cur:
        cur.execute(QUEUE_LIST, {"configured": sorted(settings.queues or [])})
        rows = cur.fetchall()
    rates = settings.rate_limits
    return [QueueInfo(name=r[0], paused=r[1], paused_at=r[2], paused_by=r[3],
                      rate_limit=str(rates[r[0]]) if r[0] in rates else None, throttled_total=r[4],
                      ready=r[5], leased=r[6]) for r in rows]


def queue_paused_names(*, alias: str | None = None) -> list[str]:
    """Names of the paused queues (metric "paused queues"), sorted."""
    return list(QueueState.objects.using(alias or db_alias()).filter(paused=True)
                .order_by("name").values_list("name", flat=True))


def queue_throttled_totals(*, alias: str | None = None) -> dict[str, int]:
    """Claims cut short by each queue's rate limit, since its state row was created (a counter,
    for the metric "throttled claims"; it only grows)."""
    return dict(QueueState.objects.using(alias or db_alias()).filter(throttled_total__gt=0)
                .order_by("name").values_list("name", "throttled_total"))


# Due ready jobs held back by their concurrency key (the key has concurrency_limit or more jobs
# leased), grouped per queue and key. Reads the ready rows that have a key and one index probe per
# key on leasequeue_job_conc_admit (see migration 0002 for the COLLATE "C" spelling); meant for
# monitoring every few seconds, not for claiming.
FLOW_KEYS_WAITING = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
waiting AS (
    SELECT r.queue, r.concurrency_key AS key, min(r.concurrency_limit) AS lim, count(*) AS due
    FROM {JOB_TABLE} r, clock
    WHERE r.status = 'ready' AND r.concurrency_key IS NOT NULL AND r.run_at <= clock.now
    GROUP BY r.queue, r.concurrency_key
)
SELECT w.queue, w.key, w.lim, w.due, l.leased
FROM waiting w
CROSS JOIN LATERAL (
    SELECT count(*) AS leased FROM {JOB_TABLE} x
    WHERE x.concurrency_key = w.key AND (x.status COLLATE "C") = 'leased' AND x.concurrency_key IS NOT NULL
) AS l
WHERE l.leased >= w.lim
ORDER BY w.due DESC, w.queue, w.key
"""


@dataclass(frozen=True)
class KeyWait:
    """A concurrency key whose due jobs wait because the key is at its limit.

    Attributes:
        queue (str), key (str); limit (int): the key's concurrency_limit (smallest among its
        waiting jobs); waiting (int): due ready jobs of the key in that queue; leased (int).
    """

    queue: str
    key: str
    limit: int
    waiting: int
    leased: int


def flow_keys_waiting(*, now: datetime | None = None, alias: str | None = None) -> list[KeyWait]:
    """Concurrency keys at their limit that have due jobs waiting, busiest first (for the admin)."""
    with _cursor(alias) as cur:
        cur.execute(FLOW_KEYS_WAITING, {"now": now})
        return [KeyWait(*r) for r in cur.fetchall()]


def flow_waiting_on_key(*, now: datetime | None = None, alias: str | None = None) -> dict[str, int]:
    """Due ready jobs waiting on a concurrency key, per queue (metric "jobs waiting on a
    concurrency key"). Queues with none are left out."""
    totals: dict[str, int] = {}
    for wait in flow_keys_waiting(now=now, alias=alias):
        totals[wait.queue] = totals.get(wait.queue, 0) + wait.waiting
    return totals


@dataclass(frozen=True)
class FlowMetrics:
    """The flow-control figures for monitoring (Prometheus gauges and counters).

    Attributes:
        waiting_on_key (dict[str, int]): queue -> due jobs held back by a concurrency key (gauge).
        throttled_claims (dict[str, int]): queue -> claims cut short by its rate limit (counter).
        paused_queues (list[str]): paused queue names (gauge: 1 per name).
    """

    waiting_on_key: dict[str, int]
    throttled_claims: dict[str, int]
    paused_queues: list[str]


def flow_metrics(*, now: datetime | None = None, alias: str | None = None) -> FlowMetrics:
    """Read all flow-control figures at once (three small queries). See :class:`FlowMetrics`."""
    return FlowMetrics(waiting_on_key=flow_waiting_on_key(now=now, alias=alias),
                       throttled_claims=queue_throttled_totals(alias=alias),
                       paused_queues=queue_paused_names(alias=alias))


# ---------------------------------------------------------------------------------------------
# Process registry
# ---------------------------------------------------------------------------------------------

PROCESS_UPSERT = f"""
WITH clock AS MATERIALIZED ({CLOCK})
INSERT INTO {PROCESS_TABLE} (id, kind, host, pid, queues, concurrency, tasks, started_at, last_heartbeat_at)
SELECT %(id)s, %(kind)s, %(host)s, %(pid)s, %(queues)s::jsonb, %(concurrency)s, %(tasks)s::jsonb, clock.now, clock.now
FROM clock
ON CONFLICT (id) DO UPDATE SET kind = EXCLUDED.kind, host = EXCLUDED.host, pid = EXCLUDED.pid,
    queues = EXCLUDED.queues, concurrency = EXCLUDED.concurrency, tasks = EXCLUDED.tasks,
    started_at = EXCLUDED.started_at, last_heartbeat_at = EXCLUDED.last_heartbeat_at
"""

PROCESS_HEARTBEAT = f"""
WITH clock AS MATERIALIZED ({CLOCK})
UPDATE {PROCESS_TABLE} p SET last_heartbeat_at = clock.now,
    last_tick_at = CASE WHEN %(tick)s THEN clock.now ELSE p.last_tick_at END
FROM clock WHERE p.id = %(id)s
"""


def process_register(*, process_id: str, kind: str, host: str, pid: int, queues: Sequence[str] | None,
                     concurrency: int, tasks: Sequence[str] | None = None, now: datetime | None = None,
                     alias: str | None = None) -> None:
    """Register (or re-register) a running worker/scheduler/reaper process.

    Args:
        queues: the queues it serves, or None for every queue (stored as ``["*"]``).
        concurrency: its handler threads (0 for a scheduler or reaper).
        tasks: the task names a worker can run (it claims only those); None: not recorded, which
            counts as knowing every task (:func:`job_dead_letter_unknown_tasks`).
        now: aware datetime instead of the database clock (tests); also the registration time.
    """
    with _cursor(alias) as cur:
        cur.execute(PROCESS_UPSERT, {"now": now, "id": process_id, "kind": kind, "host": host, "pid": pid,
                                     "queues": _dumps(list(queues) if queues is not None else ["*"]),
                                     "concurrency": concurrency,
                                     "tasks": _dumps(sorted(tasks)) if tasks is not None else None})


def process_heartbeat(process_id: str, *, tick: bool = False, now: datetime | None = None,
                      alias: str | None = None) -> bool:
    """Touch a process row's heartbeat (and its scheduler tick when ``tick``); False if it was pruned."""
    with _cursor(alias) as cur:
        cur.execute(PROCESS_HEARTBEAT, {"now": now, "id": process_id, "tick": tick})
        touched: int = cur.rowcount
        return touched == 1


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
        deleted: int = cur.rowcount
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
WITH RECURSIVE clock AS MATERIALIZED ({CLOCK}),
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
              "scan": int(scan), "type": f"{UnknownTask.__module__}.{UnknownTask.__qualname__}"}
    with _cursor(alias) as cur:
        cur.execute(JOB_DEAD_LETTER_UNKNOWN, params)
        return [DeadLettered(*r) for r in cur.fetchall()]


# ---------------------------------------------------------------------------------------------
# ---- monitoring ----
# ---------------------------------------------------------------------------------------------

# Record that a worker found its lease lost while its handler was still running (a "fence
# rejection": a renew, complete, fail or fenced_atomic write was refused because the token moved
# on). The outcome write itself wrote nothing, so this note is the only durable trace; the lease
# report counts these notes per task. It appends to ``history`` only, never touches status, token
# or lease, and is idempotent per token. The row may now be leased by another worker: SKIP LOCKED
# makes the note best-effort instead of letting a stale worker's heartbeat thread wait behind the
# new holder's fenced_atomic() transaction.
JOB_NOTE_LEASE_LOST = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
target AS (
    SELECT j.id FROM {JOB_TABLE} j
    WHERE j.id = %(id)s
      AND NOT j.history @> jsonb_build_array(jsonb_build_object('event', 'lease_lost', 'token', %(token)s::bigint))
    FOR UPDATE SKIP LOCKED
)
UPDATE {JOB_TABLE} j
SET history = j.history || jsonb_build_array(jsonb_build_object(
    'event', 'lease_lost', 'token', %(token)s::bigint, 'worker', %(worker)s::text, 'write', %(write)s::text,
    'timed_out', %(timed_out)s::boolean, 'at', clock.now))
FROM target, clock
WHERE j.id = target.id
RETURNING j.id
"""


def job_note_lease_lost(job_id: int, token: int, *, worker: str, write: str, timed_out: bool,
                        now: datetime | None = None, alias: str | None = None) -> bool:
    """Append a ``lease_lost`` event to a job's history (once per fencing token; never blocks).

    Args:
        job_id: the job.
        token: the stale ``lease_version`` the worker held.
        worker: the worker id (``host:pid:name``).
        write: which write was refused: ``renew``, ``complete``, ``fail``, ``snooze``, ``cancel``
            or ``handler`` (``fenced_atomic()``/``check_lease()`` raised :class:`LeaseLost`).
        timed_out: True when the attempt had already timed out (its handler ran past the task's
            timeout; the worker still renewed its lease), so the lease report does not count the
            loss as one "while healthy".

    Returns:
        True when the note was written; False when it already existed, the row is locked by
        another transaction right now, or the job is gone.
    """
    params = {"now": now, "id": job_id, "token": token, "worker": worker, "write": write,
              "timed_out": bool(timed_out)}
    with _cursor(alias) as cur:
        cur.execute(JOB_NOTE_LEASE_LOST, params)
        return cur.fetchone() is not None
# ---- schedules ----
# ---------------------------------------------------------------------------------------------
# The scheduler's writes. Correctness of "one job per occurrence" comes from the jobs' unique key
# (JOB_INSERT's ON CONFLICT DO NOTHING); the row lock below only stops two schedulers from doing
# the same work twice, and the monotonic advance keeps a stale scheduler from moving a schedule back.

_SCHEDULE_COLUMNS = """s.id, s.name, s.task, s.args, s.kwargs, s.cron, s.timezone, s.queue, s.priority,
       s.catch_up, s.catch_up_limit, s.last_occurrence_at, s.next_occurrence_at"""


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
    with _cursor(alias) as cur:
        cur.execute(SCHEDULE_LOCK_DUE, {"now": now, "limit": limit, "exclude": list(exclude)})
        rows = cur.fetchall()
    return [
        ScheduleRow(id=r[0], name=r[1], task=r[2], args=_load(r[3]), kwargs=_load(r[4]), cron=r[5],
                    timezone=r[6], queue=r[7], priority=r[8], catch_up=r[9], catch_up_limit=r[10],
                    last_occurrence_at=r[11], next_occurrence_at=r[12])
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
    with _cursor(alias) as cur:
        cur.execute(SCHEDULE_ADVANCE, params)
        return {r[0] for r in cur.fetchall()}


# Schedule.save() of an existing schedule: lock its row for the rest of the caller's transaction and
# read what the save needs to decide (the definition it may change and the scheduler's bookkeeping,
# which the save never writes back from its copy). A scheduler tick holding the row makes the save
# wait; a tick arriving during the save skips the row (SKIP LOCKED) and takes it on its next pass.
SCHEDULE_LOCK_FOR_SAVE = f"""
SELECT s.cron, s.timezone, s.enabled, s.last_occurrence_at, s.next_occurrence_at, s.skipped_occurrences
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
        datetimes or None) and ``skipped_occurrences``; None when no such row exists.
    """
    with _cursor(alias) as cur:
        cur.execute(SCHEDULE_LOCK_FOR_SAVE, {"id": schedule_id})
        row = cur.fetchone()
    if row is None:
        return None
    keys = ("cron", "timezone", "enabled", "last_occurrence_at", "next_occurrence_at", "skipped_occurrences")
    return dict(zip(keys, row, strict=True))


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
    with _cursor(alias) as cur:
        cur.execute(SCHEDULE_NEXT_DUE, {"exclude": list(exclude)})
        pending, earliest = cur.fetchone()
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
    last_occurrence_at, next_occurrence_at, skipped_occurrences, source, created_at, updated_at
)
SELECT t.name, t.task, t.args::jsonb, t.kwargs::jsonb, t.cron, t.timezone, t.queue, t.priority, t.enabled,
       t.catch_up, t.catch_up_limit, NULL, CASE WHEN t.enabled THEN t.next_at END, 0, 'settings',
       clock.now, clock.now
FROM clock, unnest(
    %(name)s::text[], %(task)s::text[], %(args)s::text[], %(kwargs)s::text[], %(cron)s::text[],
    %(timezone)s::text[], %(queue)s::text[], %(priority)s::smallint[], %(enabled)s::boolean[],
    %(catch_up)s::text[], %(catch_up_limit)s::int[], %(next_at)s::timestamptz[]
) AS t(name, task, args, kwargs, cron, timezone, queue, priority, enabled, catch_up, catch_up_limit, next_at)
ON CONFLICT (name) DO UPDATE SET
    task = EXCLUDED.task, args = EXCLUDED.args, kwargs = EXCLUDED.kwargs, cron = EXCLUDED.cron,
    timezone = EXCLUDED.timezone, queue = EXCLUDED.queue, priority = EXCLUDED.priority,
    enabled = EXCLUDED.enabled, catch_up = EXCLUDED.catch_up, catch_up_limit = EXCLUDED.catch_up_limit,
    source = 'settings', updated_at = EXCLUDED.updated_at,
    next_occurrence_at = CASE
        WHEN NOT EXCLUDED.enabled THEN NULL
        WHEN s.cron IS DISTINCT FROM EXCLUDED.cron OR s.timezone IS DISTINCT FROM EXCLUDED.timezone
             OR NOT s.enabled THEN EXCLUDED.next_occurrence_at
        ELSE s.next_occurrence_at END
WHERE (s.task, s.args, s.kwargs, s.cron, s.timezone, s.queue, s.priority, s.enabled, s.catch_up,
       s.catch_up_limit, s.source)
      IS DISTINCT FROM
      (EXCLUDED.task, EXCLUDED.args, EXCLUDED.kwargs, EXCLUDED.cron, EXCLUDED.timezone, EXCLUDED.queue,
       EXCLUDED.priority, EXCLUDED.enabled, EXCLUDED.catch_up, EXCLUDED.catch_up_limit, 'settings')
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
    }
    with _cursor(alias) as cur:
        cur.execute(SCHEDULE_SOURCES, params)
        existing = dict(cur.fetchall())
        written: list[str] = []
        if definitions:
            cur.execute(SCHEDULE_UPSERT_SETTINGS, params)
            written = [r[0] for r in cur.fetchall()]
        cur.execute(SCHEDULE_DISABLE_UNDECLARED, params)
        disabled = sorted(r[0] for r in cur.fetchall())
    return ScheduleSync(
        created=sorted(n for n in written if n not in existing),
        updated=sorted(n for n in written if n in existing),
        unchanged=sorted(n for n in names if n not in written),
        disabled=disabled,
        taken_over=sorted(n for n in written if existing.get(n, "settings") != "settings"),
    )
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
        written: int = cur.rowcount
        return written == 1


# A late return value (after fenced_atomic() marked the job done) that could not be stored: the
# completion stands, so the only trace the job's row can carry is this history entry. Fenced on the
# token and on 'done', as JOB_SET_RESULT is: a job that was since replayed is not annotated.
JOB_NOTE_RESULT_DROPPED = f"""
WITH clock AS MATERIALIZED ({CLOCK})
UPDATE {JOB_TABLE} j
SET history = j.history || jsonb_build_array(jsonb_build_object(
    'event', 'result_dropped', 'token', j.lease_version, 'reason', %(reason)s::text,
    'size', %(size)s::bigint, 'limit', %(limit)s::bigint, 'at', clock.now))
FROM clock
WHERE j.id = %(id)s AND j.lease_version = %(version)s AND j.status = 'done'
RETURNING j.id
"""


def job_note_result_dropped(job_id: int, version: int, *, reason: str, size: int | None = None,
                            limit: int | None = None, now: datetime | None = None,
                            alias: str | None = None) -> bool:
    """Record that the return value of a job done through ``fenced_atomic()`` was not stored.

    Appends ``{"event": "result_dropped", "token", "reason", "size", "limit", "at"}`` to the job's
    history (``at``: database time); status, result and token are unchanged.

    Args:
        job_id: the job.
        version: the fencing token (``lease_version``) the job was completed under.
        reason: why the value was dropped (the error's message), e.g. a ``ResultTooLarge`` text.
        size: the UTF-8 size of the value's JSON in bytes, or None when it has none (not JSON).
        limit: the ``MAX_RESULT_BYTES`` limit in bytes that refused it, or None.
        now: the database time to record (tests); None: the database clock.

    Returns:
        True when written; False when the job is not done under that token (nothing written).
    """
    with _cursor(alias) as cur:
        cur.execute(JOB_NOTE_RESULT_DROPPED, {"now": now, "id": job_id, "version": version, "reason": reason,
                                              "size": size, "limit": limit})
        return cur.fetchone() is not None


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


# ---------------------------------------------------------------------------------------------
# ---- admin operations ----
# Replay of dead letters and "retry now", for the admin's buttons and bulk actions. Each call is
# one statement for any number of ids (the admin sends 10,000 at a time), rows are locked in id
# order so two bulk operations cannot deadlock each other, and every change is appended to the
# job's ``history`` with who did it and when (database time).
# ---------------------------------------------------------------------------------------------

# Replay dead or cancelled jobs in place: the same row becomes ready again, due now. Because the
# row itself is replayed (no copy is inserted), replaying twice cannot create two runnable jobs:
# the second replay finds the row ready and changes nothing (C32); a concurrent second replay
# waits for the first one's row lock and then fails the status re-check.
#
# * attempts restart at 0 (the job gets its full max_attempts again); errors are kept; the fencing
#   token moves forward (lease_version + 1, never reset), so a write by any earlier lease holder
#   stays refused whatever happens next.
# * args/kwargs replace the stored ones when given (a fixed payload); the change is recorded in
#   history with the old and the new values, before the "replayed" entry.
# * unique keys: a retained-scope key stays with this row, so it is never in conflict. An
#   active-scope key is free while the job is dead or cancelled, so another ready or leased job may
#   hold it now: that row is refused (reported with the holder's id) instead of violating the
#   unique index. When several replayed rows share one active key, only the newest one is
#   replayed and the others are refused.
# * The target CTE locks rows in id order; its status filter is re-checked after a lock wait, so
#   a row replayed (or deleted) by a concurrent statement drops out.
JOB_REPLAY = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
req AS MATERIALIZED (SELECT DISTINCT r.id FROM unnest(%(ids)s::bigint[]) AS r(id)),
target AS MATERIALIZED (
    SELECT j.id, j.unique_key, j.unique_scope FROM {JOB_TABLE} j
    WHERE j.id IN (SELECT id FROM req) AND j.status IN ('dead', 'cancelled')
    ORDER BY j.id
    FOR UPDATE
),
keyed AS MATERIALIZED (
    SELECT t.id,
           CASE WHEN t.unique_key IS NOT NULL AND t.unique_scope = 'active' THEN (
               SELECT o.id FROM {JOB_TABLE} o
               WHERE o.unique_key = t.unique_key AND o.unique_scope = 'active'
                 AND o.status IN ('ready', 'leased') AND o.id <> t.id
               LIMIT 1)
           END AS holder,
           CASE WHEN t.unique_key IS NOT NULL AND t.unique_scope = 'active'
                THEN first_value(t.id) OVER (PARTITION BY t.unique_key, t.unique_scope ORDER BY t.id DESC)
           END AS key_winner
    FROM target t
),
replayed AS (
    UPDATE {JOB_TABLE} j
    SET status = 'ready', run_at = clock.now, attempts = 0, lease_version = least(j.lease_version + 1, {TOKEN_MAX}),
        leased_until = NULL, leased_by = '', finished_at = NULL, cancel_requested = false, snoozes = 0,
        interruptions = 0, result = NULL,
        args = coalesce(%(args)s::jsonb, j.args),
        kwargs = coalesce(%(kwargs)s::jsonb, j.kwargs),
        history = j.history
            || CASE WHEN coalesce(%(args)s::jsonb, j.args) IS DISTINCT FROM j.args
                      OR coalesce(%(kwargs)s::jsonb, j.kwargs) IS DISTINCT FROM j.kwargs
               THEN jsonb_build_array(jsonb_build_object(
                   'event', 'edited', 'by', %(by)s::text, 'at', clock.now,
                   'old', jsonb_build_object('args', j.args, 'kwargs', j.kwargs),
                   'new', jsonb_build_object('args', coalesce(%(args)s::jsonb, j.args),
                                             'kwargs', coalesce(%(kwargs)s::jsonb, j.kwargs))))
               ELSE '[]'::jsonb END
            || jsonb_build_array(jsonb_build_object(
                'event', 'replayed', 'by', %(by)s::text, 'at', clock.now, 'from_status', j.status,
                'attempts', j.attempts, 'token', least(j.lease_version + 1, {TOKEN_MAX})))
    FROM keyed k, clock
    WHERE j.id = k.id AND k.holder IS NULL AND (k.key_winner IS NULL OR k.key_winner = k.id)
      AND j.status IN ('dead', 'cancelled')
    RETURNING j.id, j.queue
),
woken AS (
    SELECT pg_notify(%(channel)s, q.queue) FROM (SELECT DISTINCT queue FROM replayed) AS q
    WHERE %(notify)s
)
SELECT r.id, j.status, j.unique_key, k.holder, k.key_winner, x.id IS NOT NULL,
       (SELECT count(*) FROM woken)
FROM req r
LEFT JOIN {JOB_TABLE} j ON j.id = r.id
LEFT JOIN keyed k ON k.id = r.id
LEFT JOIN replayed x ON x.id = r.id
ORDER BY r.id
"""


@dataclass(frozen=True)
class ReplayResult:
    """Outcome of :func:`job_replay`.

    Attributes:
        replayed (list[int]): ids now ready, due at once, in id order.
        refused (dict[int, str]): the other ids with the reason, e.g. ``"job is ready, only dead or
            cancelled jobs are replayed"`` or ``"unique key 'k' is held by job #7"``.
    """

    replayed: list[int]
    refused: dict[int, str]


def job_replay(ids: Iterable[int], *, by: str = "", args: list[Any] | None = None,
               kwargs: dict[str, Any] | None = None,
               now: datetime | None = None, alias: str | None = None) -> ReplayResult:
    """Replay dead or cancelled jobs in place, in one statement (10,000 ids are fine).

    Each replayed job becomes ``ready`` with ``run_at`` = now (database time), ``attempts`` = 0,
    ``lease_version`` + 1 (the fencing token only grows), its error history kept and a
    ``{"event": "replayed", "by": ..., "at": ...}`` entry appended to ``history``. Other ids are
    left alone and reported in :attr:`ReplayResult.refused`. Replaying the same job twice replays
    it once (the second call finds it ready). The idea of replaying a dead letter after fixing its
    payload is the "retry with modified arguments" of Sidekiq's and Oban's dashboards.

    Args:
        ids: job ids (duplicates are ignored).
        by: who replayed (recorded in history), e.g. the admin user name.
        args: new positional arguments for every replayed job, or None to keep each job's own.
            The caller validates them (``registry.check_json``); old and new values go to history.
        kwargs: new keyword arguments, likewise.
        now: aware datetime instead of the database clock (tests).

    Returns:
        :class:`ReplayResult`.

    Raises:
        TypeError: ``args`` is not a list or ``kwargs`` not a dict.
    """
    from .conf import get_settings

    if args is not None and not isinstance(args, list):
        raise TypeError(f"args must be a list, got {type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"kwargs must be a dict, got {type(kwargs).__name__}")
    ids = sorted({int(i) for i in ids})
    if not ids:
        return ReplayResult([], {})
    alias = alias or db_alias()
    settings = get_settings()
    params = {"now": now, "ids": ids, "by": by, "notify": settings.notify, "channel": settings.notify_channel,
              "args": None if args is None else _dumps(args),
              "kwargs": None if kwargs is None else _dumps(kwargs)}
    # A concurrent enqueue may take a replayed row's active-scope key after this statement's
    # snapshot was taken; the unique index then refuses the UPDATE. The savepoint keeps the
    # caller's transaction usable and the second round sees the new holder and refuses that row.
    for round_ in range(2):
        try:
            with transaction.atomic(using=alias), _cursor(alias) as cur:
                cur.execute(JOB_REPLAY, params)
                rows = cur.fetchall()
            break
        except IntegrityError:
            if round_:
                raise
    replayed: list[int] = []
    refused: dict[int, str] = {}
    for job_id, status, key, holder, winner, done, _woken in rows:
        if done:
            replayed.append(job_id)
        elif status is None:
            refused[job_id] = "no such job"
        elif status not in ("dead", "cancelled"):
            refused[job_id] = f"job is {status}; only dead or cancelled jobs are replayed"
        elif holder is not None:
            refused[job_id] = f"unique key {key!r} is held by job #{holder}, which is ready or leased"
        elif winner is not None and winner != job_id:
            refused[job_id] = f"unique key {key!r} is shared with job #{winner}, which was replayed instead"
        else:
            refused[job_id] = "changed while being replayed (replayed or deleted by someone else)"
    return ReplayResult(replayed, refused)


# Make ready jobs that wait out a retry backoff due now (the operator fixed the cause and does not
# want to wait). Only jobs that already failed at least once (attempts > 0) and are not yet due
# are touched: a delayed first run or a cron occurrence emitted early is not a retry. Locks in id
# order like the other bulk statements; a NOTIFY per queue wakes idle workers at commit.
JOB_RETRY_NOW = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
target AS MATERIALIZED (
    SELECT j.id FROM {JOB_TABLE} j, clock
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.status = 'ready' AND j.attempts > 0 AND j.run_at > clock.now
    ORDER BY j.id
    FOR UPDATE OF j
),
changed AS (
    UPDATE {JOB_TABLE} j
    SET run_at = clock.now,
        history = j.history || jsonb_build_array(jsonb_build_object(
            'event', 'retry_now', 'by', %(by)s::text, 'at', clock.now, 'run_at_was', j.run_at))
    FROM target, clock
    WHERE j.id = target.id AND j.status = 'ready' AND j.run_at > clock.now
    RETURNING j.id, j.queue
),
woken AS (
    SELECT pg_notify(%(channel)s, q.queue) FROM (SELECT DISTINCT queue FROM changed) AS q
    WHERE %(notify)s
)
SELECT count(*), (SELECT count(*) FROM woken) FROM changed
"""


def job_retry_now(ids: Iterable[int], *, by: str = "", now: datetime | None = None,
                  alias: str | None = None) -> int:
    """Make ready jobs waiting on a retry backoff due now, in one statement.

    Args:
        ids: job ids; only ``ready`` jobs with ``attempts > 0`` and ``run_at`` in the future change.
        by: who asked (recorded in history with the previous ``run_at``).
        now: aware datetime instead of the database clock (tests).

    Returns:
        The number of jobs made due.
    """
    from .conf import get_settings

    ids = sorted({int(i) for i in ids})
    if not ids:
        return 0
    settings = get_settings()
    with _cursor(alias) as cur:
        cur.execute(JOB_RETRY_NOW, {"now": now, "ids": ids, "by": by, "notify": settings.notify,
                                    "channel": settings.notify_channel})
        moved: int = cur.fetchone()[0]
        return moved


# ---------------------------------------------------------------------------------------------
# ---- testing helpers ----
# Statements used only by django_leasequeue.testing (users' tests): claim chosen jobs, expire one
# lease, pull future jobs forward, and move this session's database clock. They follow the same
# rules as the rest of this module (one clock read per statement, fenced on the token).
# ---------------------------------------------------------------------------------------------

# Claim the listed jobs (not "the next due ones"): eager mode runs exactly the jobs the code
# under test enqueued, and the lost-lease simulation has a second worker take over one job. Same
# eligibility as JOB_CLAIM (ready, due, queue not paused, concurrency key admitted) and the same
# SET and RETURNING, so the claimed row is indistinguishable from a worker's claim.
JOB_CLAIM_IDS = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
picked AS MATERIALIZED (
    SELECT j.id
    FROM {JOB_TABLE} j, clock
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.status = 'ready' AND j.run_at <= clock.now
      AND NOT EXISTS (SELECT 1 FROM {QUEUE_TABLE} p WHERE p.name = j.queue AND p.paused){_CONC_ADMIT}
    ORDER BY j.priority DESC, j.run_at, j.id
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE {JOB_TABLE} j
{_CLAIM_SET}
FROM picked, clock
WHERE j.id = picked.id
{_CLAIM_RETURNING}
"""


def job_claim_ids(ids: Iterable[int], *, worker_id: str, lease: float, now: datetime | None = None,
                  alias: str | None = None) -> ClaimResult:
    """Lease the listed jobs that are claimable now, as :func:`job_claim` would (testing helpers).

    Args:
        ids: job primary keys.
        worker_id: recorded in ``leased_by``.
        lease: default lease in seconds for jobs without their own ``lease_seconds``.
        now: aware datetime instead of the database clock.

    Returns:
        A :class:`ClaimResult` of the jobs leased, in claim order; a job that is not ``ready``, not
        due, in a paused queue or over its concurrency limit is left alone and not returned.
    """
    ids = list(ids)
    if not ids:
        return ClaimResult()
    params = {"now": now, "ids": ids, "worker": worker_id, "lease": float(lease), "claim": uuid.uuid4().hex[:16]}
    with _cursor(alias) as cur:
        cur.execute(JOB_CLAIM_IDS, params)
        rows = cur.fetchall()
    return _decode_claims(_claim_order(rows), alias or db_alias(), worker_id=worker_id, now=now)


# Make one held lease expire now, as if its worker had stopped renewing it long enough ago. Only
# leased_until changes; the reaper then takes the job back through its ordinary statement.
JOB_EXPIRE_LEASE = f"""
WITH clock AS MATERIALIZED ({CLOCK})
UPDATE {JOB_TABLE} j
SET leased_until = clock.now - interval '1 millisecond'
FROM clock
WHERE j.id = %(id)s AND j.lease_version = %(version)s AND j.status = 'leased'
RETURNING j.id
"""


def job_expire_lease(job_id: int, version: int, *, now: datetime | None = None, alias: str | None = None) -> bool:
    """Set the lease of ``job_id`` (token ``version``) to have expired just now (testing helpers).

    Returns:
        True when the lease was held with that token and now counts as expired.
    """
    with _cursor(alias) as cur:
        cur.execute(JOB_EXPIRE_LEASE, {"now": now, "id": job_id, "version": version})
        return cur.fetchone() is not None


# Pull ready jobs whose run_at is in the future (scheduled, or retrying after a backoff) forward
# to now, so that the ordinary claim sees them due: drain(include_future=True).
JOB_MAKE_DUE = f"""
WITH clock AS MATERIALIZED ({CLOCK})
UPDATE {JOB_TABLE} j
SET run_at = clock.now
FROM clock
WHERE j.status = 'ready' AND j.run_at > clock.now
  AND (%(queues)s::text[] IS NULL OR j.queue = ANY(%(queues)s::text[]))
"""


def job_make_due(*, queues: Sequence[str] | None = None, now: datetime | None = None,
                 alias: str | None = None) -> int:
    """Set ``run_at`` to now for ready jobs due later, in ``queues`` (None: all) (testing helpers).

    Returns:
        The number of jobs moved.
    """
    with _cursor(alias) as cur:
        cur.execute(JOB_MAKE_DUE, {"now": now, "queues": list(queues) if queues is not None else None})
        moved: int = cur.rowcount
        return moved


# The offset leasequeue_now() adds to clock_timestamp(), for this database session. is_local is
# false: it lasts for the session (a SET inside a transaction that rolls back is undone too, so
# a pytest-django `db` test leaves nothing behind).
CLOCK_OFFSET_SET = "SELECT set_config('leasequeue.clock_offset', %(offset)s, false)"
CLOCK_OFFSET_GET = """
SELECT extract(epoch FROM coalesce(nullif(current_setting('leasequeue.clock_offset', true), ''), '0')::interval)
"""
CLOCK_RAW_NOW = "SELECT clock_timestamp()"


def clock_offset_set(seconds: float, *, alias: str | None = None) -> None:
    """Make ``leasequeue_now()`` run ``seconds`` ahead of the real clock on this connection."""
    with _cursor(alias) as cur:
        cur.execute(CLOCK_OFFSET_SET, {"offset": f"{float(seconds):.6f} seconds"})


def clock_offset_get(*, alias: str | None = None) -> float:
    """Return the clock offset of this connection's session, in seconds (0.0 when unset)."""
    with _cursor(alias) as cur:
        cur.execute(CLOCK_OFFSET_GET)
        return float(cur.fetchone()[0])


def clock_real_now(*, alias: str | None = None) -> datetime:
    """Return the database's real clock (``clock_timestamp()``, without the offset)."""
    with _cursor(alias) as cur:
        cur.execute(CLOCK_RAW_NOW)
        real_now: datetime = cur.fetchone()[0]
        return real_now
