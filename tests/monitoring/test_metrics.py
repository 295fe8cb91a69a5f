"""The Prometheus endpoint: parses with prometheus-client, carries every figure, refuses strangers."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families

from django_leasequeue import health, metrics, store
from django_leasequeue.models import QueueState, WorkerProcess

from .helpers import ago, make_job

pytestmark = pytest.mark.django_db

TOKEN = "a-long-random-metrics-token-0123456789"
URL = "/leasequeue/metrics"


def with_token(**extra):
    return override_settings(LEASEQUEUE={**settings.LEASEQUEUE, "METRICS_TOKEN": [TOKEN, "second-token-for-rotation"],
                                         **extra})


def scrape(client: Client, token: str | None = TOKEN):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return client.get(URL, **headers)


def samples(body: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def seed(now):
    make_job(queue="emails", run_at=ago(now, 300))                       # due 5 min ago
    make_job(queue="emails", run_at=now + timedelta(hours=1))            # scheduled
    make_job(queue="emails", status="leased", leased_until=ago(now, 1), run_at=ago(now, 60))  # expired lease
    make_job(queue="emails", status="dead", finished_at=ago(now, 100))
    make_job(queue="emails", status="dead", finished_at=ago(now, 1000))
    make_job(queue="emails", status="done", finished_at=ago(now, 10))
    QueueState.objects.create(name="billing", paused=True)
    store.process_register(process_id="h:1:w", kind="worker", host="h", pid=1, queues=["emails"], concurrency=2)
    store.process_register(process_id="h:2:s", kind="scheduler", host="h", pid=2, queues=None, concurrency=0)
    WorkerProcess.objects.filter(id="h:2:s").update(last_tick_at=ago(now, 42))


def test_metrics_parse_and_carry_every_figure(now):
    seed(now)
    with with_token():
        response = scrape(Client())
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    assert "no-cache" in response["Cache-Control"] or "max-age=0" in response["Cache-Control"]
    got = samples(response.content.decode())
    e, b = ("queue", "emails"), ("queue", "billing")
    age = got[("leasequeue_oldest_ready_age_seconds", (e,))]
    assert 300 <= age < 360
    assert got[("leasequeue_oldest_ready_age_seconds", (b,))] == 0.0
    for status, value in {"ready_due": 1, "scheduled": 1, "leased": 1, "dead": 2}.items():
        assert got[("leasequeue_jobs", (e, ("status", status)))] == value
        assert got[("leasequeue_jobs", (b, ("status", status)))] == 0
    assert got[("leasequeue_leases_expired", (e,))] == 1
    assert got[("leasequeue_dead_letters_recent", (e, ("window", "300")))] == 1
    assert got[("leasequeue_dead_letters_recent", (e, ("window", "3600")))] == 2
    assert got[("leasequeue_jobs_done_recent", (e, ("window", "300")))] == 1
    assert got[("leasequeue_jobs_done_recent", (e, ("window", "3600")))] == 1
    assert got[("leasequeue_queue_paused", (b,))] == 1.0
    assert got[("leasequeue_queue_paused", (e,))] == 0.0
    assert got[("leasequeue_workers_alive", ())] == 1
    assert (got[("leasequeue_workers_serving", (e,))], got[("leasequeue_workers_serving", (b,))]) == (1, 0)
    assert got[("leasequeue_processes_alive", (("kind", "scheduler"),))] == 1
    assert got[("leasequeue_processes_alive", (("kind", "worker"),))] == 1
    assert got[("leasequeue_processes_alive", (("kind", "reaper"),))] == 0
    assert 42 <= got[("leasequeue_scheduler_last_tick_age_seconds", ())] < 100
    assert got[("leasequeue_health_query_seconds", ())] > 0
    # The default queue is always listed, so a fresh install shows zeros rather than nothing.
    assert got[("leasequeue_jobs", (("queue", "default"), ("status", "ready_due")))] == 0


def test_scheduler_tick_age_is_absent_when_no_tick_was_recorded(now):
    body = metrics.render().decode()
    names = {f.name for f in text_string_to_metric_families(body)}
    assert "leasequeue_scheduler_last_tick_age_seconds" not in names
    assert {"leasequeue_oldest_ready_age_seconds", "leasequeue_jobs", "leasequeue_workers_alive",
            "leasequeue_dead_letters_recent", "leasequeue_jobs_done_recent", "leasequeue_queue_paused"} <= names


def test_collector_takes_one_snapshot_per_scrape(now):
    calls = []

    def counting_snapshot():
        calls.append(1)
        return health.snapshot()

    registry = metrics.build_registry(metrics.HealthCollector(counting_snapshot))
    assert calls == []  # registering does not query
    from prometheus_client import generate_latest

    generate_latest(registry)
    generate_latest(registry)
    assert calls == [1, 1]


def test_unauthenticated_and_wrong_tokens_are_refused(now):
    client = Client()
    with with_token():
        missing = scrape(client, token=None)
        wrong = scrape(client, token="not-the-token")
        rotated = scrape(client, token="second-token-for-rotation")
        basic = client.get(URL, HTTP_AUTHORIZATION=f"Basic {TOKEN}")
        post = client.post(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert missing.status_code == 401
    assert missing["WWW-Authenticate"] == 'Bearer realm="leasequeue"'
    assert b"leasequeue_" not in missing.content
    assert wrong.status_code == 401
    assert rotated.status_code == 200
    assert basic.status_code == 401
    assert post.status_code == 405
    # No token configured: a bearer token never opens it.
    assert scrape(client).status_code == 401


def test_staff_session_or_forbidden(now):
    staff = User.objects.create_user("ops", password="x", is_staff=True)
    user = User.objects.create_user("someone", password="x")
    client = Client()
    client.force_login(user)
    assert scrape(client, token=None).status_code == 403
    client.force_login(staff)
    assert scrape(client, token=None).status_code == 200
    with override_settings(LEASEQUEUE={**settings.LEASEQUEUE, "METRICS_ALLOW_STAFF": False}):
        assert scrape(client, token=None).status_code == 403
    assert reverse("leasequeue:metrics") == URL


def test_reaping_by_workers_shows_as_a_recent_sweep_while_no_reaper_process_runs(now):
    # Bug 14: workers reap (unless --no-reaper), so processes_alive{kind="reaper"} == 0 says nothing
    # about reaping; the sweep row does, whoever swept.
    from django_leasequeue.reaper import ReaperService

    store.process_register(process_id="h:1:w", kind="worker", host="h", pid=1, queues=None, concurrency=2)
    before = samples(metrics.render().decode())
    assert ("leasequeue_reaper_last_sweep_age_seconds", ()) not in before
    ReaperService(interval=1.0).sweep()  # what a worker's service runs every REAPER_INTERVAL
    got = samples(metrics.render().decode())
    assert got[("leasequeue_processes_alive", (("kind", "reaper"),))] == 0
    assert got[("leasequeue_processes_alive", (("kind", "worker"),))] == 1
    assert 0 <= got[("leasequeue_reaper_last_sweep_age_seconds", ())] < 5
    assert 0 <= health.snapshot().reaper_last_sweep_age_seconds < 5
