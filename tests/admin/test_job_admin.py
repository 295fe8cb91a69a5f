"""Job admin and dead letters through the test client: list, filters, change page, replay (C32),
cancel, retry now, permissions, and the bulk actions on 10,000 rows (one statement each)."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from invoices.tasks import poison

from django_leasequeue import store
from django_leasequeue.admin import EXACT_COUNT_LIMIT
from django_leasequeue.models import Job

from .factories import make_job, make_jobs

pytestmark = pytest.mark.django_db

C32_KWARGS = {"opts": {}, "tags": [], "name": "ü", "n": 0}
JOBS = reverse("admin:django_leasequeue_job_changelist")
DEAD = reverse("admin:django_leasequeue_deadletter_changelist")


def change_url(job_id: int) -> str:
    return reverse("admin:django_leasequeue_job_change", args=[job_id])


def replay_url(job_id: int) -> str:
    return reverse("admin:django_leasequeue_job_replay", args=[job_id])


def dead_c32_job() -> Job:
    """A poison job with the C32 kwargs, driven to dead by three real claims and failures."""
    job = poison.enqueue(payload=C32_KWARGS)
    now = store.db_now()
    for attempt in (1, 2, 3):
        (claimed,) = store.job_claim(queues=["default"], limit=1, worker_id="w", lease=30, now=now)
        store.job_fail(job.id, claimed.lease_version,
                       {"attempt": attempt, "type": "ValueError", "message": "malformed payload", "worker": "w",
                        "traceback": f"Traceback (most recent call last):\n  line {attempt}\nValueError"},
                       retry_delay=0.0, now=now)
    job.refresh_from_db()
    assert job.status == "dead"
    return job


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


# ---- list ------------------------------------------------------------------------------------


def test_c24_changelist_defers_payload_and_renders_small(admin_client):
    big = poison.enqueue(payload={"blob": "x" * 1_000_000})
    make_job("dead")
    with CaptureQueriesContext(connection) as ctx:
        response = admin_client.get(JOBS)
    assert response.status_code == 200
    assert len(response.content) < 100_000
    job_selects = [q["sql"] for q in ctx.captured_queries if 'FROM "leasequeue_job"' in q["sql"]]
    assert job_selects
    for sql in job_selects:
        select_list = sql.split(" FROM ")[0]
        for column in ("args", "kwargs", "result", "history"):
            assert f'"leasequeue_job"."{column}"' not in select_list, sql
        # errors is read only through the short last-error annotation, never as a column.
        assert not re.search(r'"leasequeue_job"\."errors"\s*(,|$)', select_list), sql
        assert "DISTINCT" not in sql  # no SELECT DISTINCT for filter choices
    rows = response.context["cl"].result_list
    big_row = next(r for r in rows if r.id == big.id)
    assert {"args", "kwargs", "errors", "history", "result"} <= big_row.get_deferred_fields()
    # No COUNT(*) of the whole table besides the bounded one.
    counts = [q["sql"] for q in ctx.captured_queries if "COUNT(" in q["sql"].upper()]
    assert len(counts) == 1 and "LIMIT 10001" in counts[0]
    assert len(ctx.captured_queries) <= 12


def test_changelist_columns_and_last_error(admin_client):
    dead = make_job("dead")
    response = admin_client.get(JOBS)
    html = response.content.decode()
    assert "3/3" in html and "ValueError" in html and "malformed payload" in html
    assert f'href="{change_url(dead.id)}"' in html


def test_filters_and_search(admin_client):
    dead = make_job("dead", queue="mail", task="invoices.tasks.poison")
    ready = make_job("ready", queue="default", task="invoices.tasks.flaky_sync", unique_key="inv-42")

    def ids(params):
        response = admin_client.get(JOBS, params)
        assert response.status_code == 200, params
        return {o.id for o in response.context["cl"].result_list}

    assert ids({"status": "dead"}) == {dead.id}
    assert ids({"queue": "mail"}) == {dead.id}
    assert ids({"task": "invoices.tasks.flaky_sync"}) == {ready.id}
    assert ids({"has_errors": "yes"}) == {dead.id}
    assert ids({"has_errors": "no"}) == {ready.id}
    assert ids({"q": str(dead.id)}) == {dead.id}
    assert ids({"q": f"#{ready.id}"}) == {ready.id}
    assert ids({"q": "flaky"}) == {ready.id}
    assert ids({"q": "inv-42"}) == {ready.id}
    assert ids({"q": "9" * 30}) == set()
    # The queue filter offers queues without reading the job table.
    html = admin_client.get(JOBS).content.decode()
    assert "?queue=default" in html


def test_estimated_count_beyond_the_exact_limit(admin_client):
    make_jobs(EXACT_COUNT_LIMIT + 50, "done")
    with connection.cursor() as cur:
        cur.execute("ANALYZE leasequeue_job")
    response = admin_client.get(JOBS)
    cl = response.context["cl"]
    assert cl.paginator.is_estimate and cl.result_count > EXACT_COUNT_LIMIT
    assert "about " in response.content.decode()
    # A filter that matches few rows is counted exactly.
    make_job("dead")
    response = admin_client.get(JOBS, {"status": "dead"})
    assert response.context["cl"].result_count == 1 and not response.context["cl"].paginator.is_estimate


# ---- change page -------------------------------------------------------------------------------


def test_change_page_shows_arguments_errors_tracebacks_and_history(admin_client):
    job = dead_c32_job()
    store.job_replay([job.id], by="admin")
    store.job_replay([job.id], by="admin")  # no-op
    Job.objects.filter(pk=job.id).update(status="dead")  # died again (factory shortcut)
    html = admin_client.get(change_url(job.id)).content.decode()
    assert '&quot;name&quot;: &quot;ü&quot;' in html  # kwargs pretty-printed, unicode kept
    assert html.count("<summary>Traceback</summary>") == 3  # every attempt, collapsible
    assert "line 1" in html and "line 3" in html
    assert "replayed" in html and "admin" in html
    assert 'id="lq-replay"' in html
    assert 'name="_save"' not in html  # read-only: no save button


def test_change_page_of_a_big_payload_is_cut(admin_client):
    job = poison.enqueue(payload={"blob": "y" * 200_000})
    html = admin_client.get(change_url(job.id)).content.decode()
    assert "cut at" in html and len(html) < 150_000


def CONFIRMED_REPLAY(job):
    """The POST of the bulk Replay's confirmation page for one job."""
    return {"action": "replay_selected", "_selected_action": [job.id], "lq_confirm": "yes"}


