"""``runworker --metrics-port``: a real worker process serves its attempt counters and histograms,
scraped over HTTP and parsed with prometheus_client's own parser; the figures are a ledger of the
jobs run."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from django_leasequeue import enqueue
from django_leasequeue.models import Job
from tests.support import wait_for

pytestmark = [pytest.mark.process]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, str, str], float]:
    """Every leasequeue sample by (name, queue, task)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("leasequeue_") and "le" not in sample.labels:
                samples[(sample.name, sample.labels["queue"], sample.labels["task"])] = sample.value
    return samples


def test_a_worker_serves_exact_counters_and_histogram_counts_per_queue_and_task(spawn):
    port = free_port()
    records = [enqueue("qa.record", [f"r{n}"]) for n in range(5)]
    flaky = [enqueue("qa.flaky", kwargs={"failures": 2}) for _ in range(2)]  # 2 failed attempts each
    poison = enqueue("qa.poison")  # 3 attempts (max_attempts), then a dead letter
    worker = spawn("runworker", "--concurrency", "2", "--metrics-port", str(port),
                   env={"LEASEQUEUE_POLL_INTERVAL": "0.2"})
    ids = [j.id for j in [*records, *flaky, poison]]
    wait_for(lambda: Job.objects.filter(pk__in=ids, status__in=["done", "dead"]).count() == 8, timeout=60,
             what="every job to finish")
    # The hook counts right after each outcome is written: wait for the last count to land.
    wait_for(lambda: scrape(port).get(("leasequeue_job_run_seconds_count", "default", "qa.poison")) == 3,
             timeout=10, what="the dead letter to be counted")
    assert worker.running
    assert sorted(Job.objects.filter(pk__in=ids).values_list("task", "status", "attempts")) == sorted(
        [("qa.record", "done", 1)] * 5 + [("qa.flaky", "done", 3)] * 2 + [("qa.poison", "dead", 3)])
    got = scrape(port)
    q = "default"
    expected = {
        ("leasequeue_jobs_completed_total", q, "qa.record"): 5.0,
        ("leasequeue_jobs_completed_total", q, "qa.flaky"): 2.0,
        ("leasequeue_jobs_failed_total", q, "qa.flaky"): 4.0,
        ("leasequeue_jobs_failed_total", q, "qa.poison"): 2.0,
        ("leasequeue_jobs_dead_lettered_total", q, "qa.poison"): 1.0,
        ("leasequeue_jobs_retried_total", q, "qa.flaky"): 4.0,
        ("leasequeue_jobs_retried_total", q, "qa.poison"): 2.0,
        ("leasequeue_job_run_seconds_count", q, "qa.record"): 5.0,
        ("leasequeue_job_run_seconds_count", q, "qa.flaky"): 6.0,
        ("leasequeue_job_run_seconds_count", q, "qa.poison"): 3.0,
        ("leasequeue_job_wait_seconds_count", q, "qa.record"): 5.0,
        ("leasequeue_job_wait_seconds_count", q, "qa.flaky"): 6.0,
        ("leasequeue_job_wait_seconds_count", q, "qa.poison"): 3.0,
    }
    counted = {key: value for key, value in got.items()
               if key[0].endswith(("_total", "_count")) and value}
    assert counted == expected
    assert not any(key[0] == "leasequeue_jobs_fenced_out_total" for key in got)  # no attempt was fenced out
    # Sums are positive and below the test's own minute.
    for task in ("qa.record", "qa.flaky", "qa.poison"):
        assert 0 < got[("leasequeue_job_run_seconds_sum", q, task)] < 60
        assert 0 <= got[("leasequeue_job_wait_seconds_sum", q, task)] < 60


@pytest.mark.parametrize("port", ["0", "70000"])
def test_a_metrics_port_outside_1_to_65535_is_refused_before_the_worker_starts(spawn, port):
    worker = spawn("runworker", "--metrics-port", port)
    assert worker.wait(60) != 0
    assert f"--metrics-port must be a TCP port from 1 to 65535, not {port}" in worker.output()


def test_a_metrics_port_in_use_is_a_clear_error(spawn):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        worker = spawn("runworker", "--metrics-port", str(port))
        assert worker.wait(60) != 0
    assert f"--metrics-port {port} on 127.0.0.1: cannot serve metrics" in worker.output()
