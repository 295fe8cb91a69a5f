"""Retries decided by the error, with a real ``runworker`` process (thread and process execution).

Three kinds of jobs run side by side: one raising a ``discard_on`` error, one raising a
``retry_on`` error until its third attempt, and one asking ``Retry(at=now + 0.2 s)`` on its first
attempt. Every handler run writes an ``Execution`` row, outside any fence, so the counts below
are the handler's real executions.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime

import pytest
from qa.models import Execution

from django_leasequeue.models import Job
from tests.conftest import wait_for

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

ENV = {"LEASEQUEUE_POLL_INTERVAL": "0.1", "LEASEQUEUE_REAPER_INTERVAL": "5", "LEASEQUEUE_SHUTDOWN_GRACE": "2"}


# Process mode starts one interpreter per attempt (about a second each here): fewer jobs keep it short.
@pytest.mark.parametrize(("execution", "n"), [("thread", 4), ("process", 2)])
def test_discarded_retried_and_retry_at_jobs_end_with_exact_attempts_and_runs(spawn, execution, n):
    from qa.tasks import discarded_error, flaky_until_third, retry_at

    discarded = [discarded_error.enqueue(i).id for i in range(n)]
    flaky = [flaky_until_third.enqueue(i).id for i in range(n)]
    retried_at = [retry_at.enqueue(i).id for i in range(n)]
    spawn("runworker", "--concurrency", "4", "--execution", execution, env=ENV)
    wait_for(lambda: Job.objects.filter(status__in=["done", "dead"]).count() == 3 * n, timeout=60, interval=0.05,
             what=f"{3 * n} jobs finished")
    jobs = {job.id: job for job in Job.objects.all()}
    runs = Counter(Execution.objects.values_list("job_id", flat=True))
    attempts_run = {job_id: sorted(Execution.objects.filter(job_id=job_id).values_list("attempt", flat=True))
                    for job_id in jobs}

    for job_id in discarded:
        job = jobs[job_id]
        assert (job.status, job.attempts, runs[job_id], len(job.errors)) == ("dead", 1, 1, 1)
        assert (job.errors[0]["type"], job.errors[0]["decision"]) == ("builtins.PermissionError", "discarded")
        assert job.errors[0]["reason"] == "PermissionError matches discard_on (PermissionError)"

    for job_id in flaky:
        job = jobs[job_id]
        assert (job.status, job.attempts, runs[job_id], attempts_run[job_id]) == ("done", 3, 3, [1, 2, 3])
        assert [e["type"] for e in job.errors] == ["builtins.ConnectionError"] * 2
        assert not any("decision" in e for e in job.errors)

    for i, job_id in enumerate(retried_at):
        job = jobs[job_id]
        assert (job.status, job.attempts, runs[job_id], attempts_run[job_id]) == ("done", 2, 2, [1, 2])
        (entry,) = job.errors
        assert (entry["decision"], entry["reason"]) == ("retry_requested", f"quota resets (record {i})")
        at = datetime.fromisoformat(entry["message"].split(" at ", 1)[1].split(": ", 1)[0])
        assert job.run_at == at  # the retry was due exactly at the time the handler asked for
        assert 0 < (at - datetime.fromisoformat(entry["at"])).total_seconds() <= 0.2  # at = now + 0.2 s, read first
        assert job.attempted_at >= at  # and not claimed before it

    assert sum(runs.values()) == n * (1 + 3 + 2)


def test_a_dead_child_is_retried_whatever_retry_on_says(spawn):
    # The child exits with no exception to match: retry_on=ConnectionError must not dead-letter it.
    from qa.tasks import child_dies_once

    ids = [child_dies_once.enqueue(i).id for i in range(2)]
    spawn("runworker", "--concurrency", "2", "--execution", "process", env=ENV)
    wait_for(lambda: Job.objects.filter(status__in=["done", "dead"]).count() == 2, timeout=60, interval=0.05,
             what="2 jobs finished")
    for job in Job.objects.filter(id__in=ids):
        assert (job.status, job.attempts, job.result) == ("done", 2, ids.index(job.id))
        (entry,) = job.errors
        assert entry["type"].endswith("ChildProcessFailed") and "decision" not in entry
        assert "died (exit code 3)" in entry["message"]
    assert sorted(Execution.objects.values_list("attempt", flat=True)) == [1, 1, 2, 2]
