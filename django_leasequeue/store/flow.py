"""Flow control: the claims of rate-limited queues, pause and resume, and the flow-control figures.

The per-key concurrency admission is part of every claim (see :mod:`.claim`).

Queue rate limits (LEASEQUEUE["QUEUES"][name]["rate_limit"] = "N/s|m|h"): at most N claims in
any window of that length, across all workers. The queue's leasequeue_queue row keeps a sliding
log of the claims inside the window, as [[epoch seconds, jobs], ...] (one entry per claim
statement, so at most N entries, usually far fewer). A rated claim is one short transaction:

1. RATE_LOCK locks the rows of the rate-limited queues it claims from (FOR UPDATE, in name
   order, so claimers never deadlock). Claimers of one rate-limited queue run one at a time;
   claims on other queues are not affected.
2. JOB_CLAIM_RATED then starts, so its snapshot and its clock are both taken after the lock:
   it sees the log as the previous holder committed it, and claim times are increasing in lock
   order. Each queue may take allow = min(limit, N - jobs claimed in [now - window, now]); that
   allowance is the LIMIT of the queue's locked candidate scan, so no row beyond it is locked.
   The same statement appends its own claims to the log and drops entries older than the window
   (the window is closed: a claim exactly `window` seconds after another still counts it).
   Entries falling in the same 1/RATE_LOG_BUCKETS of the window are merged under the latest of
   their times, so the log never holds more than about RATE_LOG_BUCKETS + 1 entries however many
   claims a window sees. Merging only moves claim times later, so a claim is counted for at
   least as long as the window says (never an extra claim); the price is that a slot frees up
   to window/RATE_LOG_BUCKETS late (10 ms for "N/s", 0.6 s for "N/m", 36 s for "N/h").

Why a log row and not count(attempted_at) over the jobs: a retried or snoozed job's earlier claim
would vanish when attempted_at is overwritten (so the count would undercount and let bursts
through), and an index on (queue, attempted_at) would take a new entry on every state change of
every job, rate-limited or not, and would need the same per-queue lock anyway. The log row costs
only rate-limited queues: one small HOT update of a row no index covers the changed columns of.

The statement returns, for a queue whose allowance is used up, the seconds until its oldest
logged claim leaves the window, so the worker waits exactly that long instead of polling.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import transaction

from ..models import QueueState
from ._db import (
    CLOCK,
    FLOW_RULES,
    JIT_OFF_LOCAL,
    JOB_TABLE,
    QUEUE_TABLE,
    STAT_TABLE,
    TOKEN_MAX,
    _cursor,
    _jit_off_here,
    _run,
    db_alias,
)
from .trace_values import CLAIMED_TRACE_CONTEXT

if TYPE_CHECKING:
    from ..conf import RateLimit

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

# Claim from named queues when some of them are rate-limited (after RATE_LOCK, same transaction).
JOB_CLAIM_RATED = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
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
        LIMIT q.allow
        FOR UPDATE SKIP LOCKED
    ) AS c
    ORDER BY c.priority DESC, c.run_at, c.id
    LIMIT %(limit)s
),
claimed AS (
    -- id = ANY(ARRAY(...)): inside a CTE the planner otherwise hash-joins picked against a
    -- sequential scan of the whole job table; this probes the primary key per picked id.
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
              (extract(epoch FROM clock.now) * 1000000)::bigint AS claimed_at_us,
              j.priority, (extract(epoch FROM j.created_at) * 1000000)::bigint AS created_at_us,
              (extract(epoch FROM j.started_at) * 1000000)::bigint AS started_at_us,
              jsonb_array_length(j.errors) AS error_count,
              (extract(epoch FROM j.run_at) * 1000000)::bigint AS run_at_us, {CLAIMED_TRACE_CONTEXT}
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
SELECT c.id, c.task, c.queue, c.args, c.kwargs, c.attempts, c.max_attempts, c.lease_version, c.leased_until_us,
       c.lease_seconds, c.claimed_at_us, c.priority, c.created_at_us, c.started_at_us, c.error_count, c.run_at_us,
       c.trace_context, waits.waits
FROM waits LEFT JOIN claimed c ON true
"""

