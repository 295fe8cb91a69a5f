"""Graceful and hard stop of ``runworker`` (case C07)."""

import re
import signal
import time

import pytest
from qa.models import Execution

from django_leasequeue import enqueue, store
from django_leasequeue.models import Job
from tests.support import claim, wait_for

pytestmark = [pytest.mark.process]


def running(*job_ids: int) -> bool:
    """True once every job is leased and its handler has started."""
    return (Job.objects.filter(pk__in=job_ids, status="leased").count() == len(job_ids)
            and Execution.objects.filter(job_id__in=job_ids).count() == len(job_ids))


def test_c07_sigterm_finishes_short_job_releases_long_one_and_exits_0(spawn):
    x = enqueue("qa.record", ["X"], {"sleep": 15})
    y = enqueue("qa.record", ["Y"], {"sleep": 1.5})
    w = spawn("runworker", "--concurrency", "2", env={"LEASEQUEUE_SHUTDOWN_GRACE": "2"})
    wait_for(lambda: running(x.id, y.id), timeout=60, what="both jobs to run")
    w.signal(signal.SIGTERM)
    signalled = time.monotonic()
    z = enqueue("qa.record", ["Z"])  # enqueued after the signal: must not be claimed
    assert w.wait(30) == 0, w.output()
    took = time.monotonic() - signalled
    assert 1.5 <= took < 10  # waited for the grace period, not for X's 15 s
    # The worker's own books say the same: Y done, X released (not a failed attempt).
    assert re.search(r"^worker \S+ stopped after [\d.]+ s: 2 claimed, 1 done, 0 retried, 0 dead-lettered, "
                     r"0 lease lost, 1 released$", w.output(), re.MULTILINE), w.output()

    y = Job.objects.get(pk=y.id)
    assert (y.status, y.attempts, y.lease_version, y.errors) == ("done", 1, 1, [])
    x = Job.objects.get(pk=x.id)
    # Released: back to ready at once, token bumped, lease cleared, not a failed attempt.
    assert (x.status, x.attempts, x.lease_version, x.leased_until, x.errors) == ("ready", 0, 2, None, [])
    assert x.history[-1]["event"] == "released" and x.history[-1]["reason"] == "worker shutdown"
    assert x.run_at <= store.db_now()
    z = Job.objects.get(pk=z.id)
    assert (z.status, z.attempts) == ("ready", 0)
    runs = Execution.objects.filter(job_id__in=[x.id, y.id, z.id]).values_list("job_id", "attempt")
    assert sorted(runs) == sorted([(x.id, 1), (y.id, 1)])

    # X is due at once for any other worker (it does not wait for the old lease to expire).
    again = {c.id: (c.attempts, c.lease_version) for c in claim(limit=10, worker_id="next-worker")}
    assert again == {x.id: (1, 3), z.id: (1, 1)}


def test_second_signal_exits_at_once(spawn):
    x = enqueue("qa.record", ["X"], {"sleep": 20})
    w = spawn("runworker", "--concurrency", "1", env={"LEASEQUEUE_SHUTDOWN_GRACE": "20"})
    wait_for(lambda: running(x.id), timeout=60, what="the job to run")
    w.signal(signal.SIGTERM)
    time.sleep(0.5)  # the first signal's graceful stop is now waiting for X
    assert w.running
    w.signal(signal.SIGTERM)
    start = time.monotonic()
    assert w.wait(10) == 1
    assert time.monotonic() - start < 5
    # No release happened: the lease simply expires and the reaper recovers the job.
    x = Job.objects.get(pk=x.id)
    assert (x.status, x.attempts, x.lease_version) == ("leased", 1, 1)
