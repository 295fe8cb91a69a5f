"""The worker's attempt counters in process: a lost lease is one fenced-out attempt, however many
of its writes are refused, and its run time is not observed; the takeover counts as a retry."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from django_leasequeue import enqueue, worker_metrics
from django_leasequeue.attempt_hooks import uninstall_attempt_hook
from django_leasequeue.testing import drain
from django_leasequeue.testing.lost_lease import simulate_lost_lease

pytestmark = pytest.mark.django_db

NAMES = ("leasequeue_jobs_completed_total", "leasequeue_jobs_failed_total", "leasequeue_jobs_dead_lettered_total",
         "leasequeue_jobs_retried_total", "leasequeue_jobs_fenced_out_total", "leasequeue_job_run_seconds_count",
         "leasequeue_job_wait_seconds_count")


def figures(task: str) -> dict[str, float]:
    labels = {"queue": "default", "task": task}
    return {name: REGISTRY.get_sample_value(name, labels) or 0.0 for name in NAMES}


@pytest.fixture
def hook():
    worker_metrics.install()
    yield worker_metrics.HOOK
    uninstall_attempt_hook(worker_metrics.HOOK)


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name.removeprefix("leasequeue_"): after[name] - before[name] for name in NAMES
            if after[name] != before[name]}


def test_a_lost_lease_is_one_fenced_out_attempt_and_the_takeover_a_counted_retry(hook):
    job = enqueue("qa.record", ["fenced"])
    before = figures("qa.record")
    lost = simulate_lost_lease(job)
    assert (lost.stale.outcome, lost.takeover.outcome, lost.job.status) == ("lease_lost", "done", "done")
    assert delta(before, figures("qa.record")) == {
        "jobs_fenced_out_total": 1.0, "jobs_completed_total": 1.0, "jobs_retried_total": 1.0,
        "job_run_seconds_count": 1.0, "job_wait_seconds_count": 2.0}


def test_a_dead_letter_counts_its_attempt_and_nothing_is_counted_without_the_hook(hook):
    before = figures("qa.fail_once")
    enqueue("qa.fail_once")
    drain(raise_failures=False)
    assert delta(before, figures("qa.fail_once")) == {
        "jobs_dead_lettered_total": 1.0, "job_run_seconds_count": 1.0, "job_wait_seconds_count": 1.0}
    uninstall_attempt_hook(hook)
    before = figures("qa.fail_once")
    enqueue("qa.fail_once")
    drain(raise_failures=False)
    assert delta(before, figures("qa.fail_once")) == {}
