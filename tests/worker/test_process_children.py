"""Process execution: a handler's child process never outlives its worker or its lease.

A worker killed with SIGKILL cannot stop its children, and a child whose lease is lost would run
on beside the job's next attempt (for a job of a sequence, beside the jobs behind it). The kernel
kills the child with its worker (``PR_SET_PDEATHSIG``), and the worker kills a child whose lease the
heartbeat found lost.
"""

from __future__ import annotations

import os

import pytest
from qa.models import Execution

from django_leasequeue.models import Job
from tests.conftest import wait_for

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

ENV = {"LEASEQUEUE_POLL_INTERVAL": "0.1", "LEASEQUEUE_LEASE": "30", "LEASEQUEUE_REAPER_INTERVAL": "60"}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def child_pid() -> int:
    wait_for(lambda: Execution.objects.filter(tag__startswith="pid:").exists(), timeout=60, interval=0.05,
             what="the handler started in its child process")
    return int(Execution.objects.get(tag__startswith="pid:").tag.removeprefix("pid:"))


def test_a_child_dies_with_its_worker(spawn):
    from qa.tasks import child_pid_sleeper

    child_pid_sleeper.enqueue(60)
    worker = spawn("runworker", "--concurrency", "1", "--execution", "process", env=ENV)
    pid = child_pid()
    assert alive(pid) and pid != worker.pid
    worker.kill()  # SIGKILL: the worker runs no code of its own any more
    wait_for(lambda: not alive(pid), timeout=5, interval=0.05, what="the child gone with its worker")


def test_a_child_whose_lease_is_lost_is_killed(spawn):
    from qa.tasks import child_pid_sleeper

    job = child_pid_sleeper.enqueue(60)
    spawn("runworker", "--concurrency", "1", "--execution", "process",
          env={**ENV, "LEASEQUEUE_LEASE": "3"})  # renewed every second or so
    pid = child_pid()
    # What a reaper and another worker's claim do to a lease this worker can no longer renew.
    Job.objects.filter(pk=job.pk).update(lease_version=job.lease_version + 5, leased_by="elsewhere")
    wait_for(lambda: not alive(pid), timeout=10, interval=0.05, what="the child killed after its lease was lost")
    assert Execution.objects.count() == 1
