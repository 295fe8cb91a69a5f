"""The producer: the worker's claim loop, with prefetch and throttling.

Each round claims up to as many jobs as the pool has free threads, in one statement, and hands
them to the pool. When recent jobs were short it also *prefetches*: it claims a few more jobs than
free threads, as many as the threads are expected to start within ``PREFETCH_WAIT`` seconds (at
most ``PREFETCH_MAX``), so that a busy worker claims in batches instead of one statement per freed
thread. When a queue's rate limit is used up it waits until the window frees (no retry loop).

A claim that raised (the connection dropped while it was in flight: a PgBouncer or PostgreSQL
restarted at that instant) may have committed with its reply lost: its jobs are then leased to
this worker, which never learned of them. Before its next claim the producer gives them back
(:meth:`Producer.release_lost_claims`), found by the claim clock: see
:func:`~django_leasequeue.store.job_release_lost_claims`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from .. import registry, signals, store
from ..exceptions import UnknownTask
from .pool import Pool

logger = logging.getLogger("django_leasequeue.worker")

# Added to a rate-limit wait: the window is closed, so a claim exactly at the boundary still counts.
THROTTLE_MARGIN = 0.005

# Seconds the next claim waits after a claim that leased jobs but fewer than it asked for (the
# queue ran dry: an idle worker woken by a NOTIFY gets its one job so). Claiming again at once
# would find nothing, and its Python work would hold the GIL just as a handler thread picks up the
# job it was handed: measured, that moved the handler's start 0.3-0.4 ms later. Any wake (a
# NOTIFY, a freed thread, a written completion) still cuts the pause short, so a job enqueued
# meanwhile is claimed at once, and a due job found by no claim waits at most this much longer.
AFTER_SHORT_CLAIM = 0.003

# Seconds the claim of async tasks is skipped after one that found none, while the threads are
# busy (saturated, or their claim of the same round got every job it asked for). A worker that
# registers any ``async def`` task otherwise sends a second claim statement with every refill of its
# threads, and during a backlog of thread jobs that claim finds nothing each time: a round trip and
# its Python work per batch (measured: a 1 x 1 no-op drain ran about a fifth slower). With the
# threads not busy (an idle worker woken by a NOTIFY) the async claim is never skipped.
ASYNC_RECHECK = 0.05

# The longest the skip above grows to. Each async claim that finds nothing doubles the next skip, so
# a long backlog of thread jobs costs a few empty async claims, not twenty a second (measured: one
# every 50 ms still left a 1 x 1 drain 10-30 % slower than with no async task registered). A NOTIFY
# of an enqueue (:meth:`Producer.notified`) brings the skip back to ASYNC_RECHECK, so an async job
# enqueued meanwhile waits at most that, and one due later (:meth:`Producer.notified_run_at`) about
# that past its run_at; without notifications it waits at most this.
ASYNC_RECHECK_MAX = 1.0

# The reason of the ``released`` history entry and event of a job given back by release_lost_claims.
LOST_CLAIM_REASON = "claim reply lost"


class Producer:
    """Claims jobs for a :class:`~django_leasequeue.worker.pool.Pool`.

    Args:
        pool: the pool the claimed jobs are handed to.
        queues: queue names to claim from, or None for every queue.
        lease: seconds, the lease of jobs whose task sets none.
        poll_interval: seconds; a throttled claim waits no longer than this.
        worker_id: ``host:pid:name``, recorded as the jobs' holder. alias: the database alias.
        prefetch_wait: seconds of expected queueing a prefetched job may face (0: no prefetch).
        prefetch_max: most jobs held beyond the threads.
        tasks: returns the task names to claim (the worker's registered tasks).
    """

    def __init__(self, *, pool: Pool, queues: Sequence[str] | None, lease: float, poll_interval: float,
                 worker_id: str, alias: str, prefetch_wait: float, prefetch_max: int,
                 tasks: Callable[[], list[str]]) -> None:
        self.pool = pool
        self.queues = queues
        self.lease = lease
        self.poll_interval = poll_interval
        self.worker_id = worker_id
        self.alias = alias
        self.prefetch_wait = prefetch_wait
        self.prefetch_max = prefetch_max
        self.tasks = tasks
        self.claimed = 0
        self.corrupt = 0  # claimed rows that could not be decoded, dead-lettered by the claim
        self.throttled = 0  # claims cut short by a queue rate limit
        self._throttled_until = 0.0
        # The last claim got fewer jobs than free slots: a written completion may free a
        # concurrency-key slot that it found full, so claim again then rather than a poll later.
        self.short_claim = False
        # The last round claimed nothing and the pool holds no job.
        self.drained = False
        # The last round ran a claim that found nothing due (not saturated, not throttled): the
        # worker then looks up when its next job is due.
        self.found_nothing = False
        # time.monotonic() at the start of the last claim statement, and at the start of the last
        # round's first one (the thread claim, when an async claim followed it): the idle wait looks
        # for the next run_at from there, so a job due between the two claims is not skipped.
        self.claim_started = 0.0
        self.round_started = 0.0
        # The latest claim clock received (ClaimResult.clock_us; before the first claim, the clock
        # read then), in epoch microseconds: every job this worker holds was leased at or before it.
        self.claim_clock_us: int | None = None
        # A claim raised: it may have committed jobs to this worker that it never learned of.
        self.claim_unsure = False
        # Jobs of claims whose reply was lost, given back (counted as claimed and as released).
        self.lost_claim_released = 0
        # The last split of the task names into thread and async tasks (see split_tasks()).
        self._split: tuple[tuple[str, ...], list[str], list[str]] | None = None
        # time.monotonic() until which the async claim is skipped while the threads are busy: the
        # last one found nothing (see ASYNC_RECHECK); the next skip's length, and when the last
        # async claim was sent.
        self.async_empty_until = 0.0
        self.async_recheck = ASYNC_RECHECK
        self.async_claimed_at = 0.0
        # time.monotonic() of the earliest run_at notified as due later and not yet claimed for
        # (see notified_run_at()), or None.
        self.async_due_at: float | None = None

    def prefetch_allowance(self) -> int:
        """How many jobs to hold beyond the threads: as many as the threads are expected to start
        within ``prefetch_wait`` seconds, by the moving average of recent job durations (Little's
        law), at most ``prefetch_max``. 0 until jobs have been timed, and for slow jobs."""
        avg = self.pool.avg_runtime
        if avg is None or self.prefetch_wait <= 0 or self.prefetch_max <= 0:
            return 0
        return min(self.prefetch_max, int(self.pool.concurrency * self.prefetch_wait / max(avg, 1e-6)))

    def claim(self) -> float | None:
        """Claim one batch and hand it to the pool.

        Returns:
            Seconds to wait before the next round: 0.0 after a claim that got every job it asked
            for, :data:`AFTER_SHORT_CLAIM` after one that got fewer (but some), the rest of a
            rate-limit window, the rest of :data:`ASYNC_RECHECK` when the threads are saturated
            and the async claim was skipped; None when the pool is saturated or nothing was due
            (the worker waits its idle wait; :attr:`drained` tells whether the pool is empty too).
        """
        self.drained = False
        self.found_nothing = False
        if self.claim_unsure:
            # Before anything else (a DatabaseError here skips this round, and the next one tries
            # again): the jobs of a claim whose reply was lost are due at once, not after a lease.
            self.release_lost_claims()
        now = time.monotonic()
        if now < self._throttled_until:
            # A rate limit used up the allowance: a NOTIFY or a freed slot must not make us claim
            # (and be refused) again before the window frees.
            return self._throttled_until - now
        pool = self.pool
        names = self.tasks()
        sync_names, async_names = self.split_tasks(names)
        # A worker with no async task claims on its threads as it always did (also with no task
        # at all: that claim finds nothing, and a burst worker learns it is drained).
        claim_sync = bool(sync_names) or not async_names
        extra = self.prefetch_allowance()
        with pool.lock:
            want = want_async = 0
            if claim_sync:
                held = pool.busy_locked()
                # Without prefetch: claim as soon as one thread is free. With it: once half the
                # prefetched jobs were taken, so each claim brings a batch, not one job per freed thread.
                pool.refill_at = pool.concurrency - 1 + extra // 2
                # Decided under the lock, so a job finishing right now sees the flag and wakes us.
                pool.saturated = held > pool.refill_at
                if not pool.saturated:
                    want = pool.concurrency + extra - held
            if async_names:
                # The event loop's slots are filled apart from the threads, without prefetch: an
                # async job starts on the loop as soon as it is claimed.
                free = pool.async_slots - pool.busy_async_locked()
                pool.async_saturated = free <= 0 or (pool.async_saturated and free < pool.async_refill)
                if not pool.async_saturated:
                    want_async = free
            if not want and not want_async:
                return None
            # Read before the claim: a job of ours that ends after the claim's snapshot (a failed
            # attempt whose retry is due at once) is then not taken for "nothing left".
            idle = not pool.inflight
        if self.claim_clock_us is None:
            self.claim_clock_us = store.claim_clock_us(alias=self.alias)
        got = 0
        short = ran_dry = async_skipped = sent = False
        throttle_waits: list[float] = []
        for kind_names, kind_want, is_async in ((sync_names, want, False), (async_names, want_async, True)):
            if kind_want <= 0:
                continue
            if is_async and now < self.async_empty_until and claim_sync and (not want or got >= want):
                # The threads are busy and no async job was due a moment ago: the refill of the
                # threads claims for them alone (ASYNC_RECHECK).
                async_skipped = True
                continue
            if is_async and ran_dry:
                # The thread claim just ran dry: its jobs start first, and the async claim comes
                # with the next round, AFTER_SHORT_CLAIM later (claiming now would hold the GIL
                # as the handler thread wakes, which is the idle latency this pause exists for).
                continue
            jobs = self._claim_batch(kind_names, kind_want, now)
            if not sent:
                self.round_started, sent = self.claim_started, True
            got += len(jobs)
            if is_async:
                self._note_async_claim(now, found=bool(jobs))
            items = [pool.hold(job) for job in jobs]
            with pool.lock:
                for item in items:
                    pool.add_locked(item)
                if is_async:
                    pool.async_saturated = len(jobs) >= kind_want
                else:
                    pool.saturated = len(jobs) >= kind_want
            if is_async:
                pool.start_async(items)
            else:
                put = pool.tasks.put
                for item in items:
                    put(item)
            if len(jobs) < kind_want:
                short = True
                # Leased some but not all: the queue ran dry as these jobs start (AFTER_SHORT_CLAIM).
                # A claim that found nothing says no such thing of the other kind's jobs.
                ran_dry = ran_dry or bool(jobs)
                if jobs.throttle_wait is not None:
                    throttle_waits.append(jobs.throttle_wait)
        self.short_claim = short
        if throttle_waits:
            # Throttled: sleep until the oldest claim leaves the window (capped by the poll
            # interval, so other queues of this worker wait no longer than polling would make them).
            self.throttled += 1
            delay = min(self.poll_interval, min(throttle_waits) + THROTTLE_MARGIN)
            self._throttled_until = time.monotonic() + delay
            return delay
        if got:
            # Ran dry: let the threads start what they were handed before the next claim runs.
            return AFTER_SHORT_CLAIM if ran_dry else 0.0
        if async_skipped or (async_names and claim_sync and not want):
            # The threads are saturated and no async job is due: the async claim waits for the end
            # of its skip (a freed thread or any other wake may come first), neither for the poll
            # interval nor through the idle wait's look for the next run_at.
            return max(0.0, self.async_empty_until - now)
        self.drained = idle
        self.found_nothing = True
        return None

    def _note_async_claim(self, now: float, *, found: bool) -> None:
        """Record an async claim sent at monotonic ``now``: one that found jobs ends the skip; one
        that found none skips the async claim for :attr:`async_recheck` seconds while the threads
        are busy, and doubles the next skip (up to :data:`ASYNC_RECHECK_MAX`)."""
        self.async_claimed_at = now
        due = self.async_due_at
        if due is not None and due <= now:
            self.async_due_at = due = None  # this claim looked for it
        if found:
            self.async_empty_until, self.async_recheck = 0.0, ASYNC_RECHECK
        else:
            self.async_empty_until = now + self.async_recheck
            if due is not None:  # a job notified as due later: the skip ends by its run_at
                self.async_empty_until = min(self.async_empty_until, max(due, now + ASYNC_RECHECK))
            self.async_recheck = min(self.async_recheck * 2, ASYNC_RECHECK_MAX)

    def notified(self) -> None:
        """A NOTIFY said that a job of a served queue was enqueued, due now (called on the
        listener's thread): it may be an async job, so the async claim's skip ends
        :data:`ASYNC_RECHECK` after the last async claim at the latest, and grows again from there."""
        self.async_recheck = ASYNC_RECHECK
        self.async_empty_until = min(self.async_empty_until, self.async_claimed_at + ASYNC_RECHECK)

    def notified_run_at(self, at: float) -> None:
        """A NOTIFY said that a job of a served queue becomes due at ``at`` (POSIX seconds, database
        clock: a delayed enqueue, a retry, a snooze; called on the listener's thread). It may be an
        async job, and no NOTIFY comes when it falls due: the async claim's skip ends by then (but
        not sooner than :data:`ASYNC_RECHECK` after the last async claim), and a claim that still
        finds it not due backs off from ASYNC_RECHECK again, not from the grown skip."""
        clock_us = self.claim_clock_us
        if clock_us is None:  # no claim sent yet: nothing is skipped
            return
        # The database clock read by the latest claim, taken as read when that claim started: the
        # estimate errs early (by the claim's round trip), which costs one empty claim at most.
        due = self.claim_started + (at - clock_us / 1e6)
        # Kept until an async claim is sent after it (a skip that ends first must not grow past it).
        self.async_due_at = due if self.async_due_at is None else min(self.async_due_at, due)
        until = max(due, self.async_claimed_at + ASYNC_RECHECK)
        if until < self.async_empty_until:
            self.async_empty_until = until

    def split_tasks(self, names: list[str]) -> tuple[list[str], list[str]]:
        """``names`` split into the tasks run on the handler threads and the ``async def`` tasks run
        on the event loop (none when the pool has no async slots). Cached by the list of names."""
        if self.pool.async_slots <= 0:
            return names, []
        key = tuple(names)
        cached = self._split
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]
        sync_names: list[str] = []
        async_names: list[str] = []
        for name in names:
            try:
                is_async = registry.get_task(name).is_async
            except UnknownTask:
                is_async = False
            (async_names if is_async else sync_names).append(name)
        self._split = (key, sync_names, async_names)
        return sync_names, async_names

    def _claim_batch(self, names: list[str], want: int, sent_at: float) -> store.ClaimResult:
        """Claim up to ``want`` jobs of the tasks ``names``; record the claim (clock, corrupt rows,
        counts, the pause view's evidence: ``sent_at`` was read before the claim was sent)."""
        self.claim_started = time.monotonic()
        # Set until the claim's result is in hand: whatever made it raise (the connection dropped
        # in flight, or a later part of a fair claim failed after the first had committed), rows it
        # leased may be committed.
        self.claim_unsure = True
        jobs = store.job_claim(queues=self.queues, limit=want, worker_id=self.worker_id, lease=self.lease,
                               alias=self.alias, tasks=names)
        self.claim_unsure = False
        if jobs.clock_us is not None:
            self.claim_clock_us = max(self.claim_clock_us or 0, jobs.clock_us)
        for job_id, task, reason in jobs.corrupt:  # dead-lettered by the claim, never run
            signals.emit("dead_lettered", job_id=job_id, task=task, error="CorruptRow", message=reason)
        self.corrupt += len(jobs.corrupt)
        self.claimed += len(jobs)
        self.pool.pause_view.claimed(sent_at, jobs)
        return jobs

    def release_lost_claims(self) -> int:
        """Give back the jobs that this worker's claims leased after the latest claim result it
        received: those of a claim that raised (its reply lost with the connection), which no
        thread of this worker holds or ever will. Released as a prefetched job that never ran is:
        ``ready`` at once, the attempt not counted, the token bumped.

        Released rather than adopted into the pool: the claim's rows (arguments, trace context) were
        lost with its reply, so adopting would need a read and decode path of its own, and the
        free threads the claim was sized for may be taken by then. Released, they are due at once
        and the very next claim (this worker's or another's) takes them like any ready job.

        Returns:
            The number of jobs released.

        Raises:
            DatabaseError: the release failed; :attr:`claim_unsure` stays set, so the next
            round tries again before it claims.
        """
        if self.claim_clock_us is None:  # no claim was sent
            self.claim_unsure = False
            return 0
        released = store.job_release_lost_claims(self.worker_id, since_us=self.claim_clock_us,
                                                 reason=LOST_CLAIM_REASON, alias=self.alias)
        self.claim_unsure = False
        for job_id in sorted(released):
            signals.emit("released", job_id=job_id, reason=LOST_CLAIM_REASON)
        self.lost_claim_released += len(released)
        if released:
            logger.warning("worker %s: gave back %d job(s) leased by a claim whose reply was lost: %s",
                           self.worker_id, len(released), sorted(released))
        return len(released)
