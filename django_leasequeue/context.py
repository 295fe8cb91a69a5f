"""The :class:`JobContext` handed to ``takes_context=True`` handlers."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.db import DatabaseError, transaction

from .conf import get_settings
from .exceptions import JobCancelled, JobTimedOut, LeaseLost
from .payload import encode_result
from .runtime import close_broken_connections, db_error_kind, is_connection_error

if TYPE_CHECKING:
    from .store import ClaimedJob, DependencyOutcome

logger = logging.getLogger("django_leasequeue.context")

P = ParamSpec("P")
T = TypeVar("T")

# Decides, between the heartbeat (which times a handler out) and the handler's thread (which
# reports that it returned), which came first; held for a few instructions, once per job.
_TIMEOUT_LOCK = threading.Lock()


class FencedCompletion:
    """What ``with ctx.fenced_atomic() as fence:`` yields: sets the result the completion writes.

    Attributes:
        has_result (bool): True once :meth:`set_result` was called.
        result_json (str | None): the result as JSON text, or None (no result).
    """

    __slots__ = ("has_result", "result_json")

    def __init__(self) -> None:
        self.has_result = False
        self.result_json: str | None = None

    def set_result(self, value: Any) -> None:
        """Make ``value`` the job's result, committed with the job's completion at the end of the
        block (and passed to dependents that take results). A later call replaces an earlier one;
        ``None`` means no result.

        Args:
            value: any JSON-compatible value, at most ``MAX_RESULT_BYTES`` as JSON.

        Raises:
            PayloadNotSerializable: ``value`` is not JSON.
            ResultTooLarge: its JSON is over ``MAX_RESULT_BYTES``.
        """
        self.result_json = None if value is None else encode_result(value, get_settings().max_result_bytes)
        self.has_result = True


@dataclass(eq=False)
class JobContext:
    """What a running handler knows about its job and lease.

    Attributes:
        job_id (int): the job's primary key.
        task (str), queue (str): the job's task name and queue.
        attempt (int): 1 for the first claim, 2 for the first retry, ...
        max_attempts (int): attempts before the job is dead-lettered.
        lease_version (int): the fencing token of this attempt. Writes conditioned on it fail once
            another worker holds the job.
        worker_id (str): ``host:pid:name`` of this worker.
        leased_until (datetime): aware, database time, updated by each renewal.
        lease_seconds (float): lease length.
        timed_out (bool): True once the handler ran past its task's ``timeout``. The worker keeps
            the lease until the handler returns, then records the attempt as failed
            (:class:`~django_leasequeue.exceptions.JobTimedOut`) whatever the handler returned;
            ``fenced_atomic()`` refuses to commit from then on.
        claim (store.ClaimedJob | None): the claim this attempt runs under (set by the worker).
        attempt_data (dict): what the executor's attempt hooks carry from the attempt's start to
            its end, each under a key of its own.
    """

    job_id: int
    task: str
    queue: str
    attempt: int
    max_attempts: int
    lease_version: int
    worker_id: str
    leased_until: datetime
    lease_seconds: float
    alias: str = "default"
    # Plain flags, not threading.Event: they are only ever set once and read (a bool assignment is
    # atomic under the GIL), and two Events per job were a measurable part of the per-job cost.
    _lost: bool = field(default=False, repr=False)
    _cancel: bool = field(default=False, repr=False)
    completed_in_transaction: bool = False
    # True when fenced_atomic() wrote the job's result itself (fence.set_result()): the value the
    # handler returns afterwards is then not stored over it.
    fenced_result: bool = False
    timed_out: bool = False
    claim: ClaimedJob | None = field(default=None, repr=False)
    _returned: bool = field(default=False, repr=False)
    attempt_data: dict[str, Any] = field(default_factory=dict, repr=False)

    def time_out(self) -> bool:
        """Mark the attempt timed out unless its handler already returned (called by the worker
        at the task's timeout). Returns True when this call timed it out."""
        with _TIMEOUT_LOCK:
            if self._returned or self.timed_out:
                return False
            self.timed_out = True
            return True

    def handler_returned(self) -> bool:
        """Record that the handler returned (or raised); from now on it cannot time out.
        Returns True when it had timed out before (its outcome is then the timeout failure)."""
        with _TIMEOUT_LOCK:
            self._returned = True
            return self.timed_out

    @property
    def lease_lost(self) -> bool:
        """True once this worker is known to have lost the lease (its outcome will be discarded)."""
        return self._lost

    @property
    def cancel_requested(self) -> bool:
        """True once an operator asked to cancel the job (seen at the latest heartbeat)."""
        return self._cancel

    def mark_lease_lost(self) -> None:
        """Record that the lease is gone (called by the heartbeat and by fenced writes)."""
        self._lost = True

    def mark_cancel_requested(self) -> None:
        """Record that a cancel was requested (called by the heartbeat)."""
        self._cancel = True

    def check_lease(self) -> None:
        """Raise :class:`LeaseLost` if the lease is known to be lost. Cheap: reads a flag."""
        if self.lease_lost:
            raise LeaseLost(f"job {self.job_id}: lease {self.lease_version} was lost")

    def check_cancel(self) -> None:
        """Raise :class:`JobCancelled` if an operator asked to cancel the job."""
        if self.cancel_requested:
            raise JobCancelled(f"job {self.job_id} was cancelled")

    def heartbeat(self) -> bool:
        """Renew the lease now, by ``lease_seconds`` from the database clock.

        Returns:
            True when renewed; False when the lease is lost (``lease_lost`` becomes True).
        """
        from . import store

        renewed = store.job_renew([(self.job_id, self.lease_version, self.lease_seconds)], alias=self.alias)
        renewal = renewed.get(self.job_id)
        if renewal is None:
            self.mark_lease_lost()
            return False
        self.leased_until = renewal.leased_until
        if renewal.cancel_requested:
            self.mark_cancel_requested()
        return True

    @contextmanager
    def fenced_atomic(self) -> Iterator[FencedCompletion]:
        """Run a block in a transaction that commits only if this worker still holds the lease,
        and marks the job ``done`` in that same transaction.

        It yields a :class:`FencedCompletion`: ``fence.set_result(value)`` inside the block makes
        ``value`` the job's result, written with the completion. A job whose result its
        dependents receive (a chain's next step, a chord's callback) must set it so: they are
        released by that same commit, before the handler can return anything. A value returned
        after the block is still stored on the job, a moment later, but dependents released by
        the commit do not receive it (the job's history then says so, ``result_after_release``).

        The job row is locked and its fencing token re-checked first, so a stale worker (one that
        was paused past its lease while another took the job) gets :class:`LeaseLost` and its
        writes roll back: the handler's rows and the job's completion commit together or not at
        all. Use it for the handler's final, business writes, on the job table's database.

        A cancel request committed before the row lock is taken refuses the commit too
        (:class:`JobCancelled`; the job then ends ``cancelled``); one made after it waits for this
        transaction and finds the job done.

        A connection lost while committing (a restart of the server or of a pooler such as
        PgBouncer) leaves the commit's fate unknown: the job row is then read on a new connection,
        and when the commit landed the block ends normally, as if the reply had arrived.

        It must be the outermost transaction (``durable``): inside another ``atomic()`` block its
        "commit" would only release a savepoint, and the outer block could still roll back the job's
        completion. It may be used once per attempt, since it completes the job.

        Raises:
            LeaseLost: the token is stale; nothing inside the block was committed.
            JobCancelled: an operator asked to cancel the job; nothing inside the block was committed.
            JobTimedOut: the handler ran past its task's timeout (before the block or while it
                ran); nothing inside the block was committed.
            RuntimeError: used inside another ``atomic()`` block, or a second time in one attempt.
            PayloadNotSerializable, ResultTooLarge: from ``fence.set_result()`` (raised there,
                inside the block); if it leaves the block, nothing inside it was committed.
        """
        from . import store

        if self.completed_in_transaction:
            raise RuntimeError(f"job {self.job_id}: fenced_atomic() already completed this attempt; "
                               "put all the fenced writes in one block")
        committing = False
        try:
            with transaction.atomic(using=self.alias, durable=True):
                state = store.job_lock_for_commit(self.job_id, self.lease_version, alias=self.alias)
                if state == "lost":
                    self.mark_lease_lost()
                    raise LeaseLost(f"job {self.job_id}: lease {self.lease_version} was lost before commit")
                if state == "cancel_requested":
                    self.mark_cancel_requested()
                    raise JobCancelled(f"job {self.job_id} was cancelled; its work was not committed")
                self._refuse_if_timed_out()
                fence = FencedCompletion()
                yield fence
                # Checked again after the block: the timeout may have passed while it ran, and the
                # attempt is then already recorded as timed out (its retry waits for this thread).
                self._refuse_if_timed_out()
                done = store.job_complete([(self.job_id, self.lease_version, fence.result_json)], alias=self.alias)
                if self.job_id not in done:  # cannot happen while we hold the row lock; be loud if it does
                    raise LeaseLost(f"job {self.job_id}: completion refused inside fenced_atomic")
                # Set before the commit, so that a heartbeat renewal that finds the job done right
                # after it (another thread) knows the job was completed here, not taken over.
                self.completed_in_transaction = True
                self.fenced_result = fence.has_result
                committing = True  # whatever is raised from here on comes from the COMMIT
        except BaseException as exc:
            if committing and self._commit_landed(exc):
                return  # committed: only the server's reply to the COMMIT was lost
            self.completed_in_transaction = False  # nothing was committed
            self.fenced_result = False
            raise

    async def afenced_atomic(self, fn: Callable[Concatenate[FencedCompletion, P], T], /,
                             *args: P.args, **kwargs: P.kwargs) -> T:
        """The ``async def`` handler's :meth:`fenced_atomic`: run ``fn(fence, *args, **kwargs)``, a
        plain (sync) function doing the handler's final writes with the ORM, inside
        ``fenced_atomic()`` on a thread, and return what it returns.

        Django's ORM cannot run on the event loop, and a transaction cannot span ``await``: the
        whole block (lock and token check, ``fn``'s writes, the job's completion, the commit) runs
        in one call of ``sync_to_async(thread_sensitive=False)``, on one of the worker's recording
        threads with its own connection. ``thread_sensitive=False`` because the block opens and
        commits its own transaction, so it needs no particular thread, and the default
        (``True``) would pass every async job's transaction through one shared thread, one at a
        time. Everything :meth:`fenced_atomic` guarantees holds: a stale token raises
        :class:`LeaseLost` and nothing is committed.

        Cancelled while the block runs (the task's timeout), it waits for the block to end before
        it raises ``CancelledError``: the transaction then refuses to commit (the attempt timed
        out, :class:`JobTimedOut`), and the handler's slot and lease are not let go of while it
        still runs.

        Args:
            fn: called as ``fn(fence, *args, **kwargs)`` with the :class:`FencedCompletion`.

        Returns:
            What ``fn`` returned.

        Raises:
            LeaseLost, JobCancelled, JobTimedOut, RuntimeError: as :meth:`fenced_atomic`; and
            what ``fn`` raised (nothing was committed then).
        """
        def run() -> T:
            with self.fenced_atomic() as fence:
                return fn(fence, *args, **kwargs)

        block = asyncio.ensure_future(sync_to_async(run, thread_sensitive=False)())
        try:
            return await asyncio.shield(block)
        except asyncio.CancelledError:
            while not block.done():  # the thread runs on: wait for its transaction to end
                try:
                    await asyncio.wait((block,))
                except asyncio.CancelledError:
                    continue
            if not block.cancelled():
                block.exception()  # retrieved, so that asyncio does not log it as never retrieved
            raise

    async def aheartbeat(self) -> bool:
        """The ``async def`` handler's :meth:`heartbeat` (``manual_heartbeat`` tasks): renew the
        lease now, on a thread (``sync_to_async(thread_sensitive=False)``).

        Returns:
            True when renewed; False when the lease is lost.
        """
        renewed: bool = await sync_to_async(self.heartbeat, thread_sensitive=False)()
        return renewed

    def _commit_landed(self, exc: BaseException) -> bool:
        """Whether the COMMIT of :meth:`fenced_atomic`, which raised ``exc``, landed all the same.

        A connection lost once the COMMIT was sent (a restarted server or pooler, a terminated
        session) leaves it unknown: the server may have committed and only its reply be lost. The
        job row, read on a new connection, tells: done under this attempt's token means committed
        (only this token's holder completes a job under that token). Any other error is the
        server's answer: nothing was committed.

        The read is asked again while the database refuses connections and while the row is still
        locked by that commit (running on the server after its client went away), for at most
        half the lease: the heartbeat does not renew a job whose completion may have landed. When
        it cannot be read, the commit is taken as not landed: the attempt fails, and the failure's
        refused write then finds the job done under this token
        (:func:`~django_leasequeue.attempt_events.report_lease_lost`), so no lost lease is recorded.

        Returns:
            True when the job is done under this token: the block's writes and the completion
            are committed.
        """
        from . import store

        if not isinstance(exc, DatabaseError) or not is_connection_error(exc):
            return False
        deadline = time.monotonic() + self.lease_seconds / 2
        delay = 0.05
        while True:
            close_broken_connections()
            try:
                settled = store.job_settled_under([(self.job_id, self.lease_version)], alias=self.alias)
            except DatabaseError as read_error:
                # Unreachable, or the row still locked by the commit in flight: ask again.
                if db_error_kind(read_error) == "data" or time.monotonic() + delay > deadline:
                    logger.warning("job %s: the connection was lost as fenced_atomic() committed, and the job "
                                   "could not be read to learn whether the commit landed: %s", self.job_id,
                                   read_error)
                    return False
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            landed = settled.get(self.job_id) == "done"
            logger.warning("job %s: the connection was lost as fenced_atomic() committed (%s); the job row "
                           "shows the commit %s", self.job_id, str(exc).splitlines()[0] if str(exc) else
                           type(exc).__name__, "landed" if landed else "did not land")
            return landed

    def dependencies(self) -> dict[str, DependencyOutcome]:
        """This job's dependencies (a workflow step's, or ``enqueue(depends_on=...)``'s), read now.

        A step that runs anyway after a dependency died (``on_dependency_dead="run"``) finds the
        failure here: its ``status`` is ``"dead"`` (or ``"cancelled"``) and ``error`` its last error.

        Returns:
            ``{name: DependencyOutcome}`` in declaration order, keyed by step name (by job id as
            text for a dependency outside the workflow); empty for a job without dependencies.
        """
        from . import store

        return {d.name: d for d in store.job_dependencies(self.job_id, alias=self.alias)}

    def workflow_id(self) -> int | None:
        """The id of this job's workflow or batch (``WorkflowHandle(id)``), or None, read now."""
        from .models import Job

        value: int | None = Job.objects.using(self.alias).filter(id=self.job_id).values_list(
            "workflow_id", flat=True).first()
        return value

    def _refuse_if_timed_out(self) -> None:
        if self.timed_out:
            raise JobTimedOut(f"job {self.job_id}: attempt {self.attempt} ran past its task's timeout; "
                              "fenced_atomic() refused to commit")