# ---- replay --------------------------------------------------------------------------------------


def test_c32_replay_via_detail_button(admin_client):
    job = dead_c32_job()
    response = admin_client.post(replay_url(job.id), follow=True)
    assert response.redirect_chain[-1][0] == change_url(job.id)
    job.refresh_from_db()
    assert (job.status, job.attempts, job.lease_version) == ("ready", 0, 4)
    assert job.kwargs == {"payload": C32_KWARGS} and len(job.errors) == 3
    assert job.history[-1]["by"] == "admin"
    assert any("Replayed job" in m for m in messages_of(response))
    # The page now shows the job ready, without a Replay button.
    html = response.content.decode()
    assert 'id="lq-replay"' not in html and "lq-status lq-ready" in html


def test_c32_replay_via_bulk_action(admin_client):
    job = dead_c32_job()
    other = make_job("ready")
    response = admin_client.post(DEAD, CONFIRMED_REPLAY(job), follow=True)
    assert response.status_code == 200
    job.refresh_from_db()
    assert (job.status, job.attempts, job.lease_version) == ("ready", 0, 4)
    assert job.kwargs == {"payload": C32_KWARGS}
    # From the job list, a ready job among the selection is reported, not touched.
    job2 = make_job("dead")
    response = admin_client.post(JOBS, {"action": "replay_selected", "_selected_action": [job2.id, other.id],
                                             "lq_confirm": "yes"},
                                 follow=True)
    msgs = " ".join(messages_of(response))
    assert "Replayed job" in msgs and f"#{other.id}" in msgs and "job is ready" in msgs


