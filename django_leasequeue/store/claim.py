"""The claim: lease due ready jobs to a worker, and decode the leased rows into :class:`ClaimedJob`.

Every variant is one statement: a ``MATERIALIZED`` CTE picks the candidates with ``FOR UPDATE SKIP
LOCKED`` and ``LIMIT``, the outer UPDATE leases them. The plain claims (named queues, every queue)
are here; the claims of rate-limited queues are in :mod:`.flow`, and :func:`job_claim` picks the
statement. Every eligibility rule sits in the locked candidate scan, in this order:

* due and ``ready``, queue not paused;
* a fencing token with room for this claim and a later reap or release (``TOKEN_MAX``);
* the worker's registered tasks (``%(tasks)s``, unless ``%(all_tasks)s``). Rolling deploys: a worker
  never leases (and spends an attempt on) a job it could only dead-letter, while a newer worker that
  knows the task runs it. With client-side binding both are constants of the statement: for every
  task the planner folds the test away, and a list of 9 or more names is hashed. The flag is a
  parameter of its own so that the list is quoted (and sent) once per claim, not twice;
* the sequence rule (docs/howto/flow-control.md, "Sequences"): a job with a ``sequence_key`` is a
  candidate only while no earlier job of its key is ready, leased or dead with ``sequence_halts``,
  and no job of its key is leased. Two index probes (``leasequeue_job_seq_order``,
  ``leasequeue_job_seq_leased``, migration 0009), only for rows with a key. It comes before the
  concurrency admission: a row that may not run must not take a key's slot. The sequence rule and
  the two admissions below are one ``CASE`` (``_db.FLOW_RULES``, written once for every claim), so
  that PostgreSQL, which orders separate AND conditions by cost, runs them in this order;
* the per-key concurrency admission (docs/howto/flow-control.md), last: a row of another task must not
  take a key's slot. A candidate with a concurrency key is admitted only if fewer than its
  concurrency_limit jobs of that key are leased, counting the ones this statement already admitted.
  ``leasequeue_conc_admit()`` is plpgsql defined by migration 0002: it serialises the claimers of
  one key with a transaction-scoped advisory lock and counts on a fresh snapshot, which a plain SQL
  predicate cannot do (it sees only the statement's snapshot), so two workers claiming at the same
  instant cannot both take the last slot. Keyless jobs stop at the IS NULL test: no function call.
  ``%(claim)s`` is a fresh id per claim call, so admissions from an earlier claim in the same
  transaction are not counted twice. Keys the function found full or busy during this claim are
  listed in the setting ``leasequeue.conc_closed`` (prefixed by the claim id), and their rows are
  rejected by the inline ``strpos()`` before any function call: the look-ahead past a full key's
  backlog costs about as much as reading the rows, not a plpgsql call per row.
* the per-key rate admission (after the concurrency admission): a candidate with a rate key calls
  ``leasequeue_rate_admit()`` (migration 0010), which serialises the claimers of the key the same
  way and logs the admission in the key's sliding log (``leasequeue_rate_key``); used-up keys are
  listed in ``leasequeue.rate_closed`` and rejected inline by ``strpos()``. An admission whose row
  is then skipped (SKIP LOCKED, the outer LIMIT) stays counted: fewer jobs, never more.

An over-limit or unknown-task row is never locked and never counts against the batch:
the scan keeps looking behind it.
"""

from __future__ import annotations

import functools
import itertools
import uuid
import zoneinfo
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections

from . import flow, keys
from ._db import (
    CLOCK,
    CLOCK_WAKING,
    FLOW_RULES,
    JOB_TABLE,
    QUEUE_TABLE,
    TOKEN_MAX,
    _cursor,
    _load,
    _notify_channel,
    _run,
    _run_claim,
    db_alias,
    logger,
)
from .trace_values import CLAIMED_TRACE_CONTEXT, trace_carrier

