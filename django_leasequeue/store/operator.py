"""The operator's bulk operations (the admin's buttons and bulk actions): request cancel, replay
dead letters, retry now.

Each call is one statement for any number of ids (the admin sends 10,000 at a time), rows are
locked in id order so two bulk operations cannot deadlock each other, and every change is appended
to the job's ``history`` with who did it and when (database time).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction

from ._db import CLOCK, CLOCK_WAKING, JOB_TABLE, TOKEN_MAX, _dumps, _run, db_alias
from .workflows import DEPENDENCY_TABLE, WORKFLOW_TABLE

#: The reason given for an id that names no job (deleted meanwhile, or never existed).
NO_SUCH_JOB = "no such job"
#: The reason given for an id whose row changed between the operator's selection and the write.
CHANGED_MEANWHILE = "changed by someone else meanwhile"

def skipped_by_reason(reason_sql: str, acted: str) -> str:
    """SQL of a scalar subquery: the ids of ``%(ids)s`` that the CTE named ``acted`` (with an ``id``
    column) left alone, counted by ``reason_sql`` (a ``*_SKIP_REASON`` expression over ``j``) as a
    jsonb object ``{"<reason>": n}``; a row the reason passes but that was not acted on changed
    meanwhile. Read from the statement's snapshot, as the rows were before it. Shared by every
    set-based operator write, so all of them report what they skipped in the same way."""
    return f"""(SELECT coalesce(jsonb_object_agg(s.reason, s.n), '{{}}'::jsonb) FROM (
            SELECT coalesce({reason_sql}, '{CHANGED_MEANWHILE}') AS reason, count(*) AS n
            FROM unnest(%(ids)s::bigint[]) AS r(id) LEFT JOIN {JOB_TABLE} j ON j.id = r.id
            WHERE r.id NOT IN (SELECT id FROM {acted})
            GROUP BY 1) AS s)"""


# Cancel many jobs in one statement (the admin's Cancel button and bulk action). A ready job, or a
# workflow step still waiting for its dependencies, is cancelled at once; a leased job gets
# cancel_requested, which its worker learns at the next heartbeat (ctx.cancel_requested,
# ctx.check_cancel() raising JobCancelled), and which makes any later completion, failure, snooze,
# release or reap of that lease end the job cancelled. Setting the flag touches no indexed column,
# so on a leased row it is a HOT update. Rows are locked in id order (the ORDER BY sits below FOR
# UPDATE) so two bulk cancels cannot deadlock each other; a row held by a claim or a
# fenced_atomic() commit is waited for and re-checked after it commits.
#: Why a job is not cancelled, as a SQL expression over ``j`` (the job row, NULL when the id names
#: no job): the cancel reports it after the fact and the admin's confirmation page before.
CANCEL_SKIP_REASON = (f"CASE WHEN j.id IS NULL THEN '{NO_SUCH_JOB}' "
                      "WHEN j.status IN ('done', 'dead', 'cancelled') THEN 'already ' || j.status "
                      "WHEN j.status = 'leased' AND j.cancel_requested THEN 'already asked to stop' "
                      "ELSE NULL END")

JOB_REQUEST_CANCEL = f"""
WITH clock AS MATERIALIZED ({CLOCK_WAKING}),
target AS MATERIALIZED (
    SELECT j.id FROM {JOB_TABLE} j
    WHERE j.id = ANY(%(ids)s::bigint[])
      AND (j.status IN ('ready', 'waiting') OR (j.status = 'leased' AND NOT j.cancel_requested))
    ORDER BY j.id
    FOR UPDATE
),
changed AS (
    UPDATE {JOB_TABLE} j
    SET status = CASE WHEN j.status IN ('ready', 'waiting') THEN 'cancelled' ELSE j.status END,
        finished_at = CASE WHEN j.status IN ('ready', 'waiting') THEN clock.now ELSE j.finished_at END,
        cancel_requested = (j.status = 'leased'),
        history = j.history || jsonb_build_array(jsonb_build_object(
            'event', CASE WHEN j.status IN ('ready', 'waiting') THEN 'cancelled' ELSE 'cancel_requested' END,
            'by', %(by)s::text, 'at', clock.now, 'from_status', j.status))
    FROM target, clock
    WHERE j.id = target.id AND (j.status IN ('ready', 'waiting') OR (j.status = 'leased' AND NOT j.cancel_requested))
    RETURNING j.id, j.status
)
-- The ids left alone, counted by why (read from the statement's snapshot, as they were before it).
SELECT count(*) FILTER (WHERE status = 'cancelled'), count(*) FILTER (WHERE status = 'leased'),
       {skipped_by_reason(CANCEL_SKIP_REASON, "changed")}
FROM changed
"""


@dataclass(frozen=True)
class CancelCounts:
    """Outcome of :func:`job_request_cancel`.

    Attributes:
        cancelled (int): ready jobs cancelled at once.
        requested (int): leased jobs asked to stop (they end ``cancelled`` when their worker next
            writes: check_cancel(), completion, failure, snooze, release or reap).
        unchanged (int): ids already finished, already asked to stop, or unknown.
        skipped (dict[str, int]): the unchanged ids counted by reason (``"already done"``,
            ``"already asked to stop"``, ``"no such job"``); the counts add up to ``unchanged``.
    """

    cancelled: int
    requested: int
    unchanged: int
    skipped: dict[str, int] = field(default_factory=dict)


def job_request_cancel(ids: Iterable[int], *, by: str = "", now: datetime | None = None,
                       alias: str | None = None) -> CancelCounts:
    """Cancel ready and waiting jobs now and ask leased jobs to stop, in one statement (10,000 ids are fine).

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
    from ..conf import get_settings

    settings = get_settings()
    params = {"now": now, "ids": ids, "by": by, "wake": settings.notify_channel if settings.notify else None}
    cancelled, requested, skipped = _run(JOB_REQUEST_CANCEL, params, alias=alias).rows[0]
    skipped = json.loads(skipped) if isinstance(skipped, str) else skipped
    return CancelCounts(cancelled, requested, len(ids) - cancelled - requested,
                        {str(k): int(v) for k, v in skipped.items()})




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
# A job cancelled while it was still waiting: by an operator or "cancel the rest" (the cancel
# records the status it left), by the "cancel" policy's cascade (the trigger, "dependency #N"), or
# by its workflow's settle (an on_success callback, "workflow #N", no status recorded).
_CANCELLED_WHILE_WAITING = (
    "(c.history -> -1 ->> 'from_status' = 'waiting'"
    " OR (c.history -> -1 ->> 'from_status' IS NULL"
    " AND (c.history -> -1 ->> 'by' LIKE 'dependency #%%' OR c.history -> -1 ->> 'by' LIKE 'workflow #%%')))")

#: Why :func:`job_replay` would leave a job alone, as a SQL expression over ``j`` for the admin's
#: confirmation page (NULL: it would be replayed). The replay itself reports each refused id with
#: its holder's id; the admin counts those under the same reasons.
REPLAY_SKIP_REASON = (f"CASE WHEN j.id IS NULL THEN '{NO_SUCH_JOB}' "
                      "WHEN j.status NOT IN ('dead', 'cancelled') "
                      "THEN 'job is ' || j.status || '; only dead or cancelled jobs are replayed' "
                      "WHEN j.unique_key IS NOT NULL AND j.unique_scope = 'active' AND EXISTS ("
                      f"SELECT 1 FROM {JOB_TABLE} o WHERE o.unique_key = j.unique_key AND o.unique_scope = 'active' "
                      "AND o.status IN ('ready', 'waiting', 'leased') AND o.id <> j.id) "
                      "THEN 'its unique key is held by another ready or leased job' "
                      "ELSE NULL END")

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
                 AND o.status IN ('ready', 'waiting', 'leased') AND o.id <> t.id
               LIMIT 1)
           END AS holder,
           CASE WHEN t.unique_key IS NOT NULL AND t.unique_scope = 'active'
                THEN first_value(t.id) OVER (PARTITION BY t.unique_key, t.unique_scope ORDER BY t.id DESC)
           END AS key_winner
    FROM target t
),
-- A workflow callback that was cancelled while it still waited (never released: its arguments
-- hold no results yet; a job that waits never runs, and a released one never waits again) waits
-- again when replayed, unless its workflow would release it now: closed, no member pending or
-- replayed by this statement, and for on_success every member done (or the policy "run"); then it
-- starts ready with the members' results, as settle would have released it. It has no edges
-- (waiting_on stays 0); settle releases it later otherwise. A callback that was released (it ran,
-- or was cancelled while ready) is replayed ready, with the results it received.
unreleased_callback AS MATERIALIZED (
    SELECT t.id FROM target t JOIN {JOB_TABLE} c ON c.id = t.id
    WHERE c.workflow_role IN ('on_success', 'on_complete') AND c.status = 'cancelled' AND {_CANCELLED_WHILE_WAITING}
),
held_callback AS MATERIALIZED (
    SELECT t.id FROM unreleased_callback t
    JOIN {JOB_TABLE} c ON c.id = t.id
    JOIN {WORKFLOW_TABLE} w ON w.id = c.workflow_id
    WHERE (w.closed_at IS NULL OR EXISTS (
          SELECT 1 FROM {JOB_TABLE} m
          WHERE m.workflow_id = w.id AND m.workflow_role = 'member'
            AND (m.status IN ('ready', 'leased', 'waiting') OR m.id IN (SELECT id FROM target)
                 OR (c.workflow_role = 'on_success' AND w.on_dependency_dead <> 'run' AND m.status <> 'done'))))
),
-- A dependent cancelled while it waited (by an operator, or by the "cancel" policy) was never
-- released: its edges are judged again from its dependencies as they stand (one replayed by this
-- statement counts as pending), its count of unresolved ones set from that, and when none is left
-- it starts ready with their results, as a release would have given them.
unreleased AS MATERIALIZED (
    SELECT t.id FROM target t JOIN {JOB_TABLE} c ON c.id = t.id
    WHERE c.status = 'cancelled' AND {_CANCELLED_WHILE_WAITING}
      AND EXISTS (SELECT 1 FROM {DEPENDENCY_TABLE} d WHERE d.job_id = t.id)
),
reedged AS (
    UPDATE {DEPENDENCY_TABLE} d
    SET resolved = p.id NOT IN (SELECT id FROM target)
                   AND (p.status = 'done' OR (p.status IN ('dead', 'cancelled') AND c.on_dependency_dead = 'run'))
    FROM {JOB_TABLE} p, {JOB_TABLE} c
    WHERE d.job_id IN (SELECT id FROM unreleased) AND p.id = d.depends_on_id AND c.id = d.job_id
    RETURNING d.job_id, d.resolved
),
recount AS MATERIALIZED (
    SELECT r.job_id AS id, count(*) FILTER (WHERE NOT r.resolved) AS open FROM reedged r GROUP BY r.job_id
),
replayed AS (
    UPDATE {JOB_TABLE} j
    SET status = CASE WHEN coalesce(rc.open, j.waiting_on) > 0 OR j.id IN (SELECT id FROM held_callback)
                      THEN 'waiting' ELSE 'ready' END,
        waiting_on = coalesce(rc.open, j.waiting_on),
        run_at = clock.now, attempts = 0,
        lease_version = least(j.lease_version + 1, {TOKEN_MAX}),
        leased_until = NULL, leased_by = '', finished_at = NULL, cancel_requested = false, snoozes = 0,
        interruptions = 0, result = NULL,
        -- Only a job of a halting sequence can have been skipped: replayed, it halts again if it dies.
        sequence_halts = j.sequence_halts OR (j.sequence_key IS NOT NULL
                                              AND j.history @> '[{{"event": "sequence_skipped"}}]'::jsonb),
        -- Released by this replay: the results are put before its own arguments (edited or not).
        args = CASE WHEN rc.open = 0 AND j.pass_result THEN jsonb_build_array((
                        SELECT CASE WHEN count(*) = 1
                                    THEN (array_agg(CASE WHEN p.status = 'done' THEN p.result END))[1]
                                    ELSE jsonb_object_agg(e.name, CASE WHEN p.status = 'done' THEN p.result END)
                               END
                        FROM {DEPENDENCY_TABLE} e JOIN {JOB_TABLE} p ON p.id = e.depends_on_id
                        WHERE e.job_id = j.id)) || coalesce(%(args)s::jsonb, j.args)
                    WHEN j.pass_result AND j.id IN (SELECT id FROM unreleased_callback)
                         AND j.id NOT IN (SELECT id FROM held_callback) THEN jsonb_build_array((
                        SELECT coalesce(jsonb_agg(m.result ORDER BY m.id), '[]'::jsonb) FROM {JOB_TABLE} m
                        WHERE m.workflow_id = j.workflow_id AND m.workflow_role = 'member'))
                        || coalesce(%(args)s::jsonb, j.args)
                    ELSE coalesce(%(args)s::jsonb, j.args) END,
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
    FROM keyed k CROSS JOIN clock LEFT JOIN recount rc ON rc.id = k.id
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
        replayed (list[int]): ids replayed, in id order: ready and due at once, or ``waiting``
            again (a job whose dependencies are not all done, a workflow callback whose members
            are not).
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
            The caller validates them (``payload.check_json``); old and new values go to history.
        kwargs: new keyword arguments, likewise.
        now: aware datetime instead of the database clock (tests).

    Returns:
        :class:`ReplayResult`.

    Raises:
        TypeError: ``args`` is not a list or ``kwargs`` not a dict.
    """
    from ..conf import get_settings

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
            with transaction.atomic(using=alias):
                rows = _run(JOB_REPLAY, params, alias=alias).rows
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
            refused[job_id] = NO_SUCH_JOB
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
    from ..conf import get_settings

    ids = sorted({int(i) for i in ids})
    if not ids:
        return 0
    settings = get_settings()
    moved: int = _run(JOB_RETRY_NOW, {"now": now, "ids": ids, "by": by, "notify": settings.notify,
                                "channel": settings.notify_channel}, alias=alias).one()[0]
    return moved