def test_c32_double_replay_makes_one_runnable_job(admin_client):
    job = dead_c32_job()
    first = admin_client.post(replay_url(job.id), follow=True)
    second = admin_client.post(replay_url(job.id), follow=True)
    third = admin_client.post(DEAD, CONFIRMED_REPLAY(job), follow=True)
    assert first.status_code == second.status_code == third.status_code == 200
    assert "job is ready" in " ".join(messages_of(second))
    assert Job.objects.filter(task=poison.name).count() == 1
    job.refresh_from_db()
    assert job.lease_version == 4 and [h["event"] for h in job.history] == ["replayed"]
    # It runs once, successfully, on the next claim with the original kwargs.
    (claimed,) = store.job_claim(queues=["default"], limit=5, worker_id="w", lease=30)
    assert claimed.id == job.id and claimed.kwargs == {"payload": C32_KWARGS}


def test_edit_arguments_and_replay(admin_client):
    job = dead_c32_job()
    form = admin_client.get(replay_url(job.id))
    assert form.status_code == 200
    assert "&quot;name&quot;: &quot;ü&quot;" in form.content.decode()
    fixed = {"payload": {**C32_KWARGS, "customer": "ACME"}}
    response = admin_client.post(replay_url(job.id), {"args": "[]", "kwargs": json.dumps(fixed)}, follow=True)
    assert response.redirect_chain[-1][0] == change_url(job.id)
    job.refresh_from_db()
    assert job.status == "ready" and job.kwargs == fixed
    edited = job.history[-2]
    assert edited["event"] == "edited" and edited["by"] == "admin"
    assert edited["old"]["kwargs"] == {"payload": C32_KWARGS} and edited["new"]["kwargs"] == fixed
    html = response.content.decode()
    assert "arguments before and after" in html and "ACME" in html


@pytest.mark.parametrize("args, kwargs, error", [
    ("[", "{}", "not valid JSON"),
    ("{}", "{}", "args must be a JSON list"),
    ("[]", "[]", "kwargs must be a JSON object"),
    ("[NaN]", "{}", "NaN is not JSON"),
])
def test_edit_and_replay_rejects_bad_json(admin_client, args, kwargs, error):
    job = make_job("dead")
    response = admin_client.post(replay_url(job.id), {"args": args, "kwargs": kwargs})
    assert response.status_code == 200 and error in response.content.decode()
    job.refresh_from_db()
    assert job.status == "dead" and job.history == []


def test_replay_needs_the_replay_permission(operator_client, replayer_client):
    job = make_job("dead")
    # No replay_job: the button and the action are hidden, and the POST is refused with 403.
    html = operator_client.get(change_url(job.id)).content.decode()
    assert 'id="lq-replay"' not in html and "Edit arguments and replay" not in html
    dead_list = operator_client.get(DEAD).content.decode()
    assert "lq-replay" not in dead_list and "replay_selected" not in dead_list
    assert operator_client.post(replay_url(job.id)).status_code == 403
    assert operator_client.get(replay_url(job.id)).status_code == 403
    response = operator_client.post(DEAD, CONFIRMED_REPLAY(job))
    job.refresh_from_db()
    assert job.status == "dead" and response.status_code == 200
    # With replay_job (and no change_job) the button is there and works.
    html = replayer_client.get(change_url(job.id)).content.decode()
    assert 'id="lq-replay"' in html and 'id="lq-cancel"' not in html
    assert replayer_client.post(replay_url(job.id)).status_code == 302
    job.refresh_from_db()
    assert job.status == "ready" and job.history[-1]["by"] == "replayer"


def test_replay_post_needs_csrf(admin_user):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    job = make_job("dead")
    assert client.post(replay_url(job.id)).status_code == 403
    job.refresh_from_db()
    assert job.status == "dead"


# ---- dead letters -------------------------------------------------------------------------------