if TYPE_CHECKING:
    from ..conf import RateLimit


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
    # When the job was due for this attempt (its run_at: the enqueue's, or the retry's backoff);
    # the worker's wait-time histogram measures from the later of it and created_at.
    run_at: datetime | None = None
    # The W3C trace context carrier the enqueue stored (django_leasequeue.tracing), or None: the
    # attempt's "process" span links to it. None too for a stored value that is not a carrier
    # (store.trace_values): trace data never costs the job, which runs without the link.
    trace_context: dict[str, str] | None = None


# Claim up to %(limit)s due jobs from the listed queues. The LATERAL subquery runs once per queue
# so each walks the partial index leasequeue_job_ready (queue, priority DESC, run_at, id) in order
# and stops after LIMIT rows; the outer ORDER BY/LIMIT merges the queues. A queue's surplus rows are
# locked only until this statement commits. Paused queues are filtered out before any row is read:
# the queue list is its own MATERIALIZED CTE, because as a plain subquery the planner may apply the
# paused anti-join above the LATERAL, after rows of a paused queue were already locked.
# Times come back as integer microseconds since the epoch (the ``*_us`` columns; exact: extract()
# is numeric since PostgreSQL 14): C-level int loads instead of Django's Python-level timestamptz
# loader (one Python call per value, the largest single cost of a claim in a profile).
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
        WHERE j.status = 'ready' AND j.queue = q.name AND j.run_at <= clock.now
          AND (%(all_tasks)s OR j.task = ANY(%(tasks)s::text[]))
          AND j.lease_version < {TOKEN_MAX - 1}
          {FLOW_RULES}
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
FROM clock
WHERE j.id = ANY(ARRAY(SELECT picked.id FROM picked))
RETURNING j.id, j.task, j.queue, j.args, j.kwargs, j.attempts, j.max_attempts, j.lease_version,
          (extract(epoch FROM j.leased_until) * 1000000)::bigint AS leased_until_us,
          coalesce(j.lease_seconds, %(lease)s) AS lease_seconds,
          (extract(epoch FROM clock.now) * 1000000)::bigint AS claimed_at_us, j.priority,
          (extract(epoch FROM j.created_at) * 1000000)::bigint AS created_at_us,
          (extract(epoch FROM j.started_at) * 1000000)::bigint AS started_at_us,
          jsonb_array_length(j.errors) AS error_count, (extract(epoch FROM j.run_at) * 1000000)::bigint AS run_at_us,
          {CLAIMED_TRACE_CONTEXT}
"""

# The same claim over every queue (``runworker --queues '*'``). Without a queue to lead the index,
# PostgreSQL sorts the due ready rows; prefer naming queues on large backlogs.
JOB_CLAIM_ANY_QUEUE = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
picked AS MATERIALIZED (
    SELECT j.id
    FROM {JOB_TABLE} j, clock
    WHERE j.status = 'ready' AND j.run_at <= clock.now
      AND NOT EXISTS (SELECT 1 FROM {QUEUE_TABLE} p WHERE p.name = j.queue AND p.paused)
      AND (%(all_tasks)s OR j.task = ANY(%(tasks)s::text[]))
      AND j.lease_version < {TOKEN_MAX - 1}
      {FLOW_RULES}
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
FROM clock
WHERE j.id = ANY(ARRAY(SELECT picked.id FROM picked))
RETURNING j.id, j.task, j.queue, j.args, j.kwargs, j.attempts, j.max_attempts, j.lease_version,
          (extract(epoch FROM j.leased_until) * 1000000)::bigint AS leased_until_us,
          coalesce(j.lease_seconds, %(lease)s) AS lease_seconds,
          (extract(epoch FROM clock.now) * 1000000)::bigint AS claimed_at_us, j.priority,
          (extract(epoch FROM j.created_at) * 1000000)::bigint AS created_at_us,
          (extract(epoch FROM j.started_at) * 1000000)::bigint AS started_at_us,
          jsonb_array_length(j.errors) AS error_count, (extract(epoch FROM j.run_at) * 1000000)::bigint AS run_at_us,
          {CLAIMED_TRACE_CONTEXT}
"""


