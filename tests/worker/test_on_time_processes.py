"""On time with a real ``runworker`` that polls only every 10 s: a job enqueued with a delay, a
retried job and a snoozed job each start within a fraction of a second of their ``run_at``, by the
database's times (``attempted_at`` - ``run_at``), never before it.

Measured figures are printed (run pytest with ``-s`` to see them).
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from flowlab.models import Probe
from flowlab.tasks import fail_once, sleeper, snooze_once

from django_leasequeue import store
from django_leasequeue.models import Job
from tests.conftest import wait_for
from tests.flow.conftest import wait_workers

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

POLL = 10.0
# Far below the poll interval; generous for a loaded machine (a worker on time is ~ms late).
LATE_BOUND = 1.0


def test_delayed_retried_and_snoozed_jobs_start_on_time_with_a_10_s_poll(spawn):
    # The reaper's sweep also cuts an idle wait short: keep it out of the way, so only the
    # poll interval (10 s) and the wake-ups decide when the worker claims.
    spawn("runworker", "--queues", "flow", "--concurrency", "2", "--worker-id", "ontime",
          env={"LEASEQUEUE_POLL_INTERVAL": str(POLL), "LEASEQUEUE_REAPER_INTERVAL": "60"})
    wait_workers(1)
    time.sleep(0.5)  # its first claim found nothing: it now sleeps its idle wait
    started = time.monotonic()
    retried = fail_once.enqueue("retry")  # due now: notified, claimed, fails, retried 1.5 s later
    snoozed = snooze_once.enqueue("snooze", 1.2)  # due now: runs, snoozes for 1.2 s
    now = store.db_now()
    delayed = [sleeper.using(run_at=now + timedelta(seconds=s)).enqueue(customer="d", seq=i, seconds=0)
               for i, s in enumerate((0.8, 1.7, 2.6))]
    ids = [retried.pk, snoozed.pk, *(j.pk for j in delayed)]
    wait_for(lambda: Job.objects.filter(pk__in=ids, status="done").count() == 5, timeout=3 * POLL, interval=0.05,
             what="the five jobs done")
    elapsed = time.monotonic() - started
    jobs = {j.pk: j for j in Job.objects.filter(pk__in=ids)}
    # Exact outcomes: the retry ran as attempt 2, the snooze gave its attempt back, each ran once.
    assert (jobs[retried.pk].attempts, len(jobs[retried.pk].errors), jobs[retried.pk].result) == \
        (2, 1, "second time lucky")
    assert (jobs[snoozed.pk].attempts, jobs[snoozed.pk].snoozes, jobs[snoozed.pk].result) == (1, 1, "woke up")
    assert [r.attempt for r in Probe.objects.filter(key="retry", event="run").order_by("at")] == [1, 2]
    assert Probe.objects.filter(key="snooze", event="run").count() == 2
    assert [jobs[j.pk].attempts for j in delayed] == [1, 1, 1]
    # After a job finishes its run_at is the one of its last attempt (the retry's, the snooze's).
    late = {name: (jobs[pk].attempted_at - jobs[pk].run_at).total_seconds()
            for name, pk in [("retried", retried.pk), ("snoozed", snoozed.pk),
                             *((f"delayed {i}", j.pk) for i, j in enumerate(delayed))]}
    print("\non time, poll 10 s: " + ", ".join(f"{k} {v * 1000:.0f} ms late" for k, v in late.items())
          + f"; all done {elapsed:.2f} s after the first enqueue")
    assert all(v >= 0 for v in late.values()), late  # never before run_at
    assert all(v < LATE_BOUND for v in late.values()), late
    # Claimed in run_at order: the delayed jobs one after the other.
    claims = [jobs[j.pk].attempted_at for j in delayed]
    assert claims == sorted(claims)
