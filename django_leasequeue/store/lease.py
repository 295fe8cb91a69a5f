"""The fenced writes of a lease holder: renew, complete, fail, snooze, cancel, release, the lock of
``fenced_atomic()``, the timed-out and lease-lost notes, and the late result of a done job.

Every write is ``... WHERE id = ? AND lease_version = ? AND status = ...``: a row that does not come
back means the lease was lost (or the job moved on), and the caller discards its outcome. A cancel
request is honoured by every later write of the lease.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ._db import CLOCK, CLOCK_WAKING, JOB_TABLE, TOKEN_MAX, _dumps, _notify_channel, _run
from .history import history_set_result
from .workflows import DEPENDENCY_TABLE, WORKFLOW_TABLE

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
    return {r[0]: Renewal(r[0], r[1], r[2], r[3]) for r in _run(JOB_RENEW, params, alias=alias).rows}


# Mark many jobs done in one fenced statement (per row: id, token and status must still match, so
# a stale token updates nothing for that row while the others complete). A job whose cancel was
# requested while it ran ends ``cancelled`` instead, with no result: the operator's cancel wins
# over a handler that ignored it, and no completion is recorded. Ids and tokens travel as one
# comma-separated text each and the completed ids come back the same way: with Django's
# client-side binding an int[] parameter is quoted element by element in Python, which would be most
# of the completer's cost per job. Results are NULL when no job returned a value (unnest pads with NULL).
# With %(durable)s false the statement turns synchronous_commit off for its own transaction only
# (set_config(..., true) is SET LOCAL; the setting is read at commit, before the transaction's
# settings are reset), saving the WAL flush wait: the ASYNC_COMPLETIONS setting. Never the server's
# setting, never for enqueues or claims. A crash may lose the last completions; those jobs run again.
JOB_COMPLETE = f"""
WITH clock AS MATERIALIZED (
    SELECT coalesce(%(now)s::timestamptz, leasequeue_now()) AS now,
           CASE WHEN %(durable)s THEN NULL ELSE set_config('synchronous_commit', 'off', true) END AS sync,
           set_config('leasequeue.notify_channel', coalesce(%(wake)s::text, ''), true) AS wake
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
    params = {"now": now, "durable": synchronous_commit, "wake": _notify_channel(),
              "ids": ",".join([str(x[0]) for x in items]),
              "versions": ",".join([str(x[1]) for x in items]),
              "results": results if any(r is not None for r in results) else None}
    row = _run(JOB_COMPLETE, params, alias=alias).one()
    done, cancelled = row if row is not None else (None, None)
    return Completed(map(int, done.split(",")) if done else (), map(int, cancelled.split(",")) if cancelled else ())


# The jobs among (id, token) pairs that still carry that token, with their status. Only the
# token's holder takes a job out of 'leased' without moving the token (complete, fail, snooze,
# cancel, release: all fenced on it); a claim, the reaper and an operator's release move it
# forward. So such a row found in another status was settled by that holder's own write. Read
# after a write whose reply was lost with its connection (the COMMIT reached the server, the answer
# never came back), it says whether the write landed, where the fenced write repeated on a new
# connection would only find the row changed and take that for a lost lease.
# FOR SHARE NOWAIT: the lost commit may still be running on the server (its session has not yet
# noticed that the client is gone) and hold the row lock; the snapshot would show the row as it
# was before that commit. Waiting for the lock could wait long (a session behind a silent network),
# so the read fails at once instead (LockNotAvailable) and the caller asks again. The status filter
# is applied by the caller: in the WHERE clause it would be checked on the old version and skip
# the locked row instead of waiting for it.
JOB_SETTLED_UNDER = f"""
SELECT j.id, j.status FROM {JOB_TABLE} j
JOIN unnest(%(ids)s::bigint[], %(versions)s::bigint[]) AS d(id, version) ON j.id = d.id
WHERE j.lease_version = d.version
FOR SHARE OF j NOWAIT
"""


def job_settled_under(leases: Iterable[tuple[int, int]], *, alias: str | None = None) -> dict[int, str]:
    """The jobs among ``leases`` (``(job id, lease_version)`` pairs) that left ``leased`` under that
    very token, with their status: what the token holder's own write made of them.

    A fenced write refused (0 rows) means the lease was lost, unless an earlier write of the same
    holder, whose reply was lost with its connection, had already landed; this read tells the two
    apart.

    Returns:
        ``{job id: status}`` (``done``, ``ready``, ``dead``, ``cancelled``...) of those jobs; a job
        still ``leased`` under its token, or whose token moved on, is absent.

    Raises:
        django.db.OperationalError: a row is locked by a transaction still in flight
            (``LockNotAvailable``, SQLSTATE 55P03: ask again shortly), or the database is unreachable.
    """
    leases = list(leases)
    if not leases:
        return {}
    params = {"ids": [x[0] for x in leases], "versions": [x[1] for x in leases]}
    return {int(r[0]): str(r[1]) for r in _run(JOB_SETTLED_UNDER, params, alias=alias).rows if r[1] != "leased"}


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
    row = _run(JOB_LOCK_FENCED, {"id": job_id, "version": version}, alias=alias).one()
    if row is None:
        return "lost"
    return "cancel_requested" if row[1] else "held"


# A job put back to ready by its holder (a retry, a snooze) wakes the workers that sleep past its
# run_at: a NOTIFY "<queue> <run_at as POSIX seconds>" (the queue name alone when it is due at once),
# delivered at commit, when %(channel)s is not NULL (the NOTIFY setting). See
# :mod:`django_leasequeue.notify` for the payload.
_WAKE_RETRY = """CASE WHEN %(channel)s::text IS NOT NULL AND j.status = 'ready'
         THEN pg_notify(%(channel)s, CASE WHEN j.run_at <= clock.now THEN j.queue
                                          ELSE j.queue || ' ' || extract(epoch FROM j.run_at)::text END) END"""


# Record a failed attempt: retry after ``delay`` seconds (database time), or dead-letter the job
# when its attempts are exhausted or no delay is given (a non-retryable failure). The error entry
# gets the database time appended. Fenced like every other worker write. A job whose cancel was
# requested while it ran ends ``cancelled`` (error kept): retrying it would defeat the cancel.
JOB_FAIL = f"""
WITH clock AS MATERIALIZED ({CLOCK_WAKING})
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
RETURNING j.status, j.run_at, {_WAKE_RETRY}
"""


def job_fail(job_id: int, version: int, error: dict[str, Any], *, retry_delay: float | None,
             now: datetime | None = None, alias: str | None = None) -> tuple[str, datetime] | None:
    """Record a failed attempt and either schedule a retry or dead-letter the job.

    Args:
        error: JSON-able dict (attempt, type, message, traceback, worker); ``at`` is added.
        retry_delay: seconds until the retry, or None to dead-letter at once (non-retryable).

    A retry sends a NOTIFY ``"<queue> <run_at>"`` when the ``NOTIFY`` setting is on (delivered at
    commit), so that idle workers wake for it.

    Returns:
        ``(new status, run_at)`` (status ``ready``, ``dead``, or ``cancelled`` when a cancel was
        requested), or None when the lease was lost (nothing was written).
    """
    params = {"now": now, "id": job_id, "version": version, "error": _dumps(error),
              "delay": None if retry_delay is None else float(retry_delay)}
    params["wake"] = _notify_channel()
    params["channel"] = params["wake"] if retry_delay is not None else None
    row = _run(JOB_FAIL, params, alias=alias).one()
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
RETURNING j.status, {_WAKE_RETRY}
"""


def job_snooze(job_id: int, version: int, seconds: float, *, max_snoozes: int, now: datetime | None = None,
               alias: str | None = None) -> str | None:
    """Put a leased job back to ready in ``seconds`` without counting a failed attempt.

    Sends a NOTIFY ``"<queue> <run_at>"`` when the ``NOTIFY`` setting is on (delivered at commit),
    so that idle workers wake for it.

    Returns:
        The new status (``ready``; ``dead`` past ``max_snoozes``; ``cancelled`` when a cancel was
        requested), or None if the lease was lost.
    """
    row = _run(JOB_SNOOZE, {"now": now, "id": job_id, "version": version, "seconds": float(seconds),
                             "max_snoozes": max_snoozes, "channel": _notify_channel()}, alias=alias).one()
    return row[0] if row else None


# A running handler acknowledged a cancel request (raised JobCancelled): end the job cancelled.
JOB_CANCEL_LEASED = f"""
WITH clock AS MATERIALIZED ({CLOCK_WAKING})
UPDATE {JOB_TABLE} j
SET status = 'cancelled', finished_at = clock.now, leased_until = NULL
FROM clock
WHERE j.id = %(id)s AND j.lease_version = %(version)s AND j.status = 'leased'
RETURNING j.id
"""


def job_cancel_leased(job_id: int, version: int, *, now: datetime | None = None,
                      alias: str | None = None) -> bool:
    """Mark a leased job cancelled by its own worker (fenced). Returns False if the lease was lost."""
    return _run(JOB_CANCEL_LEASED, {"now": now, "id": job_id, "version": version, "wake": _notify_channel()},
                alias=alias).one() is not None


# Give leases back without counting a failed attempt (graceful shutdown, or a prefetched job that
# no thread started): the job is due at once and its token is bumped so that a late write by the
# releasing worker is refused. A job whose cancel was requested ends cancelled instead of running
# again. Since the claim does not count, a job released from its first claim has no start time
# again (started_at is the first counted claim; attempted_at keeps the latest claim).
# An *interrupted* job (its handler had started: a graceful stop cut it short) counts one more
# interruption; the refund is bounded: a job already interrupted MAX_INTERRUPTIONS times is
# dead-lettered with an ``Interrupted`` error instead (its attempt counts), so a handler that hangs
# without a timeout stops re-running on every deploy. Prefetched jobs never ran: not interrupted.
_RELEASE = f"""
WITH clock AS MATERIALIZED ({CLOCK_WAKING})
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
FROM clock, {{leases}} AS d(id, version)
WHERE j.id = d.id AND j.lease_version = d.version AND j.status = 'leased'
RETURNING j.id, j.status
"""
# {leases}: the (id, version) pairs to release; lost_claims.JOB_RELEASE_LOST_CLAIMS reads them instead.
JOB_RELEASE = _RELEASE.format(leases="unnest(%(ids)s::bigint[], %(versions)s::bigint[])")



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
              "interrupted": bool(interrupted), "max_interruptions": int(max_interruptions),
              "wake": _notify_channel()}
    rows = _run(JOB_RELEASE, params, alias=alias).rows
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
    return _run(JOB_NOTE_TIMED_OUT, {"now": now, "id": job_id, "version": version, "worker": worker,
                                     "timeout": float(timeout)}, alias=alias).one() is not None


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
    return _run(JOB_NOTE_LEASE_LOST, params, alias=alias).one() is not None


# Store the return value of a job that its handler already completed inside fenced_atomic(): the
# value is known only after that block committed the job as done (with a null result). Fenced on
# the token and on 'done', so it can only fill in the result of the attempt that completed the job;
# a replayed job (ready again, and later done under a newer token) is never overwritten. The commit
# that completed the job also released its dependents; one that takes results and was released by
# it (no longer waiting) got null for this job, which the history records ('result_after_release').
JOB_SET_RESULT = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
target AS (
    SELECT j.id,
           EXISTS (SELECT 1 FROM {DEPENDENCY_TABLE} d JOIN {JOB_TABLE} dj ON dj.id = d.job_id
                   WHERE j.has_dependents AND d.depends_on_id = j.id AND dj.pass_result
                     AND dj.status <> 'waiting')
           OR EXISTS (SELECT 1 FROM {WORKFLOW_TABLE} w JOIN {JOB_TABLE} cb
                          ON cb.id = w.on_success_id OR cb.id = w.on_complete_id
                      WHERE j.workflow_role = 'member' AND w.id = j.workflow_id AND cb.pass_result
                        AND cb.status <> 'waiting') AS missed
    FROM {JOB_TABLE} j
    WHERE j.id = %(id)s AND j.lease_version = %(version)s AND j.status = 'done'
)
UPDATE {JOB_TABLE} j
SET result = %(result)s::jsonb,
    history = CASE WHEN t.missed THEN j.history || jsonb_build_array(jsonb_build_object(
        'event', 'result_after_release', 'token', j.lease_version, 'at', clock.now,
        'reason', 'returned after fenced_atomic() completed the job: dependents released by that '
                  'commit received null; set the result inside the block with fence.set_result()'))
              ELSE j.history END
FROM target t, clock
WHERE j.id = t.id
"""


def job_set_result(job_id: int, version: int, result_json: str, *, alias: str | None = None) -> bool:
    """Record ``result_json`` (JSON text) as the result of a job done under token ``version``.

    When a dependent that takes results was already released by the job's completion, it received
    null for this job; the job's history then gets a ``result_after_release`` entry saying so.

    A job moved into the time-partitioned history since (``LEASEQUEUE["HISTORY"]``) gets the
    result there.

    Returns:
        True when written; False when the job is not done under that token (nothing written).
    """
    written: int = _run(JOB_SET_RESULT, {"now": None, "id": job_id, "version": version, "result": result_json},
                        alias=alias).rowcount
    # Moved into the time-partitioned history meanwhile (HISTORY_MOVE_AFTER passed): written there.
    return written == 1 or history_set_result(job_id, version, result_json, alias=alias)


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
    return _run(JOB_NOTE_RESULT_DROPPED, {"now": now, "id": job_id, "version": version, "reason": reason,
                                          "size": size, "limit": limit}, alias=alias).one() is not None
