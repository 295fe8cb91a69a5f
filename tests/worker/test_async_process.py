"""``async def`` handlers in a real ``runworker`` process: many at once on its event loop, and a
graceful stop that gives back the jobs still running (``runworker --async-slots``)."""

from __future__ import annotations

import signal

import pytest
from qa.async_tasks import ASYNC_TASKS

from django_leasequeue import enqueue_many, registry
from django_leasequeue.models import Job
from tests.support import tasks_registered, wait_for

pytestmark = pytest.mark.process

# Registered only while these tests run (see qa.async_tasks): popped as soon as imported.
for _task in ASYNC_TASKS:
    registry._REGISTRY.pop(_task.name, None)  # another module may have popped it first

ENV = {"LEASEQUEUE_ASYNC_TASKS": "1", "LEASEQUEUE_SHUTDOWN_GRACE": "1"}


@pytest.fixture(autouse=True)
def _registered():
    # For enqueue in this process; unregistered after (see qa.async_tasks).
    with tasks_registered(ASYNC_TASKS):
        yield


def test_a_runworker_runs_300_async_jobs_at_once_on_its_event_loop(spawn):
    enqueue_many("qa.async_nap", [[0.5]] * 300)
    worker = spawn("runworker", "--burst", "--concurrency", "1", "--async-slots", "300", env=ENV)
    assert worker.wait(120) == 0
    rows = list(Job.objects.filter(task="qa.async_nap").values_list("status", "attempts", "result"))
    assert len(rows) == 300
    assert {(status, attempts) for status, attempts, _ in rows} == {("done", 1)}
    assert {result[0] for _, _, result in rows} == {"leasequeue-async"}  # the loop's thread
    assert max(result[1] for _, _, result in rows) > 1  # several at once (300 when none is late)
    assert "300 claimed, 300 done" in worker.output()


def test_sigterm_gives_back_the_async_jobs_still_running(spawn):
    enqueue_many("qa.async_nap", [[60]] * 20)
    worker = spawn("runworker", "--concurrency", "1", "--async-slots", "50", env=ENV)
    wait_for(lambda: Job.objects.filter(task="qa.async_nap", status="leased").count() == 20, timeout=60,
             what="the 20 jobs to be claimed")
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    rows = list(Job.objects.filter(task="qa.async_nap").values_list("status", "attempts", "interruptions"))
    # Interrupted after the 1 s grace: back to ready, the attempt refunded, the interruption counted.
    assert rows == [("ready", 0, 1)] * 20
