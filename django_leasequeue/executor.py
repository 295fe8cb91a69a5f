"""Run ONE claimed job: resolve its task, call the handler, classify the outcome, report it.

Outcomes and what is written (all fenced on the job's token, through :mod:`store`):

* handler returns a JSON value -> ``done`` (batched by the worker's completer), or already done
  inside ``fenced_atomic()``;
* handler raises anything, ``BaseException`` included (``SystemExit``, ``KeyboardInterrupt``,
  ``MemoryError`` ...) -> a failed attempt: retry after backoff, or ``dead`` when attempts are
  exhausted; a non-JSON return value is a failed attempt too (case C25). The task's ``retry_on``
  and ``discard_on`` may dead-letter it at once, and ``Retry(...)`` picks the retry's time
  (:func:`~django_leasequeue.retry.decide`);
* ``Snooze(seconds)`` raised or returned -> ``ready`` again later, not a failure;
* ``JobCancelled`` (from ``ctx.check_cancel()``) -> ``cancelled``; once a cancel was requested,
  any other outcome ends ``cancelled`` too (the store refuses to mark such a job done or retry it);
* ``LeaseLost`` or a refused write -> nothing is written; the outcome is discarded;
* unknown task name -> ``dead`` at once with the reason; nothing is imported. Workers claim only
  the tasks they registered, so this is reached from claims of every task (the testing helpers);
* handler past its task's ``timeout`` -> a failed attempt of type ``JobTimedOut`` whatever it
  returned or raised (its return value is discarded, logged). In thread mode the handler cannot be
  stopped, so this is written when it finally returns (the worker kept the lease until then); in
  process mode (``EXECUTION = "process"``) the child running it is killed at the timeout.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import inspect
import logging
import multiprocessing
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from django.core.exceptions import SynchronousOnlyOperation
from django.db import DatabaseError

from . import child, registry, signals, store, tracing
from .attempt_events import end_attempt, end_settled_attempt, job_fields, report_lease_lost
from .attempt_hooks import _HOOKS, attempt_started
from .child_attempts import CHILD_TERM_GRACE, ChildAttempts, KilledAtStop, kill_child
from .conf import Settings
from .context import JobContext
from .exceptions import (
    JobCancelled,
    JobTimedOut,
    LeaseLost,
    PayloadNotSerializable,
    ResultTooLarge,
    Snooze,
    UnknownTask,
)
from .failures import MAX_MESSAGE, describe_error, storable_text
from .logging import attempt_fields
from .payload import encode_result
from .retry import Backoff, RetryDecision, clamp_delay, decide
from .runtime import close_broken_connections, is_connection_error

logger = logging.getLogger("django_leasequeue.executor")

T = TypeVar("T")

# The thread calls an async handler started on the worker's loop executor (asyncio.to_thread(),
# sync_to_async(thread_sensitive=False), afenced_atomic()): set by run_async() in the context its
# handler's task copies, filled by the loop's executor (worker.aio). A cancel ends the handler at
# once but not these threads: the attempt is recorded only once they have ended too, so that its
# retry never starts beside work it left running.
ATTEMPT_THREADS: contextvars.ContextVar[set[concurrent.futures.Future[Any]] | None] = contextvars.ContextVar(
    "leasequeue_attempt_threads", default=None)

# Django raises SynchronousOnlyOperation for an ORM call made where an event loop runs: in an
# async def handler, whether on the worker's loop or on a private one (ASYNC_SLOTS = 0, process
# mode, where the child records it under this name). Its own message does not say what to do in
# a job, so the recorded failure carries the way out.
SYNC_ONLY_ERROR = f"{SynchronousOnlyOperation.__module__}.{SynchronousOnlyOperation.__qualname__}"
SYNC_ONLY_HINT = (" [an async def handler cannot call the ORM directly: use the ORM's async methods "
                  "(aget, acreate, ...) or asgiref's sync_to_async for reads and unfenced writes, and "
                  "await ctx.afenced_atomic(fn, ...) for the fenced final writes; see the Async handlers "
                  "guide, docs/howto/async.md]")

# Process mode: seconds a child may take to set Django up and import the task modules (not the
# handler's time; its timeout counts from the handler's start).
CHILD_START_TIMEOUT = 120.0
# Process mode: how often the worker's thread looks at the job's context (a lost lease kills the
# child) while it waits for the child's outcome.
CHILD_WATCH_INTERVAL = 0.2


class ChildError(Exception):
    """A handler that ran in a child process (``EXECUTION = "process"``) raised: carries the error
    entry the child built (its real type, message and traceback), and the retry decision the child
    made with the real exception (the task's ``retry_on``, ``discard_on`` and backoff see it there)."""

    def __init__(self, error: dict[str, Any], decision: RetryDecision | None = None) -> None:
        super().__init__(error.get("message", ""))
        self.error = error
        self.decision = decision


class ChildProcessFailed(RuntimeError):
    """The child process of a process-mode attempt died (a signal, the OOM killer, ``os._exit``) or
    never started the handler. Like a crashed worker it is retried after the backoff, whatever the
    task's ``retry_on`` and ``discard_on`` say: they describe the handler's own exceptions, and none
    reached us."""


class _NotStarted(BaseException):  # noqa: N818 - internal control flow, never recorded
    """Process mode: the child was set up, but the worker's start check (``may_start``) refused
    the job before its handler ran (its queue was paused meanwhile): the worker gives it back."""


def with_reconnect(fn: Callable[[], T]) -> T:
    """Call a store function; on a dropped connection, close it and try once more on a new one.

    Every store write is fenced, so repeating one is safe: if the first attempt did commit, the
    second finds the token or status changed and writes nothing. Only connection errors are
    retried (:func:`runtime.db_error_kind`): a value the database refused fails again.
    """
    try:
        return fn()
    except DatabaseError as exc:
        if not is_connection_error(exc):
            raise
        close_broken_connections()
        time.sleep(0.2)
        return fn()


class Executor:
    """Runs claimed jobs for one worker process. Thread-safe; one instance per worker.

    Args:
        worker_id: ``host:pid:name``.
        settings: validated settings (default backoff, snooze cap).
        complete: callable ``(ctx, result_json)`` that records success (the worker's batched
            completer); it reports lease loss itself.
    """

    def __init__(self, *, worker_id: str, settings: Settings, alias: str,
                 complete: Callable[[JobContext, str | None], None]) -> None:
        self.worker_id = worker_id
        self.settings = settings
        self.alias = alias
        self.complete = complete
        self.default_backoff = Backoff(base=settings.backoff_base, max=settings.backoff_max,
                                       jitter=settings.backoff_jitter)
        self.children = ChildAttempts()  # process mode: who records each attempt's outcome

    def run(self, job: store.ClaimedJob, ctx: JobContext, *, child: bool = False,
            may_start: Callable[[], bool] | None = None) -> str:
        """Run ``job`` to an outcome and record it. Returns the outcome name (for tests and logs).

        Args:
            job: the claimed job; ctx: its context.
            child: run the handler in a child process killed at the task's timeout (process mode).
            may_start: process mode: asked once the child has set Django up (a second or more after
                the worker's own start check), just before the handler runs; False: the child
                exits without running it and the outcome is ``"not_started"`` (nothing is written:
                the caller gives the job back).
        """
        # Every record logged while the attempt runs on this thread (the handler's own, the
        # executor's) carries the job's fields in the JSON log format (django_leasequeue.logging),
        # and the attempt's "process" span (OpenTelemetry, when configured) is the parent of the
        # handler's own spans. A success is handed to the batched completer inside the span; the
        # span ends before the completer's write.
        attempt = self.children.enter(ctx) if child else None
        if attempt is not None and attempt.stopped:
            return "released"  # the worker's stop took it before it began: it releases the job
        try:
            with attempt_fields(job.id, job.task, job.queue, job.attempts, job.lease_version), \
                    tracing.process_span(job, ctx):
                outcome = self._run(job, ctx, child=child, may_start=may_start)
                tracing.attempt_ended(ctx, outcome)
                return outcome
        finally:
            if attempt is not None:
                self.children.leave(attempt)

    async def run_async(self, job: store.ClaimedJob, ctx: JobContext, *,
                        started: Callable[[asyncio.Task[Any]], None],
                        in_thread: Callable[[Callable[[], str]], Awaitable[str]],
                        discarded: Callable[[], bool]) -> str:
        """Run the ``async def`` handler of ``job`` on the running event loop and record its outcome
        through the same code as :meth:`run` (:meth:`_settle`, :meth:`_settle_raised`).

        The handler runs in a task of its own, handed to ``started`` as it starts: the worker
        cancels that task at the task's timeout (or when the lease is lost), and this coroutine
        waits for it to end whatever it does with the cancellation, so that a handler that swallows
        ``CancelledError`` keeps its slot and its lease until it really returns. Nothing here
        blocks the loop on the database: an outcome that writes (a failure, a snooze, a cancel, a
        result stored after ``fenced_atomic()``) is recorded through ``in_thread``, on a thread;
        a plain success only queues its completion for the batched completer.

        Args:
            job: the claimed job; ctx: its context.
            started: called with the handler's task once it is created.
            in_thread: runs a recording function on a thread and returns its outcome.
            discarded: True once the worker's stop took the job (it releases it): nothing is
                recorded then.

        Returns:
            The outcome name, as :meth:`run`; ``released`` when ``discarded()`` was True.
        """
        with attempt_fields(job.id, job.task, job.queue, job.attempts, job.lease_version), \
                tracing.process_span(job, ctx):
            fields = self._begin(job, ctx)
            try:
                spec = registry.get_task(job.task)
            except UnknownTask as exc:
                unknown = exc
                return await in_thread(lambda: self._fail(job, ctx, unknown, retry_delay=None, fields=fields))
            began = time.monotonic()
            threads: set[concurrent.futures.Future[Any]] = set()
            token = ATTEMPT_THREADS.set(threads)  # copied into the handler's task, not kept here
            try:
                handler = asyncio.ensure_future(self._call_async(spec, job, ctx))
            finally:
                ATTEMPT_THREADS.reset(token)
            started(handler)
            error: BaseException | None = None
            result: Any = None
            try:
                # Only the handler's task is ever cancelled (never this one): a CancelledError
                # here is the handler's, once it has ended.
                result = await handler
            except BaseException as exc:  # noqa: BLE001 - CancelledError included: recorded below
                error = exc
            while threads:  # cancelled, it may have left thread calls running: they end first
                await asyncio.wait([asyncio.wrap_future(f) for f in list(threads)])
            if discarded():
                return "released"
            if ctx.lease_lost and isinstance(error, asyncio.CancelledError):
                # Cancelled because the heartbeat found the lease gone (and reported it): another
                # worker may run the job now; there is nothing to write.
                ctx.handler_returned()
                outcome = "lease_lost"
            else:
                try:
                    self._check_timed_out(spec, job, ctx, began, error,
                                          stopped="was cancelled (async handler) at its timeout")
                except JobTimedOut as timed_out:
                    error = timed_out
                if error is None and not isinstance(result, Snooze) and not ctx.completed_in_transaction:
                    # A plain success: encoded and queued for the completer, no database call. A
                    # value that cannot be stored fails the attempt (as in _settle), a write: on a
                    # thread (the ORM refuses to run on the loop, SynchronousOnlyOperation).
                    try:
                        result_json = None if result is None else encode_result(result,
                                                                                self.settings.max_result_bytes)
                    except (PayloadNotSerializable, ResultTooLarge) as exc:
                        refused = exc
                        outcome = await in_thread(lambda: self._fail(job, ctx, refused, retry_delay=None,
                                                                     fields=fields))
                    else:
                        self.complete(ctx, result_json)
                        outcome = "done"
                else:
                    raised = error

                    def record() -> str:
                        if raised is None:
                            return self._settle(spec, job, ctx, fields, result)
                        try:  # raised here so that attempt hooks see it in sys.exc_info(), as on a thread
                            raise raised
                        except BaseException:  # noqa: BLE001
                            return self._settle_raised(spec, job, ctx, fields, raised)

                    outcome = await in_thread(record)
            tracing.attempt_ended(ctx, outcome)
            return outcome

    @staticmethod
    async def _call_async(spec: Any, job: store.ClaimedJob, ctx: JobContext) -> Any:
        args = list(job.args or [])
        kwargs = dict(job.kwargs or {})
        if spec.takes_context:
            args.insert(0, ctx)
        result = spec.func(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result

    def _run(self, job: store.ClaimedJob, ctx: JobContext, *, child: bool,
             may_start: Callable[[], bool] | None) -> str:
        fields = self._begin(job, ctx)
        try:
            spec = registry.get_task(job.task)
        except UnknownTask as exc:
            return self._fail(job, ctx, exc, retry_delay=None, fields=fields)
        try:
            result = self._call_timed(spec, job, ctx, child, may_start)
        except BaseException as exc:  # noqa: BLE001 - SystemExit etc. are failed attempts, not dead threads
            # Settled inside the except block: attempt hooks see the handler's error in sys.exc_info().
            return self._settle_raised(spec, job, ctx, fields, exc)
        return self._settle(spec, job, ctx, fields, result)

    def _begin(self, job: store.ClaimedJob, ctx: JobContext) -> dict[str, Any]:
        """Start an attempt: the ``claimed`` event and the attempt hooks. Returns its event fields."""
        fields = job_fields(job)
        if signals.enabled("claimed"):
            signals.emit("claimed", **fields)
        if _HOOKS:
            attempt_started(ctx)
        return fields

    def _settle_raised(self, spec: Any, job: store.ClaimedJob, ctx: JobContext, fields: dict[str, Any],
                       exc: BaseException) -> str:
        """Record the outcome of an attempt whose handler raised ``exc`` (the thread and the async
        paths alike): a snooze, a cancel, a lost lease, or a failed attempt (retry or dead letter)."""
        if isinstance(exc, _NotStarted):
            return "not_started"
        if isinstance(exc, KilledAtStop):
            return "released"  # the worker's stop releases the job (an interrupted attempt)
        if isinstance(exc, Snooze):
            return self._snooze(job, ctx, exc.seconds, fields)
        if isinstance(exc, JobCancelled):
            return self._cancelled(job, ctx, fields)
        if isinstance(exc, LeaseLost):
            settled = report_lease_lost(ctx, write="handler", fields=fields)
            return "lease_lost" if settled is None else end_settled_attempt(ctx, settled, fields, write="handler")
        if ctx.completed_in_transaction:
            # fenced_atomic() committed the job as done; an error after it changes nothing.
            logger.warning("job %s raised after its fenced completion: %r", job.id, exc)
            end_attempt(ctx, "succeeded", **fields)
            return "done"
        decision = self._decide(spec, job, exc)
        return self._fail(job, ctx, exc, retry_delay=decision.delay, fields=fields, decision=decision)

    def _settle(self, spec: Any, job: store.ClaimedJob, ctx: JobContext, fields: dict[str, Any],
                result: Any) -> str:
        """Record the outcome of an attempt whose handler returned ``result`` (the thread and the
        async paths alike). A plain success writes nothing here: it goes to the batched completer."""
        if isinstance(result, Snooze):
            return self._snooze(job, ctx, result.seconds, fields)
        if ctx.completed_in_transaction:
            # fenced_atomic() marked the job done before the handler returned. A result set in the
            # block (fence.set_result()) was committed with it and stands. Otherwise store the
            # return value now, fenced on the same token. A value that cannot be stored is not
            # fatal (the work is committed), but the job's history says why its result is empty.
            if ctx.fenced_result:
                if result is not None:
                    logger.warning("job %s: its return value is ignored: fenced_atomic() set the job's result "
                                   "(fence.set_result()), which is the one stored and passed on", job.id)
            elif result is not None:
                self._store_late_result(job, result)
            end_attempt(ctx, "succeeded", **fields)
            return "done"
        try:
            result_json = None if result is None else encode_result(result, self.settings.max_result_bytes)
        except (PayloadNotSerializable, ResultTooLarge) as exc:
            # Not retried: the same value would be refused again. Checked here, before the batched
            # completion, so that one oversized result fails only its own job.
            return self._fail(job, ctx, exc, retry_delay=None, fields=fields)
        self.complete(ctx, result_json)
        return "done"

    def _store_late_result(self, job: store.ClaimedJob, result: Any) -> None:
        """Store the return value of a job ``fenced_atomic()`` already completed, or note why not.

        A value that is not JSON (:class:`PayloadNotSerializable`) or over ``MAX_RESULT_BYTES``
        (:class:`ResultTooLarge`) is logged and recorded as a ``result_dropped`` history entry
        (with its size and the limit in bytes, when known); a database error is only logged, since
        the same database would refuse the note too.
        """
        try:
            late_json = encode_result(result, self.settings.max_result_bytes)
            with_reconnect(lambda: store.job_set_result(job.id, job.lease_version, late_json, alias=self.alias))
            return
        except (PayloadNotSerializable, ResultTooLarge) as exc:
            logger.exception("job %s: could not store the return value after fenced_atomic()", job.id)
            dropped = exc
        except DatabaseError:
            logger.exception("job %s: could not store the return value after fenced_atomic()", job.id)
            return
        size = dropped.size if isinstance(dropped, ResultTooLarge) else None
        limit = dropped.limit if isinstance(dropped, ResultTooLarge) else None
        entry = describe_error(dropped, attempt=job.attempts, worker=self.worker_id)  # storable text
        reason = f"{type(dropped).__name__}: {entry['message']}"
        try:
            with_reconnect(lambda: store.job_note_result_dropped(job.id, job.lease_version, reason=reason,
                                                                 size=size, limit=limit, alias=self.alias))
        except DatabaseError:
            logger.exception("job %s: could not record the dropped return value", job.id)

    def _call_timed(self, spec: Any, job: store.ClaimedJob, ctx: JobContext, child: bool,
                    may_start: Callable[[], bool] | None = None) -> Any:
        """Call the handler; once it returns or raises, a handler that ran past its timeout (the
        worker marked ``ctx`` timed out meanwhile) ends as :class:`JobTimedOut`, whatever it
        returned or raised (a lost lease excepted: nothing may be written then)."""
        started = time.monotonic()
        try:
            result = self._call_in_child(spec, job, ctx, may_start) if child else self._call(spec, job, ctx)
        except BaseException as exc:
            self._check_timed_out(spec, job, ctx, started, exc)
            raise
        self._check_timed_out(spec, job, ctx, started, None)
        return result

    def _check_timed_out(self, spec: Any, job: store.ClaimedJob, ctx: JobContext, started: float,
                         exc: BaseException | None, *, stopped: str = "could not be stopped (thread mode)") -> None:
        """Record that the handler returned (``exc`` None) or raised ``exc``; raise
        :class:`JobTimedOut` (from ``exc``) when it had run past its timeout meanwhile.

        Args:
            started: ``time.monotonic()`` at the handler's start.
            stopped: how the handler was (not) stopped at the timeout, for the error's message.
        """
        if isinstance(exc, LeaseLost | KilledAtStop | _NotStarted):
            ctx.handler_returned()
            return
        if not ctx.handler_returned() or ctx.completed_in_transaction or isinstance(exc, JobTimedOut):
            return
        if exc is None:
            logger.warning("job %s: discarding the return value of a handler that ran past its timeout", job.id)
        what = "returned; its return value was discarded" if exc is None else f"raised {type(exc).__name__}"
        took = time.monotonic() - started
        raise JobTimedOut(f"attempt {job.attempts} ran past the task's timeout of {spec.timeout:g} s; the handler "
                          f"{stopped} and {what} after {took:.1f} s") from exc

    def _call_in_child(self, spec: Any, job: store.ClaimedJob, ctx: JobContext,
                       may_start: Callable[[], bool] | None = None) -> Any:
        """Run the handler in a new child process ("spawn": a fresh interpreter that sets Django up
        and runs the task registered under ``job.task``; nothing is imported from the row) and
        return what it returned, or raise what it raised. Past the task's timeout the child gets
        SIGTERM, then SIGKILL after :data:`CHILD_TERM_GRACE` seconds, and :class:`JobTimedOut` is
        raised: a hard time limit, even for a handler that holds the GIL."""
        mp = multiprocessing.get_context("spawn")
        # Duplex: the child reports "ready" once set up and waits for the worker's "go" (or "stop").
        receiver, sender = mp.Pipe(duplex=True)
        payload = {"task": job.task, "args": list(job.args or []), "kwargs": dict(job.kwargs or {}),
                   "ctx": {"job_id": ctx.job_id, "task": ctx.task, "queue": ctx.queue, "attempt": ctx.attempt,
                           "max_attempts": ctx.max_attempts, "lease_version": ctx.lease_version,
                           "worker_id": ctx.worker_id, "leased_until": ctx.leased_until,
                           "lease_seconds": ctx.lease_seconds, "alias": ctx.alias},
                   "worker_pid": os.getpid(),
                   # The attempt's process span, the parent of the child's handler spans (or None).
                   "trace_parent": tracing.carrier_of_current_span()}
        proc = mp.Process(target=child.main, args=(sender, payload), name=f"leasequeue-job-{job.id}", daemon=True)
        attempt = self.children.enter(ctx)  # run() registered it
        self.children.start(attempt, proc)
        sender.close()
        try:
            try:
                if not receiver.poll(CHILD_START_TIMEOUT):
                    self.children.take_outcome(attempt)
                    raise ChildProcessFailed(
                        f"the child process did not start the handler within {CHILD_START_TIMEOUT:g} s")
                receiver.recv()  # "ready": Django is set up in the child
            except EOFError:
                # The child died while setting up: killed by the worker's stop (which then owns
                # the attempt), or on its own (an import error, the OOM killer).
                proc.join(CHILD_TERM_GRACE)
                self.children.take_outcome(attempt)
                raise ChildProcessFailed(f"the child process died while setting up (exit code {proc.exitcode})") \
                    from None
            if may_start is not None and not may_start():
                self.children.take_outcome(attempt)  # the stop may have taken it meanwhile: then it releases it
                receiver.send("stop")
                proc.join(CHILD_TERM_GRACE)
                raise _NotStarted()
            # The stop releases the job as interrupted exactly when "go" was sent (the child
            # enters the handler only after it); once the stop took the attempt, none is sent.
            self.children.go(attempt, receiver)  # the handler's timeout counts from here
            started = time.monotonic()
            deadline = None if spec.timeout is None else started + spec.timeout
            while not receiver.poll(CHILD_WATCH_INTERVAL if deadline is None
                                    else max(0.0, min(CHILD_WATCH_INTERVAL, deadline - time.monotonic()))):
                if ctx.lease_lost:
                    # The lease is gone (the heartbeat found the token moved): another worker may be
                    # running the job already. The child's outcome would be discarded; stop it now,
                    # so that it does not run on beside the next attempt.
                    self.children.take_outcome(attempt)
                    kill_child(proc)
                    raise LeaseLost(f"job {job.id}: lease {job.lease_version} was lost; its child process "
                                    f"was killed after {time.monotonic() - started:.1f} s")
                if deadline is not None and time.monotonic() >= deadline:
                    self.children.take_outcome(attempt)
                    ctx.time_out()
                    kill_child(proc)
                    raise JobTimedOut(f"attempt {job.attempts} ran past the task's timeout of {spec.timeout:g} s; "
                                      f"its child process was killed after {time.monotonic() - started:.1f} s")
            try:
                kind, value, completed = receiver.recv()
            except EOFError:
                proc.join(CHILD_TERM_GRACE)
                self.children.take_outcome(attempt)
                raise ChildProcessFailed(f"the child process running the handler died (exit code {proc.exitcode})") \
                    from None
            if not completed:  # a job fenced_atomic() committed is done, whoever took the attempt
                self.children.take_outcome(attempt)
        finally:
            receiver.close()
            if proc.is_alive():
                kill_child(proc)
            else:
                proc.join()
        if completed:
            ctx.completed_in_transaction = True  # fenced_atomic() committed the job in the child
        if kind == "returned":
            return value
        if kind == "snooze":
            raise Snooze(value)
        if kind == "cancelled":
            ctx.mark_cancel_requested()
            raise JobCancelled(value)
        if kind == "lease_lost":
            ctx.mark_lease_lost()
            raise LeaseLost(value)
        if kind == "not_serializable":
            raise PayloadNotSerializable(value)
        raise ChildError(value["error"], value.get("decision"))

    def stop_children(self, contexts: list[JobContext]) -> dict[int, bool]:
        """The worker's graceful stop (process mode, after its grace period): take the attempts of
        ``contexts`` whose threads have not taken their outcome, kill their children, and start no
        more; see :meth:`ChildAttempts.stop`. The stop then releases those jobs, and their
        threads record nothing.

        Returns:
            Job id -> whether its handler had started, for each attempt taken.
        """
        return self.children.stop(contexts)

    def record_timeout(self, job: store.ClaimedJob, ctx: JobContext, message: str, *,
                       min_delay: float = 0.0) -> str:
        """Record the attempt of a handler stuck past its timeout as a :class:`JobTimedOut` failure
        now, without waiting for it (the worker is exiting). Returns the outcome (see :meth:`run`).

        The stuck thread still runs until the process is gone, which takes a while after this
        write (the worker's stop goes on, then the interpreter exits): ``min_delay`` (seconds, the
        job's lease) keeps the retry from being due before then, however short the task's backoff,
        so that no other worker starts it beside the stuck attempt."""
        fields = job_fields(job)
        timed_out = JobTimedOut(message)
        try:
            decision = self._decide(registry.get_task(job.task), job, timed_out)
        except UnknownTask:
            decision = RetryDecision(delay=clamp_delay(self.default_backoff.delay(job.attempts)))
        delay = None if decision.delay is None else max(decision.delay, float(min_delay))
        return self._fail(job, ctx, timed_out, retry_delay=delay, fields=fields, decision=decision)

    def _decide(self, spec: Any, job: store.ClaimedJob, exc: BaseException) -> RetryDecision:
        """What follows ``job``'s failed attempt that raised ``exc``: the task's ``retry_on``,
        ``discard_on`` and backoff options applied by :func:`~django_leasequeue.retry.decide`
        (a process-mode child decided already, with the real exception).

        Never raises: whatever the backoff does (an exception, even a ``BaseException`` such as
        SystemExit, NaN), the default policy's delay is used and the handler's own error is still
        the one recorded.
        """
        if isinstance(exc, ChildError) and exc.decision is not None:
            return exc.decision
        # A child that could not decide leaves only a description, and a child that died left
        # nothing: matching either against retry_on/discard_on would be wrong, so it is an
        # ordinary failure (retried after the backoff).
        child = isinstance(exc, ChildError | ChildProcessFailed)
        return decide(exc, job.attempts, retry_on=None if child else spec.retry_on,
                      discard_on=None if child else spec.discard_on, backoff=spec.backoff,
                      default=self.default_backoff,
                      log=lambda message: logger.exception("job %s: %s", job.id, message))

    def _call(self, spec: Any, job: store.ClaimedJob, ctx: JobContext) -> Any:
        args = list(job.args or [])
        kwargs = dict(job.kwargs or {})
        if spec.takes_context:
            args.insert(0, ctx)
        result = spec.func(*args, **kwargs)
        if inspect.iscoroutine(result):
            # Async handlers run to completion on a private event loop in this worker thread.
            result = asyncio.run(result)
        return result

    def _fail(self, job: store.ClaimedJob, ctx: JobContext, exc: BaseException, *, retry_delay: float | None,
              fields: dict[str, Any], decision: RetryDecision | None = None) -> str:
        if isinstance(exc, ChildError):  # raised in a child process: keep the child's own description
            error = {**exc.error, "attempt": job.attempts, "worker": self.worker_id}
        else:
            error = describe_error(exc, attempt=job.attempts, worker=self.worker_id)
        if error.get("type") == SYNC_ONLY_ERROR:
            error["message"] = storable_text(str(error.get("message", ""))[:MAX_MESSAGE] + SYNC_ONLY_HINT)
        if decision is not None:
            error.update({key: storable_text(value[:MAX_MESSAGE]) for key, value in decision.entry_fields().items()})
        tracing.attempt_failed(ctx, exc, error)

        def write() -> tuple[str, Any] | None:
            now = None
            delay = retry_delay
            if decision is not None and decision.at is not None and retry_delay is not None:
                # Retry(at=...): the retry's run_at is exactly ``at``. The failure is written at
                # a database time read just before, so that now + (at - now) is ``at`` itself.
                now = store.db_now(alias=self.alias)
                delay = clamp_delay((decision.at - now).total_seconds())
            return store.job_fail(job.id, job.lease_version, error, retry_delay=delay, now=now, alias=self.alias)

        try:
            outcome = with_reconnect(write)
        except DatabaseError:
            logger.exception("job %s: could not record the failure; the lease will expire", job.id)
            return "unrecorded"
        if outcome is None:
            settled = report_lease_lost(ctx, write="fail", fields=fields)
            return "lease_lost" if settled is None else end_settled_attempt(ctx, settled, fields, write="fail")
        status, run_at = outcome
        if status == "cancelled":  # a cancel was requested while the handler ran
            end_attempt(ctx, "cancelled", error=error["type"], **fields)
        else:
            # The error's decision and reason (retry_on, discard_on, Retry), when it decided.
            decided = {key: error[key] for key in ("decision", "reason") if key in error}
            if status == "dead":
                end_attempt(ctx, "dead_lettered", error=error["type"], message=error["message"], **decided, **fields)
            else:
                end_attempt(ctx, "retried", error=error["type"], message=error["message"], run_at=run_at, **decided,
                            **fields)
        return status

    def _snooze(self, job: store.ClaimedJob, ctx: JobContext, seconds: float, fields: dict[str, Any]) -> str:
        outcome = with_reconnect(lambda: store.job_snooze(job.id, job.lease_version, seconds,
                                                          max_snoozes=self.settings.max_snoozes,
                                                          alias=self.alias))
        if outcome is None:
            settled = report_lease_lost(ctx, write="snooze", fields=fields)
            return "lease_lost" if settled is None else end_settled_attempt(ctx, settled, fields, write="snooze")
        event = {"ready": "snoozed", "cancelled": "cancelled"}.get(outcome, "dead_lettered")
        end_attempt(ctx, event, seconds=seconds, **fields)
        return "snoozed" if outcome == "ready" else outcome

    def cancel_unstarted(self, job: store.ClaimedJob, ctx: JobContext) -> str:
        """Record the cancel of a held job whose handler never started (a cancel was requested
        while it waited for a thread): fenced on its token, ``cancelled`` emitted.

        Returns:
            ``cancelled``, or ``lease_lost`` when the token moved on (reported as a lost lease).

        Raises:
            DatabaseError: the database refused or could not be reached (after one reconnect).
        """
        return self._cancelled(job, ctx, job_fields(job))

    def _cancelled(self, job: store.ClaimedJob, ctx: JobContext, fields: dict[str, Any]) -> str:
        done = with_reconnect(lambda: store.job_cancel_leased(job.id, job.lease_version, alias=self.alias))
        if not done:
            settled = report_lease_lost(ctx, write="cancel", fields=fields)
            return "lease_lost" if settled is None else end_settled_attempt(ctx, settled, fields, write="cancel")
        end_attempt(ctx, "cancelled", **fields)
        return "cancelled"

