"""Job inserts: the enqueue statements (many jobs, one job, many jobs of one task) and the lookup
of a job by its unique key."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from ..models import Job
from ._db import (
    _JOB_ATTNAMES,
    _JOB_COLUMNS,
    CLOCK,
    JOB_TABLE,
    _jobs_from_rows,
    _load,
    _run,
    _run_prepared,
    _schema_required,
    db_alias,
    logger,
)
from .sequences import sequence_locked
from .trace_values import trace_json


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
    # What an enqueue does when ``unique_key`` is taken (see enqueueing.enqueue): "keep", "replace",
    # "debounce" or "throttle". For "debounce", ``delay`` is the debounce delay and
    # ``debounce_max_wait`` caps run_at at created_at + that many seconds (None: no cap); for
    # "throttle", ``throttle`` is the window in whole seconds (the key is derived per window at insert).
    unique_mode: str = "keep"
    debounce_max_wait: float | None = None
    throttle: float | None = None
    sequence_key: str | None = None
    sequence_halts: bool = False
    rate_key: str | None = None
    rate_limit_n: int | None = None
    rate_limit_secs: float | None = None
    fair_key: str | None = None


_RETURNING = ", ".join(f"ins.{c}" for c in _JOB_COLUMNS)

# The columns every enqueue path writes, in the order of their SELECT lists below.
_INSERT_COLUMNS = ("task, queue, priority, status, args, kwargs, run_at, attempts, max_attempts, lease_seconds, "
                   "leased_by, lease_version, unique_key, unique_scope, concurrency_key, concurrency_limit, "
                   "cancel_requested, snoozes, schedule_id, occurrence_at, errors, history, created_at, "
                   "sequence_key, sequence_halts, rate_key, rate_limit_n, rate_limit_secs, fair_key, trace_context")

# Insert many jobs in one statement (unnest of parallel arrays), skipping unique-key conflicts.
# ``ON CONFLICT DO NOTHING`` (no target) covers both partial unique indexes and never raises, so
# the caller's transaction survives a duplicate; when the conflicting row belongs to a concurrent
# uncommitted transaction PostgreSQL waits for it, so a rolled-back racer never blocks the survivor.
# One NOTIFY per distinct due queue: PostgreSQL also folds identical notifications within a
# transaction, so a bulk enqueue sends a handful, not one per job; the payload is only the queue
# name, far below the 8000-byte limit. Jobs due later send one NOTIFY per queue too, with the
# earliest run_at of that queue's new jobs: "<queue> <run_at as POSIX seconds>" (see
# :mod:`django_leasequeue.notify`), so that a sleeping worker wakes at that time, not a poll later.
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
           clock.now, t.sequence_key, t.sequence_halts, t.rate_key, t.rate_limit_n, t.rate_limit_secs, t.fair_key,
           %(trace_context)s::jsonb
    FROM clock, unnest(
        %(task)s::text[], %(queue)s::text[], %(priority)s::smallint[], %(args)s::text[],
        %(kwargs)s::text[], %(run_at)s::timestamptz[], %(delay)s::float8[], %(max_attempts)s::int[],
        %(lease_seconds)s::float8[], %(unique_key)s::text[], %(unique_scope)s::text[],
        %(concurrency_key)s::text[], %(concurrency_limit)s::int[], %(schedule_id)s::bigint[],
        %(occurrence_at)s::timestamptz[], %(sequence_key)s::text[], %(sequence_halts)s::bool[],
        %(rate_key)s::text[], %(rate_limit_n)s::int[], %(rate_limit_secs)s::float8[], %(fair_key)s::text[]
    ) AS t(task, queue, priority, args, kwargs, run_at, delay, max_attempts, lease_seconds,
           unique_key, unique_scope, concurrency_key, concurrency_limit, schedule_id, occurrence_at,
           sequence_key, sequence_halts, rate_key, rate_limit_n, rate_limit_secs, fair_key)
    ON CONFLICT DO NOTHING
    RETURNING *
),
woken AS (
    SELECT pg_notify(%(channel)s, q.queue)
    FROM (SELECT DISTINCT ins.queue FROM ins, clock WHERE ins.run_at <= clock.now) AS q
    WHERE %(notify)s
),
woken_later AS (
    SELECT pg_notify(%(channel)s, f.queue || ' ' || extract(epoch FROM f.run_at)::text)
    FROM (SELECT ins.queue, min(ins.run_at) AS run_at FROM ins, clock WHERE ins.run_at > clock.now
          GROUP BY ins.queue) AS f
    WHERE %(notify)s
)
SELECT {_RETURNING}, (SELECT count(*) FROM woken) + (SELECT count(*) FROM woken_later) AS woken FROM ins
"""


