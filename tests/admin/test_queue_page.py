"""The console's charts (admin/charts.py: the SVG), the dashboard's throughput section and the page
of one queue, through the test client."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_leasequeue import health, store
from django_leasequeue.admin.charts import throughput_svg
from django_leasequeue.health import Point, Series
from django_leasequeue.models import QueueState, Schedule
from tests.monitoring.test_charts import run_jobs

from .conftest import client_for, make_user
from .factories import ERROR, make_job, make_jobs

pytestmark = pytest.mark.django_db

SVG = "{http://www.w3.org/2000/svg}"
DASHBOARD = reverse("admin:django_leasequeue_dashboard_changelist")
PAUSE = reverse("admin:django_leasequeue_dashboard_pause")
RESUME = reverse("admin:django_leasequeue_dashboard_resume")


def queue_url(name: str) -> str:
    return reverse("admin:django_leasequeue_queue", args=[name])


def series(values: list[tuple[int, int, int]]) -> Series:
    start = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    points = [Point(start + timedelta(minutes=i), *v) for i, v in enumerate(values)]
    return Series(range="hour", span=60, now=points[-1].bucket, queue=None, points=points)


# -- the SVG ----------------------------------------------------------------------------------------

def test_the_chart_is_valid_svg_with_a_bar_and_a_titled_tooltip_per_bucket():
    values = [(0, 0, 0)] * 57 + [(5, 1, 2), (0, 0, 0), (3, 0, 0)]
    svg = ET.fromstring(str(throughput_svg(series(values), title="Queue <mail> & co")))
    assert svg.tag == f"{SVG}svg" and svg.get("viewBox") == "0 0 720 210" and svg.get("width") == "100%"
    assert svg.find(f"{SVG}title").text == "Queue <mail> & co"  # escaped in the markup, read back whole
    bars = svg.findall(f".//{SVG}g[@class='lq-bar']")
    assert len(bars) == 60
    segments = svg.findall(f".//{SVG}rect[@class]")
    assert sorted(r.get("class") for r in segments if r.get("class").startswith("lq-seg")) == [
        "lq-seg lq-dead", "lq-seg lq-done", "lq-seg lq-done", "lq-seg lq-failed"]
    tip = bars[57].find(f"{SVG}title").text
    assert tip.endswith(": 5 done, 1 failed (retried), 2 dead") and "12:57" in tip
    assert bars[57].get("data-bucket") == "2026-06-01T12:57:00+00:00"
    # A legend entry per outcome, y labels up to a round maximum (8 -> 10), admin's colours.
    texts = [t.text for t in svg.iter(f"{SVG}text")]
    assert {"done", "failed (retried)", "dead", "0", "5", "10"} <= set(texts)
    markup = str(throughput_svg(series(values)))
    assert "var(--primary" in markup and "var(--error-fg" in markup and "currentColor" in markup
    assert "http://" not in markup.replace('xmlns="http://www.w3.org/2000/svg"', "")  # nothing fetched


def test_an_empty_chart_says_so_and_draws_no_bars():
    svg = ET.fromstring(str(throughput_svg(series([(0, 0, 0)] * 60))))
    assert svg.findall(f".//{SVG}g[@class='lq-bar']") == []
    [empty] = [t for t in svg.iter(f"{SVG}text") if t.get("class") == "lq-chart-empty"]
    assert empty.text == "No job finished or failed in the last hour."


# -- the dashboard's charts -------------------------------------------------------------------------

def test_the_dashboard_shows_the_throughput_chart_for_each_range_and_the_latency_table(admin_client):
    run_jobs(store.db_now(), done=3, dead=1, queue="mail")
    for period, bars in (("hour", 60), ("day", 24), ("month", 30)):
        response = admin_client.get(DASHBOARD, {"range": period})
        assert response.status_code == 200
        assert response.context["period"] == period and len(response.context["series"].points) == bars
        html = response.content.decode()
        assert html.count('class="lq-bar"') == bars and 'id="lq-throughput"' in html
    rows = [(r["row"].queue, r["row"].task, r["row"].done, r["row"].dead) for r in response.context["latency"]]
    assert rows == [("mail", None, 3, 1), ("mail", "flowlab.rated_noop", 3, 1)]
    # Four waits of 2 s in [1, 2.5): the median (rank 2 of 4) interpolates to 1.75 s; runs of 0.2 s.
    first = response.context["latency"][0]
    assert (first["wait_p50"], first["wait_mean"], first["run_p95"]) == ("1.75 s", "2.00 s", "0.24 s")
    assert "1.75 s" in response.content.decode()
    # An unknown range falls back to the hour; the queue names link to their pages.
    response = admin_client.get(DASHBOARD, {"range": "week", "latency": "day"})
    assert response.context["period"] == "hour" and response.context["window"] == "day"
    assert f'href="{queue_url("mail")}"' in response.content.decode()


# -- the queue page ---------------------------------------------------------------------------------

def fill_queue(name: str, ready: int) -> None:
    now = store.db_now()
    make_jobs(ready, "ready", queue=name, run_at=now - timedelta(minutes=3))
    make_job("ready", queue=name, run_at=now + timedelta(hours=1))
    make_job("leased", queue=name)
    for message in ("malformed payload: missing 'customer'", "malformed payload: missing 'customer'", "timeout"):
        make_job("dead", queue=name, errors=[dict(ERROR, message=message, type="builtins.ValueError")])
    make_job("dead", queue=name, task="invoices.tasks.other", errors=[])
    make_job("dead", queue="elsewhere")


def test_the_queue_page_shows_depth_workers_limits_errors_and_schedules(admin_client, settings):
    queues = {"mail": {"rate_limit": "100/m"}, "other": {}}
    settings.LEASEQUEUE = {**getattr(settings, "LEASEQUEUE", {}), "QUEUES": queues}
    fill_queue("mail", 4)
    run_jobs(store.db_now(), done=2, queue="mail")
    store.process_register(process_id="h:1:w", kind="worker", host="h", pid=1, queues=["mail"], concurrency=4)
    store.process_register(process_id="h:2:w", kind="worker", host="h", pid=2, queues=["other"], concurrency=2)
    Schedule.objects.create(name="mail digest", task="invoices.tasks.noop", cron="0 7 * * *",
                            timezone="Asia/Tokyo", queue="mail")
    Schedule.objects.create(name="elsewhere", task="invoices.tasks.noop", cron="0 7 * * *", queue="other")

    response = admin_client.get(queue_url("mail"))
    assert response.status_code == 200
    ctx = response.context
    live = ctx["live"]
    assert (live["ready_due"], live["scheduled"], live["leased"], live["dead"]) == (4, 1, 1, 4)
    assert live["oldest_due"].startswith("3 min") and live["threads"] == 4 and live["workers_serving"] == 1
    assert [w["info"].id for w in ctx["workers"]] == ["h:1:w"]
    assert ctx["limits"]["rate_limit"] == "100/m" and not live["paused"]
    # Grouped by task and error type, as Dead letters groups them; the message is the newest one's.
    assert [(e["task"], e["error_type"], e["message"], e["n"]) for e in ctx["errors"]] == [
        ("invoices.tasks.poison", "ValueError", "timeout", 3),
        ("invoices.tasks.other", "(no error recorded)", "", 1),
    ]
    assert [s["schedule"].name for s in ctx["schedules"]] == ["mail digest"]
    assert ctx["schedules"][0]["next"].endswith(" JST") and ctx["schedules"][0]["next"][11:16] == "07:00"
    assert sum(p.done for p in ctx["series"].points) == 2
    html = response.content.decode()
    # Every live-marked element shows exactly its value in the one `live` dict (what a live
    # refresh would put there), and the main figures are all marked.
    marked = dict(re.findall(r'data-live="(\w+)">([^<]*)<', html))
    main = {"ready_due", "scheduled", "leased", "dead", "oldest_due", "done_long", "threads", "state", "now"}
    assert main <= set(marked)
    assert marked == {k: str(live[k]) for k in marked}
    assert html.count('class="lq-bar"') == 60

    # The error group links select exactly that group in Dead letters, and its confirmed replay.
    group = ctx["errors"][0]
    listed = admin_client.get(group["list_url"])
    assert listed.context["cl"].result_count == 3
    confirm = admin_client.get(group["replay_url"])
    assert confirm.status_code == 200 and confirm.context["selected"] == 3 and confirm.context["preview"].acting == 3
    assert admin_client.get(ctx["errors"][1]["list_url"]).context["cl"].result_count == 1
    # The job list's and Dead letters' queue columns link to the queue's page.
    for changelist in ("job", "deadletter"):
        html = admin_client.get(reverse(f"admin:django_leasequeue_{changelist}_changelist")).content.decode()
        assert f'<a href="{queue_url("mail")}" class="lq-queue-link">mail</a>' in html


def test_the_queue_page_costs_the_same_statements_for_10_and_1000_jobs(admin_client):
    def statements(name: str) -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert admin_client.get(queue_url(name)).status_code == 200
        return len([q for q in ctx.captured_queries if "leasequeue_" in q["sql"]])

    fill_queue("small", 10)
    fill_queue("large", 1000)
    small, large = statements("small"), statements("large")
    # snapshot 3, workers page 3, chart 1, latency 1, state and errors 2, schedules 1.
    assert small == large == 11


def test_pause_is_confirmed_then_logged_and_resume_returns_to_the_queue_page(admin_client):
    fill_queue("mail", 2)
    html = admin_client.get(queue_url("mail")).content.decode()
    assert 'id="lq-pause"' in html and "Pause…" in html
    confirm = admin_client.get(PAUSE, {"queue": "mail", "_from": "queue"})
    assert confirm.status_code == 200 and not QueueState.objects.filter(name="mail", paused=True).exists()
    assert "2 due jobs" in confirm.content.decode() and 'name="csrfmiddlewaretoken"' in confirm.content.decode()
    response = admin_client.post(PAUSE, {"queue": "mail", "_from": "queue"})
    assert response.status_code == 302 and response["Location"] == queue_url("mail")
    assert QueueState.objects.get(name="mail").paused
    [entry] = LogEntry.objects.all()
    assert (entry.object_id, entry.change_message, entry.content_type.model) == (
        "mail", "Paused queue 'mail'", "queuestate")
    html = admin_client.get(queue_url("mail")).content.decode()
    assert 'id="lq-resume"' in html and "paused" in html
    assert admin_client.post(RESUME, {"queue": "mail", "_from": "queue"})["Location"] == queue_url("mail")
    assert not QueueState.objects.get(name="mail").paused
    assert [e.change_message for e in LogEntry.objects.order_by("id")] == [
        "Paused queue 'mail'", "Resumed queue 'mail'"]
    # Pausing an already paused queue changes nothing and logs nothing.
    admin_client.post(RESUME, {"queue": "mail"})
    assert LogEntry.objects.count() == 2


def test_the_queue_page_needs_the_view_permission_and_pause_the_change_permission(db):
    fill_queue("mail", 1)
    nobody = client_for(make_user("nobody"))
    assert nobody.get(queue_url("mail")).status_code == 403
    viewer = client_for(make_user("viewer", "view_job"))
    response = viewer.get(queue_url("mail"))
    assert response.status_code == 200 and 'id="lq-pause"' not in response.content.decode()
    assert all(e["replay_url"] == "" for e in response.context["errors"])
    assert viewer.get(PAUSE, {"queue": "mail"}).status_code == 403
    assert viewer.post(PAUSE, {"queue": "mail"}).status_code == 403
    assert not QueueState.objects.filter(name="mail").exists()


def test_an_odd_queue_name_round_trips_and_an_unknown_queue_shows_zeros(admin_client):
    name = "a&b #c+d/e"
    make_job("ready", queue=name)
    response = admin_client.get(queue_url(name))
    assert response.status_code == 200 and response.context["queue"] == name
    assert response.context["live"]["ready_due"] == 1
    empty = admin_client.get(queue_url("nothing-here"))
    assert empty.status_code == 200 and empty.context["live"]["ready_due"] == 0
    assert "No job finished or failed in the last hour." in empty.content.decode()
    assert health.throughput("hour", queue="nothing-here").empty
