"""Per-key flow control: the fair claim of fair queues (and a read of a per-key rate log).

Fair claiming (``LEASEQUEUE["QUEUES"][name]["fair"] = True``): the claim takes jobs round-robin
across the jobs' fair keys (the ``fair_key`` column: the task's ``fair_key``, else its concurrency
key; keyless jobs form one more group), so one key's backlog cannot hold back another key's jobs.
One statement per fair queue, :data:`JOB_CLAIM_FAIR`:

1. Walk the distinct fair keys that have a due ready job, in key order, starting after the
   queue's cursor (``leasequeue_queue.fair_cursor``: the last key the previous claim served) and
   wrapping round to the first key. The walk is a recursive skip scan over the partial index
   ``leasequeue_job_fair`` (queue, fair_key, priority DESC, run_at, id) WHERE status = 'ready':
   one index probe per key, at most ``limit`` keys, whatever the number of jobs per key.
2. Take up to ``ceil(limit / keys)`` jobs of each key (one each when there are at least
   ``limit`` keys), in the key's own claim order (priority, run_at, id), with every eligibility
   rule of the plain claim and ``FOR UPDATE SKIP LOCKED``; then keep the first ``limit`` of them
   round by round (every key's first job, then every key's second job, ...).
3. Lease them, and move the cursor to the last key served. The cursor is advisory: its row is
   updated only when no other claim holds it (SKIP LOCKED), so two workers claiming the same fair
   queue at once never wait for each other; correctness comes from the row locks alone.

Across keys the round-robin order wins over priority; within a key, priority and run_at order as
usual. The per-key rate limit and the concurrency admission apply inside the fair claim as in every
other claim (see :mod:`.claim`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..models import RateKeyState
from ._db import CLOCK, FLOW_RULES, JOB_TABLE, QUEUE_TABLE, TOKEN_MAX, _run_claim, db_alias
from .trace_values import CLAIMED_TRACE_CONTEXT

# Claim up to %(limit)s jobs of one fair queue (%(queue)s), round-robin across fair keys (see the
# module docstring). after_cursor and from_start are the two halves of the circular walk (keys
# after the cursor, then keys up to it); each step is one probe of leasequeue_job_fair, and the
# second half only runs when the first found fewer than %(limit)s keys. The keyless group
# (fair_key IS NULL) is probed through the same index (btree keeps NULLs) and served first in each
# round. A key's surplus rows (locked but cut by the final LIMIT) stay locked only until commit.
JOB_CLAIM_FAIR = f"""
WITH RECURSIVE clock AS MATERIALIZED ({CLOCK}),
q AS MATERIALIZED (
    SELECT u.name, coalesce(s.fair_cursor, '') AS cursor, s.name IS NOT NULL AS has_row
    FROM (SELECT %(queue)s::text AS name) AS u LEFT JOIN {QUEUE_TABLE} s ON s.name = u.name
    WHERE NOT coalesce(s.paused, false)
),
after_cursor (k, n) AS (
    SELECT (SELECT j.fair_key FROM {JOB_TABLE} j
            WHERE j.status = 'ready' AND j.queue = q.name AND j.fair_key > q.cursor AND j.run_at <= clock.now
            ORDER BY j.fair_key LIMIT 1), 1
    FROM q, clock
    UNION ALL
    SELECT (SELECT j.fair_key FROM {JOB_TABLE} j
            WHERE j.status = 'ready' AND j.queue = q.name AND j.fair_key > a.k AND j.run_at <= clock.now
            ORDER BY j.fair_key LIMIT 1), a.n + 1
    FROM after_cursor a, q, clock
    WHERE a.k IS NOT NULL AND a.n < %(limit)s
),
from_start (k, n) AS (
    SELECT (SELECT j.fair_key FROM {JOB_TABLE} j
            WHERE j.status = 'ready' AND j.queue = q.name AND j.fair_key > '' AND j.fair_key <= q.cursor
              AND j.run_at <= clock.now
            ORDER BY j.fair_key LIMIT 1), 1
    FROM q, clock
    WHERE q.cursor <> '' AND (SELECT count(*) FROM after_cursor a WHERE a.k IS NOT NULL) < %(limit)s
    UNION ALL
    SELECT (SELECT j.fair_key FROM {JOB_TABLE} j
            WHERE j.status = 'ready' AND j.queue = q.name AND j.fair_key > f.k AND j.fair_key <= q.cursor
              AND j.run_at <= clock.now
            ORDER BY j.fair_key LIMIT 1), f.n + 1
    FROM from_start f, q, clock
    WHERE f.k IS NOT NULL AND f.n < %(limit)s
),
fair_keys AS MATERIALIZED (
    SELECT x.k, x.ord FROM (
        SELECT a.k, a.n AS ord FROM after_cursor a WHERE a.k IS NOT NULL
        UNION ALL
        SELECT f.k, %(limit)s + f.n FROM from_start f WHERE f.k IS NOT NULL
    ) AS x
    ORDER BY x.ord
    LIMIT %(limit)s
),
share AS MATERIALIZED (
    -- The keyless group counts as one more key when it has a due job (one probe).
    SELECT ceil(%(limit)s::numeric / greatest(1, count(*) + CASE WHEN EXISTS (
               SELECT 1 FROM {JOB_TABLE} j, q, clock
               WHERE j.status = 'ready' AND j.queue = q.name AND j.fair_key IS NULL AND j.run_at <= clock.now)
           THEN 1 ELSE 0 END))::int AS per
    FROM fair_keys
),
picked AS MATERIALIZED (
    SELECT c.id, c.priority, c.run_at, fk.k, fk.ord
    FROM clock, q, share, fair_keys fk
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_at
        FROM {JOB_TABLE} j
        WHERE j.status = 'ready' AND j.queue = q.name AND j.fair_key = fk.k AND j.run_at <= clock.now
          AND (%(all_tasks)s OR j.task = ANY(%(tasks)s::text[]))
          AND j.lease_version < {TOKEN_MAX - 1}
          {FLOW_RULES}
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT share.per
        FOR UPDATE SKIP LOCKED
    ) AS c
),
keyless AS MATERIALIZED (
    SELECT j.id, j.priority, j.run_at, NULL::text AS k, 0 AS ord
    FROM {JOB_TABLE} j, clock, q, share
    WHERE j.status = 'ready' AND j.queue = %(queue)s AND j.fair_key IS NULL AND j.run_at <= clock.now
      AND (%(all_tasks)s OR j.task = ANY(%(tasks)s::text[]))
      AND j.lease_version < {TOKEN_MAX - 1}
      {FLOW_RULES}
    -- The queue as a constant and fair_key (NULL here) leading the ORDER BY make it the index's
    -- order: otherwise the planner may sort every keyless ready job of the queue on each claim.
    ORDER BY j.fair_key, j.priority DESC, j.run_at, j.id
    LIMIT (SELECT per FROM share)
    FOR UPDATE OF j SKIP LOCKED
),
chosen AS MATERIALIZED (
    SELECT r.id, r.k, r.ord, r.rn FROM (
        SELECT p.id, p.k, p.ord, p.priority,
               row_number() OVER (PARTITION BY p.ord ORDER BY p.priority DESC, p.run_at, p.id) AS rn
        FROM (SELECT * FROM picked UNION ALL SELECT * FROM keyless) AS p
    ) AS r
    ORDER BY r.rn, r.ord
    LIMIT %(limit)s
),
last_key AS MATERIALIZED (
    SELECT c.k FROM chosen c WHERE c.k IS NOT NULL ORDER BY c.ord DESC LIMIT 1
),
moved AS (
    UPDATE {QUEUE_TABLE} s SET fair_cursor = last_key.k
    FROM last_key
    WHERE s.name IN (SELECT x.name FROM {QUEUE_TABLE} x WHERE x.name = %(queue)s FOR UPDATE SKIP LOCKED)
    RETURNING s.name
),
made AS (
    INSERT INTO {QUEUE_TABLE} (name, paused, paused_at, paused_by, updated_at, rate_log, throttled_total, fair_cursor)
    SELECT q.name, false, NULL, '', clock.now, '[]'::jsonb, 0, last_key.k FROM q, clock, last_key
    WHERE NOT q.has_row
    ON CONFLICT (name) DO NOTHING
    RETURNING name
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
WHERE j.id = ANY(ARRAY(SELECT chosen.id FROM chosen))
RETURNING j.id, j.task, j.queue, j.args, j.kwargs, j.attempts, j.max_attempts, j.lease_version,
          (extract(epoch FROM j.leased_until) * 1000000)::bigint AS leased_until_us,
          coalesce(j.lease_seconds, %(lease)s) AS lease_seconds,
          (extract(epoch FROM clock.now) * 1000000)::bigint AS claimed_at_us, j.priority,
          (extract(epoch FROM j.created_at) * 1000000)::bigint AS created_at_us,
          (extract(epoch FROM j.started_at) * 1000000)::bigint AS started_at_us,
          jsonb_array_length(j.errors) AS error_count, (extract(epoch FROM j.run_at) * 1000000)::bigint AS run_at_us,
          {CLAIMED_TRACE_CONTEXT},
          (SELECT c.rn * (2 * %(limit)s + 2) + c.ord FROM chosen c WHERE c.id = j.id) AS fair_order
"""


def _claim_fair(params: dict[str, Any], queue: str, *, alias: str) -> tuple[list[Any], Sequence[Any] | None]:
    """Run :data:`JOB_CLAIM_FAIR` for one fair queue, for :func:`~django_leasequeue.store.job_claim`.

    Args:
        params: the claim's parameters (``now``, ``limit``, ``worker``, ``lease``, ``claim``,
            ``tasks``, ``all_tasks``); ``queue`` is filled in here.
        queue: the fair queue's name.
        alias: the database alias.

    Returns:
        ``(rows, cursor description)``, one row per leased job, in no particular order (the
        caller sorts them round by round, see :func:`fair_order`).
    """
    result = _run_claim(JOB_CLAIM_FAIR, {**params, "queue": queue}, alias=alias)
    return result.rows, result.description


def fair_order(rows: list[Any], names: Sequence[str]) -> list[Any]:
    """Sort rows of :data:`JOB_CLAIM_FAIR` round by round: each fair key's first job (keyless jobs
    first, then the keys in walk order), then each key's second job, and so on (the statement's
    ``fair_order`` column). UPDATE ... RETURNING gives no order, and the worker starts a batch's
    jobs in list order.

    Args:
        rows: the claim's rows; names: its column names.

    Returns:
        ``rows``, sorted in place.
    """
    at = names.index("fair_order")
    rows.sort(key=lambda r: r[at])
    return rows


def rate_key_log(key: str, *, alias: str | None = None) -> list[list[float]] | None:
    """The sliding log of one rate key, ``[[claim time as epoch seconds, jobs admitted], ...]``, or
    None when the key has no row (never admitted, or pruned). For tests and debugging."""
    row = RateKeyState.objects.using(alias or db_alias()).filter(key=key).values_list("log", flat=True).first()
    return None if row is None else [[float(t), int(c)] for t, c in row]