TraceContext = Mapping[str, str]


def _trace_json(trace_context: TraceContext | None) -> str | None:
    """The ``trace_context`` column's value: the carrier as JSON text, or None (SQL NULL). Only a
    carrier a claim reads back as written is stored (``trace_values.trace_json``); one that is not
    is logged and left out, never refused: tracing must not cost an enqueue."""
    text, problem = trace_json(trace_context)
    if problem is not None:
        logger.warning("enqueue: %s", problem)
    return text


def job_insert(jobs: Sequence[NewJob], *, notify: bool, channel: str, now: datetime | None = None,
               alias: str | None = None, trace_context: TraceContext | None = None) -> list[Job]:
    """Insert jobs in the caller's transaction; return the inserted rows as :class:`Job` objects.

    Jobs whose unique key is already taken are skipped (not returned). A NOTIFY on ``channel`` with
    the queue name is sent for due queues when ``notify`` is true (delivered at commit), and one with
    the queue name and the earliest ``run_at`` for queues whose new jobs are due later.
    ``trace_context`` (a W3C ``traceparent``/``tracestate`` carrier, or None for NULL) is written
    into every row's ``trace_context`` column by the INSERT itself.
    """
    if not jobs:
        return []
    alias = alias or db_alias()
    params = {
        "now": now,
        "notify": notify,
        "channel": channel,
        "trace_context": _trace_json(trace_context),
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
        "sequence_key": [j.sequence_key for j in jobs],
        "sequence_halts": [j.sequence_halts for j in jobs],
        "rate_key": [j.rate_key for j in jobs],
        "rate_limit_n": [j.rate_limit_n for j in jobs],
        "rate_limit_secs": [j.rate_limit_secs for j in jobs],
        "fair_key": [j.fair_key for j in jobs],
    }
    with _schema_required(alias), sequence_locked([j.sequence_key for j in jobs], alias=alias):
        rows = _run(JOB_INSERT, params, alias=alias).rows
    return _jobs_from_rows(rows, alias)


# One job: scalar parameters, not the unnest of one-element arrays, and no CTEs: a plain INSERT ...
# SELECT plans and runs in about half the time of the array form. The clock is read once, in the
# FROM subquery; created_at is that reading, so "due" is run_at <= created_at, and the NOTIFY
# (delivered at commit) is sent from RETURNING (with the run time when the job is due later, as in
# JOB_INSERT). RETURNING gives back only what the database decided (id, run_at, created_at); the
# caller builds the Job from what it sent.
#
# The statement lists only the columns this job sets: the others take their database defaults
# (migration 0019: status 'ready', counters 0, errors and history '[]'; NULL for the optional
# keys). Parsing and planning a 30-column INSERT was a large part of an enqueue's database time,
# and most jobs set none of the flow-control keys. One statement text per set of columns, built
# once (:func:`_insert_one_sql`), so a prepared statement (``_run_prepared``) is reused.
_ONE_ALWAYS = ("task", "queue", "priority", "max_attempts")
# The optional columns, in statement order, with the cast of their parameter ("": the column's
# type). A job lists one when its value differs from the column's default (:data:`_ONE_DEFAULTS`).
_ONE_OPTIONAL: tuple[tuple[str, str], ...] = (
    ("lease_seconds", "::float8"), ("unique_key", ""), ("unique_scope", ""), ("concurrency_key", ""),
    ("concurrency_limit", "::int"), ("schedule_id", "::bigint"), ("occurrence_at", "::timestamptz"),
    ("sequence_key", "::text"), ("sequence_halts", "::bool"), ("rate_key", "::text"), ("rate_limit_n", "::int"),
    ("rate_limit_secs", "::float8"), ("fair_key", "::text"), ("trace_context", "::jsonb"),
)
# The column defaults the optional columns fall back to (NULL unless listed).
_ONE_DEFAULTS: dict[str, object] = {"unique_scope": "retained", "sequence_halts": False}
# run_at: the clock reading itself when the job is due now (no run_at, no delay), else the given
# time or the clock plus the delay.
_RUN_NOW = "clock.now"
_RUN_LATER = "coalesce(%(run_at)s::timestamptz, clock.now + make_interval(secs => %(delay)s::float8))"
_RETURNING_ONE = """RETURNING id, run_at, created_at,
          CASE WHEN NOT %(notify)s THEN NULL
               WHEN run_at <= created_at THEN pg_notify(%(channel)s, %(queue)s)
               ELSE pg_notify(%(channel)s, %(queue)s::text || ' ' || extract(epoch FROM run_at)::text) END"""