class ClaimResult(list[ClaimedJob]):
    """The jobs leased by :func:`job_claim` (a list of :class:`ClaimedJob`), plus throttling news.

    Attributes:
        throttled (dict[str, float]): rate-limited queues whose allowance this claim used up, with
            the seconds until one more claim is allowed (the oldest logged claim leaves the window).
        corrupt (list[tuple[int, str, str]]): ``(job id, task, reason)`` of the claimed rows that
            could not be decoded and were dead-lettered as ``CorruptRow`` instead (not in the list).
        clock_us (int | None): the database clock of the claim statement, in integer microseconds
            since the epoch: the ``attempted_at`` it wrote into every row it leased (the latest, for
            a claim of several statements); None when it leased nothing. A worker keeps the latest
            one it received to find the rows of a claim whose reply it lost
            (:func:`~django_leasequeue.store.lost_claims.job_release_lost_claims`).
    """

    def __init__(self, jobs: Iterable[ClaimedJob] = (), throttled: Mapping[str, float] | None = None) -> None:
        super().__init__(jobs)
        self.throttled: dict[str, float] = dict(throttled or {})
        self.corrupt: list[tuple[int, str, str]] = []
        self.clock_us: int | None = None

    def merge(self, other: ClaimResult) -> None:
        """Add the jobs, corrupt rows, throttled queues and clock of ``other`` (one part of a claim)."""
        self.extend(other)
        self.corrupt.extend(other.corrupt)
        self.throttled.update(other.throttled)
        if other.clock_us is not None:
            self.clock_us = max(other.clock_us, self.clock_us or other.clock_us)

    @property
    def throttle_wait(self) -> float | None:
        """Seconds until the first throttled queue may be claimed from again; None if none is throttled."""
        return min(self.throttled.values()) if self.throttled else None


def job_claim(*, queues: Sequence[str] | None, limit: int, worker_id: str, lease: float,
              now: datetime | None = None, alias: str | None = None,
              rate_limits: Mapping[str, RateLimit] | None = None,
              tasks: Sequence[str] | None = None, fair_queues: Collection[str] | None = None) -> ClaimResult:
    """Lease up to ``limit`` due ready jobs.

    Every eligibility rule is applied inside the locked candidate scan: due, ``ready``, queue not
    paused, the job's concurrency key below its limit (across all workers), its rate key's
    allowance, and the queue's rate limit. Fair queues (``fair_queues``) are claimed round-robin
    across fair keys (``keys.JOB_CLAIM_FAIR``). Without rate-limited queues this is one statement
    (``JOB_CLAIM``, ``JOB_CLAIM_ANY_QUEUE``); with them, one short transaction of two statements
    (``flow.RATE_LOCK``, then ``flow.JOB_CLAIM_RATED`` or ``flow.JOB_CLAIM_ANY_QUEUE_RATED``).

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
        fair_queues: the queues claimed round-robin across fair keys (``keys.JOB_CLAIM_FAIR``);
            None means ``LEASEQUEUE["QUEUES"]`` ``fair`` options. Only named queues are claimed
            fairly: ``queues=None`` (every queue) uses the plain claim for all of them. A claim
            from fair and other queues claims both parts in turn, alternating which goes first.

    Returns:
        A :class:`ClaimResult`: the claimed jobs in claim order (priority descending, then run_at,
        then id), and the rate-limited queues this claim used up (``throttled``, ``throttle_wait``).
    """
    if limit <= 0:
        return ClaimResult()
    from ..conf import get_settings

    settings = get_settings()
    if rate_limits is None:
        rate_limits = settings.rate_limits
    if fair_queues is None:
        fair_queues = settings.fair_queues
    if fair_queues and queues is not None and any(q in fair_queues for q in queues):
        return _claim_with_fair(queues=queues, limit=limit, worker_id=worker_id, lease=lease, now=now, alias=alias,
                                rate_limits=rate_limits, tasks=tasks, fair_queues=fair_queues)
    alias = alias or db_alias()
    params: dict[str, Any] = {"now": now, "limit": limit, "worker": worker_id, "lease": float(lease),
                              "claim": uuid.uuid4().hex[:16], "tasks": list(tasks) if tasks is not None else None,
                              "all_tasks": tasks is None,
                              "queues": list(queues) if queues is not None else None}
    rated = sorted(q for q in (rate_limits or {}) if queues is None or q in queues)
    if not rated:
        result = _run_claim(JOB_CLAIM if queues is not None else JOB_CLAIM_ANY_QUEUE, params, alias=alias)
        return _decode_claims(result.rows, _column_names(result.description), alias, worker_id=worker_id, now=now)
    rows, description = flow._claim_rated(params, queues, rated, rate_limits, alias=alias)
    names = _column_names(description)
    waits = _load(rows[0][names.index("waits")]) if rows else {}
    id_at = names.index("id")
    return _decode_claims([r for r in rows if r[id_at] is not None], names, alias, worker_id=worker_id,
                          now=now, throttled={k: float(v) for k, v in (waits or {}).items()})


