"""The heartbeat: renews the leases of the jobs a worker holds, and its registry row.

Every lease/3 (or ``HEARTBEAT_INTERVAL`` if shorter) it renews the due leases in one statement,
passes cancel requests and lost leases on to the handlers, releases prefetched jobs that no thread
started in time or whose queue was paused (keeping the worker's pause view fresh while it
holds unstarted jobs, see :class:`~.pause_view.PauseView`), marks handlers past their task's timeout
(thread mode: the job stays leased and renewed until the handler returns) and asks the worker to
stop when too many are stuck. Every ``PROCESS_HEARTBEAT_INTERVAL`` seconds it touches the worker's process row.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django.db import DatabaseError

from .. import store
from ..attempt_events import report_lease_lost
from ..executor import with_reconnect
from ..runtime import Service, close_broken_connections
from .pool import PREFETCH_RELEASE_AFTER, InFlight, Pool

PROCESS_HEARTBEAT_INTERVAL = 5.0

logger = logging.getLogger("django_leasequeue.worker")


class HeartbeatService(Service):
    """Renews the leases of the worker's held jobs and the worker's registry row.

    Args:
        pool: the worker's pool (its held jobs).
        lease: seconds, the worker's default lease (bounds the retry wait after failed renewals).
        alias: the database alias.
        check_stuck: called with ``time.monotonic()`` after each round; stops the worker when too
            many handlers are stuck past their timeout.
        beat_process: touches the worker's registry row (every ``PROCESS_HEARTBEAT_INTERVAL`` s).
    """

    name = "heartbeat"

    def __init__(self, *, pool: Pool, lease: float, alias: str, check_stuck: Callable[[float], object],
                 beat_process: Callable[[], None]) -> None:
        super().__init__()
        self.pool = pool
        self.lease = lease
        self.alias = alias
        self.check_stuck = check_stuck
        self.beat_process = beat_process
        self._next_process_beat = 0.0

    @property
    def error_backoff_max(self) -> float:
        """Seconds: after failed renewals (a database outage) retry at least once per renewal
        interval of the shortest lease in flight (or of the worker's lease), never after the
        general 30 s cap: renewals must resume while the leases are still valid."""
        intervals = [item.renew_every for item in self.pool.inflight_snapshot()]
        return min([self.pool.renewal_interval(self.lease), *intervals])

    def run_once(self) -> float:
        self.pool.release_unstarted(older_than=PREFETCH_RELEASE_AFTER)
        try:
            self.pool.release_paused()
        except DatabaseError:
            # The read of the paused queues failed: threads then refuse to start on the aging
            # view (they try the read themselves), so nothing starts in a paused queue meanwhile.
            logger.warning("could not read the paused queues; retrying next round")
            close_broken_connections()
        now = time.monotonic()
        due: list[InFlight] = []
        next_wake = now + 1.0
        for item in self.pool.inflight_snapshot():
            if item.deadline is not None and now >= item.deadline and not item.timed_out \
                    and not item.completing:
                # Past the task's timeout. A thread cannot be stopped, so the attempt is only
                # marked timed out: the job stays leased (and renewed below, even for a manual
                # heartbeat) until the handler returns, so that its retry, or another job under
                # its concurrency key, cannot start while it still runs. (A returned job waiting
                # for its completion to be written has no deadline any more.)
                self.pool.abandon(item)
            manual = item.manual_heartbeat and item.started and not item.timed_out and not item.completing
            if manual or item.ctx.completed_in_transaction or item.ctx.lease_lost:
                # Nothing to renew: the handler renews (a manual heartbeat; until a thread starts
                # it, a prefetched job is renewed here like any other), done by fenced_atomic(),
                # or already lost.
                continue
            if now >= item.next_renewal:
                due.append(item)
            else:
                next_wake = min(next_wake, item.next_renewal)
        if due:
            leases = [(i.job.id, i.job.lease_version, i.lease) for i in due]
            # A session cut under the heartbeat (a terminated backend, a restart) is retried at
            # once on a new connection: only connection errors are (runtime.db_error_kind).
            renewals = with_reconnect(lambda: store.job_renew(leases, alias=self.alias))
            for item in due:
                renewal = renewals.get(item.job.id)
                if renewal is None:
                    # Read the flag again: the handler may have committed fenced_atomic() since the
                    # check above (the flag is set before that commit); the job is done, not lost.
                    # Nor is a job this worker let go of since the snapshot (a prefetched job
                    # released or cancelled unstarted: it leaves the held list before that write).
                    # Nor a job whose completion landed while its reply was lost (the completer's
                    # batch, or fenced_atomic(), on a connection that dropped): report_lease_lost()
                    # finds it settled under its token and reports nothing; its writer records it.
                    if not item.ctx.lease_lost and not item.ctx.completed_in_transaction \
                            and self.pool.holds(item):
                        if report_lease_lost(item.ctx, write="renew") is None and item.is_async:
                            # Another worker may run the job now: stop its coroutine (a thread
                            # cannot be stopped; its outcome is discarded when it returns).
                            self.pool.cancel_handler(item)
                    continue
                if renewal.cancel_requested:
                    item.ctx.mark_cancel_requested()
                if renewal.busy:
                    # Locked by a transaction (usually the handler's own fenced_atomic()): still
                    # ours; try again soon rather than wait for the row.
                    item.next_renewal = now + min(item.renew_every, 1.0)
                    next_wake = min(next_wake, item.next_renewal)
                    continue
                item.ctx.leased_until = renewal.leased_until
                item.lease_valid_until = now + item.lease  # ``now`` was taken before the renewal was sent
                item.next_renewal = now + item.renew_every
                next_wake = min(next_wake, item.next_renewal)
        self.check_stuck(now)
        self.pool.check_loop_stall(now)
        if now >= self._next_process_beat:
            self._next_process_beat = now + PROCESS_HEARTBEAT_INTERVAL
            self.beat_process()
        return max(0.0, min(next_wake - time.monotonic(), 0.25))
