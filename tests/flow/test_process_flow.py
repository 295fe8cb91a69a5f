"""Flow control with real ``runworker`` processes: per-key concurrency limits, queue rate limits,
pause/resume and cancel requests, measured across several worker subprocesses.

Each test starts worker subprocesses against the test database and reads outcomes from it.
Measured figures are printed (run pytest with ``-s`` to see them).
"""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from flowlab.models import Probe
from flowlab.tasks import (
    cancellable,
    customer_job,
    fenced_after_cancel,
    ignores_cancel,
    rated_noop,
    sleeper,
    snooze_once,
)

from django_leasequeue import enqueue_many, store
from django_leasequeue.models import Job, QueueState
from tests.conftest import wait_for

from .conftest import wait_workers, worker_env

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

LEASED_BY_KEY = """
SELECT concurrency_key, count(*) FROM leasequeue_job
WHERE status = 'leased' AND concurrency_key IS NOT NULL GROUP BY concurrency_key
"""


def all_finished(n: int) -> bool:
    return Job.objects.filter(status__in=["done", "dead", "cancelled"]).count() >= n


def test_keyed_limit_across_4_processes_of_2_threads(spawn, sampler):
    """200 jobs over 5 customers, limit 2, 8 threads in 4 processes: never more than 2 leased per
    customer at any sampled instant, and the other customers are not blocked (run time)."""
    for i in range(4):
        spawn("runworker", "--queues", "flow", "--concurrency", "2", "--worker-id", f"w{i}", env=worker_env())
    wait_workers(4)
    job_seconds = 0.1
    # Baseline: the same 200 jobs without a concurrency key, on the same workers.
    started = time.monotonic()
    enqueue_many(sleeper, [([], {"customer": f"c{c}", "seq": s, "seconds": job_seconds})
                           for c in range(5) for s in range(40)])
    wait_for(lambda: all_finished(200), timeout=60, interval=0.05, what="200 keyless jobs finished")
    baseline = time.monotonic() - started
    Job.objects.all().delete()
    sample = sampler(LEASED_BY_KEY, 0.003)
    started = time.monotonic()
    # Enqueued customer by customer, so each claim meets a full key's backlog before the others.
    enqueue_many(customer_job, [([], {"customer": f"c{c}", "seq": s, "seconds": job_seconds})
                                for c in range(5) for s in range(40)])
    wait_for(lambda: all_finished(200), timeout=60, interval=0.05, what="200 keyed jobs finished")
    elapsed = time.monotonic() - started
    sample.stop()
    assert Job.objects.filter(status="done", attempts=1).count() == 200  # waiting cost no attempt
    peak: dict[str, int] = {}
    concurrent_keys = 0
    for _, rows in sample.samples:
        for key, leased in rows:
            peak[key] = max(peak.get(key, 0), leased)
        concurrent_keys = max(concurrent_keys, len(rows))
    assert len(sample.samples) > 100
    assert max(peak.values()) <= 2, peak
    assert set(peak) == {f"customer-c{c}" for c in range(5)}
    # Not blocked: several customers ran side by side, and the run took far less than the 200 x 0.1 s
    # / 2 = 10 s it would take if one customer at a time held the queue.
    assert concurrent_keys >= 3
    ideal = 200 * job_seconds / 8
    print(f"\nkeyed limit: 200 jobs x {job_seconds}s, 5 customers, limit 2, 4x2 threads: {elapsed:.2f} s "
          f"(same jobs without a key {baseline:.2f} s, ideal {ideal:.2f} s, one customer at a time "
          f"{200 * job_seconds / 2:.0f} s); "
          f"{len(sample.samples)} samples, peak leased per customer {max(peak.values())}, "
          f"up to {concurrent_keys} customers at once")
    # Well under the one-customer-at-a-time bound; on a loaded machine, relative to the baseline.
    assert elapsed < max(200 * job_seconds / 2 * 0.8, 2 * baseline)


def test_rate_limit_20_per_second_over_200_jobs(spawn):
    """2 processes x 4 threads on a queue limited to 20/s: no 1-second window of claim times
    (attempted_at) holds more than 20, no job fails, and the workers wait instead of spinning."""
    env = worker_env(LEASEQUEUE_QUEUES=json.dumps({"rated": {"rate_limit": "20/s"}}))
    for i in range(2):
        spawn("runworker", "--queues", "rated", "--concurrency", "4", "--worker-id", f"r{i}", env=env)
    wait_workers(2)
    started = time.monotonic()
    enqueue_many(rated_noop, [[i] for i in range(200)])
    wait_for(lambda: all_finished(200), timeout=60, interval=0.1, what="200 rated jobs finished")
    elapsed = time.monotonic() - started
    jobs = list(Job.objects.values_list("status", "attempts", "attempted_at"))
    assert {(s, a) for s, a, _ in jobs} == {("done", 1)}
    stamps = sorted(t for _, _, t in jobs)
    worst = max(sum(1 for t in stamps[i:i + 40] if t <= start + timedelta(seconds=1))
                for i, start in enumerate(stamps))
    assert worst <= 20
    throttled = QueueState.objects.get(name="rated").throttled_total
    span = (stamps[-1] - stamps[0]).total_seconds()
    print(f"\nrate limit 20/s: 200 jobs in {elapsed:.2f} s (claims spanning {span:.2f} s), busiest 1 s "
          f"window {worst}, throttled claims {throttled}")
    assert span >= 200 / 20 - 1 - 0.05  # 180 claims after the first window need at least 9 s
    assert elapsed < 25  # the workers wake when the window frees, not a poll later per batch
    assert throttled < 120  # no spinning: about one refused claim per worker per window


