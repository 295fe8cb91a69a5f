"""Live updates of the workers page and the workflow pages: each live endpoint sends exactly the
figures its page marks (``data-live``), follows what changed since, costs no more statements than
the page, and refuses who the page refuses."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_leasequeue import chain, chord, group, store
from django_leasequeue.admin import workers as workers_admin
from django_leasequeue.models import Job

from .conftest import client_for, make_user
from .factories import make_job
from .live_marks import live_marks
from .test_workflow_admin import complete, kill, step, steps_of, total

pytestmark = pytest.mark.django_db

WORKERS = reverse("admin:django_leasequeue_workerprocess_changelist")
WORKERS_LIVE = reverse("admin:django_leasequeue_workerprocess_live")
WORKFLOWS = reverse("admin:django_leasequeue_workflow_changelist")
WORKFLOWS_LIVE = reverse("admin:django_leasequeue_workflow_live_list")


def page_and_poll(client, page_url: str, live_url: str, data: dict | None = None):
    """GET the page and then its live endpoint; their marks, values and statement counts."""
    with CaptureQueriesContext(connection) as page_queries:
        page = client.get(page_url, data)
    assert page.status_code == 200
    with CaptureQueriesContext(connection) as live_queries:
        live = client.get(live_url, data)
    assert live.status_code == 200 and live["Content-Type"] == "application/json"
    values = live.json()
    values.pop("at")
    return (live_marks(page.content.decode()), values, len(page_queries.captured_queries),
            len(live_queries.captured_queries))


def workflow_live(workflow_id: int) -> str:
    return reverse("admin:django_leasequeue_workflow_live", args=[workflow_id])


# ---- the workers page ------------------------------------------------------------------------------


def test_the_workers_page_and_its_poll_agree_and_the_poll_follows_the_leases(admin_client, monkeypatch):
    now = store.db_now()
    rows = workers_admin.workers_page
    monkeypatch.setattr(workers_admin, "workers_page", lambda **kw: rows(**{"now": now, **kw}))
    store.process_register(process_id="h:1:w", kind="worker", host="h", pid=1, queues=["default"], concurrency=2,
                           now=now - timedelta(seconds=3))
    store.process_register(process_id="h:2:gone", kind="worker", host="h", pid=2, queues=None, concurrency=1,
                           now=now - timedelta(minutes=2))
    job = make_job("leased", leased_by="h:1:w", leased_until=now + timedelta(seconds=20),
                   attempted_at=now - timedelta(seconds=7))
    marks, values, page_n, live_n = page_and_poll(admin_client, WORKERS, WORKERS_LIVE)
    assert values == marks
    assert values["summary:alive"] == "1 process alive" and values["summary:stale"] == "1 stopped heartbeating"
    assert (values["p:h:1:w:heartbeat"], values["p:h:1:w:state"]) == ("3 s ago", "alive")
    assert values["p:h:2:gone:state"] == "stopped heartbeating 2 min ago"
    assert (values[f"j:{job.pk}:lease"], values[f"j:{job.pk}:running"]) == ("in 20 s", "7 s")
    assert live_n <= page_n
    # 30 s later by the page's clock the lease has expired: the poll says so.
    later = now + timedelta(seconds=30)
    monkeypatch.setattr(workers_admin, "workers_page", lambda **kw: rows(**{"now": later, **kw}))
    values = admin_client.get(WORKERS_LIVE).json()
    assert values[f"j:{job.pk}:lease"] == "lease expired 10 s ago" and values["summary:expired"] == "1 expired lease"
    assert values["p:h:1:w:state"] == "stopped heartbeating 33 s ago"


def test_the_live_endpoints_refuse_who_the_pages_refuse(db):
    chained = chain(step.step(1), step.step()).enqueue()
    urls = [(WORKERS, WORKERS_LIVE), (WORKFLOWS, WORKFLOWS_LIVE),
            (reverse("admin:django_leasequeue_workflow_change", args=[chained.id]), workflow_live(chained.id))]
    nobody = client_for(make_user("nobody"))
    viewer = client_for(make_user("viewer", "view_job"))
    for page, live in urls:
        assert Client().get(live).status_code == 302, live  # to the login page, as the page
        assert nobody.get(page).status_code == 403 and nobody.get(live).status_code == 403, live
        assert viewer.get(page).status_code == 200 and viewer.get(live).status_code == 200, live


# ---- a workflow's page -------------------------------------------------------------------------------


def test_a_workflows_page_and_its_poll_agree_and_the_poll_follows_its_steps(admin_client):
    handle = chain(step.step(1), step.step(), step.step(), name="three").enqueue()
    a, b, c = steps_of(handle)
    page_url = reverse("admin:django_leasequeue_workflow_change", args=[handle.id])
    marks, values, page_n, live_n = page_and_poll(admin_client, page_url, workflow_live(handle.id))
    assert values == marks
    assert (values["wf:done"], values["wf:pending"], values[f"j:{a}:status"], values[f"j:{b}:status"]) == (
        "0/3 done", "3 pending", "ready", "waiting")
    assert live_n <= page_n
    assert live_n == 2 + 3  # session and user; the row, the counts, the members (no callback)

    complete(a)
    kill(b)
    values = admin_client.get(workflow_live(handle.id)).json()
    assert (values["wf:done"], values["wf:pending"], values["wf:dead_words"], values["wf:state"]) == (
        "1/3 done", "1 pending", "1 dead", "held by a dead member")
    tries = Job.objects.get(pk=a).max_attempts
    assert (values[f"j:{a}:status"], values[f"j:{a}:attempts"]) == ("done", f"1/{tries}")
    assert values[f"j:{b}:status"] == "dead"
    assert values[f"j:{c}:status"] == "waiting"
    assert values["wf:counts"] == "waiting 1 · ready 0 · leased 0 · done 1 · dead 1 · cancelled 0"
    # The badge's class follows its text (live.js applies data-live-class).
    html = admin_client.get(page_url).content.decode()
    assert f'data-live="j:{a}:status" data-live-class="lq-status lq-{{}}">done</span>' in html
    assert admin_client.get(workflow_live(10**12)).status_code == 404


def test_a_chords_callback_is_in_its_poll(admin_client):
    handle = chord([step.step(1), step.step(2)], total.step(), name="fan").enqueue()
    page_url = reverse("admin:django_leasequeue_workflow_change", args=[handle.id])
    marks, values, page_n, live_n = page_and_poll(admin_client, page_url, workflow_live(handle.id))
    assert values == marks
    callback = handle.callbacks()["on_success"].pk
    tries = Job.objects.get(pk=callback).max_attempts
    assert (values[f"j:{callback}:status"], values[f"j:{callback}:attempts"]) == ("waiting", f"0/{tries}")
    assert live_n < page_n


# ---- the workflow list ---------------------------------------------------------------------------------


def test_the_list_and_its_poll_agree_on_the_same_filtered_page_of_rows(admin_client):
    first = chain(step.step(1), step.step(), name="first").enqueue()
    second = chain(step.step(1), name="second").enqueue()
    grouped = group([step.step(1), step.step(2)], name="grouped").enqueue()
    marks, values, page_n, live_n = page_and_poll(admin_client, WORKFLOWS, WORKFLOWS_LIVE, {"kind__exact": "chain"})
    assert values == marks
    assert {key.split(":")[1] for key in values} == {str(first.id), str(second.id)}  # the group is filtered out
    assert values[f"wf:{first.id}:progress"] == "0/2" and values[f"wf:{first.id}:state"] == "running"
    assert live_n <= page_n
    html = admin_client.get(WORKFLOWS, {"kind__exact": "chain"}).content.decode()
    assert f'data-live-url="{WORKFLOWS_LIVE}?kind__exact=chain"' in html

    complete(steps_of(first)[0])
    kill(steps_of(first)[1])
    values = admin_client.get(WORKFLOWS_LIVE, {"kind__exact": "chain"}).json()
    assert (values[f"wf:{first.id}:progress"], values[f"wf:{first.id}:dead"]) == ("1/2", "1")
    assert f"wf:{grouped.id}:progress" not in values
    assert Job.objects.filter(workflow_id=first.id, status="dead").count() == 1
    assert admin_client.get(WORKFLOWS_LIVE, {"created_at__gte": "not a date"}).status_code == 400


# ---- a queue's page ----------------------------------------------------------------------------------


def test_a_queues_page_and_its_poll_agree_cost_less_and_refuse_who_the_page_refuses(admin_client, frozen):
    now = frozen
    make_job("ready", queue="odd/name&x", run_at=now - timedelta(minutes=3))
    make_job("dead", queue="odd/name&x")
    page = reverse("admin:django_leasequeue_queue", args=["odd/name&x"])
    live = reverse("admin:django_leasequeue_queue_live", args=["odd/name&x"])
    marks, values, page_n, live_n = page_and_poll(admin_client, page, live)
    assert values == marks
    assert (values["ready_due"], values["dead"], values["state"], values["oldest_due"]) == (
        "1", "1", "running", "3 min")
    assert live_n < page_n  # no charts, error groups or schedules
    # A job enqueued meanwhile shows in the next poll.
    make_job("ready", queue="odd/name&x", run_at=now - timedelta(minutes=1))
    assert admin_client.get(live).json()["ready_due"] == "2"
    nobody = client_for(make_user("nobody"))
    assert Client().get(live).status_code == 302
    assert nobody.get(page).status_code == 403 and nobody.get(live).status_code == 403
