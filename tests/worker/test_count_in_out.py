"""Invariant 8, nothing silently dropped: 1,000 jobs (successes, flaky, poison) through two worker
processes; every job ends done or dead and the counts are exact."""

import signal

import pytest
from django.db.models import Count, Sum
from qa.models import Execution

from django_leasequeue import enqueue_many
from django_leasequeue.models import Job, JobStat
from tests.support import statuses, wait_for

pytestmark = [pytest.mark.process]

SUCCESS, FLAKY, POISON = 700, 200, 100


def test_thousand_jobs_with_failures_count_in_equals_count_out(spawn):
    assert enqueue_many("qa.record", [[f"ok-{i}"] for i in range(SUCCESS)]) == SUCCESS
    assert enqueue_many("qa.flaky", [([], {"failures": 2}) for _ in range(FLAKY)]) == FLAKY  # max_attempts 4
    assert enqueue_many("qa.poison", [[] for _ in range(POISON)]) == POISON  # max_attempts 3
    workers = [spawn("runworker", "--concurrency", "4", "--worker-id", f"w{i}",
                     env={"LEASEQUEUE_POLL_INTERVAL": "0.2"}) for i in range(2)]
    wait_for(lambda: not Job.objects.filter(status__in=["ready", "leased"]).exists(), timeout=180, interval=0.2,
             what="the queue to drain")
    for w in workers:
        w.signal(signal.SIGTERM)
    assert [w.wait(60) for w in workers] == [0, 0]

    assert statuses() == {"done": SUCCESS + FLAKY, "dead": POISON}
    by_task = {row["task"]: row for row in Job.objects.values("task").annotate(
        n=Count("id"), attempts=Sum("attempts"), tokens=Sum("lease_version"))}
    assert by_task["qa.record"] == {"task": "qa.record", "n": SUCCESS, "attempts": SUCCESS, "tokens": SUCCESS}
    assert by_task["qa.flaky"] == {"task": "qa.flaky", "n": FLAKY, "attempts": 3 * FLAKY, "tokens": 3 * FLAKY}
    assert by_task["qa.poison"] == {"task": "qa.poison", "n": POISON, "attempts": 3 * POISON, "tokens": 3 * POISON}
    # Every execution is accounted for: one per claim, none lost, none duplicated.
    assert Execution.objects.count() == SUCCESS + 3 * FLAKY + 3 * POISON
    assert not Execution.objects.values("job_id", "attempt").annotate(n=Count("id")).filter(n__gt=1).exists()
    dead_errors = {len(j.errors) for j in Job.objects.filter(status="dead").only("errors")}
    assert dead_errors == {3}
    # The chart counters, kept by the trigger as the two workers moved the jobs, hold the same ledger.
    counters = {row["task"]: row for row in JobStat.objects.values("task").annotate(
        started=Sum("started"), done=Sum("done"), failed=Sum("failed"), dead=Sum("dead"), cancelled=Sum("cancelled"))}
    assert counters == {
        "qa.record": {"task": "qa.record", "started": SUCCESS, "done": SUCCESS, "failed": 0, "dead": 0, "cancelled": 0},
        "qa.flaky": {"task": "qa.flaky", "started": 3 * FLAKY, "done": FLAKY, "failed": 2 * FLAKY, "dead": 0,
                     "cancelled": 0},
        "qa.poison": {"task": "qa.poison", "started": 3 * POISON, "done": 0, "failed": 2 * POISON, "dead": POISON,
                      "cancelled": 0},
    }
    # Both processes did work.
    assert {j.leased_by.rsplit(":", 1)[1] for j in Job.objects.only("leased_by")} == {"w0", "w1"}