_fair_turn = itertools.count()

def _claim_with_fair(*, queues: Sequence[str], limit: int, worker_id: str, lease: float, now: datetime | None,
                     alias: str | None, rate_limits: Mapping[str, RateLimit], tasks: Sequence[str] | None,
                     fair_queues: Collection[str]) -> ClaimResult:
    """:func:`job_claim` for a queue list with fair queues: one fair claim per fair queue and one
    plain (or rated) claim of the others, each with what the batch has left. Which part goes first
    alternates between calls, so neither part can take every batch while the other has due jobs."""
    alias = alias or db_alias()
    fair = [q for q in queues if q in fair_queues]
    rest = [q for q in queues if q not in fair_queues]
    jobs = ClaimResult()

    def claim_fair() -> None:
        for queue in fair:
            left = limit - len(jobs)
            if left <= 0:
                return
            params = {"now": now, "limit": left, "worker": worker_id, "lease": float(lease),
                      "claim": uuid.uuid4().hex[:16], "tasks": list(tasks) if tasks is not None else None,
                      "all_tasks": tasks is None}
            rows, description = keys._claim_fair(params, queue, alias=alias)
            names = _column_names(description)
            jobs.merge(_decode_claims(keys.fair_order(rows, names), names, alias, worker_id=worker_id, now=now,
                                      ordered=True))

    def claim_rest() -> None:
        left = limit - len(jobs)
        if rest and left > 0:
            jobs.merge(job_claim(queues=rest, limit=left, worker_id=worker_id, lease=lease, now=now, alias=alias,
                                 rate_limits=rate_limits, tasks=tasks, fair_queues=()))

    for part in ((claim_fair, claim_rest) if next(_fair_turn) % 2 == 0 else (claim_rest, claim_fair)):
        part()
    return jobs


_new = object.__new__
_set = object.__setattr__
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _column_names(description: Sequence[Any] | None) -> tuple[str, ...]:
    return tuple(column.name for column in description or ())


