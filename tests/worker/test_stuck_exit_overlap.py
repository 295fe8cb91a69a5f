"""Never two attempts of one job running at once, timed-out handlers included: the retry of a stuck
attempt that a stopping worker records.

A worker whose handler is stuck past its timeout (thread mode) stops gracefully (``STUCK_EXIT_AFTER``,
``STUCK_HANDLERS_MAX``, or a SIGTERM) and, in its ``on_stop``, records the stuck attempt as a
``JobTimedOut`` failure: the job goes back to ready with the task's backoff. The stuck thread
cannot be stopped; it dies with the process. But the process is not gone yet: after that write
it still stops its heartbeat, deregisters, joins its listener, and exits the interpreter. With a
short backoff (``qa.hang_forever`` has 0.05 s) another worker could claim and start the retry while
the stuck attempt still runs in the exiting process (docs/explanation/leases.md: "the stuck
attempts fail as JobTimedOut and are retried once the process is gone"). The chaos test
(tests/worker/test_hang.py) runs that worker with no other worker alive, so it cannot see this.

The rule held here: the retry of an attempt recorded as stuck by a stopping worker is not due
before one lease has passed, the time a killed worker's job waits for its lease to expire.
"""

from __future__ import annotations

import time

import pytest
from qa.models import Execution

from django_leasequeue import enqueue
from django_leasequeue.models import Job, WorkerProcess
from tests.support import job_in, wait_for
from tests.support.chaos.harness import db_now

pytestmark = pytest.mark.process

TIMED_OUT = "django_leasequeue.exceptions.JobTimedOut"


def test_the_retry_of_a_stuck_attempt_does_not_start_before_the_stuck_worker_is_gone(spawn):
    env = {"LEASEQUEUE_LEASE": "2", "LEASEQUEUE_REAPER_INTERVAL": "0.5", "LEASEQUEUE_POLL_INTERVAL": "0.05",
           "LEASEQUEUE_SHUTDOWN_GRACE": "3"}
    job = enqueue("qa.hang_forever")  # timeout=1, backoff=0.05; the first attempt blocks for good
    # It exits STUCK_EXIT_AFTER past the timeout, and only then: the count bound is off (above the
    # concurrency), else a --concurrency 1 worker exits at its first stuck handler, before a loaded
    # machine has started the second worker.
    stuck = spawn("runworker", "--concurrency", "1", env={**env, "LEASEQUEUE_STUCK_EXIT_AFTER": "8",
                                                         "LEASEQUEUE_STUCK_HANDLERS_MAX": "2"})
    wait_for(lambda: job_in(job.id, "leased"), timeout=60, what="the hung job to be claimed")
    other = spawn("runworker", "--concurrency", "1", env=env)
    wait_for(lambda: WorkerProcess.objects.filter(pid=other.pid).exists(), timeout=60, what="the second worker")
    assert stuck.running, stuck.output()
    while stuck.running:  # it exits (status 3) STUCK_EXIT_AFTER past the timeout
        time.sleep(0.002)
    gone = db_now()
    assert stuck.proc.returncode == 3, stuck.output()
    wait_for(lambda: job_in(job.id, "done"), timeout=30, what="the retry")
    row = Job.objects.get(pk=job.id)
    assert [e["type"] for e in row.errors] == [TIMED_OUT]
    runs = list(Execution.objects.filter(job_id=job.id).order_by("attempt"))
    assert [r.attempt for r in runs] == [1, 2]
    # The retry may start only once the process running the stuck attempt is gone.
    assert runs[1].created_at >= gone, (f"attempt 2 started {(gone - runs[1].created_at).total_seconds():.3f} s "
                                        "before the process running the stuck attempt 1 was gone")
