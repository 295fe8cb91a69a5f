"""What one worker did with the jobs it claimed, for the line it prints when it stops.

:class:`WorkerTally` is an executor attempt hook (:func:`attempt_hooks.install_attempt_hook`) that
counts the recorded outcome of each attempt of one worker: hooks are process-wide, so it counts
only the attempts whose context names its worker, and several workers of one process (tests, an
embedded worker) keep their own books. Each attempt counts once, by its first outcome: a lost lease
the heartbeat found and the refused write that follows it are one ``lease_lost``, as in
:mod:`~django_leasequeue.worker_metrics`.

Jobs given back unstarted (prefetched, paused queue, shutdown) and jobs dead-lettered outside an
attempt (a corrupt row refused by the claim, an interrupted job past ``MAX_INTERRUPTIONS`` at stop)
are not attempts: the worker adds them with :meth:`WorkerTally.add`.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass

from ..context import JobContext

#: The outcomes counted, as the executor names them (its events).
OUTCOMES = ("succeeded", "retried", "dead_lettered", "lease_lost", "released", "snoozed", "cancelled")
_COUNTED = "leasequeue.tally.counted"  # ctx.attempt_data key: this attempt's outcome was counted


@dataclass(frozen=True)
class WorkerCounts:
    """One worker's books at a moment.

    Attributes:
        claimed (int): jobs its claims took, corrupt rows the claim dead-lettered included, and
            the jobs of claims whose reply was lost (given back, so also counted as released); a
            retry claimed again counts again (a claim is an attempt).
        done (int): attempts that ended with the job done (``succeeded``).
        retried (int): failed attempts with a retry scheduled.
        dead_lettered (int): jobs it dead-lettered (failed last attempts, corrupt rows, jobs
            interrupted too often).
        lease_lost (int): attempts whose fenced write was refused: the job's token moved on.
        released (int): jobs given back to ``ready`` without an attempt spent (prefetched and not
            started, a paused queue, a graceful stop, a claim whose reply was lost).
        snoozed (int): attempts that snoozed the job. cancelled (int): attempts that ended cancelled.
        elapsed (float): seconds from the worker's start to its stop (or to now, while it runs).
    """

    claimed: int
    done: int
    retried: int
    dead_lettered: int
    lease_lost: int
    released: int
    snoozed: int
    cancelled: int
    elapsed: float

    @property
    def unsettled(self) -> int:
        """Claimed jobs with no outcome counted: an outcome the database did not take (the lease
        then expires and the reaper takes the job back), or, while the worker runs, jobs in hand."""
        return self.claimed - (self.done + self.retried + self.dead_lettered + self.lease_lost + self.released
                               + self.snoozed + self.cancelled)

    def summary(self, worker_id: str, *, stopped: bool = True) -> str:
        """One line: ``worker ID stopped after 4.2 s: 8 claimed, 6 done, 1 retried, 1
        dead-lettered, 0 lease lost, 0 released``, then the snoozed, cancelled and unsettled (in
        hand, while it runs) counts where they are not 0.

        Args:
            worker_id (str): the worker's id (``host:pid:name``).
            stopped (bool): "stopped after" (True) or "running for" (False).
        """
        text = (f"worker {worker_id} {'stopped after' if stopped else 'running for'} {self.elapsed:.1f} s: "
                f"{self.claimed} claimed, {self.done} done, {self.retried} retried, "
                f"{self.dead_lettered} dead-lettered, {self.lease_lost} lease lost, {self.released} released")
        for count, what in ((self.snoozed, "snoozed"), (self.cancelled, "cancelled"),
                            (self.unsettled, "unsettled (their leases expire)" if stopped else "in hand")):
            if count:
                text += f", {count} {what}"
        return text


class WorkerTally:
    """Counts one worker's attempt outcomes (an attempt hook; see the module docstring).

    Args:
        worker_id (str): the worker whose attempts count (``JobContext.worker_id``).
    """

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def attempt_started(self, ctx: JobContext) -> None:
        """Nothing to note: claims are counted by the claim loop."""

    def attempt_ended(self, ctx: JobContext, outcome: str) -> None:
        """Count ``outcome`` if ``ctx`` is an attempt of this worker not counted yet."""
        if ctx.worker_id != self.worker_id or outcome not in OUTCOMES:
            return
        mark = object()
        # setdefault is atomic: of two threads reporting the same attempt (the heartbeat and the
        # handler's thread both meeting the moved token), only the first counts it.
        if ctx.attempt_data.setdefault(_COUNTED, mark) is not mark:
            return
        self.add(outcome)

    def add(self, outcome: str, count: int = 1) -> None:
        """Count ``count`` outcomes that were not attempts (a release, a dead letter at claim or stop).

        Raises:
            ValueError: ``outcome`` is not one of :data:`OUTCOMES`.
        """
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r}; expected one of {OUTCOMES}")
        with self._lock:
            self._counts[outcome] += count

    def counts(self, *, claimed: int, elapsed: float, counted_elsewhere: dict[str, int] | None = None) -> WorkerCounts:
        """The books now, with the worker's own claim count and running time.

        Args:
            claimed (int): jobs the worker's claims took. elapsed (float): seconds since its start.
            counted_elsewhere (dict[str, int] | None): outcomes the worker's parts keep their own
                count of (the pool's releases, the claim's dead letters), added to this tally's.
        """
        with self._lock:
            c = Counter(self._counts)
        c.update(counted_elsewhere or {})
        return WorkerCounts(claimed=claimed, done=c.get("succeeded", 0), retried=c.get("retried", 0),
                            dead_lettered=c.get("dead_lettered", 0), lease_lost=c.get("lease_lost", 0),
                            released=c.get("released", 0), snoozed=c.get("snoozed", 0),
                            cancelled=c.get("cancelled", 0), elapsed=elapsed)
