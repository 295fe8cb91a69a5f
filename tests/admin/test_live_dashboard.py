"""The dashboard's live updates, its scheduler tick after the scheduler stopped (bug 12), the
reaping gauges (bug 14), its footer (bug 15) and the admin log of pause and resume (bug 6)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families

from django_leasequeue import health, metrics, store
from django_leasequeue.admin.dashboard import dashboard_values
from django_leasequeue.models import Job, QueueState, ReaperSweep, WorkerProcess
from django_leasequeue.scheduler import SchedulerService

from .conftest import client_for, make_user
from .factories import make_job
from .live_marks import live_marks

pytestmark = pytest.mark.django_db

RULES = Path(__file__).resolve().parents[2] / "docs" / "examples" / "leasequeue-alerts.yml"
DASHBOARD = reverse("admin:django_leasequeue_dashboard_changelist")
LIVE = reverse("admin:django_leasequeue_dashboard_live")


@pytest.fixture(autouse=True)
def _no_settings_schedules(settings):
    settings.LEASEQUEUE_SCHEDULES = {}


def gauges() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def busy_system() -> None:
    now = store.db_now()
    make_job("ready", queue="default", run_at=now - timedelta(minutes=5))
    make_job("leased", queue="default")
    make_job("dead", queue="mail", finished_at=now - timedelta(minutes=2))
    make_job("done", queue="mail", finished_at=now - timedelta(minutes=1))
    store.process_register(process_id="h:1:w", kind="worker", host="h", pid=1, queues=["default"], concurrency=2)
    store.process_register(process_id="h:2:s", kind="scheduler", host="h", pid=2, queues=[], concurrency=0)
    store.process_heartbeat("h:2:s", tick=True)


def test_the_live_endpoint_sends_exactly_the_figures_the_page_shows_for_fewer_statements(admin_client, frozen):
    busy_system()
    with CaptureQueriesContext(connection) as page_queries:
        html = admin_client.get(DASHBOARD).content.decode()
    with CaptureQueriesContext(connection) as live_queries:
        response = admin_client.get(LIVE)
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    assert "no-store" in response["Cache-Control"]
    values = response.json()
    at = values.pop("at")
    assert at == frozen.isoformat(timespec="seconds")
    marks = live_marks(html)
    assert values == marks
    assert {"q:default:ready_due", "q:mail:dead", "total:ready_due", "p:h:1:w:heartbeat", "summary:tick"} <= set(marks)
    assert (values["q:default:ready_due"], values["q:default:leased"], values["q:mail:dead"]) == ("1", "1", "1")
    assert (values["q:mail:dead_recent_short"], values["q:mail:done_recent_short"]) == ("1", "1")
    assert (values["total:ready_due"], values["summary:workers_alive"]) == ("1", "1 worker alive")
    assert (values["summary:tick"], values["summary:scheduler"]) == (live_marks(html)["summary:tick"], "")
    assert len(live_queries.captured_queries) <= len(page_queries.captured_queries)
    job_statements = [q for q in live_queries.captured_queries if "leasequeue_" in q["sql"]]
    assert len(job_statements) == health.SNAPSHOT_QUERIES


def test_a_poll_sees_a_new_job_and_the_page_marks_every_figure_it_updates(admin_client, frozen):
    make_job("ready", queue="default")
    assert admin_client.get(LIVE).json()["q:default:ready_due"] == "1"
    make_job("ready", queue="default")
    make_job("ready", queue="default", run_at=store.db_now() + timedelta(hours=1))
    values = admin_client.get(LIVE).json()
    assert (values["q:default:ready_due"], values["q:default:scheduled"]) == ("2", "1")
    assert "total:ready_due" not in values  # one queue: the page has no total row either
    assert values.keys() - {"at"} == live_marks(admin_client.get(DASHBOARD).content.decode()).keys()
    assert dashboard_values(health.snapshot())["q:default:ready_due"] == "2"


def test_the_live_endpoint_has_the_pages_permissions(db):
    assert Client().get(LIVE).status_code == 302  # to the login page, as the page
    assert Client().get(DASHBOARD).status_code == 302
    nobody = client_for(make_user("nobody"))
    assert nobody.get(DASHBOARD).status_code == 403
    assert nobody.get(LIVE).status_code == 403
    viewer = client_for(make_user("viewer", "view_job"))
    assert viewer.get(LIVE).status_code == 200


def test_the_page_polls_instead_of_reloading_and_has_no_developer_footer(admin_client):
    html = admin_client.get(DASHBOARD).content.decode()
    assert 'http-equiv="refresh"' not in html
    assert f'data-live-url="{LIVE}"' in html and 'data-live-interval="5"' in html
    assert "django_leasequeue/live.js" in html
    # The old ?refresh=N sets the poll interval now; out of bounds, the default.
    assert 'data-live-interval="10"' in admin_client.get(DASHBOARD, {"refresh": "10"}).content.decode()
    assert 'data-live-interval="5"' in admin_client.get(DASHBOARD, {"refresh": "1"}).content.decode()
    # Bug 15: the footer spoke of statements and partial indexes, for developers.
    assert "health.snapshot()" not in html and "partial indexes" not in html and "statements" not in html


# ---- bug 12: the last tick outlives the scheduler's row --------------------------------------------


def test_the_last_tick_survives_the_scheduler_row_on_the_dashboard_and_in_the_metric(admin_client, db_clock):
    scheduler = SchedulerService(sync=False, process_id="h:9:scheduler")
    scheduler.register()
    scheduler.run_once()  # one tick (no schedule is due), stamped on its row and the sweep record
    tick = WorkerProcess.objects.get(pk="h:9:scheduler").last_tick_at
    assert ReaperSweep.objects.values_list("scheduler_tick_at", flat=True).get() == tick
    db_clock.advance(600)
    assert store.process_prune(older_than=300) == 1  # what the reaper does to a silent process
    assert not WorkerProcess.objects.exists()

    snap = health.snapshot()
    # The database clock runs on (by the few milliseconds of the statements since the tick).
    assert snap.scheduler_last_tick_age_seconds == pytest.approx(600, abs=0.4) and snap.scheduler_last_tick_at == tick
    assert snap.alive_by_kind.get("scheduler", 0) == 0
    assert gauges()[("leasequeue_scheduler_last_tick_age_seconds", ())] == pytest.approx(600, abs=0.4)
    values = admin_client.get(LIVE).json()
    assert (values["summary:tick"], values["summary:scheduler"]) == ("10 min ago", "no scheduler running")
    html = admin_client.get(DASHBOARD).content.decode()
    assert live_marks(html)["summary:tick"] == "10 min ago" and "no scheduler running" in html
    # A clean stop deletes the row at once: the same.
    again = SchedulerService(sync=False, process_id="h:10:scheduler")
    again.register()
    again.run_once()
    again.on_stop()
    db_clock.advance(42)
    assert health.snapshot().scheduler_last_tick_age_seconds == pytest.approx(42, abs=0.4)
    assert admin_client.get(LIVE).json()["summary:tick"] == "42 s ago"


def test_a_tick_before_any_sweep_claims_no_sweep_and_the_first_sweep_is_a_first_sweep(db):
    job = make_job("leased", leased_until=store.db_now() - timedelta(seconds=5))
    assert store.process_heartbeat("h:9:scheduler", tick=True) is False  # no row: the tick is kept anyway
    snap = health.snapshot()
    assert snap.reaper_last_sweep_age_seconds is None
    assert snap.scheduler_last_tick_age_seconds == pytest.approx(0, abs=0.4)
    # The row loads through the ORM; its sweep time is the epoch, store.NEVER_SWEPT.
    record = ReaperSweep.objects.get()
    assert snap.scheduler_last_tick_at == record.scheduler_tick_at
    assert record.last_sweep_at == datetime(1970, 1, 1, tzinfo=UTC) and record.resumed_at is None
    assert ("leasequeue_reaper_last_sweep_age_seconds", ()) not in gauges()
    # The sweep after it is the first: no outage is declared, the expired lease is taken back now.
    assert [r.id for r in store.job_reap_expired(silence=10.0)] == [job.pk]
    sweep = ReaperSweep.objects.get()
    assert sweep.resumed_at is None and sweep.scheduler_tick_at is not None
    assert Job.objects.get(pk=job.pk).status == "ready"
    assert 0 <= health.snapshot().reaper_last_sweep_age_seconds < 5
    # A plain heartbeat (not a tick) leaves the record alone.
    stamped = sweep.scheduler_tick_at
    store.process_heartbeat("h:9:scheduler", tick=False, now=store.db_now() + timedelta(hours=1))
    assert ReaperSweep.objects.get().scheduler_tick_at == stamped


# ---- bug 14: which gauge says that somebody reaps --------------------------------------------------


def test_workers_that_reap_show_in_the_sweep_age_not_in_the_reaper_process_count(db):
    from django_leasequeue.reaper import ReaperService

    store.process_register(process_id="h:1:w", kind="worker", host="h", pid=1, queues=None, concurrency=2,
                           reaps=True)
    store.process_register(process_id="h:2:w", kind="worker", host="h", pid=2, queues=None, concurrency=2,
                           reaps=False)  # runworker --no-reaper
    ReaperService(interval=1.0, process_id="h:1:w").sweep()  # the sweep a worker runs every REAPER_INTERVAL
    got = gauges()
    assert got[("leasequeue_processes_alive", (("kind", "reaper"),))] == 0
    # The gauge of who reaps counts the worker that reaps, not the one started with --no-reaper.
    assert got[("leasequeue_reapers_alive", ())] == 1
    assert health.snapshot().reapers_alive == 1
    assert 0 <= got[("leasequeue_reaper_last_sweep_age_seconds", ())] < 5
    # The example alert on reaping is on the sweep age, never on the reaper process count.
    exprs = [line.split("expr:", 1)[1].strip() for line in RULES.read_text().splitlines() if "expr:" in line]
    assert "leasequeue_reaper_last_sweep_age_seconds > 300" in exprs
    assert not any('kind="reaper"' in expr for expr in exprs)


# ---- bug 6: pause and resume write admin log entries -----------------------------------------------


def test_pause_and_resume_write_admin_log_entries_on_the_queue(admin_client):
    make_job("ready", queue="mail")
    admin_client.post(reverse("admin:django_leasequeue_dashboard_pause"), {"queue": "mail"})
    admin_client.post(reverse("admin:django_leasequeue_dashboard_pause"), {"queue": "mail"})  # already: no entry
    admin_client.post(reverse("admin:django_leasequeue_dashboard_resume"), {"queue": "mail"})
    admin_client.post(reverse("admin:django_leasequeue_dashboard_resume"), {"queue": "nope"})  # not paused
    entries = list(LogEntry.objects.order_by("id"))
    assert [(e.action_flag, e.object_id, e.change_message) for e in entries] == [
        (CHANGE, "mail", "Paused queue 'mail'"), (CHANGE, "mail", "Resumed queue 'mail'")]
    assert {e.content_type for e in entries} == {ContentType.objects.get_for_model(QueueState)}
    assert {e.user.username for e in entries} == {"admin"}
    # The admin index's "Recent actions" lists them.
    recent = admin_client.get(reverse("admin:index")).content.decode().split('class="actionlist"')[1]
    assert "mail (paused)" in recent and "queue state" in recent.lower()
