"""Process mode (``EXECUTION = "process"``), the worker's side: the attempts running in child
processes, who records each one's outcome, and how a child is killed.

An attempt's outcome is recorded by exactly one party: the worker's thread that runs it, once it
takes the child's message (or its death, or kills it at the timeout or at a lost lease), or the
worker's graceful stop, which takes every attempt still running after its grace period, kills its
child and releases its job. The two take an attempt under one lock, so a child that the stop
killed is never also recorded by its thread (as a failure for the closed pipe, or as a lost lease
for a write the stop's release refused), and the stop knows whether the handler had started: the
child enters the handler only after the worker's "go", sent under the same lock.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

from .context import JobContext

# Process mode: seconds between SIGTERM and SIGKILL when a child is killed.
CHILD_TERM_GRACE = 2.0


class KilledAtStop(BaseException):  # noqa: N818 - internal control flow, never recorded
    """The worker's graceful stop took the attempt (and killed its child, after the grace period):
    the stop releases the job, and the attempt's thread records nothing."""


def signal_group(pgid: int | None, sig: int) -> None:
    """Send ``sig`` to the process group ``pgid`` (a process-mode child's own group); nothing when
    it does not exist (any more, or yet)."""
    if pgid is None:
        return
    try:
        os.killpg(pgid, sig)
    except OSError:
        pass


def kill_child(proc: Any) -> None:
    """Kill the child process ``proc`` (a ``multiprocessing.Process``) and its process group:
    SIGTERM, SIGKILL after :data:`CHILD_TERM_GRACE` seconds if it is still alive; returns once it
    is gone."""
    # The child runs in a process group of its own (child.main), so the handler's own
    # subprocesses are signalled with it; before the child made its group (still starting),
    # the group does not exist and only the child itself is signalled.
    signal_group(proc.pid, signal.SIGTERM)
    proc.terminate()
    proc.join(CHILD_TERM_GRACE)
    if proc.is_alive():  # SIGTERM ignored, or a handler holding the GIL never ran the handler
        proc.kill()
        proc.join()
    signal_group(proc.pid, signal.SIGKILL)  # subprocesses that outlived the child


class ChildAttempt:
    """One process-mode attempt: its child, and who records its outcome. Changed only under the
    lock of its :class:`ChildAttempts`.

    Attributes:
        ctx: the attempt's context (a job's later attempt has another one).
        proc: its child process, once started.
        started: the worker sent the child "go": its handler runs, or is about to (the child can
            enter the handler only after that message). False while the child sets Django up.
        settled: the thread took the outcome: the thread records it.
        stopped: the graceful stop took the attempt: it releases the job; the thread records nothing.
    """

    __slots__ = ("ctx", "proc", "started", "settled", "stopped")

    def __init__(self, ctx: JobContext, *, stopped: bool = False) -> None:
        self.ctx = ctx
        self.proc: Any = None
        self.started = False
        self.settled = False
        self.stopped = stopped


class ChildAttempts:
    """The process-mode attempts of one worker, from the start of each one's run to its end (its
    outcome recorded). Thread-safe; see the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._attempts: dict[int, ChildAttempt] = {}  # job id -> its attempt
        self._stopping = False

    def enter(self, ctx: JobContext) -> ChildAttempt:
        """Register the attempt ``ctx`` (or return the one the stop took already: ``stopped``)."""
        with self._lock:
            attempt = self._attempts.get(ctx.job_id)
            if attempt is None or attempt.ctx is not ctx:
                # A stop already under way did not hold this attempt: not this worker's to run.
                attempt = self._attempts[ctx.job_id] = ChildAttempt(ctx, stopped=self._stopping)
            return attempt

    def leave(self, attempt: ChildAttempt) -> None:
        """Forget ``attempt``: its outcome is recorded (or the stop's)."""
        with self._lock:
            if self._attempts.get(attempt.ctx.job_id) is attempt:
                del self._attempts[attempt.ctx.job_id]

    def start(self, attempt: ChildAttempt, proc: Any) -> None:
        """Start the child process ``proc`` of ``attempt``.

        Raises:
            KilledAtStop: the stop took the attempt: no child is started.
        """
        with self._lock:
            if attempt.stopped:
                raise KilledAtStop()
            proc.start()
            attempt.proc = proc

    def go(self, attempt: ChildAttempt, conn: Any) -> None:
        """Tell the child of ``attempt``, set up, to run the handler (``"go"`` through ``conn``),
        and note that its handler started.

        Raises:
            KilledAtStop: the stop took the attempt while the child set up: the handler never starts.
        """
        with self._lock:
            if attempt.stopped:
                raise KilledAtStop()
            conn.send("go")
            attempt.started = True

    def take_outcome(self, attempt: ChildAttempt) -> None:
        """The thread takes the outcome of ``attempt`` (the child's message, its death, a kill at
        the timeout or at a lost lease): it records it from now on, and the stop leaves the job.

        Raises:
            KilledAtStop: the stop took the attempt first: the thread records nothing.
        """
        with self._lock:
            if attempt.stopped:
                raise KilledAtStop()
            attempt.settled = True

    def stop(self, contexts: list[JobContext]) -> dict[int, bool]:
        """The worker's graceful stop, after its grace period: take the attempts of ``contexts``
        whose threads have not taken their outcome, kill their children, and start no more.

        Args:
            contexts: the contexts of the jobs the worker still holds.

        Returns:
            Job id -> whether its handler had started (the child was sent "go"), for each attempt
            taken; the jobs missing from it are their threads' to record.
        """
        taken: dict[int, bool] = {}
        procs = []
        with self._lock:
            self._stopping = True
            for ctx in contexts:
                attempt = self._attempts.get(ctx.job_id)
                if attempt is None or attempt.ctx is not ctx:
                    # Its thread has not begun the attempt yet (or is past it, the outcome recorded:
                    # a fenced release then writes nothing): no handler starts now.
                    attempt = self._attempts[ctx.job_id] = ChildAttempt(ctx, stopped=True)
                elif attempt.settled:
                    continue
                attempt.stopped = True
                taken[ctx.job_id] = attempt.started
                if attempt.proc is not None:
                    procs.append(attempt.proc)
        for proc in procs:
            kill_child(proc)
        return taken
