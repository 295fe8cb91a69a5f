"""Schedule admin and the queue dashboard through the test client."""

from __future__ import annotations

from datetime import UTC, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_leasequeue import cron, health, store
from django_leasequeue.admin import describe_cron
from django_leasequeue.models import Job, QueueState, Schedule, WorkerProcess

from .conftest import client_for, make_user
from .factories import make_job

pytestmark = pytest.mark.django_db

NOOP = "invoices.tasks.noop"
SCHEDULES = reverse("admin:django_leasequeue_schedule_changelist")
DASHBOARD = reverse("admin:django_leasequeue_dashboard_changelist")


@pytest.fixture(autouse=True)
def _no_settings_schedules(settings):
    settings.LEASEQUEUE_SCHEDULES = {}


def schedule(name: str = "nightly", cron_expr: str = "30 2 * * 1-5", tz: str = "Europe/Berlin", **fields) -> Schedule:
    return Schedule.objects.create(name=name, task=NOOP, cron=cron_expr, timezone=tz, **fields)


def form_data(**overrides) -> dict:
    data = {"name": "s", "task": NOOP, "cron": "*/15 * * * *", "timezone": "Europe/Berlin", "args": "[]",
            "kwargs": "{}", "queue": "", "priority": "0", "enabled": "on", "catch_up": "latest",
            "catch_up_limit": "10"}
    data.update(overrides)
    return data


# ---- schedules -----------------------------------------------------------------------------------


@pytest.mark.parametrize("expr, words", [
    ("30 2 * * 1-5", "At 02:30, Monday through Friday"),
    ("*/15 * * * *", "Every 15 minutes"),
    ("@daily", "At 00:00"),
    ("0 * * * * 30", "At 30 seconds past the minute, at 0 minutes past the hour"),  # seconds LAST (croniter)
])
def test_cron_in_words(expr, words):
    assert describe_cron(expr).startswith(words)


def test_schedule_list_and_page_show_words_and_next_five_in_the_zone(admin_client):
    s = schedule()
    assert "At 02:30, Monday through Friday" in admin_client.get(SCHEDULES).content.decode()
    html = admin_client.get(reverse("admin:django_leasequeue_schedule_change", args=[s.pk])).content.decode()
    assert "At 02:30, Monday through Friday" in html
    expected, after = [], store.db_now()
    for _ in range(5):
        after = cron.next_occurrence(s.cron, "Europe/Berlin", after)
        expected.append(after)
    for occurrence in expected:
        local = occurrence.astimezone(ZoneInfo("Europe/Berlin"))
        assert local.strftime("%Y-%m-%d 02:30:00") in html and local.strftime("%Z") in html
        assert occurrence.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") in html
    assert 'id="lq-run-now"' in html


@pytest.mark.parametrize("field, value, message", [
    ("cron", "61 * * * *", "cron"),
    ("cron", "0 0 30 2 *", "never"),
    ("timezone", "Mars/Olympus", "Mars/Olympus"),
    ("task", "no.such.task", "not registered"),
    ("kwargs", "[1]", "kwargs must be a JSON object"),
])
def test_schedule_form_shows_validation_errors(admin_client, field, value, message):
    response = admin_client.post(reverse("admin:django_leasequeue_schedule_add"), form_data(**{field: value}))
    assert response.status_code == 200  # the form again, with the error on the field
    errors = response.context["adminform"].form.errors
    assert field in errors and message.lower() in " ".join(errors[field]).lower()
    assert not Schedule.objects.exists()


def test_schedule_add_sets_next_occurrence(admin_client):
    response = admin_client.post(reverse("admin:django_leasequeue_schedule_add"), form_data())
    assert response.status_code == 302
    s = Schedule.objects.get(name="s")
    assert s.next_occurrence_at is not None and s.next_occurrence_at > store.db_now() - timedelta(seconds=1)


def test_enable_and_disable_actions(admin_client):
    on, off = schedule("on"), schedule("off", enabled=False)
    admin_client.post(SCHEDULES, {"action": "disable_selected", "_selected_action": [on.pk]})
    on.refresh_from_db()
    assert not on.enabled and on.next_occurrence_at is None
    admin_client.post(SCHEDULES, {"action": "enable_selected", "_selected_action": [off.pk, on.pk]})
    on.refresh_from_db()
    off.refresh_from_db()
    now = store.db_now()
    assert on.enabled and off.enabled
    # Re-enabled schedules start from now: the next occurrence is in the future (no catch-up).
    assert on.next_occurrence_at > now - timedelta(seconds=5) and off.next_occurrence_at > now - timedelta(seconds=5)


def test_run_now_enqueues_one_job_with_its_own_key(admin_client):
    s = schedule(kwargs={})
    url = reverse("admin:django_leasequeue_schedule_run_now", args=[s.pk])
    first = admin_client.post(url, {"nonce": "abc123"}, follow=True)
    again = admin_client.post(url, {"nonce": "abc123"}, follow=True)  # the same form posted twice
    (job,) = Job.objects.filter(schedule=s)
    assert job.unique_key == f"leasequeue:schedule:{s.pk}:run-now:abc123"
    assert job.status == "ready" and job.occurrence_at is None and job.task == NOOP
    assert "Enqueued job" in str(list(first.context["messages"])[0])
    assert "already run" in str(list(again.context["messages"])[0])
    admin_client.post(url, {"nonce": "other"})
    admin_client.post(SCHEDULES, {"action": "run_now_selected", "_selected_action": [s.pk]})
    assert Job.objects.filter(schedule=s).count() == 3
    # Occurrence keys of the scheduler are untouched by manual runs.
    assert not Job.objects.filter(schedule=s, unique_key__regex=r":\d{4}-\d\d-\d\dT").exists()


