"""The line ``runworker`` prints when it stops: what the worker did, counted by the worker itself,
checked against the job rows and the handler executions of a known workload, after a ``--burst``
run and after SIGTERM and SIGINT."""

from __future__ import annotations

import re
import signal

import pytest
from qa.models import Execution

from django_leasequeue import enqueue
from django_leasequeue.models import Job
from tests.support import wait_for

pytestmark = [pytest.mark.process]

FAST = {"LEASEQUEUE_POLL_INTERVAL": "0.2"}
SUMMARY = re.compile(r"^worker (\S+) stopped after (\d+\.\d) s: (.*)$", re.MULTILINE)
# 5 jobs that succeed, 1 that fails its first attempt and succeeds on its retry (due at once),
# 1 that fails with max_attempts=1: 8 claims, 6 done, 1 retried, 1 dead letter.
EXPECTED = "8 claimed, 6 done, 1 retried, 1 dead-lettered, 0 lease lost, 0 released"


def enqueue_the_workload() -> list[int]:
    ids = [enqueue("qa.record", [f"ok {n}"]).id for n in range(5)]
    ids.append(enqueue("qa.fails_first").id)
    ids.append(enqueue("qa.fail_once").id)
    return ids


def assert_the_books(output: str, ids: list[int]) -> None:
    found = SUMMARY.findall(output)
    assert len(found) == 1, output
    worker_id, seconds, counts = found[0]
    assert counts == EXPECTED, output
    assert 0 < float(seconds) < 120
    # The rows agree: every claim of this worker is one attempt of the jobs, and every attempt ran
    # its handler once.
    jobs = {j.pk: j for j in Job.objects.filter(pk__in=ids)}
    assert sorted((j.status, j.attempts) for j in jobs.values()) == [("dead", 1)] + [("done", 1)] * 5 + [("done", 2)]
    assert sum(j.attempts for j in jobs.values()) == 8
    assert Execution.objects.filter(job_id__in=ids).count() == 8
    assert set(Execution.objects.filter(job_id__in=ids).values_list("worker", flat=True)) == {worker_id}


def test_a_burst_run_prints_what_it_did_when_it_exits(spawn):
    ids = enqueue_the_workload()
    worker = spawn("runworker", "--burst", "--concurrency", "2", env=FAST)
    assert worker.wait(90) == 0, worker.output()
    assert_the_books(worker.output(), ids)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_worker_stopped_by_a_signal_prints_the_same_line(spawn, sig):
    ids = enqueue_the_workload()
    worker = spawn("runworker", "--concurrency", "2", env=FAST)
    wait_for(lambda: Job.objects.filter(pk__in=ids, status__in=["done", "dead"]).count() == len(ids), timeout=90,
             what="the workload to finish")
    worker.signal(sig)
    assert worker.wait(60) == 0, worker.output()
    assert_the_books(worker.output(), ids)
