"""Two real ``runworker`` processes and no runreaper: the elected worker prunes finished jobs past
``RETENTION``; SIGKILLed, the other takes over once its row's heartbeat ages past
``PROCESS_ALIVE_WITHIN``. Who pruned is read from each process's own log line."""

from __future__ import annotations

import re
import signal
import time
from datetime import timedelta

import pytest
from invoices.tasks import flaky_sync

from django_leasequeue import enqueue_many, store
from django_leasequeue.models import Job, WorkerProcess
from tests.support import wait_for

pytestmark = [pytest.mark.process]

ENV = {"LEASEQUEUE_MAINTENANCE_INTERVAL": "0.5", "LEASEQUEUE_PROCESS_ALIVE_WITHIN": "10",
       "LEASEQUEUE_REAPER_INTERVAL": "0.5", "LEASEQUEUE_POLL_INTERVAL": "0.5", "LEASEQUEUE_LOG_LEVEL": "INFO"}
PRUNED = re.compile(r"maintenance by (\S+): pruned (\d+) finished job\(s\)")


def finished_long_ago(count: int, tag: str) -> list[int]:
    """``count`` done jobs finished 8 days ago (past the default 7-day RETENTION)."""
    enqueue_many(flaky_sync.using(queue="nobody"), [[f"{tag}{i}"] for i in range(count)])
    ids = list(Job.objects.filter(status="ready", queue="nobody").values_list("id", flat=True))
    Job.objects.filter(pk__in=ids).update(status="done", finished_at=store.db_now() - timedelta(days=8))
    return ids


def pruned_by(output: str) -> list[tuple[str, int]]:
    return [(m[1], int(m[2])) for m in PRUNED.finditer(output)]


def test_one_elected_worker_prunes_and_the_other_takes_over_after_a_sigkill(spawn):
    first = spawn("runworker", "--concurrency", "1", "--queues", "default", env=ENV)
    first_id = wait_for(lambda: WorkerProcess.objects.filter(pid=first.pid).values_list("id", flat=True).first(),
                        what="the first worker's row")
    time.sleep(0.05)  # a later started_at for the second worker, whatever the clock's resolution
    second = spawn("runworker", "--concurrency", "1", "--queues", "default", env=ENV)
    second_id = wait_for(lambda: WorkerProcess.objects.filter(pid=second.pid).values_list("id", flat=True).first(),
                         what="the second worker's row")
    assert store.process_maintainer(alive_within=10) == first_id

    finished_long_ago(5, "a")
    wait_for(lambda: not Job.objects.exists(), timeout=20, what="the first 5 jobs pruned")
    wait_for(lambda: pruned_by(first.output()), what="the first worker's log line")
    assert (pruned_by(first.output()), pruned_by(second.output())) == ([(first_id, 5)], [])

    first.signal(signal.SIGKILL)
    first.proc.wait(10)
    killed_at = time.monotonic()
    finished_long_ago(7, "b")
    wait_for(lambda: not Job.objects.exists(), timeout=30, what="the next 7 jobs pruned by the survivor")
    took_over = time.monotonic() - killed_at
    wait_for(lambda: pruned_by(second.output()), what="the second worker's log line")
    assert pruned_by(second.output()) == [(second_id, 7)]
    assert pruned_by(first.output()) == [(first_id, 5)]
    assert store.process_maintainer(alive_within=10) == second_id
    # Not before the dead worker's heartbeat aged past PROCESS_ALIVE_WITHIN (10 s; it beats every 5 s).
    assert 5 <= took_over < 20, took_over
    print(f"takeover {took_over:.1f} s after SIGKILL")
