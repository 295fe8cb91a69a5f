"""The pool: the worker's handler threads and the table of the jobs it holds.

A held job (:class:`InFlight`) is either prefetched (claimed, waiting for a thread) or running;
a job whose handler returned stays held, its thread free, until the completer has written or
refused its completion, so that its lease is renewed meanwhile. :class:`Pool` owns the threads,
the held-jobs table and its lock, starts held jobs on free threads (never one whose lease may be
gone, that was cancelled meanwhile, or whose queue may be paused: see :class:`PauseView`), gives
unstarted jobs back to ``ready`` and marks handlers past their task's timeout.

Held ``async def`` jobs (``InFlight.is_async``) run on the pool's event loop instead
(:class:`~.aio.AsyncLoop`, :meth:`Pool.start_async`), counted against ``async_slots`` apart from
the threads; the same start check (:meth:`Pool.admit`) lets them start, and a timeout cancels
their coroutine (:meth:`Pool.abandon`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import queue as queue_module
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, connections
from django.db.backends.signals import connection_created

from .. import registry, signals, store
from ..attempt_events import job_fields
from ..conf import Settings
from ..context import JobContext
from ..executor import Executor, with_reconnect
from ..runtime import check_connections_after_loss, close_broken_connections
from .aio import STALL_WARN_AFTER, STOP_WAIT, AsyncLoop
from .completer import Completer
from .pause_view import PauseView

logger = logging.getLogger("django_leasequeue.worker")

# A prefetched job that no thread started within this many seconds is released back to ready.
PREFETCH_RELEASE_AFTER = 1.0
# The reason recorded in the history of a held job given back because its queue was paused.
PAUSED_REASON = "queue paused"
# Weight of the newest job in the moving average of job durations that sizes the prefetch.
RUNTIME_EWMA_WEIGHT = 0.05


# Whether the current thread ever opened a database connection. Job threads check (and close) broken
# connections after each job only when their handlers used the database: the full check walks
# Django's connection handler, several microseconds per job that no-op and non-database jobs skip.
_thread_db = threading.local()


def _note_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
    _thread_db.used = True


connection_created.connect(_note_connection, dispatch_uid="django_leasequeue.worker.thread_db")


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
    # time plus the lease. A held job is not started past it, less a margin (see Pool.run_job).
    lease_valid_until: float = 0.0
    deadline: float | None = None  # monotonic time of the task's timeout (set when started, thread mode)
    started: bool = False  # a thread took it (False: prefetched, waiting for a thread)
    timed_out: bool = False
    # The handler returned and its completion is queued in the completer: the thread is free (not
    # counted against the concurrency) but the lease is still renewed until the completion is
    # written or refused, so no reaper takes back a job whose handler already returned.
    completing: bool = False
    thread: threading.Thread | None = field(default=None, repr=False)
    # An ``async def`` handler run on the worker's event loop (an async slot, not a thread).
    is_async: bool = False
    # The asyncio task running the async handler, once started (cancelled at the timeout).
    handler: asyncio.Task[Any] | None = field(default=None, repr=False)
    # The worker's stop took this async job (Pool.interrupt_async): its handler is cancelled and
    # its outcome is not recorded (the stop gives the job back).
    interrupted: bool = False


def start_margin(lease: float) -> float:
    """Seconds before the end of a held job's lease (by this process's clock) after which a
    thread no longer starts it: a tenth of the lease, at most 1 s."""
    return min(1.0, lease / 10)


class Pool:
    """The handler threads and the held-jobs table of one worker.

    Args:
        concurrency: number of handler threads.
        async_slots: most ``async def`` handlers run at once on the worker's event loop (0: they
            run on the handler threads, each on a private loop).
        execution: ``"thread"`` or ``"process"`` (each handler in a child process).
        settings: validated settings (``HEARTBEAT_INTERVAL``).
        alias: the database alias. worker_id: ``host:pid:name``.
        wake: called when a freed thread (or a released job) should make the claim loop claim now.

    The executor and the completer are attached with :meth:`bind` (each needs the pool's
    callbacks when it is built).
    """

    executor: Executor
    completer: Completer

    def __init__(self, *, concurrency: int, execution: str, settings: Settings, alias: str, worker_id: str,
                 wake: Callable[[], None], async_slots: int = 0) -> None:
        self.concurrency = concurrency
        self.async_slots = async_slots
        self.execution = execution
        self.settings = settings
        self.alias = alias
        self.worker_id = worker_id
        self.wake = wake
        self.lock = threading.Lock()
        self.inflight: dict[int, InFlight] = {}
        self.tasks: queue_module.SimpleQueue[InFlight | None] = queue_module.SimpleQueue()
        self.threads: list[threading.Thread] = []
        # Set by the claim loop under the lock: it found every thread busy, so a finishing job
        # wakes it once no more than ``refill_at`` jobs are held.
        self.saturated = False
        self.refill_at = concurrency - 1
        self.avg_runtime: float | None = None  # moving average of handler durations, seconds
        self.completing = 0  # held jobs whose handler returned, completion not yet written
        self.prefetch_released = 0
        self.pause_view = PauseView(alias)
        self.pause_released = 0  # held jobs given back unstarted because their queue was paused
        # Async handlers: how many held jobs are async (and of those, returned and completing);
        # the claim loop fills the async slots apart from the threads.
        self.held_async = 0
        self.completing_async = 0
        self.async_saturated = False
        # A saturated claim loop is woken once this many async slots are free, so that a full
        # event loop claims in batches rather than once per finished coroutine.
        self.async_refill = max(1, async_slots // 20)
        self.aio: AsyncLoop | None = None  # the event loop thread, started with the first async job
        self._aio_lock = threading.Lock()
        self._async_stopping = False  # the worker's stop took the async jobs still running
        self._stall_warned = False

    def bind(self, *, executor: Executor, completer: Completer) -> None:
        """Attach the executor that runs the held jobs and the completer that writes their success."""
        self.executor = executor
        self.completer = completer

    # -- the held-jobs table ----------------------------------------------------------------------
    def submit_completion(self, ctx: JobContext, result_json: str | None) -> None:
        """The executor's success path: keep the job held (renewed by the heartbeat, no longer
        counted against the concurrency) until the completer has written or refused it."""
        with self.lock:
            item = self.inflight.get(ctx.job_id)
            if item is not None and item.ctx is ctx and not item.completing:
                item.completing = True
                item.deadline = None  # the handler returned: its timeout no longer applies
                self.completing += 1
                self.completing_async += item.is_async
        self.completer.submit(ctx, result_json)

    def completions_settled(self, contexts: Sequence[JobContext]) -> None:
        """The completer decided these completions: stop holding their jobs."""
        with self.lock:
            for ctx in contexts:
                item = self.inflight.get(ctx.job_id)
                if item is not None and item.ctx is ctx and item.completing:
                    self.forget_locked(item)

    def forget(self, item: InFlight) -> None:
        """Drop ``item`` from the held jobs; no-op if it is not held."""
        with self.lock:
            self.forget_locked(item)

    def forget_locked(self, item: InFlight) -> None:
        """Drop ``item`` from the held jobs (caller holds ``lock``); no-op if it is not held."""
        if self.inflight.get(item.job.id) is item:
            self.unhold_locked(item)
            if item.completing:
                self.completing -= 1
                self.completing_async -= item.is_async

    def add_locked(self, item: InFlight) -> None:
        """Add ``item`` to the held jobs (caller holds ``lock``)."""
        self.inflight[item.job.id] = item
        self.held_async += item.is_async

    def unhold_locked(self, item: InFlight) -> None:
        """Remove ``item``, known to be held, from the held jobs (caller holds ``lock``)."""
        del self.inflight[item.job.id]
        self.held_async -= item.is_async

    def busy_locked(self) -> int:
        """Held thread jobs that occupy a thread or wait for one (caller holds ``lock``): returned
        jobs waiting for their completion to be written do not, nor async jobs."""
        return len(self.inflight) - self.held_async - (self.completing - self.completing_async)

    def busy_async_locked(self) -> int:
        """Held async jobs whose handler has not returned (caller holds ``lock``)."""
        return self.held_async - self.completing_async

    def inflight_snapshot(self) -> list[InFlight]:
        """The held jobs (running and prefetched), for the heartbeat."""
        with self.lock:
            return list(self.inflight.values())

    def holds(self, item: InFlight) -> bool:
        """True while ``item`` is in the held list (running or prefetched, not let go of)."""
        with self.lock:
            return self.inflight.get(item.job.id) is item

    def free_slots(self) -> int:
        """Threads not running a job and not promised to a prefetched one."""
        with self.lock:
            return self.concurrency - self.busy_locked()

    def renewal_interval(self, lease: float) -> float:
        """Seconds between heartbeats of a job with this lease: lease/3, or ``HEARTBEAT_INTERVAL``
        when that is shorter (it also bounds how late a running handler learns of a cancel)."""
        return min(lease / 3, self.settings.heartbeat_interval)

    def hold(self, job: store.ClaimedJob, context_class: type[JobContext] = JobContext) -> InFlight:
        """Wrap a claimed job for the pool and the heartbeat (the caller adds it to ``inflight``
        under ``lock`` and queues it with :meth:`dispatch`)."""
        # Renew by the lease the claim granted (the row's lease_seconds, else the worker default),
        # never by the task's declared lease: using(lease=...) stores another value in the row, and
        # renewing every declared/3 seconds would let a shorter granted lease expire in between.
        lease = job.lease_seconds
        try:
            spec = registry.get_task(job.task)
            timeout, manual, is_async = spec.timeout, spec.manual_heartbeat, spec.is_async and self.async_slots > 0
        except Exception:
            timeout, manual, is_async = None, False, False
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
                        lease_valid_until=now + lease, is_async=is_async)

    def track(self, job: store.ClaimedJob, context_class: type[JobContext] = JobContext) -> InFlight:
        """Build the :class:`JobContext` of a claimed job and add it to the held jobs (the
        heartbeat renews it from now on); return its :class:`InFlight` record."""
        item = self.hold(job, context_class)
        with self.lock:
            self.add_locked(item)
        return item

    def dispatch(self, item: InFlight) -> None:
        """Queue a held job for the next free thread."""
        self.tasks.put(item)

    def _wake_if_refill_locked(self) -> bool:
        """True when the claim loop, saturated, should claim again now (caller holds ``lock``)."""
        return self.saturated and self.busy_locked() <= self.refill_at

    def _wake_if_async_refill_locked(self) -> bool:
        """True when the claim loop, with every async slot taken, should claim again now (caller
        holds ``lock``): ``async_refill`` slots are free."""
        return self.async_saturated and self.async_slots - self.busy_async_locked() >= self.async_refill

    # -- timeouts ---------------------------------------------------------------------------------
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
        if item.is_async:
            logger.warning("job %s: attempt %s ran past its task's timeout of %s s; cancelling its coroutine",
                           item.job.id, item.job.attempts, item.timeout)
        else:
            logger.warning("job %s: attempt %s ran past its task's timeout of %s s; the handler cannot be stopped "
                           "in thread mode, so its lease is kept until it returns", item.job.id, item.job.attempts,
                           item.timeout)
        try:
            store.job_note_timed_out(item.job.id, item.job.lease_version, worker=self.worker_id,
                                     timeout=float(item.timeout or 0), alias=self.alias)
        except DatabaseError:
            logger.exception("job %s: could not record the timeout in its history", item.job.id)
            close_broken_connections()
        if item.is_async:
            # Cancelled once the note is written (the failure it leads to ends the lease, and the
            # note is fenced on it). It keeps its slot and lease until its coroutine ends: one that
            # swallows CancelledError stays stuck, as a thread would.
            self.cancel_handler(item)

    def stuck(self) -> list[InFlight]:
        """The held jobs whose handler is past its task's timeout and still running (thread mode)."""
        with self.lock:
            return [i for i in self.inflight.values() if i.timed_out]

    # -- giving jobs back -------------------------------------------------------------------------
    def release_unstarted(self, older_than: float | None = None) -> int:
        """Release prefetched jobs that no thread has started (all of them, or those claimed more
        than ``older_than`` seconds ago) back to ``ready``: fenced, token bumped, not an attempt.

        Returns:
            The number of jobs released.
        """
        now = time.monotonic()
        with self.lock:
            items = [i for i in self.inflight.values()
                     if not i.started and (older_than is None or now - i.claimed_at > older_than)]
            for item in items:  # the threads skip them when they reach them in the queue
                self.unhold_locked(item)
        if not items:
            return 0
        reason = "worker shutdown" if older_than is None else "prefetched job not started in time"
        released = self.release(*items, reason=reason)
        if older_than is not None and released:
            # No thread freed up for ``older_than`` seconds: the durations that sized the prefetch
            # are out of date. Prefetch nothing until a job finishes, or the wake below would
            # claim the same number again at once, to release them again a second later (a
            # token bump and a history entry per job per second, held away from idle workers).
            self.avg_runtime = None
        return released

    def release(self, *items: InFlight, reason: str) -> int:
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
            with self.lock:
                for item in items:
                    if item.job.id not in self.inflight:
                        self.add_locked(item)
            logger.exception("could not release %d prefetched job(s); still holding them", len(items))
            return 0
        for item in items:
            if item.job.id in released:
                signals.emit("released", reason=reason, **job_fields(item.job))
        self.prefetch_released += len(released)
        self.wake()
        return len(released)

    def release_paused(self) -> int:
        """Keep the pause view fresh while unstarted jobs are held, and give back those whose
        queue is paused (fenced, token bumped, not an attempt). The heartbeat calls this each
        round: a refresh once the evidence about a held job's queue is ``PAUSE_GRACE / 2`` old,
        so that threads seldom wait for one.

        Returns:
            The number of jobs released.

        Raises:
            DatabaseError: the read of the paused queues failed.
        """
        with self.lock:
            queues = {i.job.queue for i in self.inflight.values() if not i.started}
        if not queues:
            return 0
        view = self.pause_view
        now = time.monotonic()
        if any(view.age(q, now) >= store.PAUSE_GRACE / 2 for q in queues):
            view.refresh()
        now = time.monotonic()
        paused = {q for q in queues if view.may_start(q, now) is False}
        if not paused:
            return 0
        with self.lock:
            items = [i for i in self.inflight.values() if not i.started and i.job.queue in paused]
            for item in items:  # the threads skip them when they reach them in the queue
                self.unhold_locked(item)
        if not items:
            return 0
        released = self.release(*items, reason=PAUSED_REASON)
        self.pause_released += released
        return released

    # -- threads ----------------------------------------------------------------------------------
    def start_threads(self) -> None:
        """Start the ``concurrency`` handler threads."""
        for _ in range(self.concurrency):
            thread = threading.Thread(target=self._thread_main, name=f"leasequeue-job-{len(self.threads)}",
                                      daemon=True)
            self.threads.append(thread)
            thread.start()

    def stop_threads(self) -> None:
        """Ask every handler thread to exit once it has finished its current job."""
        for _ in self.threads:
            self.tasks.put(None)

    def _thread_main(self) -> None:
        try:
            get = self.tasks.get
            while True:
                item = get()
                if item is None:
                    return
                if self.run_job(item):
                    return
        finally:
            # This thread's connections would otherwise stay open until the process exits (an
            # in-process worker, e.g. in tests, then keeps sessions on the database after it stopped).
            connections.close_all()

    def run_job(self, item: InFlight) -> bool:
        """Run one held job on this thread. Returns True when this thread must retire."""
        if not self.admit(item):
            return False
        started = time.monotonic()
        self.run_started(item, started)
        return False

    def run_started(self, item: InFlight, started: float) -> None:
        """Run the admitted thread job ``item`` on this thread (``started``: monotonic start)."""
        child = self.execution == "process"
        if item.timeout and not child:  # in process mode the executor enforces the timeout itself
            item.deadline = started + item.timeout
        outcome = None
        try:
            # A session of this thread may have died unseen with its server (a restart, a failover)
            # while the thread idled: test it now rather than fail the attempt on it.
            check_connections_after_loss()
            # Process mode: a child takes a second or more to set Django up, so the pause view is
            # asked again when it is ready, just before the handler runs.
            outcome = self.executor.run(item.job, item.ctx, child=child,
                                        may_start=(lambda: self._still_not_paused(item)) if child else None)
        except BaseException:  # noqa: BLE001 - never lose a handler thread
            logger.exception("job %s: worker error outside the handler", item.job.id)
        finally:
            if getattr(_thread_db, "used", False):
                close_broken_connections()
            runtime = time.monotonic() - started
            avg = self.avg_runtime
            self.avg_runtime = runtime if avg is None else avg + RUNTIME_EWMA_WEIGHT * (runtime - avg)
            with self.lock:
                if not item.completing:  # a returned job stays held until its completion is written
                    self.forget_locked(item)
                wake = self._wake_if_refill_locked()
            if wake:
                self.wake()
        if outcome == "not_started":  # its handler never ran: give it back, attempt refunded
            self.pause_released += self.release(item, reason=PAUSED_REASON)

    def admit(self, item: InFlight) -> bool:
        """Decide, just before its handler starts, whether the held job ``item`` may start, and
        mark it started if so. Otherwise it is let go of: given back to ``ready`` (its queue is
        paused, or it is too late by this process's clock) or, its lease lost or a cancel
        requested, dropped (a cancel recorded). Used for thread and async jobs alike.

        Returns:
            True when the handler may start now.
        """
        view = self.pause_view
        if view.may_start(item.job.queue, time.monotonic()) is None and self.holds(item):
            # The evidence that the queue runs is too old to start on: read the paused queues
            # first (or wait for the read another thread has in flight). On a database error the
            # evidence stays stale and the job is released below (if that fails too, it is held
            # again and the heartbeat's next release round gives it back).
            try:
                view.refresh(item.job.queue)
            except DatabaseError:
                logger.warning("job %s: could not read the paused queues; not starting it", item.job.id)
                close_broken_connections()
        with self.lock:
            if self.inflight.get(item.job.id) is not item:
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
            # Nor unless the pause view, checked here, under the lock, just before the start, says
            # its queue ran within PAUSE_GRACE seconds (see PauseView): queue_pause() returns only
            # after such evidence from before the pause has aged past the grace.
            verdict = view.may_start(item.job.queue, now)
            paused = not stale and not too_late and verdict is not True
            if stale or too_late or paused:
                self.unhold_locked(item)
            else:
                item.started = True
        if paused:
            if verdict is None:
                self.release(item, reason="could not confirm that the job's queue is not paused")
            else:
                self.pause_released += self.release(item, reason=PAUSED_REASON)
            return False
        if too_late:
            self.release(item, reason="too late to start the job (lease may be gone)")
            return False
        if stale:
            self._drop_unstarted(item)
            return False
        return True

    # -- async handlers ---------------------------------------------------------------------------
    def start_async(self, items: Sequence[InFlight]) -> None:
        """Start held async jobs on the event loop (started with the first one), each once
        :meth:`admit` lets it start; called by the claim loop right after the claim."""
        admitted = [functools.partial(self._run_async, item) for item in items if self.admit(item)]
        if admitted:
            self._event_loop().spawn(admitted)

    def _event_loop(self) -> AsyncLoop:
        with self._aio_lock:
            if self.aio is None:
                aio = AsyncLoop()
                aio.start()
                self.aio = aio
            return self.aio

    async def _run_async(self, item: InFlight) -> None:
        """One async attempt on the loop: the executor runs and records it; the slot stays taken
        (and the lease renewed) until the handler's coroutine has ended."""
        aio = self.aio
        assert aio is not None
        started = time.monotonic()
        if item.timeout:  # the heartbeat cancels the handler at this deadline (Pool.abandon)
            item.deadline = started + item.timeout

        def handler_started(task: asyncio.Task[Any]) -> None:
            item.handler = task
            aio.handlers.add(task)
            task.add_done_callback(aio.handlers.discard)
            # Timed out, lost, or taken by the worker's stop before the task existed.
            if item.timed_out or item.ctx.lease_lost or item.interrupted:
                task.cancel()

        try:
            await self.executor.run_async(item.job, item.ctx, started=handler_started, in_thread=aio.in_thread,
                                          discarded=lambda: self._async_stopping or item.interrupted)
        except BaseException:  # noqa: BLE001 - never lose the loop
            logger.exception("job %s: worker error outside the async handler", item.job.id)
        finally:
            with self.lock:
                if not item.completing:  # a returned job stays held until its completion is written
                    self.forget_locked(item)
                wake = self._wake_if_async_refill_locked()
            if wake:
                self.wake()

    def cancel_handler(self, item: InFlight) -> None:
        """Cancel the coroutine of the async job ``item`` (thread-safe; nothing for a thread job or
        one whose handler has not started: :meth:`_run_async` cancels it as it starts)."""
        aio = self.aio
        if aio is None or not item.is_async:
            return
        try:
            aio.call(lambda: item.handler.cancel() if item.handler is not None else None)
        except RuntimeError:
            # The worker's stop closed the loop: every handler on it was cancelled then. (Raised
            # into the heartbeat, it would cut short the rest of its round of renewals.)
            pass

    def interrupt_async(self, items: Sequence[InFlight], timeout: float = STOP_WAIT) -> int:
        """The worker's stop, before it gives back the held jobs ``items``: cancel the handlers of
        the async ones (their outcomes are not recorded: the stop releases the jobs) and wait up
        to ``timeout`` seconds for their coroutines to end, so that none still runs when its job
        is released and another worker starts the next attempt. (A thread cannot be stopped so;
        nor can a coroutine that swallows the ``CancelledError`` for longer than ``timeout``.)

        Returns:
            How many of those coroutines were still running after ``timeout`` seconds.
        """
        aio = self.aio
        items = [i for i in items if i.is_async]
        if aio is None or not items:
            return 0
        for item in items:
            item.interrupted = True  # read by _run_async on the loop: discard the outcome

        def cancel() -> None:
            for item in items:
                if item.handler is not None:
                    item.handler.cancel()

        aio.call(cancel)
        deadline = time.monotonic() + timeout
        while (left := sum(self.holds(i) and not i.completing for i in items)) and time.monotonic() < deadline:
            time.sleep(0.02)
        return left

    def check_loop_stall(self, now: float) -> float:
        """Warn (once per stall) when the event loop has been blocked for ``STALL_WARN_AFTER``
        seconds or more at monotonic ``now``; called by the heartbeat. Returns the stall in seconds."""
        aio = self.aio
        if aio is None:
            return 0.0
        stalled = aio.stalled_for(now)
        if stalled < STALL_WARN_AFTER:
            self._stall_warned = False
            return stalled
        if not self._stall_warned:
            self._stall_warned = True
            with self.lock:
                running = sorted(i.job.id for i in self.inflight.values() if i.is_async and i.started)
            logger.warning("the event loop of the async handlers has been blocked for %.1f s: an async handler "
                           "made a blocking call (time.sleep, a synchronous query...); every async job waits, "
                           "timeouts included. Async jobs running: %s", stalled, running[:20])
        return stalled

    def stop_async(self) -> None:
        """The worker's stop, once it released or recorded the jobs still held: cancel the async
        handlers still running (their outcomes are not recorded) and stop the event loop."""
        aio = self.aio
        if aio is None:
            return
        self._async_stopping = True

        def cancel() -> None:
            for task in list(aio.handlers):
                task.cancel()

        aio.stop(cancel)

    def _still_not_paused(self, item: InFlight) -> bool:
        """The pause view's verdict for ``item``'s queue now (refreshed when older than the grace;
        False when it cannot be read): True only on fresh evidence that the queue runs."""
        view = self.pause_view
        if view.may_start(item.job.queue, time.monotonic()) is None:
            try:
                view.refresh(item.job.queue)
            except DatabaseError:
                logger.warning("job %s: could not read the paused queues; not starting it", item.job.id)
                close_broken_connections()
                return False
        return view.may_start(item.job.queue, time.monotonic()) is True

    def _drop_unstarted(self, item: InFlight) -> None:
        """A held job that will not be started (lease lost, or cancel requested): record the
        cancel (fenced; a lost lease was already reported by the heartbeat) and free its slot."""
        if not item.ctx.lease_lost:
            try:
                self.executor.cancel_unstarted(item.job, item.ctx)
            except DatabaseError:
                logger.exception("job %s: could not record its cancel; the lease will expire", item.job.id)
        with self.lock:
            wake = self._wake_if_async_refill_locked() if item.is_async else self._wake_if_refill_locked()
        if wake:
            self.wake()
