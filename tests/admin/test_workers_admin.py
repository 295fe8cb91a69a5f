"""The workers page through the test client: processes alive or stale by the database clock, each
worker's running jobs with their marks, the "Release now" button, the cut at JOBS_SHOWN, and a
constant number of statements however many processes and jobs there are."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib import admin
from django.http import HttpResponse
from django.urls import path, reverse

from django_leasequeue import store
from django_leasequeue.admin import JOBS_SHOWN, workers_page
from django_leasequeue.admin.workers import relative
from django_leasequeue.models import Job
from tests.admin.conftest import client_for, make_user
from tests.admin.factories import make_job, make_jobs

pytestmark = pytest.mark.django_db

URL = "/admin/django_leasequeue/workerprocess/"


def _release(request, object_id):  # stands in for the job admin's release view (another area's)
    return HttpResponse("released")


# A URLconf with a release view under the name the page reverses, so that the button's rendering
# is tested whether or not the job admin's view is installed (see test_release_button_*).
urlpatterns = [
    path("admin/", ([path("django_leasequeue/job/<path:object_id>/release/", _release,
                          name="django_leasequeue_job_release"), *admin.site.get_urls()], "admin", "admin")),
]


def register(name: str, *, kind: str = "worker", ago: float = 0.0, queues=("default",), concurrency: int = 4) -> str:
    """Register a process whose last heartbeat (and start) is ``ago`` seconds before the db clock."""
    process_id = f"host-a:{100 + len(name)}:{name}"
    store.process_register(process_id=process_id, kind=kind, host="host-a", pid=100 + len(name),
                           queues=list(queues), concurrency=concurrency,
                           now=store.db_now() - timedelta(seconds=ago))
    return process_id


def lease(holder: str, *, left: float = 30.0, running: float = 5.0, **fields) -> Job:
    now = store.db_now()
    return make_job("leased", leased_by=holder, leased_until=now + timedelta(seconds=left),
                    attempted_at=now - timedelta(seconds=running), **fields)


def process_block(html: str, holder: str) -> str:
    match = re.search(rf'<div class="module lq-process[^"]*" id="lq-process-\d+" data-process="{re.escape(holder)}">'
                      r"(.*?)\n  </div>", html, re.S)
    assert match, f"no block for {holder}"
    return match.group(1)


def test_relative_words():
    assert [relative(s) for s in (240, -12, 0.2, -3700)] == ["in 4 min", "12 s ago", "now", "1 h 1 min ago"]


def test_lists_every_process_alive_or_stale_by_the_database_clock(admin_client, db_clock):
    w = register("w", ago=2)
    s = register("sched", kind="scheduler", ago=2, concurrency=0)
    gone = register("gone", ago=120)
    html = admin_client.get(URL).content.decode()
    assert "alive" in process_block(html, w) and "stopped heartbeating" not in process_block(html, w)
    assert "scheduler " + s in html
    assert "stopped heartbeating 2 min ago" in process_block(html, gone)
    stale = re.search(r'<div class="module lq-stale-list" id="lq-stale">(.*?)</div>', html, re.S).group(1)
    assert gone in stale and w not in stale and "last heartbeat 2 min ago" in stale
    assert "2 processes alive" in html
    # Judged by the database clock: move it on and the live ones go stale too.
    db_clock.advance(3600)
    html = admin_client.get(URL).content.decode()
    assert "0 processes alive" in html and "3 stopped heartbeating" in html


def test_a_workers_running_jobs_with_attempt_lease_and_running_time(admin_client):
    w = register("w")
    job = lease(w, left=25, running=65, task="invoices.tasks.send", queue="invoices", attempts=2, max_attempts=5)
    block = process_block(admin_client.get(URL).content.decode(), w)
    assert f'<a href="{reverse("admin:django_leasequeue_job_change", args=[job.id])}">#{job.id}</a>' in block
    assert "invoices.tasks.send" in block and ">invoices<" in block and ">2/5<" in block
    assert "in 25 s" in block and "1 min 5 s" in block
    assert job.leased_until.strftime("%H:%M:%S") in block  # absolute, to the second (UTC in the test project)
    assert "lease expired" not in block and "Release now" not in block and "past its timeout" not in block


def test_a_handler_past_its_timeout_is_marked_for_its_current_token_only(admin_client):
    w = register("w")
    at = store.db_now().isoformat()
    stuck = lease(w, lease_version=3, history=[{"event": "timed_out", "token": "3", "at": at}])
    earlier = lease(w, lease_version=4, history=[{"event": "timed_out", "token": "3", "at": at}])
    html = admin_client.get(URL).content.decode()
    rows = dict(re.findall(r'<tr class="[^"]*" data-job="(\d+)">(.*?)</tr>', html, re.S))
    assert "past its timeout" in rows[str(stuck.id)]
    assert "past its timeout" not in rows[str(earlier.id)]
    assert "1 handler past its timeout" in html


@pytest.mark.urls(__name__)
def test_release_button_on_expired_leases_posts_to_the_job_release_view(client, db):
    client.force_login(make_user("op", "view_job", "change_job"))
    w = register("w")
    expired = lease(w, left=-42)
    fresh = lease(w, left=30)
    html = client.get(URL).content.decode()
    rows = dict(re.findall(r'<tr class="([^"]*)" data-job="(\d+)">(.*?)</tr>', html, re.S)[i][1:]
                for i in range(2))
    assert "lease expired 42 s ago" in rows[str(expired.id)]
    action = reverse("admin:django_leasequeue_job_release", args=[expired.id])
    assert (f'<form method="post" action="{action}" class="lq-inline lq-release">' in rows[str(expired.id)])
    assert '<input type="hidden" name="_from" value="workers">' in rows[str(expired.id)]
    assert "Release now" not in rows[str(fresh.id)] and "lease expired" not in rows[str(fresh.id)]
    assert "1 expired lease" in html


@pytest.mark.urls(__name__)
def test_no_release_button_without_change_job(client):
    client.force_login(make_user("viewer", "view_job"))
    lease(register("w"), left=-5)
    html = client.get(URL).content.decode()
    assert "lease expired 5 s ago" in html and "Release now" not in html


def test_the_page_works_without_the_release_view(admin_client):
    # Until the job admin's release view is installed there is no URL to post to: the mark stays.
    lease(register("w"), left=-5)
    html = admin_client.get(URL).content.decode()
    assert "lease expired 5 s ago" in html
    try:
        action = reverse("admin:django_leasequeue_job_release", args=[1]).rsplit("/1/", 1)[0]
    except Exception:
        assert "Release now" not in html
    else:
        assert f'action="{action}' in html


def test_jobs_of_an_unregistered_holder_are_listed(admin_client):
    job = lease("host-b:9:pruned", left=-300)
    block = process_block(admin_client.get(URL).content.decode(), "host-b:9:pruned")
    assert "not registered" in block and f"#{job.id}" in block and "lease expired 5 min ago" in block


def test_at_most_JOBS_SHOWN_jobs_per_worker_then_a_link_to_the_rest(admin_client):
    w = register("w")
    now = store.db_now()
    make_jobs(JOBS_SHOWN + 3, "leased", leased_by=w, attempted_at=now, leased_until=now + timedelta(seconds=30))
    _, rows = workers_page()
    [row] = rows
    assert (len(row.jobs), row.total, row.more) == (JOBS_SHOWN, JOBS_SHOWN + 3, 3)
    block = process_block(admin_client.get(URL).content.decode(), w)
    assert block.count("data-job=") == JOBS_SHOWN
    link = re.search(r'<a href="([^"]+)">and 3 more</a>', block).group(1).replace("&amp;", "&")
    listed = admin_client.get(link)
    assert listed.status_code == 200
    assert listed.context["cl"].queryset.count() == JOBS_SHOWN + 3


@pytest.mark.parametrize("workers", [1, 5])
def test_constant_statements_however_many_processes_and_jobs(admin_client, django_assert_num_queries, workers):
    for i in range(workers):
        w = register(f"w{i}")
        for left in (30, -5, 10):
            lease(w, left=left)
    register("stale", ago=600)
    lease("host-z:1:pruned", left=-60)
    admin_client.get(URL)  # warm the session
    with django_assert_num_queries(9):
        html = admin_client.get(URL).content.decode()
    assert html.count("data-job=") == 3 * workers + 1


def test_permissions(client):
    client.force_login(make_user("dead-only", "view_deadletter"))
    assert client.get(URL).status_code == 403
    viewer = client_for(make_user("processes", "view_workerprocess"))
    assert viewer.get(URL).status_code == 200
    assert client_for(make_user("jobs", "view_job")).get(URL).status_code == 200