# Claim from every queue when some queues are rate-limited: the unlimited queues through the
# any-queue scan, the rate-limited ones through their own allowance, merged in claim order.
JOB_CLAIM_ANY_QUEUE_RATED = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
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
),
unrated AS MATERIALIZED (
    SELECT j.id, j.priority, j.run_at
    FROM {JOB_TABLE} j, clock
    WHERE j.status = 'ready' AND j.run_at <= clock.now AND j.queue <> ALL(%(queues)s::text[])
      AND NOT EXISTS (SELECT 1 FROM {QUEUE_TABLE} p WHERE p.name = j.queue AND p.paused)
      AND (%(all_tasks)s OR j.task = ANY(%(tasks)s::text[]))
      AND j.lease_version < {TOKEN_MAX - 1}
      {FLOW_RULES}
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
),
rated AS MATERIALIZED (
    SELECT c.id, c.priority, c.run_at
    FROM clock, q
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_at
        FROM {JOB_TABLE} j
        WHERE j.status = 'ready' AND j.queue = q.name AND j.run_at <= clock.now
          AND (%(all_tasks)s OR j.task = ANY(%(tasks)s::text[]))
          AND j.lease_version < {TOKEN_MAX - 1}
          {FLOW_RULES}
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT q.allow
        FOR UPDATE SKIP LOCKED
    ) AS c
),
picked AS MATERIALIZED (
    SELECT p.id FROM (SELECT * FROM unrated UNION ALL SELECT * FROM rated) AS p
    ORDER BY p.priority DESC, p.run_at, p.id
    LIMIT %(limit)s
),
claimed AS (
    -- id = ANY(ARRAY(...)): inside a CTE the planner otherwise hash-joins picked against a
    -- sequential scan of the whole job table; this probes the primary key per picked id.
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
              (extract(epoch FROM clock.now) * 1000000)::bigint AS claimed_at_us,
              j.priority, (extract(epoch FROM j.created_at) * 1000000)::bigint AS created_at_us,
              (extract(epoch FROM j.started_at) * 1000000)::bigint AS started_at_us,
              jsonb_array_length(j.errors) AS error_count,
              (extract(epoch FROM j.run_at) * 1000000)::bigint AS run_at_us, {CLAIMED_TRACE_CONTEXT}
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
SELECT c.id, c.task, c.queue, c.args, c.kwargs, c.attempts, c.max_attempts, c.lease_version, c.leased_until_us,
       c.lease_seconds, c.claimed_at_us, c.priority, c.created_at_us, c.started_at_us, c.error_count, c.run_at_us,
       c.trace_context, waits.waits
FROM waits LEFT JOIN claimed c ON true
"""


def _claim_rated(params: dict[str, Any], queues: Sequence[str] | None, rated: Sequence[str],
                 rate_limits: Mapping[str, RateLimit], *, alias: str) -> tuple[list[Any], Sequence[Any] | None]:
    """Run the rated claim for :func:`~django_leasequeue.store.job_claim`: lock the rate rows of
    ``rated`` (creating missing ones), then claim in the same short transaction.

    Args:
        params: the claim's parameters (``now``, ``limit``, ``worker``, ``lease``, ``claim``, ``tasks``);
            ``queues``, ``rate_n`` and ``rate_secs`` are filled in here.
        queues: the queues asked for, or None for every queue.
        rated: the sorted names of the rate-limited queues among them.
        rate_limits: queue name -> its rate limit.
        alias: the database alias.

    Returns:
        ``(rows, cursor description)``: one row per claimed job (a row with a NULL id when none
        was), each carrying the ``waits`` object of the queues this claim used up.
    """
    names = list(queues) if queues is not None else list(rated)
    params = {**params, "queues": names,
              "rate_n": [rate_limits[q].limit if q in rate_limits else None for q in names],
              "rate_secs": [float(rate_limits[q].per) if q in rate_limits else None for q in names]}
    sql = JOB_CLAIM_RATED if queues is not None else JOB_CLAIM_ANY_QUEUE_RATED
    jit_off = _jit_off_here(alias)
    with transaction.atomic(using=alias), _cursor(alias) as cur:
        if jit_off:
            cur.execute(JIT_OFF_LOCAL)  # for this transaction only (store/_db.py)
        cur.execute(RATE_LOCK, {"names": list(rated)})
        if len(cur.fetchall()) < len(rated):
            cur.execute(RATE_ROWS_CREATE, {"names": list(rated), "now": params["now"]})
            cur.execute(RATE_LOCK, {"names": list(rated)})
        cur.execute(sql, params)
        return cur.fetchall(), cur.description


# Seconds a worker's pause view (the paused flags it last read, see worker.pause_view.PauseView) stays
# good for starting jobs; queue_pause() waits this long, plus PAUSE_MARGIN, after its commit.
PAUSE_GRACE = 0.5
# Added to the wait of queue_pause(): covers the few statements between a worker's freshness check
# and the start of the handler, and any small difference in the rates of the two monotonic clocks.
PAUSE_MARGIN = 0.05

# Pause a queue: claims skip it from the next claim statement on (the claim reads
# leasequeue_queue.paused in SQL). Jobs a worker already holds unstarted are kept from starting by
# the worker's pause view and the wait in queue_pause(); leased jobs that started run to the end.
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


def queue_pause(name: str, *, by: str = "", now: datetime | None = None, alias: str | None = None,
                wait: bool = True) -> bool:
    """Pause queue ``name``: once this returns, no job of the queue starts, in any worker, until
    :func:`queue_resume`.

    Handlers that had started run to the end. Jobs a worker holds unstarted (prefetched) go back
    to ``ready`` without spending an attempt. Works for queues not yet seen (the row is created).

    Why the wait makes the rule hold: a worker starts a held job only on a *pause view* (the paused
    flags it read) younger than ``PAUSE_GRACE`` seconds, aged from the moment the reading
    statement was sent, by the worker's monotonic clock. A view read after the pause committed
    sees it. A view read before the commit was sent before the commit, so once this function has
    waited ``PAUSE_GRACE + PAUSE_MARGIN`` seconds after the commit (by its own monotonic clock),
    every such view is older than the grace and starts nothing, even in a worker that was frozen
    (SIGSTOP) meanwhile, whose monotonic clock kept running. This assumes that the monotonic clocks
    of this process and of the workers advance at the same rate (true on one host; across hosts,
    up to ordinary clock drift, which the margin covers many times over); it assumes nothing
    about their offsets.

    Inside ``transaction.atomic()`` the pause commits with the outermost block, so the wait runs
    then (``on_commit``) and the rule holds once that block has exited.

    Args:
        name: queue name.
        by: who paused it (shown by ``manage.py leasequeue_queue list`` and the admin).
        now: aware datetime recorded as ``paused_at`` instead of the database clock (tests).
        wait: False returns right after the commit (the old behaviour): no job is *claimed* from
            the queue after that, but jobs that workers hold unstarted may still start during the
            next ``PAUSE_GRACE + PAUSE_MARGIN`` seconds.

    Returns:
        True if the queue was running and is now paused; False if it was already paused (the wait
        applies too: a pause committed by someone else a moment ago may still be in its grace).
    """
    changed = _run(QUEUE_PAUSE, {"now": now, "name": name, "by": by}, alias=alias).one() is not None
    if wait:
        transaction.on_commit(queue_pause_wait, using=alias or db_alias())
    return changed


def queue_pause_wait(seconds: float | None = None) -> None:
    """Sleep until every worker's pause view read before now is past its grace: ``seconds``
    (default ``PAUSE_GRACE + PAUSE_MARGIN``) by this process's monotonic clock. Called by
    :func:`queue_pause` after its commit; exposed for callers that paused with ``wait=False``."""
    deadline = time.monotonic() + (PAUSE_GRACE + PAUSE_MARGIN if seconds is None else seconds)
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(left)


def queue_resume(name: str, *, now: datetime | None = None, alias: str | None = None) -> bool:
    """Resume queue ``name`` and wake the workers that serve it (NOTIFY, at commit).

    Returns:
        True if the queue was paused and now runs again; False if it was not paused.
    """
    from ..conf import get_settings

    params = {"now": now, "name": name, "channel": get_settings().notify_channel}
    return _run(QUEUE_RESUME, params, alias=alias).one() is not None


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
        waiting (int): jobs waiting for their dependencies (workflows).
        dead (int): dead letters kept in the queue.
    """

    name: str
    paused: bool
    paused_at: datetime | None
    paused_by: str
    rate_limit: str | None
    throttled_total: int
    ready: int
    leased: int
    waiting: int = 0
    dead: int = 0

    @property
    def depth(self) -> int:
        """Jobs not finished yet (ready, waiting or leased)."""
        return self.ready + self.waiting + self.leased


# Every queue that holds jobs or has a state row or a configuration. Each count's WHERE names one
# status, so PostgreSQL reads it from that status's partial index (leasequeue_job_ready, _leased,
# _waiting, _dead), not from the retained finished rows; a queue whose jobs are all done or
# cancelled is found in the chart counters instead (they record every finished job per queue).
QUEUE_LIST = f"""
WITH ready AS (SELECT queue AS name, count(*) AS n FROM {JOB_TABLE} WHERE status = 'ready' GROUP BY queue),
leased AS (SELECT queue AS name, count(*) AS n FROM {JOB_TABLE} WHERE status = 'leased' GROUP BY queue),
waiting AS (SELECT queue AS name, count(*) AS n FROM {JOB_TABLE} WHERE status = 'waiting' GROUP BY queue),
dead AS (SELECT queue AS name, count(*) AS n FROM {JOB_TABLE} WHERE status = 'dead' GROUP BY queue),
names AS (
    SELECT name FROM {QUEUE_TABLE} UNION SELECT name FROM ready UNION SELECT name FROM leased
    UNION SELECT name FROM waiting UNION SELECT name FROM dead UNION SELECT DISTINCT queue FROM {STAT_TABLE}
    UNION SELECT unnest(%(configured)s::text[])
)
SELECT n.name, coalesce(s.paused, false), s.paused_at, coalesce(s.paused_by, ''),
       coalesce(s.throttled_total, 0), coalesce(r.n, 0), coalesce(l.n, 0), coalesce(w.n, 0), coalesce(d.n, 0)
FROM names n LEFT JOIN {QUEUE_TABLE} s ON s.name = n.name
LEFT JOIN ready r ON r.name = n.name LEFT JOIN leased l ON l.name = n.name
LEFT JOIN waiting w ON w.name = n.name LEFT JOIN dead d ON d.name = n.name
ORDER BY n.name
"""


def queue_list(*, alias: str | None = None) -> list[QueueInfo]:
    """Every known queue, by name: configured in ``LEASEQUEUE["QUEUES"]``, with a state row (paused
    or rate-limited once), holding jobs in any state, or with finished jobs in the chart counters.

    Reads the counts with one aggregate per status over its partial index: fine for a dashboard
    or a management command, not for a tight loop.

    Args:
        alias: database alias; default the job table's.

    Returns:
        One :class:`QueueInfo` per queue, sorted by name.
    """
    from ..conf import get_settings

    settings = get_settings()
    rows = _run(QUEUE_LIST, {"configured": sorted(settings.queues or [])}, alias=alias).rows
    rates = settings.rate_limits
    return [QueueInfo(name=r[0], paused=r[1], paused_at=r[2], paused_by=r[3],
                      rate_limit=str(rates[r[0]]) if r[0] in rates else None, throttled_total=r[4],
                      ready=r[5], leased=r[6], waiting=r[7], dead=r[8]) for r in rows]


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
    return [KeyWait(*r) for r in _run(FLOW_KEYS_WAITING, {"now": now}, alias=alias).rows]


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

