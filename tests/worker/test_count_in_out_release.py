"""The chart counters' ledger across a graceful stop in process execution mode: a worker stopped
(SIGTERM, no grace) with handlers running gives their leases back, and another worker finishes
the queue. A released claim is a claim with no outcome, so the counters' claims equal the jobs'
counted attempts plus the releases recorded in their histories, and every other count equals the
rows (a child cut mid-run is sometimes recorded as a failed attempt instead, EOFError: counted
as failed, and its attempt counts)."""

import signal

import pytest
from django.db.models import Sum

from django_leasequeue import enqueue_many
from django_leasequeue.models import Job, JobStat
from tests.support import wait_for

pytestmark = [pytest.mark.process]

JOBS = 40


def test_released_claims_are_claims_without_an_outcome_and_every_count_equals_the_rows(spawn):
    assert enqueue_many("qa.record", [([f"r-{i}"], {"sleep": 1.0}) for i in range(JOBS)]) == JOBS
    first = spawn("runworker", "--concurrency", "4", "--worker-id", "p1",
                  env={"LEASEQUEUE_POLL_INTERVAL": "0.2", "LEASEQUEUE_EXECUTION": "process",
                       "LEASEQUEUE_SHUTDOWN_GRACE": "0"})
    wait_for(lambda: Job.objects.filter(status="done").count() >= 4
             and Job.objects.filter(status="leased").count() >= 4, timeout=120, interval=0.1,
             what="a few done and four running")
    first.signal(signal.SIGTERM)
    assert first.wait(60) == 0
    released = sum(1 for h in Job.objects.values_list("history", flat=True) for e in h if e.get("event") == "released")
    # The four running handlers are given back, or (a child cut mid-run by the stop: EOFError)
    # recorded as a failed attempt to retry; prefetched jobs are given back too.
    cut = sum(len(errors) for errors in Job.objects.values_list("errors", flat=True))
    assert released + cut >= 4
    assert not Job.objects.filter(status="leased").exists()

    second = spawn("runworker", "--concurrency", "4", "--worker-id", "p2", env={"LEASEQUEUE_POLL_INTERVAL": "0.2"})
    wait_for(lambda: Job.objects.filter(status="done").count() == JOBS, timeout=120, interval=0.2,
             what="the queue to drain")
    second.signal(signal.SIGTERM)
    assert second.wait(60) == 0

    failed = sum(len(errors) for errors in Job.objects.values_list("errors", flat=True))
    assert failed == cut  # the second worker failed nothing
    attempts = Job.objects.aggregate(n=Sum("attempts"))["n"]
    assert attempts == JOBS + failed  # a release gives the attempt back; a failed attempt counts
    stats = JobStat.objects.aggregate(started=Sum("started"), done=Sum("done"), failed=Sum("failed"),
                                      dead=Sum("dead"), cancelled=Sum("cancelled"))
    assert stats == {"started": attempts + released, "done": JOBS, "failed": failed, "dead": 0, "cancelled": 0}
