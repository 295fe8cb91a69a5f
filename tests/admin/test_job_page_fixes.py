"""The job page and list fixes through the test client: snoozed jobs (bug 7), expired
leases and "Release now" (bug 8), times and the database clock (bug 9), error names (bug 10), the
replay form (bug 11), headings (bug 15), and the queue and task filters (bugs 2 and 3)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_leasequeue import store
from django_leasequeue.models import Job

from .factories import ERROR, make_job

pytestmark = pytest.mark.django_db

JOBS = reverse("admin:django_leasequeue_job_changelist")
DEAD = reverse("admin:django_leasequeue_deadletter_changelist")
SECONDS = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")


def page(client, job_id: int) -> str:
    response = client.get(reverse("admin:django_leasequeue_job_change", args=[job_id]))
    assert response.status_code == 200
    return response.content.decode()


def state_line(html: str) -> str:
    start = html.index('id="lq-state"')
    return html[start:html.index("</p>", start)]


def list_badge(client, job_id: int, url: str = JOBS) -> str:
    html = client.get(url).content.decode()
    row = html[html.index(f'/job/{job_id}/change/') if url == JOBS else html.index(f'/deadletter/{job_id}/change/'):]
    return re.search(r'class="lq-status[^"]*"[^>]*>([^<]+)<', row).group(1)


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


@pytest.fixture
def snoozed():
    now = store.db_now()
    return make_job("ready", snoozes=2, attempts=0, lease_version=3, run_at=now + timedelta(minutes=10),
                    attempted_at=now - timedelta(minutes=1), leased_by="host-a:41:w1")


# ---- bug 7: snoozed ------------------------------------------------------------------------------


def test_a_snoozed_job_reads_snoozed_on_the_list_and_the_page_without_a_stale_holder(admin_client, snoozed):
    assert list_badge(admin_client, snoozed.id) == "snoozed"
    html = page(admin_client, snoozed.id)
    assert 'id="lq-state-badge">snoozed<' in html
    assert "snoozed 2 times; due in 10 min" in state_line(html)
    assert "host-a:41:w1" not in html  # leased_by shows only while leased
    assert "not leased" in html
    assert 'id="lq-run-now"' in html and 'id="lq-retry-now"' not in html


def test_run_now_makes_a_snoozed_job_due_fenced_on_its_token(admin_client, snoozed):
    url = reverse("admin:django_leasequeue_job_run_now", args=[snoozed.id])
    stale = admin_client.post(url, {"lease_version": "2"}, follow=True)
    assert messages_of(stale) == ["No job was made due: skipped 1: 1 × changed by someone else meanwhile."]
    response = admin_client.post(url, {"lease_version": "3"}, follow=True)
    assert messages_of(response) == ["Made due now: 1 job."]
    job = Job.objects.get(pk=snoozed.id)
    assert job.run_at <= store.db_now() and job.history[-1]["event"] == "run_now"
    assert job.history[-1]["by"] == "admin" and job.lease_version == 3
    assert list(LogEntry.objects.values_list("object_id", "change_message")) == [(str(job.id), "Made due now: 1 job")]
    again = admin_client.post(url, follow=True)
    assert messages_of(again) == ["No job was made due: skipped 1: 1 × already due."]


def test_run_now_in_bulk_is_one_statement_with_reasons():
    now = store.db_now()
    later = [make_job("ready", run_at=now + timedelta(hours=1)).id for _ in range(3)]
    due = make_job("ready").id
    dead = make_job("dead").id
    outcome = store.job_run_now([*later, due, dead, 10**12], by="ops")
    assert outcome.done == sorted(later)
    assert outcome.skipped == {"already due": 1, "job is dead": 1, "no such job": 1}


# ---- bug 8: an expired lease ----------------------------------------------------------------------


@pytest.fixture
def expired():
    return make_job("leased", attempts=1, lease_version=5, leased_by="host-b:7:w2",
                    leased_until=store.db_now() - timedelta(seconds=40))


def test_an_expired_lease_has_a_badge_and_release_now_not_held_until_a_past_time(admin_client, expired):
    html = page(admin_client, expired.id)
    line = state_line(html)
    assert 'id="lq-state-badge">lease expired<' in line
    assert re.search(r"lease expired 4\d s ago \(held by host-b:7:w2\)", line)
    assert "until" not in line
    assert 'id="lq-release"' in html
    assert list_badge(admin_client, expired.id) == "lease expired"


def test_release_now_does_what_the_reaper_would_and_records_who(admin_client, expired):
    url = reverse("admin:django_leasequeue_job_release", args=[expired.id])
    assert admin_client.get(url).status_code == 405
    response = admin_client.post(url, {"lease_version": "5", "next": "/admin/?from=workers"})
    assert response.status_code == 302 and response["Location"] == "/admin/?from=workers"
    job = Job.objects.get(pk=expired.id)
    assert (job.status, job.lease_version, job.leased_until) == ("ready", 6, None)
    assert job.run_at <= store.db_now()
    assert job.history[-1] | {"at": None, "expired_at": None} == {
        "event": "released", "by": "admin", "at": None, "holder": "host-b:7:w2", "expired_at": None, "token": 6}
    assert job.errors[-1]["type"] == "LeaseExpired" and job.errors[-1]["worker"] == "host-b:7:w2"
    # The old holder is fenced out: its completion with token 5 is refused.
    assert set(store.job_complete([(job.id, 5, None)])) == set()
    assert Job.objects.get(pk=job.id).status == "ready"
    assert list(LogEntry.objects.values_list("change_message", flat=True)) == ["Released 1 job"]


def test_release_refuses_a_live_lease_and_a_moved_token(admin_client, expired):
    live = make_job("leased")
    url = reverse("admin:django_leasequeue_job_release", args=[live.id])
    response = admin_client.post(url, follow=True)
    assert messages_of(response) == ["No job was released: skipped 1: 1 × lease not expired."]
    response = admin_client.post(reverse("admin:django_leasequeue_job_release", args=[expired.id]),
                                 {"lease_version": "4"}, follow=True)
    assert messages_of(response) == ["No job was released: skipped 1: 1 × changed by someone else meanwhile."]
    assert Job.objects.get(pk=expired.id).status == "leased"


def test_release_needs_change_permission(viewer_client, expired):
    assert viewer_client.post(reverse("admin:django_leasequeue_job_release", args=[expired.id])).status_code == 403
    assert 'id="lq-release"' not in page(viewer_client, expired.id)


def test_release_is_set_based_and_judged_by_the_database_clock(db_clock, django_assert_num_queries):
    now = store.db_now()
    ids = [make_job("leased", leased_until=now + timedelta(seconds=30)).id for _ in range(3)]
    spent = make_job("leased", attempts=3, max_attempts=3, leased_until=now - timedelta(seconds=1)).id
    asked = make_job("leased", cancel_requested=True, leased_until=now - timedelta(seconds=1)).id
    assert store.job_release_expired(ids).skipped == {"lease not expired": 3}
    db_clock.advance(60)  # the database's clock moves on: the leases have run out
    with django_assert_num_queries(1):
        outcome = store.job_release_expired([*ids, spent, asked, 10**12], by="ops")
    assert outcome.done == sorted([*ids, spent, asked]) and outcome.skipped == {"no such job": 1}
    assert dict(Job.objects.filter(pk__in=[*ids, spent, asked]).values_list("pk", "status")) == \
        {**dict.fromkeys(ids, "ready"), spent: "dead", asked: "cancelled"}


# ---- bug 9: times, wait and run time, the database clock ------------------------------------------


def test_times_to_the_second_with_wait_and_run_time(admin_client):
    now = store.db_now()
    job = make_job("done", run_at=now - timedelta(minutes=10), attempted_at=now - timedelta(minutes=8),
                   started_at=now - timedelta(minutes=8), finished_at=now - timedelta(minutes=7, seconds=30))
    html = page(admin_client, job.id)
    for label in ("run at", "created", "first claim", "latest claim", "finished"):
        block = re.search(rf"<label[^>]*>{label}:</label>\s*<div class=\"readonly\">(.*?)</div>", html, re.I | re.S)
        assert block and SECONDS.fullmatch(re.sub(r"<[^>]+>", "", block.group(1)).strip()), label
    wait = re.search(r"<label[^>]*>wait time:</label>\s*<div class=\"readonly\">([^<]*)</div>", html, re.I).group(1)
    run = re.search(r"<label[^>]*>run time:</label>\s*<div class=\"readonly\">([^<]*)</div>", html, re.I).group(1)
    assert (wait.strip(), run.strip()) == ("2 min (due to start of the latest attempt)", "30 s")
    running = make_job("leased", attempted_at=now - timedelta(seconds=90))
    # 90 s before the clock reading above; the page reads the clock again, a moment later (under
    # 10 s even on a loaded machine).
    assert re.search(r"running for 1 min 3\d s", page(admin_client, running.id))
    listed = admin_client.get(JOBS).content.decode()
    assert SECONDS.search(listed)


def test_retry_now_is_judged_by_the_database_clock(admin_client, db_clock):
    job = make_job("ready", attempts=1, run_at=store.db_now() + timedelta(minutes=30), errors=[ERROR])
    assert 'id="lq-retry-now"' in page(admin_client, job.id)
    assert list_badge(admin_client, job.id) == "retry wait"
    db_clock.advance(3600)  # the web server's clock has not moved; the database's says it is due
    assert 'id="lq-retry-now"' not in page(admin_client, job.id)
    assert list_badge(admin_client, job.id) == "ready"


# ---- bug 10: error names one way --------------------------------------------------------------------


def test_error_names_are_the_class_name_everywhere(admin_client):
    job = make_job("dead", errors=[dict(ERROR, type="builtins.ValueError"),
                                   dict(ERROR, type="asyncio.exceptions.CancelledError", message="cancelled")])
    for html in (page(admin_client, job.id), admin_client.get(JOBS).content.decode(),
                 admin_client.get(DEAD).content.decode()):
        assert "CancelledError" in html
        shown = re.sub(r'href="[^"]*"', "", html)  # the group links select by the stored type, exactly
        assert "asyncio.exceptions" not in shown and "builtins." not in shown
    assert "<b>ValueError</b>" in page(admin_client, job.id)


def test_error_name_helper():
    from django_leasequeue.admin.common import error_name

    assert [error_name(t) for t in ("builtins.ValueError", "ValueError", "asyncio.exceptions.CancelledError",
                                    "", None)] == ["ValueError", "ValueError", "CancelledError", "", ""]


# ---- bug 11: the replay form -------------------------------------------------------------------------


def test_replay_form_textareas_are_sized_to_their_content(admin_client):
    job = make_job("dead", args=[], kwargs={f"k{i}": i for i in range(10)})
    html = admin_client.get(reverse("admin:django_leasequeue_job_replay", args=[job.id])).content.decode()
    assert re.search(r'<textarea name="args"[^>]*rows="3"', html)
    assert re.search(r'<textarea name="kwargs"[^>]*rows="12"', html)  # 10 keys and the braces
    big = make_job("dead", args=list(range(100)), kwargs={})
    html = admin_client.get(reverse("admin:django_leasequeue_job_replay", args=[big.id])).content.decode()
    assert re.search(r'<textarea name="args"[^>]*rows="30"', html)
    assert re.search(r'<textarea name="kwargs"[^>]*rows="3"', html)


# ---- bug 15: headings --------------------------------------------------------------------------------


def test_the_job_page_has_one_heading_naming_the_job(admin_client):
    job = make_job("dead")
    html = page(admin_client, job.id)
    assert html.count(f"<h1>Job #{job.id}</h1>") == 1
    assert f"<h2>{job}</h2>" not in html and str(job) not in re.findall(r"<h2>(.*?)</h2>", html)


# ---- bugs 2 and 3: filters ---------------------------------------------------------------------------


def choices(response, title: str) -> list[str]:
    spec = next(s for s in response.context["cl"].filter_specs if str(s.title) == title)
    return [str(c["display"]) for c in spec.choices(response.context["cl"])][1:]  # after "All"


def test_queue_filter_lists_the_queues_holding_jobs_without_distinct(admin_client):
    for queue in ("invoices", "orders", "partners", "reports"):
        make_job("ready", queue=queue)
    make_job("waiting", queue="batches")
    make_job("dead", queue="legacy")
    with CaptureQueriesContext(connection) as ctx:
        response = admin_client.get(JOBS)
    names = choices(response, "queue")
    assert {"invoices", "orders", "partners", "reports", "batches"} <= set(names) and names == sorted(names)
    assert not any("DISTINCT" in q["sql"] for q in ctx.captured_queries)
    dead = choices(admin_client.get(DEAD), "queue")
    assert dead == ["legacy"]


def test_queue_skip_scan_reads_one_probe_per_queue():
    for queue in ("a", "b", "c"):
        for _ in range(3):
            make_job("ready", queue=queue)
    assert store.queue_names_holding([]) == ["a", "b", "c"]
    assert store.queue_names_holding(["z"]) == ["a", "b", "c", "z"]


def test_task_filter_is_sorted_by_its_label_and_dead_letters_list_only_dead_tasks(admin_client):
    make_job("dead", task="invoices.tasks.poison")
    make_job("dead", task="zz.tasks.alpha")
    labels = choices(admin_client.get(JOBS), "task")
    assert labels == sorted(labels, key=str.lower)
    assert choices(admin_client.get(DEAD), "task") == ["alpha", "poison"]