_INSERT_ONE_SQL: dict[tuple[tuple[str, ...], bool, bool], str] = {}


def _insert_one_sql(optional: tuple[str, ...], later: bool, unique: bool) -> str:
    """The one-job INSERT listing the always-set columns and the ``optional`` ones (in
    :data:`_ONE_OPTIONAL` order), with run_at from the clock alone unless ``later``, and ON CONFLICT
    DO NOTHING when ``unique`` (the job has a unique key). Built once per combination."""
    key = (optional, later, unique)
    sql = _INSERT_ONE_SQL.get(key)
    if sql is None:
        casts = dict(_ONE_OPTIONAL)
        columns = [*_ONE_ALWAYS, "args", "kwargs", "run_at", "created_at", *optional]
        values = [f"%({name})s" for name in _ONE_ALWAYS]
        values += ["%(args)s::jsonb", "%(kwargs)s::jsonb", _RUN_LATER if later else _RUN_NOW, "clock.now"]
        values += [f"%({name})s{casts[name]}" for name in optional]
        sql = (f"INSERT INTO {JOB_TABLE} ({', '.join(columns)})\nSELECT {', '.join(values)}\n"
               f"FROM ({CLOCK}) AS clock\n{_ON_CONFLICT if unique else ''}\n{_RETURNING_ONE}")
        _INSERT_ONE_SQL[key] = sql
    return sql


# ON CONFLICT only for jobs with a unique key: without one nothing can conflict (the id comes from
# the sequence), and ON CONFLICT makes every row a speculative insertion (an extra WAL record and a
# probe of every unique index per row).
_ON_CONFLICT = "ON CONFLICT DO NOTHING"

# The one-job INSERT of a plain job (no optional column, due now, no unique key).
JOB_INSERT_ONE = _insert_one_sql((), False, False)

# The scalar parameters of the other one-job statements (job_insert_many's template, the replacing insert).
_ONE_FIELDS = ("task", "queue", "priority", "run_at", "delay", "max_attempts", "lease_seconds", "unique_key",
               "unique_scope", "concurrency_key", "concurrency_limit", "schedule_id", "occurrence_at", "sequence_key",
               "sequence_halts", "rate_key", "rate_limit_n", "rate_limit_secs", "fair_key")


