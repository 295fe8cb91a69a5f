"""The jobs of a claim whose reply was lost: find them and give them back.

A connection that drops while a claim is in flight (a PgBouncer or PostgreSQL restarted at that
instant) may drop the claim's reply after the claim committed: its jobs are then leased to the
worker, which never learnt of them. Without a release they would wait a whole lease, then be
reaped with a ``LeaseExpired`` error that counts an attempt no handler made (a job with
``max_attempts=1`` would end dead without having run). The worker calls
:func:`job_release_lost_claims` before its next claim.
"""

from __future__ import annotations

from datetime import datetime

from ._db import CLOCK, JOB_TABLE, _notify_channel, _run
from .lease import _RELEASE, Released

# lease.JOB_RELEASE (not interrupted) for the rows of this worker's claims whose result it never
# got. They are told apart from every job the worker does hold by the claim's clock: each claim
# writes its statement clock into attempted_at of every row it leases, and returns it
# (ClaimResult.clock_us). A job the worker holds (running, prefetched, or returned with its
# completion still queued) came from a claim it received, so its attempted_at is at most the latest
# clock received, %(since_us)s, and it is never touched; a row leased to the worker later than that
# is a lost claim's. Compared in integer microseconds, exactly as the claim returns its clock. A
# clock that went back (a failover to a server whose clock is behind) can only hide a lost claim's
# rows (they expire, as before), never take a held job. The leased rows are few (partial index).
JOB_RELEASE_LOST_CLAIMS = _RELEASE.format(leases=f"""(
    SELECT l.id, l.lease_version FROM {JOB_TABLE} l
    WHERE l.status = 'leased' AND l.leased_by = %(worker)s
      AND (extract(epoch FROM l.attempted_at) * 1000000)::bigint > %(since_us)s
)""")


# The claim clock now, as the claims return it (ClaimResult.clock_us): the bound a worker starts
# from before its first claim, for job_release_lost_claims. Rows leased to the same worker id
# before it (an earlier process of the same host, pid and name) are not its claims' to give back.
CLAIM_CLOCK_US = f"SELECT (extract(epoch FROM clock.now) * 1000000)::bigint FROM ({CLOCK}) AS clock"


def claim_clock_us(*, now: datetime | None = None, alias: str | None = None) -> int:
    """The database clock a claim would write now, in integer microseconds since the epoch, the
    unit of :attr:`~django_leasequeue.store.claim.ClaimResult.clock_us`.

    Args:
        now: an aware datetime standing in for the database clock (tests). alias: the database alias.

    Returns:
        Microseconds since the epoch (int).
    """
    value: int = _run(CLAIM_CLOCK_US, {"now": now}, alias=alias).rows[0][0]
    return value


def job_release_lost_claims(worker_id: str, *, since_us: int, reason: str = "claim reply lost",
                            now: datetime | None = None, alias: str | None = None) -> Released:
    """Give back at once the jobs that claims of ``worker_id`` leased after ``since_us`` without the
    worker learning of them (a claim whose reply was lost), not as a failed attempt: the release of
    a prefetched job that never ran (:func:`~django_leasequeue.store.lease.job_release` with
    ``interrupted=False``): ``attempts`` back, token bumped, due at once, a ``released`` history
    entry with ``reason``.

    Safe for the jobs the worker holds only if ``since_us`` is at least the clock of every claim
    whose result it received (:attr:`~django_leasequeue.store.claim.ClaimResult.clock_us`; before any,
    :func:`claim_clock_us` read before the first claim): their rows were leased at or before it.
    Call it before the next claim.

    Args:
        worker_id: the ``leased_by`` of the claims (``host:pid:name``).
        since_us: integer microseconds since the epoch, database clock: rows leased at or before
            it are left alone.
        reason: recorded in the ``released`` history entry.
        now: an aware datetime standing in for the database clock (tests). alias: the database alias.

    Returns:
        The ids released (:class:`Released`; a job whose cancel was requested ends cancelled).
    """
    params = {"now": now, "reason": reason, "worker": worker_id, "since_us": int(since_us), "interrupted": False,
              "max_interruptions": 0, "wake": _notify_channel()}
    rows = _run(JOB_RELEASE_LOST_CLAIMS, params, alias=alias).rows
    return Released((r[0] for r in rows), dead=(r[0] for r in rows if r[1] == "dead"))
