"""The console's set-based interventions on single jobs or selections: run now, release an expired
lease, delete finished jobs.

Like the bulk operations in ``operator`` (whose reason constants they share), each is one statement
for any number of ids, locks rows in id order, appends to each job's ``history`` and reports the ids
it left alone counted by reason, judged by the same expression the confirmation page previews.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ._db import CLOCK, CLOCK_WAKING, JOB_TABLE, TOKEN_MAX, _run
from .maintenance import _STILL_READ, JOB_PRUNE_WORKFLOWS
from .operator import CHANGED_MEANWHILE, NO_SUCH_JOB, skipped_by_reason
from .workflows import DEPENDENCY_TABLE

# Make ready jobs that are not yet due run now: a retry waiting out its backoff, a snoozed job, a
# job enqueued for later or a schedule's occurrence emitted early (the job page's "Run now").
# Conditional like every operator write: only rows still ready and not yet due change, and, when
# the caller passes the fencing token it saw, only rows whose token is still that one (a row that
# was claimed and snoozed again meanwhile is the operator's to look at again, not to move). Locks
# in id order; a NOTIFY per queue wakes idle workers at commit.
# The skip reason of a row whose fencing token is no longer the one the caller saw (%(tokens)s maps
# job ids to tokens, or is NULL when the caller passed none): a CASE branch shared by the writes below.
_TOKEN_MOVED = ("WHEN %(tokens)s::jsonb IS NOT NULL "
                "AND j.lease_version IS DISTINCT FROM (%(tokens)s::jsonb ->> j.id::text)::bigint "
                f"THEN '{CHANGED_MEANWHILE}'")

RUN_NOW_SKIP_REASON = (f"CASE WHEN j.id IS NULL THEN '{NO_SUCH_JOB}' "
                       "WHEN j.status <> 'ready' THEN 'job is ' || j.status "
                       "WHEN j.run_at <= (SELECT now FROM clock) THEN 'already due' "
                       f"{_TOKEN_MOVED} ELSE NULL END")

JOB_RUN_NOW = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
target AS MATERIALIZED (
    SELECT j.id FROM {JOB_TABLE} j
    WHERE j.id = ANY(%(ids)s::bigint[]) AND {RUN_NOW_SKIP_REASON} IS NULL
    ORDER BY j.id
    FOR UPDATE OF j
),
changed AS (
    UPDATE {JOB_TABLE} j
    SET run_at = clock.now,
        history = j.history || jsonb_build_array(jsonb_build_object(
            'event', 'run_now', 'by', %(by)s::text, 'at', clock.now, 'run_at_was', j.run_at))
    FROM target, clock
    WHERE j.id = target.id AND {RUN_NOW_SKIP_REASON} IS NULL
    RETURNING j.id, j.queue
),
woken AS (
    SELECT pg_notify(%(channel)s, q.queue) FROM (SELECT DISTINCT queue FROM changed) AS q
    WHERE %(notify)s
)
SELECT (SELECT coalesce(array_agg(id ORDER BY id), '{{}}') FROM changed),
       {skipped_by_reason(RUN_NOW_SKIP_REASON, "changed")},
       (SELECT count(*) FROM woken)
"""


@dataclass(frozen=True)
class BulkOutcome:
    """Outcome of a set-based operator write (:func:`job_run_now`, :func:`job_release_expired`,
    :func:`job_delete_finished`).

    Attributes:
        done (list[int]): the ids acted on, in id order.
        skipped (dict[str, int]): the other ids counted by reason, e.g. ``{"job is leased": 3}``;
            ``len(done) + sum(skipped.values())`` is the number of distinct ids asked for.
    """

    done: list[int]
    skipped: dict[str, int]


def _outcome(row: Any) -> BulkOutcome:
    done, skipped = row[0], row[1]
    skipped = json.loads(skipped) if isinstance(skipped, str) else skipped
    return BulkOutcome([int(i) for i in done], {str(k): int(v) for k, v in skipped.items()})


def _tokens(tokens: Mapping[int, int] | None) -> str | None:
    return None if tokens is None else json.dumps({str(int(k)): int(v) for k, v in tokens.items()})


