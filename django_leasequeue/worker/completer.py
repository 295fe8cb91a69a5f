"""The completer: writes the worker's successful completions in batches.

One fenced ``UPDATE ... FROM unnest`` every few milliseconds instead of one transaction per job. A
completion is fenced on the job's token, not on the clock, so writing it late is safe: while the
database is away the completions stay queued (and the worker keeps renewing those leases), and a
batch the database refuses on its data is written one row at a time so that one bad row fails only
its own job. :class:`~django_leasequeue.worker.WorkerService` owns one and starts it.
"""

from __future__ import annotations

import functools
import logging
import queue as queue_module
import time
from collections.abc import Callable, Sequence

from django.db import DatabaseError

from .. import signals, store
from ..attempt_events import ctx_fields, end_attempt, end_settled_attempt, report_lease_lost
from ..attempt_hooks import _HOOKS, attempt_ended
from ..context import JobContext
from ..executor import with_reconnect
from ..failures import describe_error
from ..runtime import ERROR_BACKOFF_MAX, Service, close_broken_connections, db_error_kind

logger = logging.getLogger("django_leasequeue.worker")


class Completer(Service):
    """Batches successful completions into one fenced statement per flush.

    Args:
        alias: the database alias.
        gather: seconds to let a batch gather before a flush.
        max_batch: most completions per statement.
        on_flush: called after completions were written (a concurrency slot may be free).
        on_settled: called with the contexts whose completion was decided (written, refused for a
            lost lease or cancel, or recorded as a failed attempt), from the thread that flushed
            them; the worker stops renewing those leases then. Completions kept for a later flush
            (the database is unreachable) are not settled.
        retry_cap: returns the longest wait in seconds after failed flushes (the worker passes a
            third of the shortest lease it holds); None: the general 30 s cap.
        synchronous_commit: False commits completions without waiting for the WAL flush.
    """

    name = "completer"

    def __init__(self, *, alias: str, gather: float = 0.002, max_batch: int = 1000,
                 on_flush: Callable[[], None] | None = None, synchronous_commit: bool = True,
                 on_settled: Callable[[Sequence[JobContext]], None] | None = None,
                 retry_cap: Callable[[], float] | None = None) -> None:
        super().__init__()
        self.alias = alias
        self.on_flush = on_flush  # called after completions were written (a concurrency slot may be free)
        self.on_settled = on_settled
        self.retry_cap = retry_cap
        self.gather = gather
        self.max_batch = max_batch
        self.synchronous_commit = synchronous_commit
        self._idle = True
        self._queue: queue_module.SimpleQueue[tuple[JobContext, str | None]] = queue_module.SimpleQueue()
        self.completed = 0

    @property
    def error_backoff_max(self) -> float:
        """Seconds: after failed flushes (a database outage) retry well within the shortest lease
        held, so that the completions are written while those leases can still be renewed (the
        general 30 s cap would outlast them)."""
        if self.retry_cap is None:
            return ERROR_BACKOFF_MAX
        return min(ERROR_BACKOFF_MAX, self.retry_cap())

    @property
    def pending(self) -> bool:
        """True while completions are queued and not yet written."""
        return not self._queue.empty()

    def submit(self, ctx: JobContext, result_json: str | None) -> None:
        """Queue a success for the next flush (within a few milliseconds)."""
        self._queue.put((ctx, result_json))
        if self._idle:  # only an idle completer needs waking; a busy one flushes the queue anyway
            self.wake()

    def run_once(self) -> float:
        # Declared idle *before* looking at the queue: a submit that lands after the check sees
        # the flag and wakes us, one that landed before it is found by the check.
        self._idle = True
        if self._queue.empty():
            return 1.0
        self._idle = False
        time.sleep(self.gather)  # let a batch gather; completion latency is not on the claim path
        try:
            self.flush()
        except Exception:
            # Backing off after a failed flush counts as idle: a new submission wakes us to try
            # again at once, rather than waiting out the backoff.
            self._idle = True
            raise
        return 0.0

    def flush(self) -> None:
        """Write every queued completion now (batches of ``max_batch``).

        Raises:
            DatabaseError: the database is unreachable (or answered with a transient error); the
                completions not written are queued again for the next flush.
        """
        while not self._queue.empty():
            batch: list[tuple[JobContext, str | None]] = []
            while len(batch) < self.max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            items = [(c.job_id, c.lease_version, r) for c, r in batch]
            try:
                done = with_reconnect(functools.partial(
                    store.job_complete, items, alias=self.alias, synchronous_commit=self.synchronous_commit))
            except DatabaseError as exc:
                if db_error_kind(exc) != "data":
                    # The database is unreachable (or busy). Keep them for the next flush:
                    # completion is fenced on the token, not on the clock, so writing it late
                    # is safe (the heartbeat keeps renewing these leases meanwhile).
                    for item in batch:
                        self._queue.put(item)
                    raise
                # One row the database refuses (a value jsonb cannot hold) must not block every
                # other completion: write them one by one and record the refused ones as failed
                # attempts with their own error.
                close_broken_connections()
                done, failed = self._complete_one_by_one(batch)
            else:
                failed = set()
            self.completed += len(done)
            if self.on_settled is not None:
                self.on_settled([ctx for ctx, _ in batch])
            if self.on_flush is not None:
                self.on_flush()
            report = signals.enabled("succeeded")
            for ctx, _ in batch:
                if ctx.job_id in done:
                    if report:
                        signals.emit("succeeded", **ctx_fields(ctx))
                    if _HOOKS:
                        attempt_ended(ctx, "succeeded")
                    continue
                fields = ctx_fields(ctx)
                if ctx.job_id in done.cancelled:  # cancel requested while it ran: result discarded
                    ctx.mark_cancel_requested()
                    end_attempt(ctx, "cancelled", **fields)
                elif ctx.job_id in failed:  # refused by the database: already recorded (and emitted)
                    continue
                elif not ctx.lease_lost:  # a loss the heartbeat found was reported already
                    settled = report_lease_lost(ctx, write="complete", fields=fields)
                    if settled is not None:
                        # Not lost: this completion had landed on a connection that dropped before
                        # its reply came back, and with_reconnect()'s second try found it done.
                        self.completed += settled == "done"
                        end_settled_attempt(ctx, settled, fields, write="complete")

    def _complete_one_by_one(self, batch: list[tuple[JobContext, str | None]]) -> tuple[store.Completed, set[int]]:
        """Write ``batch`` one completion at a time; a completion the database refuses (e.g. a
        result jsonb cannot hold) becomes a failed attempt with that error (dead: the same result
        would be refused again). Returns the completions written and the ids recorded as failed.
        On a connection (or transient) error, this item and every later one go back on the queue
        and the error is raised (none is lost); the contexts decided before it are settled."""
        done = store.Completed()
        failed: set[int] = set()
        for index, (ctx, result) in enumerate(batch):
            try:
                one = store.job_complete([(ctx.job_id, ctx.lease_version, result)], alias=self.alias)
            except DatabaseError as exc:
                if db_error_kind(exc) != "data":
                    self._requeue(batch, index)
                    raise
                logger.exception("job %s: the database refused its result", ctx.job_id)
                close_broken_connections()
                error = describe_error(exc, attempt=ctx.attempt, worker=ctx.worker_id)
                try:
                    outcome = store.job_fail(ctx.job_id, ctx.lease_version, error, retry_delay=None, alias=self.alias)
                except DatabaseError as fail_exc:
                    if db_error_kind(fail_exc) != "data":
                        self._requeue(batch, index)
                        raise
                    # Not even the failure could be written: the lease will expire and the job be
                    # retried. Not a lost lease, and no reason to drop the rest of the batch.
                    close_broken_connections()
                    logger.exception("job %s: could not record the refused result; the lease will expire",
                                     ctx.job_id)
                    failed.add(ctx.job_id)
                    continue
                if outcome is None:
                    continue  # the token moved on meanwhile: reported as a lost lease by flush()
                failed.add(ctx.job_id)
                fields = {**ctx_fields(ctx), "error": error["type"]}
                if outcome[0] == "cancelled":
                    end_attempt(ctx, "cancelled", **fields)
                else:
                    end_attempt(ctx, "dead_lettered", message=error["message"], **fields)
                continue
            done.update(one)
            done.cancelled.update(one.cancelled)
        return done, failed

    def _requeue(self, batch: list[tuple[JobContext, str | None]], index: int) -> None:
        """Queue ``batch[index:]`` again for the next flush; settle the ones decided before it."""
        for item in batch[index:]:
            self._queue.put(item)
        if index and self.on_settled is not None:
            self.on_settled([ctx for ctx, _ in batch[:index]])

    def on_stop(self) -> None:
        try:
            self.flush()
        except DatabaseError:
            logger.exception("completer: final flush failed; those jobs will be retried after their lease")
