"""What a worker knows of its queues' paused flags (:class:`PauseView`): a held job starts only on
fresh evidence that its queue was not paused."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from .. import store
from ..executor import with_reconnect


class PauseView:
    """What this worker knows of its queues' paused flags, and how old that knowledge is.

    A held job starts only on evidence, younger than ``store.PAUSE_GRACE`` seconds, that its queue
    was not paused; its age counts from the moment the statement that read it was *sent*, by this
    process's monotonic clock. :func:`~django_leasequeue.store.queue_pause` waits that long (plus a
    margin) after its commit, so evidence read before the pause is too old by the time it returns,
    and evidence read after it sees the pause (its docstring gives the argument in full).

    Two statements give evidence. The claim: it leases no job of a paused queue, so a claim sent
    at ``t`` that leased a job of queue ``q`` shows ``q`` was running at ``t`` (:meth:`claimed`;
    free, and enough for the jobs a thread starts right after their claim). And the read of the
    paused queues (:meth:`refresh`, one indexed ``SELECT`` of a few rows), for held jobs that
    wait longer: the heartbeat refreshes the view while the worker holds unstarted jobs, and a
    thread about to start a job on stale evidence refreshes it first (one read at a time).

    Args:
        alias: the database alias.
    """

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self._lock = threading.Lock()
        self._refreshing = threading.Lock()  # at most one read of the paused queues in flight
        self.paused: frozenset[str] = frozenset()
        self.read_at = float("-inf")  # monotonic send time of the read behind ``paused``
        # queue -> monotonic send time of the latest claim that leased a job of the queue
        self.claimed_at: dict[str, float] = {}
        self.refreshes = 0

    def claimed(self, sent_at: float, jobs: Sequence[store.ClaimedJob]) -> None:
        """Record a claim sent at monotonic ``sent_at`` (taken before the statement was sent):
        the queues of the ``jobs`` it leased were not paused then."""
        with self._lock:
            for queue in {job.queue for job in jobs}:
                if sent_at > self.claimed_at.get(queue, float("-inf")):
                    self.claimed_at[queue] = sent_at

    def evidence(self, queue: str) -> tuple[bool, float]:
        """``(running, sent_at)``: the latest evidence about ``queue`` (claim or read), with the
        monotonic send time of the statement it came from (``-inf``: none yet)."""
        with self._lock:
            claimed = self.claimed_at.get(queue, float("-inf"))
            if claimed > self.read_at:
                return True, claimed
            return queue not in self.paused, self.read_at

    def may_start(self, queue: str, now: float) -> bool | None:
        """True: a job of ``queue`` may start at monotonic ``now``; False: the queue is paused
        (release the job); None: the evidence is older than ``PAUSE_GRACE`` (refresh first)."""
        running, sent_at = self.evidence(queue)
        if now - sent_at >= store.PAUSE_GRACE:
            return None
        return running

    def age(self, queue: str, now: float) -> float:
        """Seconds (monotonic) since the statement behind the latest evidence about ``queue`` was sent."""
        return now - self.evidence(queue)[1]

    def refresh(self, queue: str | None = None) -> None:
        """Read the paused queues now. With ``queue``, skip the read when another thread brought
        fresh evidence about it while this one waited for the read in flight.

        Raises:
            DatabaseError: the read failed (the view keeps its old, aging evidence).
        """
        with self._refreshing:
            if queue is not None and self.may_start(queue, time.monotonic()) is not None:
                return
            sent_at = time.monotonic()
            paused = frozenset(with_reconnect(lambda: store.queue_paused_names(alias=self.alias)))
            with self._lock:
                if sent_at > self.read_at:
                    self.paused, self.read_at = paused, sent_at
                self.refreshes += 1
