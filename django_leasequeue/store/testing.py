"""Statements used only by :mod:`django_leasequeue.testing` (users' tests): claim chosen jobs,
expire one lease, pull future jobs forward, and move this session's database clock. They follow the
same rules as the rest of the store (one clock read per statement, fenced on the token)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime

from ._db import CLOCK, FLOW_RULES, JOB_TABLE, QUEUE_TABLE, TOKEN_MAX, _run, db_alias
from .claim import ClaimResult, _column_names, _decode_claims
from .trace_values import CLAIMED_TRACE_CONTEXT

# Claim the listed jobs (not "the next due ones"): eager mode runs exactly the jobs the code
# under test enqueued, and the lost-lease simulation has a second worker take over one job. Same
# eligibility as ``claim.JOB_CLAIM`` (ready, due, queue not paused, token room, concurrency key admitted)
# and the same SET and RETURNING, so the claimed row is indistinguishable from a worker's claim.
JOB_CLAIM_IDS = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
picked AS MATERIALIZED (
    SELECT j.id
    FROM {JOB_TABLE} j, clock
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.status = 'ready' AND j.run_at <= clock.now
      AND NOT EXISTS (SELECT 1 FROM {QUEUE_TABLE} p WHERE p.name = j.queue AND p.paused)
      AND j.lease_version < {TOKEN_MAX - 1}
      {FLOW_RULES}
    ORDER BY j.priority DESC, j.run_at, j.id
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
RETURNING j.id, j.task, j.queue, j.args, j.kwargs, j.attempts, j.max_attempts, j.lease_version,
          (extract(epoch FROM j.leased_until) * 1000000)::bigint AS leased_until_us,
          coalesce(j.lease_seconds, %(lease)s) AS lease_seconds,
          (extract(epoch FROM clock.now) * 1000000)::bigint AS claimed_at_us, j.priority,
          (extract(epoch FROM j.created_at) * 1000000)::bigint AS created_at_us,
          (extract(epoch FROM j.started_at) * 1000000)::bigint AS started_at_us,
          jsonb_array_length(j.errors) AS error_count, (extract(epoch FROM j.run_at) * 1000000)::bigint AS run_at_us,
          {CLAIMED_TRACE_CONTEXT}
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
    result = _run(JOB_CLAIM_IDS, params, alias=alias, describe=True)
    return _decode_claims(result.rows, _column_names(result.description), alias or db_alias(), worker_id=worker_id,
                          now=now)


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
    return _run(JOB_EXPIRE_LEASE, {"now": now, "id": job_id, "version": version}, alias=alias).one() is not None


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
    params = {"now": now, "queues": list(queues) if queues is not None else None}
    moved: int = _run(JOB_MAKE_DUE, params, alias=alias).rowcount
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
    _run(CLOCK_OFFSET_SET, {"offset": f"{float(seconds):.6f} seconds"}, alias=alias)


def clock_offset_get(*, alias: str | None = None) -> float:
    """Return the clock offset of this connection's session, in seconds (0.0 when unset)."""
    return float(_run(CLOCK_OFFSET_GET, alias=alias).one()[0])


def clock_real_now(*, alias: str | None = None) -> datetime:
    """Return the database's real clock (``clock_timestamp()``, without the offset)."""
    real_now: datetime = _run(CLOCK_RAW_NOW, alias=alias).one()[0]
    return real_now