def job_run_now(ids: Iterable[int], *, by: str = "", tokens: Mapping[int, int] | None = None,
                now: datetime | None = None, alias: str | None = None) -> BulkOutcome:
    """Make ready jobs that are not yet due (retry wait, snoozed, scheduled) due now, in one statement.

    Args:
        ids: job ids (duplicates are ignored).
        by: who asked (recorded in each job's history with the previous ``run_at``).
        tokens: optional ``{job id: lease_version}`` the operator saw; a row whose fencing token
            moved since is skipped as changed meanwhile.
        now: aware datetime instead of the database clock (tests).

    Returns:
        :class:`BulkOutcome`: the ids made due, the rest counted by reason (``"job is leased"``,
        ``"already due"``, ``"no such job"``, ``"changed by someone else meanwhile"``).
    """
    from ..conf import get_settings

    ids = sorted({int(i) for i in ids})
    if not ids:
        return BulkOutcome([], {})
    settings = get_settings()
    row = _run(JOB_RUN_NOW, {"now": now, "ids": ids, "by": by, "tokens": _tokens(tokens),
                             "notify": settings.notify, "channel": settings.notify_channel}, alias=alias).one()
    return _outcome(row)


# Take back expired leases on an operator's word ("Release now" on a job or the workers page: the
# operator knows the holder is gone and does not want to wait for the reaper, or the reaper is not
# running). What the reaper's JOB_REAP does to one row, conditional on the row still being leased,
# its lease expired by the database clock, and (when given) its fencing token the one the operator
# saw: ready again and due now (dead when its attempts are spent, cancelled when a cancel was
# requested), the token moved forward so the old holder can never write, a LeaseExpired error
# naming the holder, and a history entry naming the operator. Unlike the reaper it does not wait
# out an outage window: the operator vouches for the holder being gone.
RELEASE_SKIP_REASON = (f"CASE WHEN j.id IS NULL THEN '{NO_SUCH_JOB}' "
                       "WHEN j.status <> 'leased' THEN 'job is ' || j.status "
                       "WHEN j.leased_until IS NULL OR j.leased_until >= (SELECT now FROM clock) "
                       "THEN 'lease not expired' "
                       f"{_TOKEN_MOVED} ELSE NULL END")

JOB_RELEASE_EXPIRED = f"""
WITH clock AS MATERIALIZED ({CLOCK_WAKING}),
target AS MATERIALIZED (
    SELECT j.id FROM {JOB_TABLE} j
    WHERE j.id = ANY(%(ids)s::bigint[]) AND {RELEASE_SKIP_REASON} IS NULL
    ORDER BY j.id
    FOR UPDATE OF j
),
changed AS (
    UPDATE {JOB_TABLE} j
    SET status = CASE WHEN j.cancel_requested THEN 'cancelled'
                      WHEN j.attempts >= j.max_attempts OR j.lease_version >= {TOKEN_MAX - 2} THEN 'dead'
                      ELSE 'ready' END,
        run_at = clock.now,
        finished_at = CASE WHEN j.cancel_requested OR j.attempts >= j.max_attempts
                                OR j.lease_version >= {TOKEN_MAX - 2}
                           THEN clock.now ELSE NULL END,
        lease_version = least(j.lease_version + 1, {TOKEN_MAX}),
        leased_until = NULL,
        errors = j.errors || jsonb_build_array(jsonb_build_object(
            'attempt', j.attempts, 'type', 'LeaseExpired',
            'message', 'lease expired; released by ' || %(by)s::text || ', who knew the worker was gone',
            'traceback', '', 'worker', j.leased_by, 'at', clock.now)),
        history = j.history || jsonb_build_array(jsonb_build_object(
            'event', 'released', 'by', %(by)s::text, 'at', clock.now, 'holder', j.leased_by,
            'expired_at', j.leased_until, 'token', least(j.lease_version + 1, {TOKEN_MAX})))
    FROM target, clock
    WHERE j.id = target.id AND {RELEASE_SKIP_REASON} IS NULL
    RETURNING j.id, j.queue, j.status
),
woken AS (
    SELECT pg_notify(%(channel)s, q.queue) FROM (SELECT DISTINCT queue FROM changed WHERE status = 'ready') AS q
    WHERE %(notify)s
)
SELECT (SELECT coalesce(array_agg(id ORDER BY id), '{{}}') FROM changed),
       {skipped_by_reason(RELEASE_SKIP_REASON, "changed")},
       (SELECT count(*) FROM woken)
"""


