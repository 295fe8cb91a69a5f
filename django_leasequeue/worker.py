"""The worker: claims due jobs in batches and runs them on a pool of threads.

Services (all on :mod:`runtime`'s loop; the :class:`WorkerService` starts and stops the others):

* :class:`WorkerService` claims up to as many jobs as it has free threads, in one statement, and
  hands them to the pool. When recent jobs were short it also *prefetches*: it claims a few more
  jobs than free threads, as many as its threads are expected to start within ``PREFETCH_WAIT``
  seconds (at most ``PREFETCH_MAX``), so that a busy worker claims in batches instead of one
  statement per freed thread. A prefetched job is leased and heartbeated like a running one; if no
  thread starts it within ``PREFETCH_RELEASE_AFTER`` seconds (a long job got in the way) it is
  released back to ``ready`` at once (token bumped, not an attempt) for other workers; no thread
  starts it later than that, nor once its lease is known lost (the process was frozen, say). It sleeps
  until a NOTIFY, freed threads (only when it was saturated) or the poll interval, and runs the
  reaper's sweep every ``REAPER_INTERVAL`` so one process suffices.
  When a queue's rate limit is used up it sleeps until the window frees (no retry loop).
* :class:`HeartbeatService` renews the leases of running jobs in one statement every lease/3
  (or ``HEARTBEAT_INTERVAL`` if shorter), and passes cancel requests and lost leases on to the
  handlers. A handler past its task's ``timeout`` cannot be stopped in thread mode: the attempt is
  marked timed out (a ``timed_out`` history entry), but the job stays leased and renewed and the
  handler keeps its thread's slot until it returns, so neither the job's retry nor another job
  under the same concurrency key starts beside it; when it returns the attempt fails as
  ``JobTimedOut``. Once ``STUCK_HANDLERS_MAX`` handlers are stuck (default: all threads), or one
  is stuck ``STUCK_EXIT_AFTER`` seconds past its timeout, the worker stops gracefully and exits
  with status :data:`EXIT_STUCK`, for its supervisor to restart it. ``EXECUTION = "process"`` runs
  each handler in a child process killed at its timeout instead.
* :class:`~django_leasequeue.completer.Completer` marks finished jobs done in batches: one fenced
  ``UPDATE ... FROM unnest`` per few milliseconds instead of one transaction per job. A job whose handler returned stays
  held (its lease renewed, its thread free) until its completion is written or refused, so that
  a database outage does not let the lease run out; the worker writes its own pending
  completions before its reaper sweeps. A batch the database refuses on its data (SQLSTATE class
  22 or 54, see :func:`runtime.db_error_kind`) is written one row at a time.
* :class:`~django_leasequeue.notify.Listener` wakes the worker on ``LISTEN`` notifications.

Graceful stop (SIGTERM): stop claiming, let running jobs finish up to ``SHUTDOWN_GRACE`` seconds,
flush completions, then release the leases still held (back to ready at once, token bumped, not a
failed attempt). Several workers on any number of hosts are safe: claims use ``SKIP LOCKED`` and
every later write is fenced on the token.

Events emitted: claimed, succeeded, retried, dead_lettered, lease_lost, released, snoozed,
cancelled (see :mod:`signals`).
"""

from __future__ import annotations

import functools
import logging
import os
import queue as queue_module
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, connections
from django.db.backends.signals import connection_created

from . import reaper, registry, signals, store
from .completer import Completer
from .conf import EXECUTION_MODES, Settings, check_lease_seconds, get_settings, queue_name_problem
from .context import JobContext
from .executor import Executor, report_lease_lost, with_reconnect
from .notify import Listener
from .runtime import Service, close_broken_connections

logger = logging.getLogger("django_leasequeue.worker")

PROCESS_HEARTBEAT_INTERVAL = 5.0
# Added to a rate-limit wait: the window is closed, so a claim exactly at the boundary still counts.
THROTTLE_MARGIN = 0.005
# A prefetched job that no thread started within this many seconds is released back to ready.
PREFETCH_RELEASE_AFTER = 1.0
# Weight of the newest job in the moving average of job durations that sizes the prefetch.
RUNTIME_EWMA_WEIGHT = 0.05
#: Exit status of a worker that stopped because of handlers stuck past their timeout (thread mode).
EXIT_STUCK = 3


# Whether the current thread ever opened a database connection. Job threads check (and close) broken
# connections after each job only when their handlers used the database: the full check walks
# Django's connection handler, several microseconds per job that no-op and non-database jobs skip.
_thread_db = threading.local()


def _note_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
    _thread_db.used = True