def test_pause_stops_claims_within_one_poll_interval_and_resume_restarts(spawn):
    poll = 0.3
    spawn("runworker", "--queues", "flow", "--concurrency", "2", "--no-notify",
          env=worker_env(LEASEQUEUE_POLL_INTERVAL=str(poll)))
    wait_workers(1)
    running = customer_job.enqueue(customer="p", seq=0, seconds=1.5)
    wait_for(lambda: Job.objects.filter(pk=running.pk, status="leased").exists(), what="first job leased")
    assert store.queue_pause("flow", by="test")
    paused_at = store.db_now()
    enqueue_many(customer_job, [([], {"customer": f"q{i}", "seq": i, "seconds": 0}) for i in range(5)])
    time.sleep(poll * 4)
    assert Job.objects.filter(status="ready", attempts=0).count() == 5
    assert not Job.objects.filter(attempted_at__gt=paused_at).exists()
    # The job that was running when the queue was paused finishes normally.
    wait_for(lambda: Job.objects.filter(pk=running.pk, status="done").exists(), what="leased job finished")
    assert store.queue_resume("flow")
    resumed_at = store.db_now()
    wait_for(lambda: all_finished(6), timeout=20, what="jobs after resume")
    first_claim = min(Job.objects.exclude(pk=running.pk).values_list("attempted_at", flat=True))
    delay = (first_claim - resumed_at).total_seconds()
    print(f"\npause/resume: first claim {delay * 1000:.0f} ms after resume (poll interval {poll * 1000:.0f} ms)")
    assert delay <= poll + 0.2


def test_snooze_runs_the_job_again_after_the_delay(spawn):
    spawn("runworker", "--queues", "flow", "--concurrency", "1", env=worker_env())
    wait_workers(1)
    job = snooze_once.enqueue("s1", 1.0)
    wait_for(lambda: all_finished(1), timeout=20, what="snoozed job finished")
    job.refresh_from_db()
    runs = list(Probe.objects.filter(key="s1", event="run").order_by("at"))
    assert len(runs) == 2
    gap = (runs[1].at - runs[0].at).total_seconds()
    assert 1.0 <= gap < 3.0
    # Attempts as documented: the snoozed run is given back, so the job finishes at attempt 1.
    assert [r.attempt for r in runs] == [1, 1]
    assert (job.status, job.attempts, job.snoozes, job.result, job.errors) == ("done", 1, 1, "woke up", [])
    print(f"\nsnooze 1.0 s: ran again {gap:.3f} s later")


def test_cancel_of_a_running_job(spawn):
    """Lease 3 s, so heartbeats every 1 s: the handler sees the cancel within one heartbeat
    interval, the job ends cancelled, and no completion is recorded."""
    heartbeat = 1.0
    spawn("runworker", "--queues", "flow", "--concurrency", "3", env=worker_env())
    wait_workers(1)
    loop = cancellable.enqueue("c1")
    ignorer = ignores_cancel.enqueue("c2", 2.5)
    fenced = fenced_after_cancel.enqueue("c3")
    wait_for(lambda: Probe.objects.filter(event="started").count() == 3, what="three handlers started")
    time.sleep(0.3)  # somewhere inside a heartbeat interval
    asked_at = store.db_now()
    counts = store.job_request_cancel([loop.pk, ignorer.pk, fenced.pk], by="test")
    assert counts == store.CancelCounts(cancelled=0, requested=3, unchanged=0)
    wait_for(lambda: all_finished(3), timeout=20, what="cancelled jobs finished")
    observed = Probe.objects.get(key="c1", event="observed").at
    latency = (observed - asked_at).total_seconds()
    print(f"\ncancel: the handler observed it {latency * 1000:.0f} ms after the request "
          f"(heartbeat interval {heartbeat * 1000:.0f} ms)")
    assert latency <= heartbeat + 0.25
    for job in (loop, ignorer, fenced):
        job.refresh_from_db()
        assert (job.status, job.result) == ("cancelled", None), job
        assert job.finished_at is not None and job.attempts == 1 and job.errors == []
    assert not Probe.objects.filter(event__in=["finished", "committed"]).exists()
    assert Probe.objects.filter(key="c2", event="returned").exists()  # it ran to the end, result discarded


def test_cancel_of_a_ready_job_is_immediate(spawn):
    job = rated_noop.using(queue="flow").enqueue(1)
    counts = store.job_request_cancel([job.pk])
    assert counts.cancelled == 1
    job.refresh_from_db()
    assert job.status == "cancelled"
    spawn("runworker", "--queues", "flow", "--concurrency", "1", "--burst", env=worker_env()).wait(30)
    job.refresh_from_db()
    assert (job.status, job.attempts) == ("cancelled", 0)