@functools.lru_cache(maxsize=16)
def _claim_decoder(names: tuple[str, ...]) -> Callable[[Sequence[Any]], ClaimedJob]:
    """A function that builds a :class:`ClaimedJob` from one claim row, for a result set whose
    columns are ``names`` (the claim statements' RETURNING list; times as ``*_us`` epoch
    microseconds). The positions are looked up here, once per column layout (cached), never per row."""
    at = {name: i for i, name in enumerate(names)}
    i_id, i_task, i_queue, i_args, i_kwargs = at["id"], at["task"], at["queue"], at["args"], at["kwargs"]
    i_attempts, i_max, i_version, i_until = at["attempts"], at["max_attempts"], at["lease_version"], \
        at["leased_until_us"]
    i_lease, i_claimed, i_priority = at["lease_seconds"], at["claimed_at_us"], at["priority"]
    i_created, i_started, i_errors = at["created_at_us"], at["started_at_us"], at["error_count"]
    i_run_at = at["run_at_us"]
    i_trace = at["trace_context"]

    def decode(r: Sequence[Any]) -> ClaimedJob:
        # The claim path builds one ClaimedJob per job: filling the frozen dataclass's __dict__ at
        # once costs a tenth of its generated __init__ (one object.__setattr__ per field). Same object.
        job: ClaimedJob = _new(ClaimedJob)
        started = r[i_started]
        _set(job, "__dict__", {
            "id": r[i_id], "task": r[i_task], "queue": r[i_queue], "args": _load(r[i_args]),
            "kwargs": _load(r[i_kwargs]), "attempts": r[i_attempts], "max_attempts": r[i_max],
            "lease_version": r[i_version], "leased_until": _EPOCH + r[i_until] * _MICROSECOND,
            "lease_seconds": float(r[i_lease]), "claimed_at": _EPOCH + r[i_claimed] * _MICROSECOND,
            "priority": r[i_priority], "created_at": _EPOCH + r[i_created] * _MICROSECOND,
            "started_at": None if started is None else _EPOCH + started * _MICROSECOND, "error_count": r[i_errors],
            "run_at": _EPOCH + r[i_run_at] * _MICROSECOND,
            "trace_context": None if r[i_trace] is None else _trace_context(r[i_id], r[i_trace]),
        })
        return job

    return decode


def _trace_context(job_id: int, text: str) -> dict[str, str] | None:
    """The carrier of a claimed row's ``trace_context`` text, or None with a warning naming the job
    and the reason when the value is not one (the job still runs; only its span link is lost)."""
    carrier, problem = trace_carrier(text)
    if problem is not None:
        logger.warning("job %s: trace_context ignored, the attempt is traced without a link: %s", job_id, problem)
    return carrier


def _claim_order(rows: list[Any], names: Sequence[str]) -> list[Any]:
    """Put claimed rows in claim order (priority descending, then run_at, then id). UPDATE ...
    RETURNING gives no order; the worker starts a batch's jobs in list order."""
    if len(rows) > 1:
        i_priority, i_run_at, i_id = names.index("priority"), names.index("run_at_us"), names.index("id")
        rows.sort(key=lambda r: (-r[i_priority], r[i_run_at], r[i_id]))
    return rows


_TIME_FIELDS = ("leased_until", "claimed_at", "created_at", "started_at", "run_at")


def _connection_zone(alias: str) -> zoneinfo.ZoneInfo | None:
    """The zone claimed times are converted to on ``alias`` (see :func:`_to_zone`), or None to keep
    them aware in UTC."""
    connection = connections[alias]
    if connection.timezone is not None or not connection.timezone_name:
        return None  # USE_TZ = True: aware, as decoded (or no TIME_ZONE to convert to)
    return zoneinfo.ZoneInfo(connection.timezone_name)


def _to_zone(job: ClaimedJob, zone: zoneinfo.ZoneInfo) -> None:
    """Give the claim's times (decoded from epoch microseconds as aware UTC) the form of every other
    read on the connection: with ``USE_TZ = False`` Django reads timestamptz as naive datetimes in
    the connection's time zone (the ORM, lease renewals), and mixing both would raise TypeError."""
    values = job.__dict__  # frozen dataclass: fill its __dict__ as the decoder does
    for name in _TIME_FIELDS:
        if values[name] is not None:
            values[name] = values[name].astimezone(zone).replace(tzinfo=None)