connection_created.connect(_note_connection, dispatch_uid="django_leasequeue.worker.thread_db")


def make_worker_id(name: str | None = None) -> str:
    """Return ``host:pid:name`` (a random name when none is given)."""
    return f"{socket.gethostname()}:{os.getpid()}:{name or uuid.uuid4().hex[:8]}"


@dataclass(eq=False, slots=True)
class InFlight:
    """A job held by this process (prefetched or running), as the heartbeat sees it."""

    job: store.ClaimedJob
    ctx: JobContext
    lease: float
    manual_heartbeat: bool
    timeout: float | None  # the task's timeout in seconds, counted from the start of the handler
    next_renewal: float
    renew_every: float  # seconds between renewals
    claimed_at: float  # monotonic
    # Monotonic time until which the lease is surely ours: the claim's (or the last renewal's)
    # time plus the lease. A held job is not started past it, less a margin (see _run_job).
    lease_valid_until: float = 0.0
    deadline: float | None = None  # monotonic time of the task's timeout (set when started, thread mode)
    started: bool = False  # a thread took it (False: prefetched, waiting for a thread)
    timed_out: bool = False
    # The handler returned and its completion is queued in the completer: the thread is free (not
    # counted against the concurrency) but the lease is still renewed until the completion is
    # written or refused, so no reaper takes back a job whose handler already returned.
    completing: bool = False
    thread: threading.Thread | None = field(default=None, repr=False)


def stuck_jobs_outcome(job_ids: list[int]) -> str:
    """What happens to the jobs of stuck handlers when their worker exits, for its log line.

    Args:
        job_ids: the jobs' ids (one or more).

    Returns:
        ``"job 9 fails as JobTimedOut and is retried"`` for one id, ``"jobs 9, 10 fail as
        JobTimedOut and are retried"`` for several ("retried" covers a dead letter on the last
        attempt, as for any failure).
    """
    ids = ", ".join(str(i) for i in job_ids)
    if len(job_ids) == 1:
        return f"job {ids} fails as JobTimedOut and is retried"
    return f"jobs {ids} fail as JobTimedOut and are retried"


def start_margin(lease: float) -> float:
    """Seconds before the end of a held job's lease (by this process's clock) after which a
    thread no longer starts it: a tenth of the lease, at most 1 s."""
    return min(1.0, lease / 10)


class HeartbeatService(Service):
    """Renews the leases of the worker's running jobs and the worker's registry row."""

    name = "heartbeat"

    def __init__(self, worker: WorkerService) -> None:
        super().__init__()
        self.worker = worker
        self._next_process_beat = 0.0

    @property
    def error_backoff_max(self) -> float:
        """Seconds: after failed renewals (a database outage) retry at least once per renewal
        interval of the shortest lease in flight (or of the worker's lease), never after the
        general 30 s cap: renewals must resume while the leases are still valid."""
        intervals = [item.renew_every for item in self.worker.inflight_snapshot()]
        return min([self.worker.renewal_interval(self.worker.lease), *intervals])

    def run_once(self) -> float:
        self.worker.release_unstarted(older_than=PREFETCH_RELEASE_AFTER)
        now = time.monotonic()
        due: list[InFlight] = []
        next_wake = now + 1.0
        for item in self.worker.inflight_snapshot():
            if item.deadline is not None and now >= item.deadline and not item.timed_out \
                    and not item.completing:
                # Past the task's timeout. A thread cannot be stopped, so the attempt is only
                # marked timed out: the job stays leased (and renewed below, even for a manual
                # heartbeat) until the handler returns, so that its retry, or another job under
                # its concurrency key, cannot start while it still runs. (A returned job waiting
                # for its completion to be written has no deadline any more.)
                self.worker.abandon(item)
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
            renewals = with_reconnect(lambda: store.job_renew(leases, alias=self.worker.alias))
            for item in due:
                renewal = renewals.get(item.job.id)
                if renewal is None:
                    # Read the flag again: the handler may have committed fenced_atomic() since the
                    # check above (the flag is set before that commit); the job is done, not lost.
                    # Nor is a job this worker let go of since the snapshot (a prefetched job
                    # released or cancelled unstarted: it leaves the held list before that write).
                    if not item.ctx.lease_lost and not item.ctx.completed_in_transaction \
                            and self.worker.holds(item):
                        report_lease_lost(item.ctx, write="renew")
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
        self.worker.check_stuck(now)
        if now >= self._next_process_beat:
            self._next_process_beat = now + PROCESS_HEARTBEAT_INTERVAL
            if not store.process_heartbeat(self.worker.worker_id, alias=self.worker.alias):
                self.worker.register()
        return max(0.0, min(next_wake - time.monotonic(), 0.25))