def job_release_expired(ids: Iterable[int], *, by: str = "", tokens: Mapping[int, int] | None = None,
                        now: datetime | None = None, alias: str | None = None) -> BulkOutcome:
    """Take back expired leases now, as the reaper would, in one statement (an operator's "Release now").

    Args:
        ids: job ids (duplicates are ignored).
        by: who released (recorded in history and in the LeaseExpired error).
        tokens: optional ``{job id: lease_version}`` the operator saw; a row claimed again since
            (another token) is skipped as changed meanwhile.
        now: aware datetime instead of the database clock (tests).

    Returns:
        :class:`BulkOutcome`: the ids released (ready and due now; dead when out of attempts;
        cancelled when a cancel was requested), the rest by reason (``"job is done"``,
        ``"lease not expired"``, ``"no such job"``, ``"changed by someone else meanwhile"``).
    """
    from ..conf import get_settings

    ids = sorted({int(i) for i in ids})
    if not ids:
        return BulkOutcome([], {})
    settings = get_settings()
    row = _run(JOB_RELEASE_EXPIRED, {
        "now": now, "ids": ids, "by": by, "tokens": _tokens(tokens), "notify": settings.notify,
        "channel": settings.notify_channel, "wake": settings.notify_channel if settings.notify else None,
    }, alias=alias).one()
    return _outcome(row)


# Delete finished jobs an operator picked (a search result, an error group). Only done, dead and
# cancelled rows go, and not those something still reads (the retention rule of JOB_PRUNE: a
# member of an unfinished workflow, a dependency of a job that waits or was cancelled while
# waiting). Their dependency edges go in the same statement; the finished workflows left without
# a job are deleted by JOB_PRUNE_WORKFLOWS (a second statement, as for pruning).
DELETE_SKIP_REASON = (f"CASE WHEN j.id IS NULL THEN '{NO_SUCH_JOB}' "
                      "WHEN j.status NOT IN ('done', 'dead', 'cancelled') "
                      "THEN 'job is ' || j.status || '; only finished jobs are deleted' "
                      f"WHEN NOT ({_STILL_READ}) THEN 'still read by its workflow or a dependent job' "
                      "ELSE NULL END")

JOB_DELETE_FINISHED = f"""
WITH target AS MATERIALIZED (
    SELECT j.id FROM {JOB_TABLE} j
    WHERE j.id = ANY(%(ids)s::bigint[]) AND {DELETE_SKIP_REASON} IS NULL
    ORDER BY j.id
    FOR UPDATE OF j
),
deleted AS (
    DELETE FROM {JOB_TABLE} j
    WHERE j.id IN (SELECT id FROM target) AND {DELETE_SKIP_REASON} IS NULL
    RETURNING j.id, j.workflow_id
),
edges_in AS (
    DELETE FROM {DEPENDENCY_TABLE} d WHERE d.job_id IN (SELECT id FROM deleted)
),
edges_out AS (
    DELETE FROM {DEPENDENCY_TABLE} d WHERE d.depends_on_id IN (SELECT id FROM deleted)
)
SELECT (SELECT coalesce(array_agg(id ORDER BY id), '{{}}') FROM deleted),
       {skipped_by_reason(DELETE_SKIP_REASON, "deleted")},
       (SELECT coalesce(array_agg(DISTINCT workflow_id) FILTER (WHERE workflow_id IS NOT NULL), '{{}}')
        FROM deleted)
"""


def job_delete_finished(ids: Iterable[int], *, alias: str | None = None) -> BulkOutcome:
    """Delete finished jobs (done, dead, cancelled) with their dependency edges, in one statement
    (plus one for the finished workflows left without a job, when any job belonged to one).

    Args:
        ids: job ids (duplicates are ignored).

    Returns:
        :class:`BulkOutcome`: the ids deleted, the rest by reason (``"job is ready; only finished
        jobs are deleted"``, ``"still read by its workflow or a dependent job"``, ``"no such job"``).
    """
    ids = sorted({int(i) for i in ids})
    if not ids:
        return BulkOutcome([], {})
    row = _run(JOB_DELETE_FINISHED, {"ids": ids}, alias=alias).one()
    if row[2]:
        _run(JOB_PRUNE_WORKFLOWS, {"ids": list(row[2])}, alias=alias)
    return _outcome(row)
