"""A graceful stop in process mode (``EXECUTION = "process"``) owns the outcome of the attempts
whose children it kills after ``SHUTDOWN_GRACE``: each job is released, as interrupted only when
its handler had started in the child, and the killed child's thread records nothing of its own (no
failed attempt for the closed pipe, no lost lease for the write the release refused, nothing in
the worker's books).

Real ``runworker`` processes: 4 jobs on 4 threads, a 1 s grace, handlers that sleep 6 s, SIGTERM
once the 4 jobs are leased. ``TESTPROJECT_SLOW_SETUP`` makes every child take 8 s to set Django up,
so the stop kills them all before any handler starts; without it the test waits for the 4 handlers
to have started (their Execution rows) before the signal.
"""

from __future__ import annotations

import re
import signal

import pytest
from qa.models import Execution

from django_leasequeue import enqueue
from django_leasequeue.models import Job
from tests.support import wait_for

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

ENV = {"LEASEQUEUE_EXECUTION": "process", "LEASEQUEUE_SHUTDOWN_GRACE": "1", "LEASEQUEUE_POLL_INTERVAL": "0.2",
       "LEASEQUEUE_LEASE": "30", "LEASEQUEUE_REAPER_INTERVAL": "60"}
SUMMARY = re.compile(r"^worker \S+ stopped after \d+\.\d s: (.*)$", re.MULTILINE)


def stop_while_running(spawn, *, slow_setup: bool) -> tuple[list[Job], str]:
    """Run 4 sleeping jobs (``max_attempts=1``) on one process-mode worker and SIGTERM it once they
    are leased (``slow_setup``: children still setting Django up) or their handlers started."""
    ids = [enqueue("qa.record", [f"stop {n}"], {"sleep": 6.0}, max_attempts=1).id for n in range(4)]
    env = {**ENV, **({"TESTPROJECT_SLOW_SETUP": "8"} if slow_setup else {})}
    # The worker loads the settings too: with slow_setup it takes 8 s to start.
    worker = spawn("runworker", "--concurrency", "4", env=env)
    wait_for(lambda: Job.objects.filter(pk__in=ids, status="leased").count() == 4, timeout=90,
             what="the 4 jobs leased")
    if not slow_setup:
        wait_for(lambda: Execution.objects.filter(job_id__in=ids).count() == 4, timeout=90,
                 what="the 4 handlers started in their children")
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.output()
    found = SUMMARY.findall(worker.output())
    assert len(found) == 1, worker.output()
    return list(Job.objects.filter(pk__in=ids).order_by("pk")), found[0]


def assert_released_by_the_stop(jobs: list[Job], counts: str, *, interruptions: int) -> None:
    assert [(j.status, j.attempts, j.interruptions) for j in jobs] == [("ready", 0, interruptions)] * 4
    assert [j.errors for j in jobs] == [[]] * 4  # no EOFError, no ChildProcessFailed: no failed attempt
    for job in jobs:
        events = [entry["event"] for entry in job.history]
        assert "lease_lost" not in events, job.history
        released = [entry for entry in job.history if entry["event"] == "released"]
        assert [(e["reason"], e["interrupted"]) for e in released] == [("worker shutdown", bool(interruptions))]
    # The books add up: 4 claims, 4 releases, nothing else, nothing unsettled.
    assert counts == "4 claimed, 0 done, 0 retried, 0 dead-lettered, 0 lease lost, 4 released"


def test_children_still_setting_up_at_the_stop_are_released_as_never_started(spawn):
    jobs, counts = stop_while_running(spawn, slow_setup=True)
    assert Execution.objects.filter(job_id__in=[j.pk for j in jobs]).count() == 0  # no handler ran
    assert_released_by_the_stop(jobs, counts, interruptions=0)


def test_handlers_cut_by_the_grace_are_released_as_interrupted(spawn):
    jobs, counts = stop_while_running(spawn, slow_setup=False)
    assert Execution.objects.filter(job_id__in=[j.pk for j in jobs]).count() == 4
    assert_released_by_the_stop(jobs, counts, interruptions=1)