def job_insert_one(job: NewJob, *, notify: bool, channel: str, now: datetime | None = None,
                   alias: str | None = None, trace_context: TraceContext | None = None) -> Job | None:
    """Insert one job in the caller's transaction (see :func:`job_insert`); return it, or None when
    its unique key is already taken. NOTIFY on ``channel`` with the queue name when it is due, with
    the queue name and its ``run_at`` when it is due later. ``trace_context`` is the row's W3C
    trace context carrier (None: NULL)."""
    alias = alias or db_alias()
    trace_json = _trace_json(trace_context)
    params: dict[str, object] = {
        "task": job.task, "queue": job.queue, "priority": job.priority, "max_attempts": job.max_attempts,
        "args": job.args_json, "kwargs": job.kwargs_json, "now": now, "notify": notify, "channel": channel,
    }
    optional = []
    for name, _cast in _ONE_OPTIONAL:
        value = trace_json if name == "trace_context" else getattr(job, name)
        if value is not None and value != _ONE_DEFAULTS.get(name):
            optional.append(name)
            params[name] = value
    later = job.run_at is not None or job.delay != 0
    if later:
        params.update(run_at=job.run_at, delay=float(job.delay))
    sql = _insert_one_sql(tuple(optional), later, job.unique_key is not None)
    with _schema_required(alias), sequence_locked([job.sequence_key], alias=alias):
        row = _run_prepared(sql, params, alias=alias).one()
    if row is None:
        return None
    values = {
        "id": row[0], "task": job.task, "queue": job.queue, "priority": job.priority, "status": "ready",
        "args": _load(job.args_json), "kwargs": _load(job.kwargs_json), "run_at": row[1], "attempts": 0,
        "max_attempts": job.max_attempts, "lease_seconds": job.lease_seconds, "leased_until": None,
        "leased_by": "", "lease_version": 0, "unique_key": job.unique_key, "unique_scope": job.unique_scope,
        "concurrency_key": job.concurrency_key, "concurrency_limit": job.concurrency_limit,
        "cancel_requested": False, "snoozes": 0, "schedule_id": job.schedule_id, "occurrence_at": job.occurrence_at,
        "interruptions": 0, "sequence_key": job.sequence_key, "sequence_halts": job.sequence_halts,
        "errors": [], "history": [], "result": None, "created_at": row[2], "started_at": None,
        "attempted_at": None, "finished_at": None,
        "rate_key": job.rate_key, "rate_limit_n": job.rate_limit_n, "rate_limit_secs": job.rate_limit_secs,
        "fair_key": job.fair_key, "workflow_id": None, "workflow_step": None, "workflow_role": None,
        "waiting_on": 0, "has_dependents": False, "pass_result": False, "on_dependency_dead": "hold",
        "trace_context": None if trace_json is None else _load(trace_json),
    }
    return Job.from_db(alias, _JOB_ATTNAMES, [values[name] for name in _JOB_ATTNAMES])


# Many jobs of one task with the same options (enqueue_many): the arguments travel as ONE JSON
# array per kind (args, kwargs) expanded by jsonb_array_elements, instead of one array parameter
# per column that the client quotes element by element; the order of the list is kept (ids follow
# it). One NOTIFY when the jobs are due, or one with their run time when they are due later.
# Returns the count and, when asked, the new ids as text.
JOB_INSERT_MANY = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
ins AS (
    INSERT INTO {JOB_TABLE} (
        {_INSERT_COLUMNS}
    )
    SELECT %(task)s, %(queue)s, %(priority)s, 'ready', a.value, coalesce(k.value, '{{{{}}}}'::jsonb),
           coalesce(%(run_at)s::timestamptz, clock.now + make_interval(secs => %(delay)s::float8)), 0,
           %(max_attempts)s, %(lease_seconds)s::float8, '', 0, %(unique_key)s, %(unique_scope)s,
           NULL, NULL, false, 0, NULL, NULL, '[]'::jsonb, '[]'::jsonb, clock.now, NULL, false, NULL, NULL, NULL, NULL,
           %(trace_context)s::jsonb
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
),
woken_later AS (
    SELECT pg_notify(%(channel)s, %(queue)s::text || ' ' || extract(epoch FROM later.run_at)::text)
    FROM (SELECT min(ins.run_at) AS run_at FROM ins, clock WHERE ins.run_at > clock.now) AS later
    WHERE %(notify)s AND later.run_at IS NOT NULL
)
SELECT count(*), CASE WHEN %(want_ids)s THEN string_agg(id::text, ',' ORDER BY id) END,
       (SELECT count(*) FROM woken) + (SELECT count(*) FROM woken_later)
