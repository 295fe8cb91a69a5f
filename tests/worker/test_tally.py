"""``WorkerTally``: one worker's books, counted from the executor's attempt hooks (the line
``runworker`` prints at stop; the real processes are in ``test_runworker_summary.py``)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from django_leasequeue.context import JobContext
from django_leasequeue.worker.tally import WorkerCounts, WorkerTally


def attempt(job_id: int, worker: str = "h:1:me") -> JobContext:
    return JobContext(job_id=job_id, task="qa.record", queue="default", attempt=1, max_attempts=3, lease_version=1,
                      worker_id=worker, leased_until=datetime.now(UTC), lease_seconds=30.0)


def test_each_attempt_counts_once_by_its_first_outcome_and_only_for_its_own_worker():
    tally = WorkerTally("h:1:me")
    lost = attempt(1)
    tally.attempt_ended(lost, "lease_lost")  # the heartbeat found the token moved
    tally.attempt_ended(lost, "lease_lost")  # then the handler's refused failure write
    tally.attempt_ended(attempt(2), "succeeded")
    tally.attempt_ended(attempt(3), "retried")
    tally.attempt_ended(attempt(4), "dead_lettered")
    tally.attempt_ended(attempt(5, worker="h:1:other"), "succeeded")  # another worker of this process
    tally.add("released", 2)
    counts = tally.counts(claimed=7, elapsed=1.25, counted_elsewhere={"released": 1})
    assert counts == WorkerCounts(claimed=7, done=1, retried=1, dead_lettered=1, lease_lost=1, released=3,
                                  snoozed=0, cancelled=0, elapsed=1.25)
    assert counts.unsettled == 0
    assert counts.summary("h:1:me") == ("worker h:1:me stopped after 1.2 s: 7 claimed, 1 done, 1 retried, "
                                        "1 dead-lettered, 1 lease lost, 3 released")


def test_the_line_names_snoozed_cancelled_and_unsettled_jobs_only_when_there_are_some():
    counts = WorkerCounts(claimed=9, done=2, retried=0, dead_lettered=0, lease_lost=0, released=0, snoozed=1,
                          cancelled=2, elapsed=0.04)
    assert counts.summary("h:1:me", stopped=False) == (
        "worker h:1:me running for 0.0 s: 9 claimed, 2 done, 0 retried, 0 dead-lettered, 0 lease lost, "
        "0 released, 1 snoozed, 2 cancelled, 4 in hand")
    assert counts.summary("h:1:me").endswith(", 4 unsettled (their leases expire)")


def test_an_unknown_outcome_is_refused():
    with pytest.raises(ValueError, match="unknown outcome 'done'"):
        WorkerTally("h:1:me").add("done")
