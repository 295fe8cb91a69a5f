"""Debounce with a real ``runworker`` process: many rapid enqueues of one key run the handler
exactly once, with the arguments of the last enqueue, after the debounce delay."""

from __future__ import annotations

import pytest
from qa.models import Execution

from django_leasequeue import enqueue
from django_leasequeue.models import Job, WorkerProcess
from tests.support import wait_for

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

ENQUEUES = 25


def test_debounced_burst_runs_once_with_the_last_arguments(spawn):
    spawn("runworker", "--concurrency", "2", "--worker-id", "debouncer",
          env={"LEASEQUEUE_POLL_INTERVAL": "0.2", "LEASEQUEUE_SHUTDOWN_GRACE": "2"})
    wait_for(lambda: WorkerProcess.objects.filter(kind="worker").exists(), timeout=30, what="worker registered")
    ids = {enqueue("qa.record", [f"edit {i}"], unique_key="reindex:42", unique_mode="debounce",
                   debounce=1.5, debounce_max_wait=30).id for i in range(ENQUEUES)}
    (job_id,) = ids
    wait_for(lambda: Job.objects.filter(id=job_id, status="done").exists(), timeout=20, interval=0.05,
             what="the debounced job done")
    job = Job.objects.get(id=job_id)
    (execution,) = Execution.objects.all()
    assert (execution.job_id, execution.tag, execution.attempt, execution.lease_version) == (
        job_id, f"edit {ENQUEUES - 1}", 1, 1)
    assert (job.args, job.attempts, job.result) == ([f"edit {ENQUEUES - 1}"], 1, f"edit {ENQUEUES - 1}")
    # It started no earlier than its run_at, which the last enqueue pushed to that enqueue + 1.5 s.
    assert job.started_at >= job.run_at
    assert Job.objects.count() == 1