FROM ins
"""

_INSERT_MANY = {unique: JOB_INSERT_MANY.format(on_conflict=_ON_CONFLICT if unique else "") for unique in (False, True)}


def job_insert_many(template: NewJob, args_json: str, kwargs_json: str | None, *, notify: bool, channel: str,
                    want_ids: bool = False, now: datetime | None = None,
                    alias: str | None = None, trace_context: TraceContext | None = None) -> tuple[int, list[int]]:
    """Insert jobs that share ``template``'s task and options, one per element of ``args_json``.

    Args:
        template: the shared task, queue, priority, run_at/delay, max_attempts, lease and unique
            key (its own args are ignored; no concurrency or sequence key: those differ per job).
        args_json: a JSON array with one array of positional arguments per job.
        kwargs_json: a JSON array of keyword-argument objects, parallel to ``args_json``, or None
            when no job has keyword arguments.
        want_ids: also return the new ids (in insertion order).
        trace_context: the W3C trace context carrier written into every new row, or None (NULL).

    Returns:
        ``(number inserted, ids or [])``; jobs whose unique key is taken are skipped.
    """
    params = {name: getattr(template, name) for name in _ONE_FIELDS if name not in (
        "concurrency_key", "concurrency_limit", "schedule_id", "occurrence_at", "sequence_key", "sequence_halts",
        "rate_key", "rate_limit_n", "rate_limit_secs", "fair_key")}
    params.update(now=now, notify=notify, channel=channel, args=args_json, kwargs=kwargs_json,
                  delay=float(template.delay), want_ids=want_ids, trace_context=_trace_json(trace_context))
    sql = _INSERT_MANY[template.unique_key is not None]
    with _schema_required(alias):
        count, ids, _ = _run(sql, params, alias=alias).rows[0]
    return count, ([int(x) for x in ids.split(",")] if ids else [])


# Replace and debounce: one statement, race-free. A conflict on the key's partial unique index (the
# conflict target names the index by its predicate, so PostgreSQL infers it) turns the insert into
# an update of the holder, but only while the holder is ready and never claimed (lease_version 0:
# every claim adds 1 and no write takes it back), of the same task and not asked to cancel. ON
# CONFLICT DO UPDATE locks the holder and evaluates that WHERE on its latest committed version, so a
# claim that committed first (status 'leased', token 1) makes it update nothing, and a claim that
# comes second skips the locked row (SKIP LOCKED) and takes it later, with the new values. A holder
# that fails the WHERE is left unchanged (it stays locked until the caller's transaction ends) and
# no row is returned: the caller then looks the holder up. The holder keeps its id, created_at,
# history and key; everything the enqueue decides is replaced, and the trace context becomes this
# enqueue's when it has one (its "send" span is the one that set the values the job runs with). The
# new run_at is the enqueue's, for debounce capped at created_at + the maximum wait (least() ignores
# the NULL of "no cap", and of replace). The first reading of the clock (clock.now) stamps
# created_at; RETURNING cannot see it, so the due test of the NOTIFY reads the clock again (a later
# reading: a job due then is due).
# "xmax = 0" tells an inserted row (no locker) from an updated one (locked by this transaction).
_ARBITER = {
    "retained": "unique_key IS NOT NULL AND unique_scope = 'retained'",
    "active": "unique_key IS NOT NULL AND unique_scope = 'active' AND status IN ('ready', 'leased')",
}
JOB_INSERT_REPLACING = f"""
INSERT INTO {JOB_TABLE} AS job (
    {_INSERT_COLUMNS}
)
SELECT %(task)s, %(queue)s, %(priority)s, 'ready', %(args)s::jsonb, %(kwargs)s::jsonb,
       coalesce(%(run_at)s::timestamptz, clock.now + make_interval(secs => %(delay)s::float8)), 0,
       %(max_attempts)s, %(lease_seconds)s::float8, '', 0, %(unique_key)s, %(unique_scope)s,
       %(concurrency_key)s, %(concurrency_limit)s::int, false, 0, %(schedule_id)s::bigint,
       %(occurrence_at)s::timestamptz, '[]'::jsonb, '[]'::jsonb, clock.now, %(sequence_key)s::text,
       %(sequence_halts)s::bool, %(rate_key)s::text, %(rate_limit_n)s::int, %(rate_limit_secs)s::float8,
       %(fair_key)s::text, %(trace_context)s::jsonb