# Dead-letter a claimed row that cannot be decoded (CorruptRow): fenced on the token the claim just
# gave it, so a row another worker has claimed since is left alone. The row keeps every value as it
# is, for the operator to read in SQL; only the state, the lease and the error list change. errors
# itself may be what is corrupt, so a value that is not an array is replaced, not appended to.
JOB_DEAD_CORRUPT = f"""
WITH clock AS MATERIALIZED ({CLOCK_WAKING})
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


def _decode_claims(rows: list[Any], names: tuple[str, ...], alias: str, *, worker_id: str,
                   now: datetime | None, throttled: Mapping[str, float] | None = None,
                   ordered: bool = False) -> ClaimResult:
    """Decode claimed rows (their columns named by ``names``, the claim's RETURNING list) one at a
    time into a :class:`ClaimResult`, in claim order.

    A row that cannot be decoded (a number Python refuses to read back, arguments that are not a
    list and an object, a time outside Python's datetime range: a row written by hand or by an older
    version) is dead-lettered at once with a ``CorruptRow`` error naming the reason, fenced on its
    new token, and left out; the rest of the batch runs. The claim has already committed (or will,
    with the caller's transaction), so raising instead would leave every row of the batch leased
    with no one to run it. ``ordered``: the rows are already in claim order (the fair claim's
    round-robin order), keep it.
    """
    jobs = ClaimResult(throttled=throttled)
    if not rows:
        return jobs
    # One clock reading per statement (the MATERIALIZED clock CTE): the same in every row.
    jobs.clock_us = rows[0][names.index("claimed_at_us")]
    decode = _claim_decoder(names)
    i_id, i_version, i_task = names.index("id"), names.index("lease_version"), names.index("task")
    zone = _connection_zone(alias)
    corrupt: list[tuple[int, int, str, str]] = []
    for r in (rows if ordered else _claim_order(rows, names)):
        try:
            job = decode(r)
            if type(job.args) is not list or type(job.kwargs) is not dict:
                raise TypeError(f"args is a JSON {type(job.args).__name__} and kwargs a JSON "
                                f"{type(job.kwargs).__name__}; they must be a list and an object")
            if zone is not None:
                _to_zone(job, zone)
        except Exception as exc:  # noqa: BLE001 - one bad row harms only itself
            corrupt.append((r[i_id], r[i_version], str(r[i_task]),
                            f"job row cannot be decoded: {type(exc).__name__}: {str(exc)[:500]}"))
            continue
        jobs.append(job)
    if corrupt:
        with _cursor(alias) as cur:
            for job_id, version, task, reason in corrupt:
                logger.error("job %s: dead-lettered as CorruptRow: %s", job_id, reason)
                cur.execute(JOB_DEAD_CORRUPT, {"now": now, "id": job_id, "version": version, "reason": reason,
                                               "worker": worker_id, "wake": _notify_channel()})
                if cur.rowcount:
                    jobs.corrupt.append((job_id, task, reason))
    return jobs



# The earliest run_at among the future ready jobs of some queues: how long an idle worker may sleep
# before a job it serves becomes due. leasequeue_job_ready is (queue, priority DESC, run_at, id),
# so min(run_at) over a queue would read every ready row of it (a large backlog scheduled for
# later makes that a long scan on every idle turn). Instead a skip scan walks the distinct
# priorities of each queue (one index probe each, by the recursive CTE ``levels``) and takes the
# first later run_at of each (queue, priority) pair, again one probe: a handful of probes
# whatever the backlog, and no index of its own to maintain on every enqueue. The worker of every
# queue first walks the distinct queues the same way (``{served}``). "Later" is after the start of
# the worker's claim that found nothing (%(since)s seconds ago): a job that became due between that
# claim and this look-up comes back (due: the worker claims again at once), and one that was due at
# the claim is the claim's business (one it did not take, a busy concurrency key, must not make the
# worker spin). Paused queues are left out (their resume notifies). Always one row: the clock reading
# comes back too, so the worker can tell when its wait ends in database time.
JOB_NEXT_RUN_AT = f"""
WITH RECURSIVE clock AS MATERIALIZED ({CLOCK}),
{{served}},
levels(queue, priority) AS (
    SELECT s.queue, (SELECT j.priority FROM {JOB_TABLE} j WHERE j.status = 'ready' AND j.queue = s.queue
                     ORDER BY j.priority DESC LIMIT 1)
    FROM served s
    WHERE NOT EXISTS (SELECT 1 FROM {QUEUE_TABLE} p WHERE p.name = s.queue AND p.paused)
    UNION ALL
    SELECT l.queue, (SELECT j.priority FROM {JOB_TABLE} j WHERE j.status = 'ready' AND j.queue = l.queue
                     AND j.priority < l.priority ORDER BY j.priority DESC LIMIT 1)
    FROM levels l WHERE l.priority IS NOT NULL
)
SELECT extract(epoch FROM c.now)::float8, extract(epoch FROM n.run_at)::float8
FROM clock c, LATERAL (
    SELECT min((SELECT j.run_at FROM {JOB_TABLE} j
                WHERE j.status = 'ready' AND j.queue = l.queue AND j.priority = l.priority
                  AND j.run_at > c.now - make_interval(secs => %(since)s::float8)
                ORDER BY j.run_at LIMIT 1)) AS run_at
    FROM levels l WHERE l.priority IS NOT NULL
) AS n
"""
_SERVED_NAMED = "served AS (SELECT DISTINCT unnest(%(queues)s::text[]) AS queue)"
_SERVED_ALL = f"""queues(queue) AS (
    (SELECT j.queue FROM {JOB_TABLE} j WHERE j.status = 'ready' ORDER BY j.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM {JOB_TABLE} j WHERE j.status = 'ready' AND j.queue > q.queue
            ORDER BY j.queue LIMIT 1)
    FROM queues q WHERE q.queue IS NOT NULL
),
served AS (SELECT queue FROM queues WHERE queue IS NOT NULL)"""
_NEXT_RUN_AT = {named: JOB_NEXT_RUN_AT.format(served=_SERVED_NAMED if named else _SERVED_ALL)
                for named in (True, False)}


@dataclass(frozen=True)
class NextRunAt:
    """The earliest future ``run_at`` of the ready jobs of some queues, with the clock reading.

    Times are POSIX seconds of the database clock, comparable with the run times that enqueue,
    retry and snooze notifications carry.

    Attributes:
        now: the database clock when it was read.
        at: the earliest ``run_at`` after the look-up's start (usually after ``now``), or None
            when no such job exists.
    """

    now: float
    at: float | None

    @property
    def seconds(self) -> float | None:
        """Seconds from ``now`` until ``at`` (<= 0 for a job that became due during the look-up),
        or None when no job is due later."""
        return None if self.at is None else self.at - self.now


def job_next_run_at(queues: Sequence[str] | None, *, since: float = 0.0, now: datetime | None = None,
                    alias: str | None = None) -> NextRunAt:
    """The earliest ``run_at`` after ``now - since`` among the ready jobs of ``queues``, paused
    queues left out.

    Args:
        queues: queue names, or None for every queue.
        since: seconds (>= 0) before now that the look-up starts from: how long ago the claim
            that found nothing started, so that a job that became due since is found (its
            ``at`` is then at or before ``now``).
        now: an aware datetime standing in for the database clock (tests); None: the database's.
        alias: the database alias (None: the configured one).

    Returns:
        A :class:`NextRunAt` (its ``at`` is None when no ready job of those queues is due later).
    """
    params = {"now": now, "queues": list(queues) if queues is not None else None, "since": max(0.0, float(since))}
    row = _run(_NEXT_RUN_AT[queues is not None], params, alias=alias).one()
    return NextRunAt(now=row[0], at=row[1])