def test_run_now_needs_change_permission(viewer_client):
    s = schedule()
    url = reverse("admin:django_leasequeue_schedule_run_now", args=[s.pk])
    assert viewer_client.post(url, {"nonce": "x"}).status_code == 403
    assert not Job.objects.exists()


# ---- dashboard -----------------------------------------------------------------------------------------


def test_dashboard_shows_queue_figures_workers_and_tick(admin_client):
    now = store.db_now()
    make_job("ready", queue="default", run_at=now - timedelta(minutes=5))
    make_job("ready", queue="default", run_at=now + timedelta(hours=10))
    make_job("leased", queue="default")
    for minutes in (1, 2, 30):
        make_job("dead", queue="mail", finished_at=now - timedelta(minutes=minutes))
    make_job("done", queue="mail", finished_at=now - timedelta(minutes=1))
    store.process_register(process_id="h:1:w", kind="worker", host="h", pid=1, queues=["default"], concurrency=2)
    store.process_register(process_id="h:2:s", kind="scheduler", host="h", pid=2, queues=[], concurrency=1)
    store.process_heartbeat("h:2:s", tick=True)
    with CaptureQueriesContext(connection) as ctx:
        response = admin_client.get(DASHBOARD)
    assert response.status_code == 200
    rows = {r["stats"].queue: r["stats"] for r in response.context["rows"]}
    d, m = rows["default"], rows["mail"]
    assert (d.ready_due, d.scheduled, d.leased, d.dead) == (1, 1, 1, 0)
    assert 290 < d.oldest_ready_age_seconds < 400  # from run_at, by the database clock (C30)
    assert (m.dead, m.dead_recent_short, m.dead_recent_long, m.done_recent_short) == (3, 2, 3, 1)
    html = response.content.decode()
    assert "5 min" in html and "h:1:w" in html and "alive" in html
    assert "last scheduler tick:" in html and "never" not in html.split("last scheduler tick:")[1][:40]
    # The figures come from health.snapshot(): its statements (queues, processes, workflows)
    # besides session and user; the chart and the latency table read the counters (one each).
    job_queries = [q for q in ctx.captured_queries if "leasequeue_" in q["sql"]]
    assert len(job_queries) == health.SNAPSHOT_QUERIES + 2 == 5, [q["sql"][:80] for q in job_queries]
    # The counters table: the chart, the latency table, and the snapshot's recent done/dead counts.
    assert sum("leasequeue_job_stat" in q["sql"] for q in job_queries) == 3


def test_dashboard_is_in_the_admin_index(admin_client):
    html = admin_client.get(reverse("admin:app_list", args=["django_leasequeue"])).content.decode()
    assert f'href="{DASHBOARD}"' in html and "Queue dashboard" in html


def test_pause_and_resume(admin_client):
    make_job("ready", queue="mail")
    admin_client.post(reverse("admin:django_leasequeue_dashboard_pause"), {"queue": "mail"})
    state = QueueState.objects.get(name="mail")
    assert state.paused and state.paused_by == "admin"
    html = admin_client.get(DASHBOARD).content.decode()
    assert "Resume" in html
    # A paused queue is not claimed from.
    assert store.job_claim(queues=["mail"], limit=5, worker_id="w", lease=30) == []
    admin_client.post(reverse("admin:django_leasequeue_dashboard_resume"), {"queue": "mail"})
    assert not QueueState.objects.get(name="mail").paused


def test_dashboard_permissions(viewer_client, db):
    # view_job is enough to see it; pausing needs change_queuestate; no permission: 403.
    assert viewer_client.get(DASHBOARD).status_code == 200
    assert ">Pause<" not in viewer_client.get(DASHBOARD).content.decode()
    assert viewer_client.post(reverse("admin:django_leasequeue_dashboard_pause"), {"queue": "x"}).status_code == 403
    assert viewer_client.get(reverse("admin:django_leasequeue_dashboard_pause")).status_code == 405
    assert not QueueState.objects.filter(name="x").exists()
    nobody = client_for(make_user("nobody"))
    assert nobody.get(DASHBOARD).status_code == 403
    pauser = client_for(make_user("pauser", "view_job", "change_queuestate"))
    assert pauser.post(reverse("admin:django_leasequeue_dashboard_pause"), {"queue": "x"}).status_code == 302
    assert QueueState.objects.get(name="x").paused


def test_dashboard_warns_about_queues_without_a_worker(admin_client):
    make_job("ready", queue="mail")
    assert not WorkerProcess.objects.exists()
    html = admin_client.get(DASHBOARD).content.decode()
    assert "no worker" in html and "No process has registered" in html