FROM ({CLOCK}) AS clock
ON CONFLICT (unique_key) WHERE {{arbiter}}
DO UPDATE SET args = EXCLUDED.args, kwargs = EXCLUDED.kwargs, priority = EXCLUDED.priority,
              queue = EXCLUDED.queue, max_attempts = EXCLUDED.max_attempts,
              lease_seconds = EXCLUDED.lease_seconds, concurrency_key = EXCLUDED.concurrency_key,
              concurrency_limit = EXCLUDED.concurrency_limit, rate_key = EXCLUDED.rate_key,
              rate_limit_n = EXCLUDED.rate_limit_n, rate_limit_secs = EXCLUDED.rate_limit_secs,
              fair_key = EXCLUDED.fair_key,
              trace_context = coalesce(EXCLUDED.trace_context, job.trace_context),
              run_at = least(EXCLUDED.run_at, job.created_at + make_interval(secs => %(max_wait)s::float8))
WHERE job.status = 'ready' AND job.lease_version = 0 AND job.task = EXCLUDED.task AND NOT job.cancel_requested
RETURNING {", ".join(f"job.{c}" for c in _JOB_COLUMNS)}, job.xmax = 0,
          CASE WHEN %(notify)s AND job.run_at <= coalesce(%(now)s::timestamptz, leasequeue_now())
               THEN pg_notify(%(channel)s, job.queue) END
"""
_INSERT_REPLACING = {scope: JOB_INSERT_REPLACING.format(arbiter=arbiter) for scope, arbiter in _ARBITER.items()}


def job_insert_replacing(job: NewJob, *, notify: bool, channel: str, now: datetime | None = None,
                         alias: str | None = None, trace_context: TraceContext | None = None
                         ) -> tuple[Job, bool] | None:
    """Insert one job with a unique key, or replace the pending job holding the key (``replace`` and
    ``debounce`` modes), in the caller's transaction.

    Args:
        job: the job; ``job.unique_key`` must be set. Its ``debounce_max_wait`` (seconds, or None)
            caps the run_at of an updated holder at the holder's ``created_at`` plus that.
        notify: send a NOTIFY on ``channel`` with the queue name when the resulting job is due
            (delivered at commit).
        now: the database clock reading to use (an aware datetime); None: read it.
        trace_context: the W3C trace context carrier of this enqueue, or None; an updated holder
            takes it, or keeps its own when None.

    Returns:
        ``(job, True)`` when a new row was inserted, ``(job, False)`` when the holder (ready, never
        claimed, same task, no cancel request) took the new values, None when the key is held by a
        job that is not pending (claimed, retrying, finished, another task): nothing was written.
    """
    if job.unique_key is None:
        raise ValueError("job_insert_replacing needs a job with a unique_key")
    alias = alias or db_alias()
    params = {name: getattr(job, name) for name in _ONE_FIELDS}
    params.update(now=now, notify=notify, channel=channel, args=job.args_json, kwargs=job.kwargs_json,
                  delay=float(job.delay), max_wait=job.debounce_max_wait, trace_context=_trace_json(trace_context))
    # An updated holder keeps its sequence key and so its place (its id) in its sequence.
    with _schema_required(alias), sequence_locked([job.sequence_key], alias=alias):
        row = _run(_INSERT_REPLACING[job.unique_scope], params, alias=alias).one()
    if row is None:
        return None
    return _jobs_from_rows([row], alias)[0], bool(row[len(_JOB_COLUMNS)])


def job_get_by_unique_key(key: str, scope: str, alias: str | None = None) -> Job | None:
    """Return the job that holds ``key`` in ``scope`` (active scope: a ready or leased job), or None."""
    qs = Job.objects.using(alias or db_alias()).filter(unique_key=key, unique_scope=scope)
    if scope == "active":
        qs = qs.filter(status__in=["ready", "leased"])
    return qs.order_by("-id").first()
