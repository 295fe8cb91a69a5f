"""Graceful stop: a handler that returns while the worker is stopping has its result written, or
its job released; never neither.

The race: the grace period runs out, the worker stops its completer (final flush), and then takes
the list of jobs still running to release them. A handler returning in between must not submit
its completion to the stopped completer (never written) while leaving the running list (never
released): such a job would stay ``leased`` until its lease expired and then run a second time.
"""

import threading
import time

import pytest
from qa.models import Execution
from qa.tasks import GATES

from django_leasequeue import enqueue, signals
from django_leasequeue.conf import build
from django_leasequeue.models import Job
from django_leasequeue.runtime import run_services
from django_leasequeue.worker import WorkerService
from tests.support import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def start_worker(grace: float) -> tuple[WorkerService, threading.Event, threading.Thread]:
    worker = WorkerService(concurrency=1, poll_interval=0.05, notify=False, reap=False,
                           settings=build({"LEASE": 30, "SHUTDOWN_GRACE": grace}))
    stop = threading.Event()
    thread = threading.Thread(target=run_services, args=([worker],), kwargs={"install_signals": False,
                                                                             "stop_when": stop})
    thread.start()
    return worker, stop, thread


def test_handler_returning_after_the_completers_final_flush_still_has_its_result_written(request):
    key = f"shutdown-{request.node.name}"
    job = enqueue("qa.adv_gated", [key])
    worker, stop, thread = start_worker(grace=0.2)
    wait_for(lambda: Execution.objects.filter(job_id=job.id).exists(), what="the handler to start")
    completer_join = worker.completer.join

    def join_then_let_the_handler_return(timeout=None):
        # Exactly in the window: the completer has stopped; the handler returns now and its
        # job leaves the running list before the worker looks for jobs to release.
        stopped = completer_join(timeout)
        GATES[key].set()
        wait_for(lambda: worker.pool.free_slots() == 1, timeout=10, what="the handler to return")
        return stopped

    worker.completer.join = join_then_let_the_handler_return
    stop.set()
    thread.join(30)
    assert not thread.is_alive()
    job.refresh_from_db()
    assert (job.status, job.attempts, job.result, job.leased_until) == ("done", 1, key, None)
    assert Execution.objects.filter(job_id=job.id).count() == 1


def test_handler_still_running_after_the_grace_period_is_released_and_its_late_result_discarded(request):
    key = f"shutdown-{request.node.name}"
    job = enqueue("qa.adv_gated", [key])
    released = []
    signals.job_released.connect(lambda sender, job_id, **kw: released.append(job_id), weak=False,
                                 dispatch_uid="adversarial-shutdown-released")
    try:
        worker, stop, thread = start_worker(grace=0.2)
        wait_for(lambda: Execution.objects.filter(job_id=job.id).exists(), what="the handler to start")
        claimed_token = Job.objects.get(pk=job.id).lease_version
        started = time.monotonic()
        stop.set()
        thread.join(30)
        assert not thread.is_alive() and time.monotonic() - started < 10
    finally:
        signals.job_released.disconnect(dispatch_uid="adversarial-shutdown-released")
    job.refresh_from_db()
    # Back to ready at once, token bumped, not a failed attempt (the claim is given back: attempts 0).
    assert (job.status, job.attempts, job.lease_version, job.errors) == ("ready", 0, claimed_token + 1, [])
    assert released == [job.id]
    GATES[key].set()  # the handler returns now; its completion must not be written
    wait_for(lambda: worker.pool.free_slots() == 1, timeout=10, what="the handler to return")
    worker.completer.flush()
    job.refresh_from_db()
    assert (job.status, job.lease_version, job.result) == ("ready", claimed_token + 1, None)


def test_prefetched_jobs_no_thread_started_go_back_at_once_and_the_running_one_finishes(request):
    """Graceful stop with prefetched jobs: the ones no thread started are released at once (token
    bumped, no attempt, no start time), the running one still finishes within the grace period."""
    key = f"shutdown-{request.node.name}"
    running = enqueue("qa.adv_gated", [key], priority=10)
    waiting = [enqueue("qa.record", [f"p{i}"]) for i in range(5)]
    worker = WorkerService(concurrency=1, poll_interval=0.05, notify=False, reap=False, prefetch_wait=0.05,
                           prefetch_max=8, settings=build({"LEASE": 30, "SHUTDOWN_GRACE": 10}))
    worker.pool.avg_runtime = 0.001  # recent jobs were short: the first claim prefetches
    stop = threading.Event()
    thread = threading.Thread(target=run_services, args=([worker],), kwargs={"install_signals": False,
                                                                             "stop_when": stop})
    thread.start()
    try:
        wait_for(lambda: Execution.objects.filter(job_id=running.id).exists(), what="the gated handler to start")
        # One thread, six held jobs: the gated one runs, five wait in the pool, leased and heartbeated.
        assert len(worker.pool.inflight_snapshot()) == 6
        assert Job.objects.filter(status="leased").count() == 6
        stop.set()
        wait_for(lambda: Job.objects.filter(pk__in=[j.id for j in waiting], status="ready").count() == 5,
                 timeout=10, what="the prefetched jobs to be released")
    finally:
        GATES[key].set()
        stop.set()
        thread.join(30)
    assert not thread.is_alive()
    running.refresh_from_db()
    assert (running.status, running.attempts, running.result) == ("done", 1, key)
    rows = Job.objects.filter(pk__in=[j.id for j in waiting])
    assert {(j.status, j.attempts, j.lease_version, j.started_at, j.history[-1]["event"], j.history[-1]["reason"])
            for j in rows} == {("ready", 0, 2, None, "released", "worker shutdown")}
    assert not Execution.objects.filter(job_id__in=[j.id for j in waiting]).exists()