class WorkerService(Service):
    """Claims and runs jobs. See the module docstring.

    Args:
        queues: queue names to serve, or None for every queue.
        concurrency: number of handler threads.
        lease: default lease in seconds for jobs whose task sets none, in (0, 7 days]; None: the setting.
        poll_interval: seconds between claims when idle and no notification arrives.
        burst: stop once no due job is left and nothing is running.
        worker_name: the last part of the worker id (``host:pid:name``).
        notify: listen for enqueue notifications (None: the ``NOTIFY`` setting).
        reap: run the reaper's sweep in this process.
        prefetch_wait: seconds of expected queueing a prefetched job may face (None: the
            ``PREFETCH_WAIT`` setting; 0 disables prefetching).
        prefetch_max: most jobs held beyond the threads (None: the ``PREFETCH_MAX`` setting).
        execution: ``"thread"`` or ``"process"`` (None: the ``EXECUTION`` setting).

    Raises:
        ValueError: ``concurrency`` below 1, a ``lease`` outside (0, 7 days], a queue name
            outside the grammar of :func:`~django_leasequeue.conf.queue_name_problem`, or an unknown
            ``execution``.
    """

    name = "worker"

    def __init__(self, *, queues: Sequence[str] | None = None, concurrency: int = 4, lease: float | None = None,
                 poll_interval: float | None = None, burst: bool = False, worker_name: str | None = None,
                 notify: bool | None = None, reap: bool = True, settings: Settings | None = None,
                 prefetch_wait: float | None = None, prefetch_max: int | None = None,
                 execution: str | None = None) -> None:
        super().__init__()
        self.settings = settings or get_settings()
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if isinstance(queues, str):
            raise ValueError(f"queues must be a list of queue names or None, got the str {queues!r}")
        self.queues = list(queues) if queues is not None else None
        for name in self.queues or ():
            problem = queue_name_problem(name, "queue")
            if problem:
                raise ValueError(problem)
        self.concurrency = concurrency
        problem = check_lease_seconds(lease, "lease") if lease is not None else None
        if problem:
            raise ValueError(problem)
        self.lease = float(lease if lease is not None else self.settings.lease)
        self.poll_interval = float(poll_interval or self.settings.poll_interval)
        self.burst = burst
        self.worker_id = make_worker_id(worker_name)
        self.alias = store.db_alias()
        self.reap = reap
        self.prefetch_wait = float(self.settings.prefetch_wait if prefetch_wait is None else prefetch_wait)
        self.prefetch_max = int(self.settings.prefetch_max if prefetch_max is None else prefetch_max)
        # No prefetch from rate-limited queues: the limit counts claims, and a prefetched job would
        # use the allowance before a thread is free to run it (and may be released unrun).
        if any(self.queues is None or q in self.queues for q in self.settings.rate_limits):
            self.prefetch_max = 0
        self._next_reap = 0.0
        self._next_process_prune = 0.0
        self._lock = threading.Lock()
        self._inflight: dict[int, InFlight] = {}
        self._tasks: queue_module.SimpleQueue[InFlight | None] = queue_module.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._saturated = False
        # A finishing job wakes the claim loop (when saturated) once this few jobs are held.
        self._refill_at = concurrency - 1
        self._avg_runtime: float | None = None  # moving average of handler durations, seconds
        # A written completion may free a concurrency-key slot that the last claim found full:
        # claim again now rather than a poll interval later (only when the last claim came up short).
        self._completing = 0  # held jobs whose handler returned, completion not yet written
        self.completer = Completer(alias=self.alias, on_flush=self._after_completions,
                                   synchronous_commit=not self.settings.async_completions,
                                   on_settled=self._completions_settled,
                                   retry_cap=lambda: self.heartbeat.error_backoff_max)
        self.heartbeat = HeartbeatService(self)
        use_notify = self.settings.notify if notify is None else notify
        self.listener = Listener(self, channel=self.settings.notify_channel) if use_notify else None
        self.executor = Executor(worker_id=self.worker_id, settings=self.settings, alias=self.alias,
                                 complete=self._submit_completion)
        self.claimed = 0
        self.throttled = 0  # claims cut short by a queue rate limit
        self._throttled_until = 0.0
        self._short_claim = False  # the last claim got fewer jobs than free slots
        self.prefetch_released = 0
        # "thread" or "process" (EXECUTION): in process mode each handler runs in a child process.
        self.execution = execution or self.settings.execution
        if self.execution not in EXECUTION_MODES:
            raise ValueError(f"execution must be one of {EXECUTION_MODES}, got {self.execution!r}")
        self.exit_code = 0  # EXIT_STUCK once stopped because of stuck handlers
        # Set along with stop() when the worker decides to exit (run_services' stop_when), so
        # that the other services of the process stop too.
        self.exit_event: threading.Event | None = None

    def _after_completions(self) -> None:
        if self._short_claim:
            self.wake()

    def _submit_completion(self, ctx: JobContext, result_json: str | None) -> None:
        """The executor's success path: keep the job held (renewed by the heartbeat, no longer
        counted against the concurrency) until the completer has written or refused it."""
        with self._lock:
            item = self._inflight.get(ctx.job_id)
            if item is not None and item.ctx is ctx and not item.completing:
                item.completing = True
                item.deadline = None  # the handler returned: its timeout no longer applies
                self._completing += 1
        self.completer.submit(ctx, result_json)

    def _completions_settled(self, contexts: Sequence[JobContext]) -> None:
        """The completer decided these completions: stop holding their jobs."""
        with self._lock:
            for ctx in contexts:
                item = self._inflight.get(ctx.job_id)
                if item is not None and item.ctx is ctx and item.completing:
                    self._forget_locked(item)

    def _forget_locked(self, item: InFlight) -> None:
        """Drop ``item`` from the held jobs (caller holds ``_lock``); no-op if it is not held."""
        if self._inflight.get(item.job.id) is item:
            del self._inflight[item.job.id]
            if item.completing:
                self._completing -= 1

    def _busy_locked(self) -> int:
        """Held jobs that occupy a thread or wait for one (caller holds ``_lock``): returned jobs
        waiting for their completion to be written do not."""
        return len(self._inflight) - self._completing

    # -- pool -----------------------------------------------------------------------------------
    def inflight_snapshot(self) -> list[InFlight]:
        """The held jobs (running and prefetched), for the heartbeat."""
        with self._lock:
            return list(self._inflight.values())

    def renewal_interval(self, lease: float) -> float:
        """Seconds between heartbeats of a job with this lease: lease/3, or ``HEARTBEAT_INTERVAL``
        when that is shorter (it also bounds how late a running handler learns of a cancel)."""
        return min(lease / 3, self.settings.heartbeat_interval)

    def holds(self, item: InFlight) -> bool:
        """True while ``item`` is in the held list (running or prefetched, not let go of)."""
        with self._lock:
            return self._inflight.get(item.job.id) is item

    def free_slots(self) -> int:
        """Threads not running a job and not promised to a prefetched one."""
        with self._lock:
            return self.concurrency - self._busy_locked()

    def prefetch_allowance(self) -> int:
        """How many jobs to hold beyond the threads: as many as the threads are expected to start
        within ``prefetch_wait`` seconds, by the moving average of recent job durations (Little's
        law), at most ``prefetch_max``. 0 until jobs have been timed, and for slow jobs."""
        avg = self._avg_runtime
        if avg is None or self.prefetch_wait <= 0 or self.prefetch_max <= 0:
            return 0
        return min(self.prefetch_max, int(self.concurrency * self.prefetch_wait / max(avg, 1e-6)))

    def abandon(self, item: InFlight) -> None:
        """Mark a running job whose handler passed its task's timeout as timed out (thread mode).

        The handler cannot be stopped, so it keeps its slot (it counts against ``concurrency``
        until it returns) and the job stays leased and renewed by this worker; a ``timed_out``
        entry in the job's history records the attempt as timed out meanwhile (monitoring counts
        these as stuck handlers). When the handler returns, the executor records the attempt as a
        :class:`~django_leasequeue.exceptions.JobTimedOut` failure. Does nothing when the handler
        returned first."""
        if not item.ctx.time_out():
            return
        item.timed_out = True
        logger.warning("job %s: attempt %s ran past its task's timeout of %s s; the handler cannot be stopped "
                       "in thread mode, so its lease is kept until it returns", item.job.id, item.job.attempts,
                       item.timeout)
        try:
            store.job_note_timed_out(item.job.id, item.job.lease_version, worker=self.worker_id,
                                     timeout=float(item.timeout or 0), alias=self.alias)
        except DatabaseError:
            logger.exception("job %s: could not record the timeout in its history", item.job.id)
            close_broken_connections()

    def stuck(self) -> list[InFlight]:
        """The held jobs whose handler is past its task's timeout and still running (thread mode)."""
        with self._lock:
            return [i for i in self._inflight.values() if i.timed_out]

    def check_stuck(self, now: float) -> bool:
        """Stop the worker (exit status :data:`EXIT_STUCK`) when its stuck handlers reach
        ``STUCK_HANDLERS_MAX`` (default: all threads) or one is stuck ``STUCK_EXIT_AFTER`` seconds
        past its timeout. ``now`` is ``time.monotonic()``. Returns True when it asked to stop."""
        stuck = self.stuck()
        if not stuck or self.exit_code:
            return False
        bound = self.settings.stuck_handlers_max or self.concurrency
        longest = max(now - (i.deadline or now) for i in stuck)
        after = self.settings.stuck_exit_after
        if len(stuck) >= bound:
            why = ("1 handler stuck past its timeout" if len(stuck) == 1
                   else f"{len(stuck)} handlers stuck past their timeout") + f" (STUCK_HANDLERS_MAX: {bound})"
        elif after is not None and longest >= after:
            why = f"a handler stuck {longest:.0f} s past its timeout (STUCK_EXIT_AFTER: {after:g} s)"
        else:
            return False
        logger.error("worker %s: %s; stopping gracefully with exit status %d so that its supervisor restarts it "
                     "(%s)", self.worker_id, why, EXIT_STUCK, stuck_jobs_outcome([i.job.id for i in stuck]))
        self.exit_code = EXIT_STUCK
        if self.exit_event is not None:
            self.exit_event.set()
        self.stop()
        return True

    def release_unstarted(self, older_than: float | None = None) -> int:
        """Release prefetched jobs that no thread has started (all of them, or those claimed more
        than ``older_than`` seconds ago) back to ``ready``: fenced, token bumped, not an attempt.

        Returns:
            The number of jobs released.
        """
        now = time.monotonic()
        with self._lock:
            items = [i for i in self._inflight.values()
                     if not i.started and (older_than is None or now - i.claimed_at > older_than)]
            for item in items:  # the threads skip them when they reach them in the queue
                del self._inflight[item.job.id]
        if not items:
            return 0
        reason = "worker shutdown" if older_than is None else "prefetched job not started in time"
        released = self._release(*items, reason=reason)
        if older_than is not None and released:
            # No thread freed up for ``older_than`` seconds: the durations that sized the prefetch
            # are out of date. Prefetch nothing until a job finishes, or the wake below would
            # claim the same number again at once, to release them again a second later (a
            # token bump and a history entry per job per second, held away from idle workers).
            self._avg_runtime = None
        return released

    def _release(self, *items: InFlight, reason: str) -> int:
        """Give held, unstarted jobs (already out of the held list) back to ``ready``: fenced,
        token bumped, not an attempt. On a database error they are held again. Returns how many
        the database released."""
        try:
            released = with_reconnect(lambda: store.job_release([(i.job.id, i.job.lease_version) for i in items],
                                                                reason=reason, alias=self.alias))
        except DatabaseError:
            # Still ours: hold them again, so that the heartbeat keeps renewing them and a later
            # round releases them (dropped, they would expire and each be charged a LeaseExpired
            # attempt without having run). A thread that met one in the meantime skipped it.
            with self._lock:
                for item in items:
                    self._inflight.setdefault(item.job.id, item)
            logger.exception("could not release %d prefetched job(s); still holding them", len(items))
            return 0
        for item in items:
            if item.job.id in released:
                signals.emit("released", job_id=item.job.id, task=item.job.task, queue=item.job.queue,
                             attempt=item.job.attempts, token=item.job.lease_version, reason=reason)
        self.prefetch_released += len(released)
        self.wake()
        return len(released)

    def _start_thread(self) -> None:
        thread = threading.Thread(target=self._thread_main, name=f"leasequeue-job-{len(self._threads)}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _thread_main(self) -> None:
        try:
            get = self._tasks.get
            while True:
                item = get()
                if item is None:
                    return
                if self._run_job(item):
                    return
        finally:
            # This thread's connections would otherwise stay open until the process exits (an
            # in-process worker, e.g. in tests, then keeps sessions on the database after it stopped).
            connections.close_all()

    def _run_job(self, item: InFlight) -> bool:
        """Run one held job on this thread. Returns True when this thread must retire."""
        with self._lock:
            if self._inflight.get(item.job.id) is not item:
                return False  # released (prefetched job not started in time, or shutdown)
            # Held but not started: the heartbeat may have learnt meanwhile that the lease is gone
            # (another worker may run the job now) or that an operator cancelled it. Never start
            # the handler then; a cancelled job ends cancelled at once (nothing ran).
            stale = item.ctx.lease_lost or item.ctx.cancel_requested
            # Nor when it is too late by this process's own clock: it waited past the release
            # bound (PREFETCH_RELEASE_AFTER; the process was frozen, e.g. SIGSTOP), or its lease
            # may have run out (a heartbeat starved of CPU could not yet report the loss), so
            # another worker could be running it. Give it back instead (a fenced release: if the
            # lease did run out, it writes nothing and the reaper takes the job back).
            now = time.monotonic()
            too_late = not stale and (now - item.claimed_at > PREFETCH_RELEASE_AFTER
                                      or now > item.lease_valid_until - start_margin(item.lease))
            if stale or too_late:
                del self._inflight[item.job.id]
            else:
                item.started = True
        if too_late:
            self._release(item, reason="too late to start the job (lease may be gone)")
            return False
        if stale:
            self._drop_unstarted(item)
            return False
        started = time.monotonic()
        child = self.execution == "process"
        if item.timeout and not child:  # in process mode the executor enforces the timeout itself
            item.deadline = started + item.timeout
        try:
            self.executor.run(item.job, item.ctx, child=child)
        except BaseException:  # noqa: BLE001 - never lose a handler thread
            logger.exception("job %s: worker error outside the handler", item.job.id)
        finally:
            if getattr(_thread_db, "used", False):
                close_broken_connections()
            runtime = time.monotonic() - started
            avg = self._avg_runtime
            self._avg_runtime = runtime if avg is None else avg + RUNTIME_EWMA_WEIGHT * (runtime - avg)
            with self._lock:
                if not item.completing:  # a returned job stays held until its completion is written
                    self._forget_locked(item)
                wake = self._saturated and self._busy_locked() <= self._refill_at
            if wake:
                self.wake()
        return False

    def _drop_unstarted(self, item: InFlight) -> None:
        """A held job that will not be started (lease lost, or cancel requested): record the
        cancel (fenced; a lost lease was already reported by the heartbeat) and free its slot."""
        if not item.ctx.lease_lost:
            fields = {"job_id": item.job.id, "task": item.job.task, "queue": item.job.queue,
                      "attempt": item.job.attempts, "token": item.job.lease_version}
            try:
                self.executor._cancelled(item.job, item.ctx, fields)
            except DatabaseError:
                logger.exception("job %s: could not record its cancel; the lease will expire", item.job.id)
        with self._lock:
            wake = self._saturated and self._busy_locked() <= self._refill_at
        if wake:
            self.wake()

    # -- service --------------------------------------------------------------------------------
    # The task names this worker registered (None until register()): recorded in its registry row
    # and passed to every claim, so it leases only jobs it can run (rolling deploys).
    task_names: list[str] | None = None

    def register(self) -> None:
        """Write this worker's registry row: queues, concurrency and the task names it can run."""
        self.task_names = registry.known_task_names()
        store.process_register(process_id=self.worker_id, kind="worker", host=socket.gethostname(),
                               pid=os.getpid(), queues=self.queues, concurrency=self.concurrency,
                               tasks=self.task_names, alias=self.alias)

    def claim_tasks(self) -> list[str]:
        """The task names to claim: every task registered in this process now. A task registered
        after start (a module imported late) is recorded in the registry row first, so no job of
        it is claimed before the row says this worker knows it."""
        known = registry.known_task_names()
        if self.task_names is not None and known != self.task_names:
            self.register()
        return known

    def on_start(self) -> None:
        registry.autodiscover()
        for _ in range(self.concurrency):
            self._start_thread()
        self.register()
        self.completer.start()
        self.heartbeat.start()
        if self.listener is not None:
            self.listener.start()
        logger.info("worker %s started: queues=%s concurrency=%s lease=%ss", self.worker_id,
                    self.queues or "*", self.concurrency, self.lease)

    def run_once(self) -> float:
        now = time.monotonic()
        if self.reap and now >= self._next_reap:
            self._next_reap = now + self.settings.reaper_interval
            if self.completer.pending:
                # Write this worker's own completions first: after an outage its returned jobs'
                # leases may have run out by the clock, and the sweep must find them done, not
                # expired. A failed flush (the database is still away) skips this sweep.
                self.completer.flush()
            reaper.reap_once(alias=self.alias, settings=self.settings)
            reaper.dead_letter_unknown_tasks(self.settings, alias=self.alias, by=self.worker_id)
            if now >= self._next_process_prune:
                self._next_process_prune = now + reaper.PROCESS_PRUNE_EVERY
                reaper.prune_processes(self.settings, alias=self.alias)
        if now < self._throttled_until:
            # A rate limit used up the allowance: a NOTIFY or a freed slot must not make us claim
            # (and be refused) again before the window frees.
            return self._throttled_until - now
        extra = self.prefetch_allowance()
        with self._lock:
            held = self._busy_locked()
            # Without prefetch: claim as soon as one thread is free. With it: once half the
            # prefetched jobs were taken, so each claim brings a batch, not one job per freed thread.
            self._refill_at = self.concurrency - 1 + extra // 2
            if held > self._refill_at:
                # Decided under the lock, so a job finishing right now sees the flag and wakes us.
                self._saturated = True
                return self._idle_wait()
            want = self.concurrency + extra - held
        jobs = store.job_claim(queues=self.queues, limit=want, worker_id=self.worker_id, lease=self.lease,
                               alias=self.alias, tasks=self.claim_tasks())
        for job_id, task, reason in jobs.corrupt:  # dead-lettered by the claim, never run
            signals.emit("dead_lettered", job_id=job_id, task=task, error="CorruptRow", message=reason)
        self.claimed += len(jobs)
        items = [self._hold(job) for job in jobs]
        with self._lock:
            for item in items:
                self._inflight[item.job.id] = item
            self._saturated = len(jobs) >= want
            idle = not self._inflight
        put = self._tasks.put
        for item in items:
            put(item)
        self._short_claim = len(jobs) < want
        wait = jobs.throttle_wait
        if wait is not None and len(jobs) < want:
            # Throttled: sleep until the oldest claim leaves the window (capped by the poll
            # interval, so other queues of this worker wait no longer than polling would make them).
            self.throttled += 1
            delay = min(self.poll_interval, wait + THROTTLE_MARGIN)
            self._throttled_until = time.monotonic() + delay
            return delay
        if jobs:
            return 0.0
        if self.burst and idle and self.completer._queue.empty():
            self.stop()
            return 0.0
        return self._idle_wait()

    def _idle_wait(self) -> float:
        """Seconds to wait before the next claim: the poll interval, cut short by the next reaper
        sweep. Without the cut a worker polling every 30 s (it relies on NOTIFY) would also reap
        only every 30 s, and a dead peer's jobs would wait that long beyond their lease."""
        if not self.reap:
            return self.poll_interval
        return max(0.0, min(self.poll_interval, self._next_reap - time.monotonic()))

    def _dispatch(self, job: store.ClaimedJob) -> None:
        self._tasks.put(self.track(job))

    def track(self, job: store.ClaimedJob, context_class: type[JobContext] = JobContext) -> InFlight:
        """Build the :class:`JobContext` of a claimed job and add it to the held jobs (the
        heartbeat renews it from now on); return its :class:`InFlight` record."""
        item = self._hold(job, context_class)
        with self._lock:
            self._inflight[job.id] = item
        return item

    def _hold(self, job: store.ClaimedJob, context_class: type[JobContext] = JobContext) -> InFlight:
        """Wrap a claimed job for the pool and the heartbeat (the caller registers and queues it)."""
        # Renew by the lease the claim granted (the row's lease_seconds, else the worker default),
        # never by the task's declared lease: using(lease=...) stores another value in the row, and
        # renewing every declared/3 seconds would let a shorter granted lease expire in between.
        lease = job.lease_seconds
        try:
            spec = registry.get_task(job.task)
            timeout, manual = spec.timeout, spec.manual_heartbeat
        except Exception:
            timeout, manual = None, False
        # HEARTBEAT_INTERVAL is honoured, but never above a third of this job's own lease: the
        # setting defaults to LEASE/3, and a task with a shorter lease must still renew in time.
        renew_every = self.renewal_interval(lease)
        ctx = context_class(job_id=job.id, task=job.task, queue=job.queue, attempt=job.attempts,
                            max_attempts=job.max_attempts, lease_version=job.lease_version,
                            worker_id=self.worker_id, leased_until=job.leased_until, lease_seconds=lease,
                            alias=self.alias, claim=job)
        now = time.monotonic()
        return InFlight(job=job, ctx=ctx, lease=lease, manual_heartbeat=manual, timeout=timeout,
                        next_renewal=now + renew_every, renew_every=renew_every, claimed_at=now,
                        lease_valid_until=now + lease)

    def run_inline(self, job: store.ClaimedJob, context_class: type[JobContext] = JobContext) -> str:
        """Run a claimed job in the calling thread, on its database connection, and write its
        completion before returning: no handler thread, no completer thread, no heartbeat.

        For :mod:`django_leasequeue.testing` (``drain()`` inside a test's transaction, where no other
        connection can see the test's rows). The job goes through the same :class:`Executor` and
        :class:`~django_leasequeue.completer.Completer` code as in :meth:`run_once`; only the threads
        are missing, so a handler that runs longer than its lease is not renewed.

        Args:
            job: a job claimed with this worker's id (``store.job_claim(..., worker_id=self.worker_id)``).
            context_class: :class:`JobContext` or a subclass (the lost-lease simulation uses one).

        Returns:
            The outcome: ``done``, ``ready`` (retry scheduled), ``dead``, ``snoozed``, ``cancelled``,
            ``lease_lost`` (a fenced write was refused, the completion included) or ``unrecorded``.
        """
        item = self.track(job, context_class)
        item.started = True  # never a prefetched job: release_unstarted() must leave it alone
        if item.timeout:
            item.deadline = time.monotonic() + item.timeout
        try:
            outcome = self.executor.run(job, item.ctx)
            self.completer.flush()
        finally:
            with self._lock:
                self._forget_locked(item)
        if outcome == "done" and not item.ctx.completed_in_transaction:
            # The completer decided: done, cancelled (requested while it ran) or refused (lease lost).
            if item.ctx.lease_lost:
                return "lease_lost"
            if item.ctx.cancel_requested:
                return "cancelled"
        return outcome

    def on_stop(self) -> None:
        if self.listener is not None:
            self.listener.stop()
        # Prefetched jobs that no thread started go back at once; running ones get the grace period.
        self.release_unstarted()
        deadline = time.monotonic() + self.settings.shutdown_grace
        while time.monotonic() < deadline:
            with self._lock:
                if not self._inflight:  # returned jobs too: their completions are being written
                    break
            time.sleep(0.05)
        self.completer.stop()
        self.completer.join()
        with self._lock:
            # Returned jobs whose completion is still queued are not released (that would run them
            # again): the flush below writes them, or their lease expires.
            held = [i for i in self._inflight.values() if not i.completing]
        if self.execution == "process":
            # Children still running after the grace period are killed before their jobs are
            # released, so no handler runs on beside the next attempt. (Read the held jobs first:
            # a killed child's thread lets go of its job at once, and the release must see it.)
            self.executor.kill_children()
        leftover = [i for i in held if not i.timed_out]
        # A handler that returned after the completer's final flush (the grace period ran out as it
        # finished) submitted its success to the stopped completer and left the running list, so it
        # is not released below either: write those completions now. Every job missing from
        # ``leftover`` has finished, so its completion is queued by now. A completion that races
        # this flush for a job in ``leftover`` is harmless: written first, the release skips the
        # done job; released first, the completion is refused by the token.
        try:
            self.completer.flush()
        except DatabaseError:
            logger.exception("could not write the last completions; those jobs will be retried after their lease")
        for item in held:
            if item.timed_out:
                # Stuck past its timeout: the attempt fails as timed out now (retried after backoff,
                # or dead-lettered), never refunded; the thread dies with the process. The retry
                # waits at least one lease, as a killed worker's job would: the stuck handler still
                # runs until this process is gone, after the rest of this stop.
                try:
                    self.executor.record_timeout(item.job, item.ctx, (
                        f"attempt {item.job.attempts} ran past the task's timeout of {item.timeout:g} s and was "
                        f"still running when worker {self.worker_id} stopped"), min_delay=item.lease)
                except DatabaseError:
                    logger.exception("job %s: could not record its timeout; the lease will expire", item.job.id)
        # A handler that had started was interrupted: its attempt is refunded, up to
        # MAX_INTERRUPTIONS times (then the job is dead-lettered as Interrupted). One that never
        # started (prefetched) did not run: released freely.
        for interrupted in (True, False):
            batch = [(i.job.id, i.job.lease_version) for i in leftover if i.started is interrupted]
            if not batch:
                continue
            try:
                released = with_reconnect(functools.partial(
                    store.job_release, batch, interrupted=interrupted,
                    max_interruptions=self.settings.max_interruptions, alias=self.alias))
                for job_id in released:
                    if job_id in released.dead:
                        signals.emit("dead_lettered", job_id=job_id, error="Interrupted",
                                     message="interrupted more than MAX_INTERRUPTIONS times")
                    else:
                        signals.emit("released", job_id=job_id, reason="worker shutdown")
                logger.info("released %d job(s) still running after the %.0f s grace period",
                            len(released), self.settings.shutdown_grace)
            except DatabaseError:
                logger.exception("could not release leases; they will expire and be reaped")
        self.heartbeat.stop()
        self.heartbeat.join()
        for _ in self._threads:
            self._tasks.put(None)
        try:
            store.process_deregister(self.worker_id, alias=self.alias)
        except DatabaseError:
            logger.exception("could not deregister worker %s", self.worker_id)
        if self.listener is not None:
            self.listener.join(2.0)
        logger.info("worker %s stopped (claimed %d)", self.worker_id, self.claimed)