def test_dead_letters_list_only_dead_newest_first_with_groups(admin_client):
    now = store.db_now()
    old = make_job("dead", finished_at=now - timedelta(hours=2))
    new = make_job("dead", finished_at=now - timedelta(minutes=1), task="invoices.tasks.flaky_sync",
                   errors=[{"type": "ConnectionError", "message": "timeout", "attempt": 1}])
    make_job("ready"), make_job("done"), make_job("cancelled")
    response = admin_client.get(DEAD)
    assert [o.id for o in response.context["cl"].result_list] == [new.id, old.id]
    groups = {(g["task"], g["last_error_type"]): g["n"] for g in response.context["lq_groups"]}
    assert groups == {("invoices.tasks.poison", "ValueError"): 1, ("invoices.tasks.flaky_sync", "ConnectionError"): 1}
    html = response.content.decode()
    assert 'id="lq-groups"' in html and "ConnectionError" in html


def test_dead_letter_row_replay_button(admin_client):
    job = make_job("dead")
    html = admin_client.get(DEAD).content.decode()
    assert f'formaction="{replay_url(job.id)}"' in html
    # The button submits the changelist form (with its CSRF token) to the replay URL.
    response = admin_client.post(replay_url(job.id), {"_from": "list", "action": "", "index": "0"},
                                 HTTP_REFERER="http://testserver" + DEAD)
    assert response.status_code == 302 and response["Location"].endswith(DEAD)
    job.refresh_from_db()
    assert job.status == "ready"
    # A foreign referer is not followed.
    other = make_job("dead")
    response = admin_client.post(replay_url(other.id), {"_from": "list"}, HTTP_REFERER="https://evil.example/x")
    assert response["Location"] == DEAD


def test_dead_letters_visible_with_job_permissions_only(viewer_client):
    make_job("dead")
    assert viewer_client.get(DEAD).status_code == 200


# ---- cancel and retry now --------------------------------------------------------------------------


def test_cancel_ready_and_leased_from_the_page(admin_client):
    ready, leased = make_job("ready"), make_job("leased")
    assert 'id="lq-cancel"' in admin_client.get(change_url(ready.id)).content.decode()
    admin_client.post(reverse("admin:django_leasequeue_job_cancel", args=[ready.id]))
    admin_client.post(reverse("admin:django_leasequeue_job_cancel", args=[leased.id]))
    ready.refresh_from_db()
    leased.refresh_from_db()
    assert ready.status == "cancelled" and ready.history[-1]["by"] == "admin"
    assert leased.status == "leased" and leased.cancel_requested
    # The worker's completion is refused: the job ends cancelled, with no result.
    done = store.job_complete([(leased.id, leased.lease_version, '"ok"')])
    leased.refresh_from_db()
    assert leased.status == "cancelled" and leased.result is None and not done
    # Cancelled jobs can be replayed.
    assert 'id="lq-replay"' in admin_client.get(change_url(ready.id)).content.decode()


def test_cancel_and_retry_now_need_change_permission(viewer_client):
    job = make_job("ready", attempts=1, run_at=store.db_now() + timedelta(hours=1))
    html = viewer_client.get(change_url(job.id)).content.decode()
    assert 'id="lq-cancel"' not in html and 'id="lq-retry-now"' not in html
    assert viewer_client.post(reverse("admin:django_leasequeue_job_cancel", args=[job.id])).status_code == 403
    assert viewer_client.post(reverse("admin:django_leasequeue_job_retry_now", args=[job.id])).status_code == 403
    assert viewer_client.get(reverse("admin:django_leasequeue_job_cancel", args=[job.id])).status_code == 405
    job.refresh_from_db()
    assert job.status == "ready" and job.history == []


def test_retry_now_button(operator_client):
    job = make_job("ready", attempts=2, run_at=store.db_now() + timedelta(hours=1))
    assert 'id="lq-retry-now"' in operator_client.get(change_url(job.id)).content.decode()
    operator_client.post(reverse("admin:django_leasequeue_job_retry_now", args=[job.id]))
    job.refresh_from_db()
    assert job.run_at <= store.db_now() and job.history[-1]["event"] == "retry_now"
    assert job.history[-1]["by"] == "operator"


