"""The documented Prometheus alert rules are valid and fire on the omission scenarios.

Runs ``promtool check rules`` and ``promtool test rules`` (unit tests with synthetic series in
``docs/examples/leasequeue-alerts.test.yml``) when promtool is installed (Debian: ``apt-get install
prometheus``); skipped otherwise.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed")
@pytest.mark.parametrize("args", [["check", "rules", "leasequeue-alerts.yml"],
                                  ["test", "rules", "leasequeue-alerts.test.yml"]])
def test_promtool(args):
    result = subprocess.run([PROMTOOL, *args], cwd=EXAMPLES, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_rule_names_match_the_metrics_we_expose():
    from django_leasequeue import metrics

    text = (EXAMPLES / "leasequeue-alerts.yml").read_text()
    doc = metrics.__doc__ or ""
    for name in ("leasequeue_oldest_ready_age_seconds", "leasequeue_workers_alive", "leasequeue_workers_serving",
                 "leasequeue_jobs", "leasequeue_scheduler_last_tick_age_seconds", "leasequeue_dead_letters_recent",
                 "leasequeue_jobs_done_recent", "leasequeue_leases_expired", "leasequeue_queue_paused",
                 "leasequeue_workflows_stuck", "leasequeue_reaper_last_sweep_age_seconds"):
        assert name in text and f"``{name}" in doc, name


def test_rules_on_the_worker_counters_name_series_the_workers_expose():
    from django_leasequeue import worker_metrics

    text = (EXAMPLES / "leasequeue-alerts.yml").read_text()
    doc = worker_metrics.__doc__ or ""
    for name in ("leasequeue_jobs_dead_lettered_total", "leasequeue_jobs_fenced_out_total"):
        assert name in text and f"``{name}" in doc, name
