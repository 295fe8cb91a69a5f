"""Losing a lease on purpose: :func:`simulate_lost_lease` runs a job on a stale worker while a
second worker takes it over, and reports what each one achieved."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from .. import reaper, store
from ..context import FencedCompletion, JobContext
from ..models import Job
from .inline import _depth, _inline_worker, _run
from .results import JobRun


@dataclass
class LostLease:
    """What :func:`simulate_lost_lease` observed.

    Attributes:
        stale (JobRun): the attempt of the worker that lost its lease. ``outcome`` is
            ``lease_lost`` when its fenced writes were refused, as they must be.
        takeover (JobRun): the attempt of the worker that took the job over (normally ``done``).
        interrupted_at (str): where the stale worker stalled: ``start`` (after its claim),
            ``fenced_atomic``, ``heartbeat`` or ``complete`` (returning its result).
        job (Job): the job row afterwards.
    """

    stale: JobRun
    takeover: JobRun
    interrupted_at: str
    job: Job

    @property
    def tokens(self) -> tuple[int, int]:
        """``(stale token, takeover token)``."""
        return self.stale.token, self.takeover.token


class _StallingContext(JobContext):
    """The stale worker's context: calls its ``stall`` hook before the first fenced write."""

    stall: Callable[[str], None] | None = None

    def _stall(self, point: str) -> None:
        hook, self.stall = self.stall, None
        if hook is not None:
            hook(point)

    @contextlib.contextmanager
    def fenced_atomic(self) -> Iterator[FencedCompletion]:
        self._stall("fenced_atomic")
        with super().fenced_atomic() as fence:
            yield fence

    def heartbeat(self) -> bool:
        self._stall("heartbeat")
        return super().heartbeat()


def simulate_lost_lease(job: Job | int, *, at: Literal["fenced_write", "start"] = "fenced_write") -> LostLease:
    """Run ``job`` on a worker that loses its lease, while a second worker takes it over.

    The story, told with the real store statements: worker A claims the job (token N) and runs the
    handler; A stalls (a GC pause, a stopped VM) until its lease has expired; the reaper takes the
    job back (token N+1, "lease expired" recorded as A's attempt) and worker B claims it (token
    N+2) and runs the handler to its end; then A resumes with its stale token. A's fenced writes
    (``fenced_atomic()``, heartbeat, completion, failure) must all be refused: the job's outcome and
    the business rows written under the fence are B's alone. Writes A made outside the fence
    happened twice: that is what an idempotent handler must tolerate.

    Args:
        job: a ready, due job (or its id).
        at: where A stalls. ``"fenced_write"`` (default): at A's first fenced write, i.e. on
            entering ``fenced_atomic()``, on ``heartbeat()``, or when it returns its result; so A
            has done all its unfenced work before B runs. The handler must not have opened a
            transaction of its own around that point (on one connection, B's work would be inside
            A's transaction). ``"start"``: right after A's claim, before its handler runs; works
            for any handler.

    Returns:
        A :class:`LostLease` with both attempts and the job row afterwards.

    Raises:
        ValueError: the job cannot be claimed now (not ready, not due, paused queue...).
        AssertionError: with ``at="fenced_write"``, the handler ended (e.g. raised) before any
            fenced write, so the lease was never lost; try ``at="start"``.
        RuntimeError: the stall point is inside a transaction the handler opened (use ``at="start"``).
    """
    if at not in ("fenced_write", "start"):
        raise ValueError(f"at must be 'fenced_write' or 'start', got {at!r}")
    job_id = job.pk if isinstance(job, Job) else int(job)
    stale_worker = _inline_worker(name="stale")
    takeover_worker = _inline_worker(name="takeover")
    alias = stale_worker.alias
    claimed = store.job_claim_ids([job_id], worker_id=stale_worker.worker_id, lease=stale_worker.lease, alias=alias)
    if not claimed:
        row = Job.objects.using(alias).filter(pk=job_id).first()
        state = "does not exist" if row is None else f"is {row.status}, run_at {row.run_at.isoformat()}"
        raise ValueError(f"job {job_id} cannot be claimed now: it {state} (or its queue is paused)")
    stale_job = claimed[0]
    runs: dict[str, Any] = {"point": None, "takeover": None, "error": None}
    start_depth = _depth(alias)

    def take_over(point: str) -> None:
        if _depth(alias) > start_depth:
            runs["error"] = RuntimeError(
                f"simulate_lost_lease(at='fenced_write'): the handler of job {job_id} reached {point} inside a "
                "transaction of its own; the takeover would run inside it and be rolled back with it. "
                "Use at='start'."
            )
            raise runs["error"]
        runs["point"] = point
        if not store.job_expire_lease(job_id, stale_job.lease_version, alias=alias):
            raise RuntimeError(f"job {job_id}: the stale worker no longer held token {stale_job.lease_version}")
        reaper.reap_once(alias=alias)
        again = store.job_claim_ids([job_id], worker_id=takeover_worker.worker_id, lease=takeover_worker.lease,
                                    alias=alias)
        if not again:
            row = Job.objects.using(alias).get(pk=job_id)
            raise RuntimeError(f"job {job_id}: the takeover worker could not claim it after the reaper "
                               f"({row.status}, attempts {row.attempts}/{row.max_attempts})")
        runs["takeover"] = _run(takeover_worker, again[0])

    if at == "start":
        take_over("start")
        stale = _run(stale_worker, stale_job)
    else:
        class Context(_StallingContext):
            stall = staticmethod(take_over)

        submit = stale_worker.executor.complete

        def complete(ctx: JobContext, result_json: str | None) -> None:
            if isinstance(ctx, _StallingContext):
                ctx._stall("complete")
            submit(ctx, result_json)

        stale_worker.executor.complete = complete
        stale = _run(stale_worker, stale_job, Context)
        if runs["error"] is not None:
            raise runs["error"]
        if runs["takeover"] is None:
            raise AssertionError(
                f"job {job_id}: the handler ended with outcome {stale.outcome!r} before any fenced write, so the "
                "lease was never lost (a failure is recorded with the valid token). Use at='start' to take the "
                "lease away before the handler runs."
            )
    return LostLease(stale=stale, takeover=runs["takeover"], interrupted_at=runs["point"],
                     job=Job.objects.using(alias).get(pk=job_id))

