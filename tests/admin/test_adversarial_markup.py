"""Markup in every name an attacker can choose (queue, task, unique key, error type and message,
arguments, worker id, schedule name) comes out escaped on every console page, the SVG charts, the
confirmation page and the result messages: the raw tag never reaches the HTML."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse

from django_leasequeue import store
from django_leasequeue.models import Job, Schedule

from .factories import ERROR, make_job

pytestmark = pytest.mark.django_db

EVIL = '<img src=x onerror=alert(1)>"\'&'
RAW = "<img src=x"


@pytest.fixture
def evil():
    now = store.db_now()
    error = dict(ERROR, type=f"evil.{EVIL}", message=EVIL, traceback=EVIL, worker=EVIL)
    dead = make_job("dead", queue=EVIL, task=EVIL, unique_key=EVIL, args=[EVIL], kwargs={EVIL: EVIL},
                    errors=[error], history=[{"event": EVIL, "by": EVIL, "at": now.isoformat()}])
    holder = f"{EVIL}:1:w"
    store.process_register(process_id=holder, kind="worker", host=EVIL, pid=1, queues=[EVIL], concurrency=1,
                           now=now)
    leased = make_job("leased", queue=EVIL, task=EVIL, leased_by=holder, leased_until=now - timedelta(seconds=5),
                      attempted_at=now - timedelta(seconds=60))
    schedule = Schedule.objects.create(name=EVIL, task="invoices.tasks.noop", cron="*/5 * * * *", timezone="UTC",
                                       queue=EVIL)
    Schedule.objects.filter(pk=schedule.pk).update(task=EVIL)  # a task renamed since (no validation)
    return {"dead": dead, "leased": leased, "schedule": schedule}


def pages(evil) -> list[str]:
    app = "admin:django_leasequeue"
    return [
        reverse(f"{app}_job_changelist"), reverse(f"{app}_deadletter_changelist"),
        reverse(f"{app}_job_changelist") + "?error_type=" + "x",
        reverse(f"{app}_job_change", args=[evil["dead"].pk]), reverse(f"{app}_job_change", args=[evil["leased"].pk]),
        reverse(f"{app}_job_replay", args=[evil["dead"].pk]),
        reverse(f"{app}_job_bulk", args=["replay"]), reverse(f"{app}_deadletter_bulk", args=["replay"]),
        reverse(f"{app}_dashboard_changelist"), reverse(f"{app}_queue", args=[EVIL]),
        reverse(f"{app}_workerprocess_changelist"),
        reverse(f"{app}_schedule_changelist"), reverse(f"{app}_schedule_change", args=[evil["schedule"].pk]),
        reverse(f"{app}_job_history", args=[evil["dead"].pk]),
    ]


def test_every_page_escapes_chosen_names(admin_client, evil):
    for url in pages(evil):
        response = admin_client.get(url)
        assert response.status_code == 200, url
        html = response.content.decode()
        assert RAW not in html, url
    # The markup is there, escaped (the pages do show the names).
    html = admin_client.get(reverse("admin:django_leasequeue_deadletter_changelist")).content.decode()
    assert "&lt;img src=x onerror=alert(1)&gt;" in html


def test_result_messages_escape_chosen_names(admin_client, evil):
    # A unique key held by a ready job: the refusal names the key.
    Job.objects.filter(pk=evil["leased"].pk).update(unique_key=EVIL, unique_scope="active")
    Job.objects.filter(pk=evil["dead"].pk).update(unique_scope="active")
    url = reverse("admin:django_leasequeue_job_changelist")
    response = admin_client.post(url, {"action": "replay_selected", "_selected_action": [evil["dead"].pk],
                                       "select_across": "0", "index": "0", "lq_confirm": "yes",
                                       "lq_ids": str(evil["dead"].pk)}, follow=True)
    html = response.content.decode()
    assert "Not replayed" in html
    assert RAW not in html