def test_retry_now_says_which_jobs_were_left_alone(operator_client):
    due = make_job("ready", attempts=2, run_at=store.db_now() - timedelta(minutes=1))
    response = operator_client.post(reverse("admin:django_leasequeue_job_retry_now", args=[due.id]), follow=True)
    assert messages_of(response) == [
        "1 job was left alone: only ready jobs waiting out a retry backoff are moved."]
    due.refresh_from_db()
    assert due.history == []


# ---- bulk actions on 10,000 rows ------------------------------------------------------------------


def run_action(client, url, action, ids, *, select_across=False):
    data = {"action": action, "_selected_action": ids[:1] if select_across else ids,
            "select_across": "1" if select_across else "0", "index": "0", "lq_confirm": "yes"}
    with CaptureQueriesContext(connection) as ctx:
        response = client.post(url, data)
    assert response.status_code == 302, response.content[:500]
    return ctx.captured_queries


def state_changes(queries) -> list[str]:
    return [q["sql"] for q in queries if "UPDATE" in q["sql"] and "leasequeue_job" in q["sql"]]


def test_bulk_replay_10000_select_across(admin_client):
    ids = make_jobs(10_000, "dead")
    make_job("ready")
    queries = run_action(admin_client, DEAD, "replay_selected", ids, select_across=True)
    assert Job.objects.filter(status="ready", attempts=0).count() == 10_001
    assert len(state_changes(queries)) == 1  # one statement for all 10,000 rows
    assert len(queries) <= 20, [q["sql"][:120] for q in queries]


def test_bulk_cancel_10000_select_across_filtered(admin_client):
    ids = make_jobs(10_000, "ready", queue="mail")
    other = make_job("ready", queue="default")
    queries = run_action(admin_client, JOBS + "?status=ready&queue=mail", "cancel_selected", ids, select_across=True)
    assert Job.objects.filter(status="cancelled", queue="mail").count() == 10_000
    other.refresh_from_db()
    assert other.status == "ready"
    assert len(state_changes(queries)) == 1
    assert len(queries) <= 20


def test_bulk_cancel_explicit_selection(admin_client):
    # Explicitly ticked rows arrive as one POST field each; Django refuses more than
    # DATA_UPLOAD_MAX_NUMBER_FIELDS (1,000) of them, so large selections use "select all".
    ids = make_jobs(900, "ready")
    queries = run_action(admin_client, JOBS, "cancel_selected", ids)
    assert Job.objects.filter(status="cancelled").count() == 900
    assert len(state_changes(queries)) == 1
    assert len(queries) <= 20


def test_bulk_retry_now_select_across_with_filter(admin_client):
    later = store.db_now() + timedelta(hours=1)
    ids = make_jobs(10_000, "ready", attempts=1, run_at=later, queue="mail")
    untouched = make_job("ready", attempts=1, run_at=later, queue="default")
    data_url = JOBS + "?queue=mail"
    queries = run_action(admin_client, data_url, "retry_now_selected", ids, select_across=True)
    assert Job.objects.filter(queue="mail", run_at__lt=later).count() == 10_000
    untouched.refresh_from_db()
    assert untouched.run_at == later
    assert len(state_changes(queries)) == 1
    assert len(queries) <= 20


def test_bulk_actions_hidden_without_permission(viewer_client):
    make_job("dead")
    html = viewer_client.get(JOBS).content.decode()
    assert "replay_selected" not in html and "cancel_selected" not in html


def test_task_filter_shows_full_names_when_two_tasks_share_a_function_name():
    from django_leasequeue.admin import TaskFilter

    task_filter = object.__new__(TaskFilter)  # label() needs no request
    names = ["billing.tasks.sync", "crm.tasks.sync", "crm.tasks.export"]
    assert [task_filter.label(n, names) for n in names] == ["billing.tasks.sync", "crm.tasks.sync", "export"]
