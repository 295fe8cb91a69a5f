"""The worker service: composes the pool, producer, heartbeat, completer, reaper and listener.

:class:`WorkerService` is one :class:`~django_leasequeue.runtime.Service` whose loop is the
producer's claim loop (:mod:`.producer`), feeding the handler threads of the pool (:mod:`.pool`).
It starts and stops the others: the heartbeat (:mod:`.heartbeat`), the completer that writes
successful completions in batches (:mod:`.completer`), and the LISTEN wake-ups
(:class:`~django_leasequeue.notify.Listener`). Unless ``reap=False`` it sweeps expired leases with
a composed :class:`~django_leasequeue.reaper.ReaperService` every ``REAPER_INTERVAL``, so that one
process suffices; the worker writes its own pending completions before each sweep, so that no job
whose handler returned is reaped and run again because its completion was still queued.

A prefetched job is leased and heartbeated like a running one; if no thread starts it within
``PREFETCH_RELEASE_AFTER`` seconds (a long job got in the way) it is released back to ``ready`` at
once (token bumped, not an attempt) for other workers; no thread starts it later than that, nor
once its lease is known lost (the process was frozen, say). The claim loop sleeps until a NOTIFY,
freed threads (only when it was saturated), the earliest future ``run_at`` of its queues or the poll
interval, whichever comes first (see :meth:`WorkerService.wake_for_run_at`).

A handler past its task's ``timeout`` cannot be stopped in thread mode: the attempt is marked
timed out (a ``timed_out`` history entry), but the job stays leased and renewed and the handler
keeps its thread's slot until it returns, so neither the job's retry nor another job under the
same concurrency key starts beside it; when it returns the attempt fails as ``JobTimedOut``. Once
``STUCK_HANDLERS_MAX`` handlers are stuck (default: all threads), or one is stuck
``STUCK_EXIT_AFTER`` seconds past its timeout, the worker stops gracefully and exits with status
:data:`EXIT_STUCK`, for its supervisor to restart it. ``EXECUTION = "process"`` runs each handler in
a child process killed at its timeout instead.

``async def`` handlers run on the pool's event loop (:mod:`.aio`), up to ``async_slots`` at once
(``ASYNC_SLOTS``), claimed apart from the threads; the heartbeat cancels one at its timeout (it
keeps its slot and lease until its coroutine ends) or when its lease is lost, and the stop cancels
those it released.

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
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError

from .. import registry, signals, store
from ..attempt_hooks import install_attempt_hook, uninstall_attempt_hook
from ..conf import EXECUTION_MODES, Settings, check_lease_seconds, get_settings, queue_name_problem
from ..executor import Executor, with_reconnect
from ..notify import Listener
from ..processes import RegisteredService, make_process_id
from ..reaper import ReaperService
from .aio import STOP_WAIT
from .completer import Completer
from .heartbeat import HeartbeatService
from .pool import InFlight, Pool
from .producer import Producer
from .tally import WorkerCounts, WorkerTally

logger = logging.getLogger("django_leasequeue.worker")

#: Exit status of a worker that stopped because of handlers stuck past their timeout (thread mode).
EXIT_STUCK = 3


def make_worker_id(name: str | None = None) -> str:
    """Return ``host:pid:name`` (a random name when none is given)."""
    return make_process_id(name or uuid.uuid4().hex[:8])


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


class WorkerService(RegisteredService):
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
        async_slots: most ``async def`` handlers run at once on the worker's event loop, beside
            the ``concurrency`` threads (None: the ``ASYNC_SLOTS`` setting; 0: async handlers run
            on the threads, each on a private event loop).

    Raises:
        ValueError: ``async_slots`` below 0, ``concurrency`` below 1, a ``lease`` outside (0, 7 days], a queue name
            outside the grammar of :func:`~django_leasequeue.conf.queue_name_problem`, or an unknown
            ``execution``.
    """

    name = "worker"
    kind = "worker"

    def __init__(self, *, queues: Sequence[str] | None = None, concurrency: int = 4, lease: float | None = None,
                 poll_interval: float | None = None, burst: bool = False, worker_name: str | None = None,
                 notify: bool | None = None, reap: bool = True, settings: Settings | None = None,
                 prefetch_wait: float | None = None, prefetch_max: int | None = None,
                 execution: str | None = None, async_slots: int | None = None) -> None:
        super().__init__()
        self.settings = settings or get_settings()
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.async_slots = self.settings.async_slots if async_slots is None else async_slots
        if isinstance(self.async_slots, bool) or not isinstance(self.async_slots, int) or self.async_slots < 0:
            raise ValueError(f"async_slots must be an int >= 0, got {self.async_slots!r}")
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
        self.process_id = self.worker_id
        self.alias = store.db_alias()
        self.reap = reap
        self.prefetch_wait = float(self.settings.prefetch_wait if prefetch_wait is None else prefetch_wait)
        self.prefetch_max = int(self.settings.prefetch_max if prefetch_max is None else prefetch_max)
        # No prefetch from rate-limited queues: the limit counts claims, and a prefetched job would
        # use the allowance before a thread is free to run it (and may be released unrun).
        if any(self.queues is None or q in self.queues for q in self.settings.rate_limits):
            self.prefetch_max = 0
        self._next_reap = 0.0
        # "thread" or "process" (EXECUTION): in process mode each handler runs in a child process.
        self.execution = execution or self.settings.execution
        if self.execution not in EXECUTION_MODES:
            raise ValueError(f"execution must be one of {EXECUTION_MODES}, got {self.execution!r}")
        # Process mode runs every handler in a child process, async ones too (asyncio.run there).
        if self.execution == "process":
            self.async_slots = 0
        self.pool = Pool(concurrency=concurrency, execution=self.execution, settings=self.settings,
                         alias=self.alias, worker_id=self.worker_id, wake=self.wake, async_slots=self.async_slots)
        self.completer = Completer(alias=self.alias, on_flush=self._after_completions,
                                   synchronous_commit=not self.settings.async_completions,
                                   on_settled=self.pool.completions_settled,
                                   retry_cap=lambda: self.heartbeat.error_backoff_max)
        self.executor = Executor(worker_id=self.worker_id, settings=self.settings, alias=self.alias,
                                 complete=self.pool.submit_completion)
        self.pool.bind(executor=self.executor, completer=self.completer)
        self.producer = Producer(pool=self.pool, queues=self.queues, lease=self.lease,
                                 poll_interval=self.poll_interval, worker_id=self.worker_id, alias=self.alias,
                                 prefetch_wait=self.prefetch_wait, prefetch_max=self.prefetch_max,
                                 tasks=self.claim_tasks)
        self.heartbeat = HeartbeatService(pool=self.pool, lease=self.lease, alias=self.alias,
                                          check_stuck=self.check_stuck, beat_process=self.beat)
        self.reaper = ReaperService(interval=self.settings.reaper_interval, settings=self.settings,
                                    process_id=self.worker_id, alias=self.alias)
        use_notify = self.settings.notify if notify is None else notify
        self.listener = Listener(self, channel=self.settings.notify_channel) if use_notify else None
        self.exit_code = 0  # EXIT_STUCK once stopped because of stuck handlers
        # Set along with stop() when the worker decides to exit (run_services' stop_when), so
        # that the other services of the process stop too.
        self.exit_event: threading.Event | None = None
        # When the current idle wait ends, as POSIX seconds of the database clock; None while it
        # is not known (claiming, saturated, looking up the next run_at): then every notification
        # of a job due later wakes the loop, which cannot miss one that way.
        self._wait_ends_at: float | None = None
        self._wait_lock = threading.Lock()
        # What this worker did, for the line runworker prints when it stops (summary()).
        self.tally = WorkerTally(self.worker_id)
        self._started_at: float | None = None  # time.monotonic() at the start
        self._stopped_at: float | None = None  # time.monotonic() at the end of the stop

    @property
    def claimed(self) -> int:
        """Jobs claimed since start."""
        return self.producer.claimed

    @property
    def error_backoff_max(self) -> float:
        """Seconds: the longest wait of the claim loop after failed rounds. The general cap, except
        while a claim's reply may have been lost (``producer.claim_unsure``): that claim's jobs are
        leased to this worker, which must give them back before their lease expires (else they are
        reaped as an attempt that never ran), so the loop retries as often as the heartbeat renews,
        once per renewal interval, however long the database has been refusing it."""
        if self.producer.claim_unsure:
            return min(super().error_backoff_max, self.heartbeat.error_backoff_max)
        return super().error_backoff_max

    def counts(self) -> WorkerCounts:
        """What this worker did since it started: jobs claimed, then each outcome (done, retried,
        dead-lettered, lease lost, released, snoozed, cancelled) and the seconds it ran, up to its
        stop once stopped. See :class:`~django_leasequeue.worker.tally.WorkerCounts`."""
        started = self._started_at
        elapsed = 0.0 if started is None else (self._stopped_at or time.monotonic()) - started
        producer = self.producer
        return self.tally.counts(claimed=producer.claimed + producer.corrupt + producer.lost_claim_released,
                                 elapsed=elapsed,
                                 counted_elsewhere={"released": self.pool.prefetch_released
                                                    + producer.lost_claim_released,
                                                    "dead_lettered": self.producer.corrupt})

    def summary(self) -> str:
        """:meth:`counts` as one line, ``worker ID stopped after 4.2 s: 8 claimed, 6 done, ...``
        (``running for`` until the worker has stopped)."""
        return self.counts().summary(self.worker_id, stopped=self._stopped_at is not None)

    @property
    def throttled(self) -> int:
        """Claims cut short by a queue's rate limit since start."""
        return self.producer.throttled

    @property
    def prefetch_released(self) -> int:
        """Prefetched jobs given back unstarted since start."""
        return self.pool.prefetch_released

    def _after_completions(self) -> None:
        if self.producer.short_claim:
            self.wake()

    def _flush_before_sweep(self) -> None:
        """Write this worker's own completions before its reaper sweeps: after an outage its
        returned jobs' leases may have run out by the clock, and the sweep must find them done, not
        expired. A failed flush (the database is still away) raises and so skips this sweep."""
        if self.completer.pending:
            self.completer.flush()

    def stuck(self) -> list[InFlight]:
        """The held jobs whose handler is past its task's timeout and still running (thread mode)."""
        return self.pool.stuck()

    def check_stuck(self, now: float) -> bool:
        """Stop the worker (exit status :data:`EXIT_STUCK`) when its stuck handlers reach
        ``STUCK_HANDLERS_MAX`` (default: all threads) or one is stuck ``STUCK_EXIT_AFTER`` seconds
        past its timeout. ``now`` is ``time.monotonic()``. Returns True when it asked to stop."""
        stuck = self.stuck()
        if not stuck or self.exit_code:
            return False
        # Stuck threads count against the threads, stuck coroutines (cancelled at their timeout,
        # still running: they swallowed the CancelledError) against the async slots.
        threads = [i for i in stuck if not i.is_async]
        coroutines = [i for i in stuck if i.is_async]
        longest = max(now - (i.deadline or now) for i in stuck)
        after = self.settings.stuck_exit_after
        over = [(kind, bound) for kind, bound in ((threads, self.settings.stuck_handlers_max or self.concurrency),
                                                  (coroutines, self.settings.stuck_handlers_max or self.async_slots))
                if kind and len(kind) >= bound]
        if over:
            count, bound = len(over[0][0]), over[0][1]
            why = ("1 handler stuck past its timeout" if count == 1
                   else f"{count} handlers stuck past their timeout") + f" (STUCK_HANDLERS_MAX: {bound})"
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

    # -- service --------------------------------------------------------------------------------
    # The task names this worker registered (None until register()): recorded in its registry row
    # and passed to every claim, so it leases only jobs it can run (rolling deploys).
    task_names: list[str] | None = None

    def reaps(self) -> bool:
        return bool(self.reap)

    def registration(self) -> dict[str, Any]:
        """The registry row's queues, concurrency and the task names this worker can run now."""
        self.task_names = registry.known_task_names()
        return {"queues": self.queues, "concurrency": self.concurrency, "tasks": self.task_names}

    def claim_tasks(self) -> list[str]:
        """The task names to claim: every task registered in this process now. A task registered
        after start (a module imported late) is recorded in the registry row first, so no job of
        it is claimed before the row says this worker knows it."""
        known = registry.known_task_names()
        if self.task_names is not None and known != self.task_names:
            self.register()
        return known

    def on_start(self) -> None:
        self._started_at = time.monotonic()
        install_attempt_hook(self.tally)
        registry.autodiscover()
        self.pool.start_threads()
        self.register()
        self.completer.start()
        self.heartbeat.start()
        if self.listener is not None:
            self.listener.start()
        # The async slots only where they are used (an async task registered), as in the banner.
        has_async = bool(self.producer.split_tasks(self.producer.tasks())[1])
        slots = f" async_slots={self.async_slots}" if has_async else ""
        logger.info("worker %s started: queues=%s concurrency=%s%s lease=%ss", self.worker_id,
                    self.queues or "*", self.concurrency, slots, self.lease)

    def run_once(self) -> float:
        with self._wait_lock:
            self._wait_ends_at = None  # until _idle_wait knows the new one
        now = time.monotonic()
        if self.reap and now >= self._next_reap:
            self._next_reap = now + self.reaper.interval
            self._flush_before_sweep()
            self.reaper.sweep()
            self.reaper.maintain_if_elected(now)
        delay = self.producer.claim()
        if delay is not None:
            return delay
        if self.burst and self.producer.drained and not self.completer.pending:
            self.stop()
            return 0.0
        return self._idle_wait()

    def wake_for_due(self) -> None:
        """A NOTIFY of a job due now in a served queue (called by the listener's thread): wake the
        loop, and end the producer's skip of the async claim soon (it may be an async job)."""
        self.producer.notified()
        self.wake()

    def wake_for_run_at(self, at: float) -> None:
        """A job of a served queue becomes ready for ``at`` (a notification of a delayed enqueue, a
        retry or a snooze; called by the listener's thread): cut the idle wait short unless it ends
        by then anyway, so that the loop claims (nothing yet) and sleeps until the new earliest
        ``run_at``.

        Args:
            at: the job's ``run_at`` as POSIX seconds of the database clock.
        """
        # It may be an async job: the producer's skip of the async claim must end by ``at``, or the
        # job would wait up to ASYNC_RECHECK_MAX past it while the threads are busy.
        self.producer.notified_run_at(at)
        with self._wait_lock:
            ends = self._wait_ends_at
        if ends is None or at < ends:
            self.wake()

    def _idle_wait(self) -> float:
        """Seconds to wait before the next claim: the poll interval, cut short by the next reaper
        sweep and, after a claim that found nothing due, by the earliest future ``run_at`` of the
        worker's queues (by the database clock, so the job is due when the loop claims again).
        Without the reaper cut a worker polling every 30 s (it relies on NOTIFY) would also reap
        only every 30 s, and a dead peer's jobs would wait that long beyond their lease."""
        wait = self.poll_interval
        if self.reap:
            wait = max(0.0, min(wait, self._next_reap - time.monotonic()))
        if not self.producer.found_nothing:
            return wait  # saturated: freed threads wake the loop, and no thread could take a job
        # From the start of that claim: a job that became due since is not skipped (wait 0).
        nxt = store.job_next_run_at(self.queues, since=time.monotonic() - self.producer.round_started,
                                    alias=self.alias)
        if nxt.seconds is not None:
            wait = max(0.0, min(wait, nxt.seconds))
        with self._wait_lock:
            self._wait_ends_at = nxt.now + wait
        return wait

    def on_stop(self) -> None:
        if self.listener is not None:
            self.listener.stop()
        # Prefetched jobs that no thread started go back at once; running ones get the grace period.
        self.pool.release_unstarted()
        if self.producer.claim_unsure:
            # The last claim raised and no claim since gave its jobs back: do it now, not a lease later.
            try:
                with_reconnect(self.producer.release_lost_claims)
            except DatabaseError:
                logger.exception("could not give back the jobs of a claim whose reply was lost; their leases "
                                 "will expire")
        deadline = time.monotonic() + self.settings.shutdown_grace
        while time.monotonic() < deadline:
            with self.pool.lock:
                if not self.pool.inflight:  # returned jobs too: their completions are being written
                    break
            time.sleep(0.05)
        self.completer.stop()
        self.completer.join()
        with self.pool.lock:
            # Returned jobs whose completion is still queued are not released (that would run them
            # again): the flush below writes them, or their lease expires.
            held = [i for i in self.pool.inflight.values() if not i.completing]
        # Whether each job's handler had started, for the release below.
        started = {i.job.id: i.started for i in held}
        if self.execution == "process":
            # Children still running after the grace period are killed before their jobs are
            # released, so no handler runs on beside the next attempt. The stop takes those
            # attempts from their threads (which then record nothing: no failure for the closed
            # pipe, no lost lease for a write the release refused) and releases them, as
            # interrupted only when the child had been told to start the handler: one killed
            # while it set Django up never ran it. A job whose thread took its child's outcome
            # first is left to that thread. (Read the held jobs first: a killed child's thread
            # lets go of its job at once, and the release must see it.)
            started = self.executor.stop_children([i.ctx for i in held])
            held = [i for i in held if i.job.id in started]
        leftover = [i for i in held if not i.timed_out]
        # Async handlers still running are cancelled first, and their coroutines given a moment
        # to end: released while one still ran, its job could start on another worker beside it.
        # Their outcomes are not recorded (this stop records or releases every held job below):
        # a timed-out one ending meanwhile must not record its timeout beside record_timeout().
        still = self.pool.interrupt_async(held)
        if still:
            logger.warning("%d async handler(s) still running %.0f s after they were cancelled (they swallow "
                           "CancelledError); releasing their jobs all the same", still, STOP_WAIT)
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
            batch = [(i.job.id, i.job.lease_version) for i in leftover if started[i.job.id] is interrupted]
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
                dead = sum(1 for job_id in released if job_id in released.dead)
                self.tally.add("dead_lettered", dead)
                self.tally.add("released", len(released) - dead)
                logger.info("released %d job(s) still running after the %.0f s grace period",
                            len(released), self.settings.shutdown_grace)
            except DatabaseError:
                logger.exception("could not release leases; they will expire and be reaped")
        # Async handlers still running were released (or recorded as timed out) above: cancel them
        # without recording anything more, and stop the event loop.
        self.pool.stop_async()
        self.heartbeat.stop()
        self.heartbeat.join()
        self.pool.stop_threads()
        try:
            self.deregister()
        except DatabaseError:
            logger.exception("could not deregister worker %s", self.worker_id)
        if self.listener is not None:
            self.listener.join(2.0)
        uninstall_attempt_hook(self.tally)
        self._stopped_at = time.monotonic()
        logger.info("worker %s stopped (claimed %d)", self.worker_id, self.producer.claimed)
