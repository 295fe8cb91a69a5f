"""Confirmed bulk actions (bugs 5 and 6): the confirmation page counts exactly what will be
acted on and skipped (by reason) and writes nothing; the confirming POST acts on the pinned set in
a constant number of statements, says exactly how many were done and skipped per reason, and writes
one summary LogEntry. Single actions from a job's page write one LogEntry each."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.urls import reverse

from django_leasequeue import store
from django_leasequeue.models import Dependency, Job

from .factories import ERROR, make_job, make_jobs

pytestmark = pytest.mark.django_db

JOBS = reverse("admin:django_leasequeue_job_changelist")
DEAD = reverse("admin:django_leasequeue_deadletter_changelist")
READY_REASON = "job is ready; only dead or cancelled jobs are replayed"
KEY_REASON = "its unique key is held by another ready or leased job"


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def action(name: str, ids: list[int], *, select_across: bool = False, **extra: str) -> dict:
    return {"action": name, "_selected_action": ids[:1] if select_across else ids,
            "select_across": "1" if select_across else "0", "index": "0", **extra}


def statuses(ids: list[int]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for status in Job.objects.filter(pk__in=ids).values_list("status", flat=True):
        counts[status] = counts.get(status, 0) + 1
    return counts


@pytest.fixture
def mixed():
    """12 dead jobs, 3 ready ones and a dead one whose active unique key a ready job holds."""
    dead = make_jobs(12, "dead")
    ready = make_jobs(3, "ready")
    holder = make_job("ready", unique_key="inv-7", unique_scope="active")
    blocked = make_job("dead", unique_key="inv-7", unique_scope="active")
    return {"dead": dead, "ready": ready, "holder": holder.id, "blocked": blocked.id,
            "all": dead + ready + [holder.id, blocked.id]}


def test_the_first_post_shows_the_confirmation_with_exact_counts_and_writes_nothing(admin_client, mixed):
    response = admin_client.post(JOBS, action("replay_selected", mixed["all"], select_across=True))
    assert response.status_code == 200
    assert response.templates[0].name == "admin/django_leasequeue/job/bulk_confirm.html"
    preview = response.context["preview"]
    assert response.context["selected"] == 17
    assert preview.acting == 12
    assert preview.skipped == {READY_REASON: 4, KEY_REASON: 1}
    assert len(preview.sample) == 10
    assert [r.id for r in preview.sample] == sorted(mixed["all"], reverse=True)[:10]
    blocked_row = next(r for r in preview.sample if r.id == mixed["blocked"])
    assert (blocked_row.skip_reason, blocked_row.error_type) == (KEY_REASON, "ValueError")
    html = response.content.decode()
    assert 'id="lq-acting">12<' in html and 'id="lq-skipped">5<' in html and "Yes, replay 12 jobs" in html
    # Nothing written, no log entry.
    assert statuses(mixed["all"]) == {"dead": 13, "ready": 4}
    assert LogEntry.objects.count() == 0


def test_confirming_replays_the_pinned_set_and_reports_exact_counts(admin_client, mixed):
    page = admin_client.post(JOBS, action("replay_selected", mixed["all"], select_across=True))
    pinned = page.context["ids"]
    late = make_job("dead")  # arrives after the page was shown: not part of what was confirmed
    response = admin_client.post(JOBS, action("replay_selected", mixed["all"][:1], lq_confirm="yes",
                                              lq_ids=pinned), follow=True)
    assert messages_of(response)[0] == "Replayed 12 jobs: they are ready and due now."
    warning = messages_of(response)[1]
    assert warning.startswith(f"Not replayed: 4 × {READY_REASON} (#") and f"; 1 × {KEY_REASON} (#{mixed['blocked']})" \
        in warning
    assert "other reasons" not in warning
    assert statuses(mixed["dead"]) == {"ready": 12}
    assert Job.objects.get(pk=late.id).status == "dead"
    (entry,) = LogEntry.objects.all()
    assert (entry.object_id, entry.action_flag) == (str(min(mixed["dead"])), CHANGE)
    assert entry.change_message == f"Replayed 12 jobs (skipped 5: 4 × {READY_REASON}; 1 × {KEY_REASON})"


def test_many_unique_key_refusals_are_one_reason_with_its_count(admin_client):
    # Bug 5: 45 distinct keys made "... and 45 other reasons" without numbers.
    for n in range(45):
        make_job("ready", unique_key=f"k{n}", unique_scope="active")
        make_job("dead", unique_key=f"k{n}", unique_scope="active")
    dead = list(Job.objects.filter(status="dead").values_list("pk", flat=True))
    response = admin_client.post(DEAD, action("replay_selected", dead, select_across=True, lq_confirm="yes"),
                                 follow=True)
    (message,) = messages_of(response)
    assert message.startswith(f"Not replayed: 45 × {KEY_REASON} (#") and message.count("×") == 1


def test_cancel_reports_every_skipped_reason_exactly(admin_client, db_clock):
    now = store.db_now()
    ready = make_jobs(4, "ready")
    leased = make_job("leased")
    asked = make_job("leased", cancel_requested=True)
    done = make_jobs(2, "done")
    ids = ready + [leased.id, asked.id] + done
    page = admin_client.post(JOBS, action("cancel_selected", ids))
    assert (page.context["preview"].acting, page.context["preview"].skipped) == \
        (5, {"already done": 2, "already asked to stop": 1})
    response = admin_client.post(JOBS, action("cancel_selected", ids, lq_confirm="yes",
                                              lq_ids=page.context["ids"]), follow=True)
    assert messages_of(response) == [
        "Cancelled 4 ready jobs; asked 1 running job to stop (its worker's completion will be refused and the job "
        "ends cancelled).",
        "3 jobs were left alone: 2 already done; 1 already asked to stop."]
    (entry,) = LogEntry.objects.all()
    assert entry.change_message.endswith("(skipped 3: 2 × already done; 1 × already asked to stop)")
    assert now  # the statement judged by the database clock


def test_delete_takes_only_finished_jobs_nothing_still_read(admin_client):
    done = make_jobs(3, "done")
    dead = make_job("dead")
    ready = make_job("ready")
    needed = make_job("done", has_dependents=True)
    waiting = make_job("waiting", waiting_on=1)
    Dependency.objects.create(job_id=waiting.id, depends_on_id=needed.id, name=str(needed.id))
    ids = done + [dead.id, ready.id, needed.id]
    page = admin_client.post(JOBS, action("delete_finished_selected", ids))
    assert page.context["preview"].acting == 4
    assert page.context["preview"].skipped == {"job is ready; only finished jobs are deleted": 1,
                                               "still read by its workflow or a dependent job": 1}
    assert Job.objects.filter(pk__in=ids).count() == 6
    response = admin_client.post(JOBS, action("delete_finished_selected", ids, lq_confirm="yes",
                                              lq_ids=page.context["ids"]), follow=True)
    assert messages_of(response) == [
        "Deleted 4 jobs; skipped 2: 1 × job is ready; only finished jobs are deleted; "
        "1 × still read by its workflow or a dependent job."]
    assert sorted(Job.objects.filter(pk__in=ids).values_list("pk", flat=True)) == sorted([ready.id, needed.id])
    (entry,) = LogEntry.objects.all()
    assert (entry.object_id, entry.action_flag) == (str(min(ids)), DELETION)


def test_delete_needs_the_delete_permission(operator_client):
    job = make_job("done")
    html = operator_client.get(JOBS).content.decode()
    assert "delete_finished_selected" not in html
    operator_client.post(JOBS, action("delete_finished_selected", [job.id], lq_confirm="yes"))
    assert Job.objects.filter(pk=job.id).exists()


# ---- constant statements, whatever the row count ------------------------------------------------


def _warm(admin_client) -> None:
    ContentType.objects.get_for_model(Job)  # the LogEntry's content type is cached after the first use
    admin_client.get(DEAD)


@pytest.mark.parametrize("rows", [3, 1000])
def test_confirmed_replay_costs_the_same_statements_for_3_and_1000_rows(admin_client, django_assert_num_queries,
                                                                        rows):
    ids = make_jobs(rows, "dead")
    _warm(admin_client)
    # session, user, the filter choices (queues and tasks of dead jobs) and the page's count, clock
    # and rows twice (Django builds the changelist twice on an action POST), the ids, the replay
    # (savepoint, statement, release), the LogEntry (its job, the insert).
    with django_assert_num_queries(15):
        response = admin_client.post(DEAD, action("replay_selected", ids, select_across=True, lq_confirm="yes"))
    assert response.status_code == 302
    assert statuses(ids) == {"ready": rows}


@pytest.mark.parametrize("rows", [3, 1000])
def test_confirmation_page_costs_the_same_statements_for_3_and_1000_rows(admin_client, django_assert_num_queries,
                                                                         rows):
    ids = make_jobs(rows, "dead")
    _warm(admin_client)
    with django_assert_num_queries(11):  # as above, then the ids and the preview instead of the write
        response = admin_client.post(DEAD, action("replay_selected", ids, select_across=True))
    assert response.context["preview"].acting == rows


@pytest.mark.parametrize("rows", [3, 1000])
def test_confirmed_cancel_and_delete_cost_the_same_statements(admin_client, django_assert_num_queries, rows):
    ready = make_jobs(rows, "ready", queue="mail")
    _warm(admin_client)
    with django_assert_num_queries(13):
        admin_client.post(JOBS + "?queue=mail", action("cancel_selected", ready, select_across=True,
                                                       lq_confirm="yes"))
    assert statuses(ready) == {"cancelled": rows}
    with django_assert_num_queries(13):
        admin_client.post(JOBS + "?queue=mail", action("delete_finished_selected", ready, select_across=True,
                                                       lq_confirm="yes"))
    assert statuses(ready) == {}


# ---- from an error group ------------------------------------------------------------------------


def test_an_error_group_links_to_exactly_its_jobs_and_to_its_confirmed_replay(admin_client):
    value_errors = make_jobs(4, "dead", task="invoices.tasks.poison")
    key_errors = make_jobs(2, "dead", task="invoices.tasks.poison",
                           errors=[dict(ERROR, type="builtins.KeyError", message="'customer'")])
    other_task = make_jobs(3, "dead", task="orders.tasks.sync")
    response = admin_client.get(DEAD)
    groups = {(g["task"], g["error_type"]): g for g in response.context["lq_groups"]}
    assert {k: g["n"] for k, g in groups.items()} == {
        ("invoices.tasks.poison", "ValueError"): 4, ("invoices.tasks.poison", "KeyError"): 2,
        ("orders.tasks.sync", "ValueError"): 3}
    group = groups[("invoices.tasks.poison", "KeyError")]
    listed = admin_client.get(f"{DEAD}?{group['query']}").context["cl"].result_list
    assert sorted(j.id for j in listed) == key_errors
    confirm_url = reverse("admin:django_leasequeue_deadletter_bulk", args=["replay"]) + "?" + group["query"]
    assert confirm_url in response.content.decode().replace("&amp;", "&")
    page = admin_client.get(confirm_url)
    assert page.status_code == 200, page.content[:300]
    assert page.context["preview"].acting == 2 and page.context["preview"].skipped == {}
    assert statuses(key_errors) == {"dead": 2}
    form_url = page.context["post_url"]
    response = admin_client.post(form_url, action("replay_selected", key_errors[:1], lq_confirm="yes",
                                                  lq_ids=page.context["ids"]), follow=True)
    assert messages_of(response) == ["Replayed 2 jobs: they are ready and due now."]
    assert statuses(key_errors) == {"ready": 2}
    assert statuses(value_errors + other_task) == {"dead": 7}


def test_the_bulk_url_needs_the_action_permission(operator_client):
    make_job("dead")
    assert operator_client.get(reverse("admin:django_leasequeue_deadletter_bulk", args=["replay"])).status_code == 403
    assert operator_client.get(reverse("admin:django_leasequeue_job_bulk", args=["nope"])).status_code == 404


# ---- single actions: one LogEntry per job -------------------------------------------------------


def entries_of(job_id: int) -> list[str]:
    return list(LogEntry.objects.filter(object_id=str(job_id)).order_by("id").values_list("change_message", flat=True))


def test_each_single_action_writes_one_log_entry_on_its_job(admin_client, db_clock):
    now = store.db_now()
    dead = make_job("dead")
    ready = make_job("ready")
    retry = make_job("ready", attempts=1, run_at=now + timedelta(hours=1), errors=[ERROR])
    expired = make_job("leased", leased_until=now - timedelta(seconds=40))
    admin_client.post(reverse("admin:django_leasequeue_job_replay", args=[dead.id]))
    admin_client.post(reverse("admin:django_leasequeue_job_cancel", args=[ready.id]))
    admin_client.post(reverse("admin:django_leasequeue_job_retry_now", args=[retry.id]))
    admin_client.post(reverse("admin:django_leasequeue_job_release", args=[expired.id]))
    assert entries_of(dead.id) == ["Replayed 1 job"]
    assert entries_of(ready.id) == ["Cancelled 1 ready job"]
    assert entries_of(retry.id) == ["Retry now: 1 job made due"]
    assert entries_of(expired.id) == ["Released 1 job"]
    history = admin_client.get(reverse("admin:django_leasequeue_job_history", args=[dead.id])).content.decode()
    assert "Replayed 1 job" in history
    recent = admin_client.get(reverse("admin:index")).content.decode()  # "Recent actions" names each job
    assert all(str(Job.objects.get(pk=j.id)) in recent for j in (dead, ready, retry, expired))


def test_a_refused_single_action_writes_no_log_entry(admin_client):
    ready = make_job("ready")
    admin_client.post(reverse("admin:django_leasequeue_job_replay", args=[ready.id]))
    assert entries_of(ready.id) == []


def test_an_error_groups_links_keep_the_lists_filters(admin_client):
    # A group counted under a filter (a queue here) must link to, and replay, exactly the jobs it
    # counts, not every dead job of its task and error type.
    for queue in ("mail", "mail", "other"):
        make_job("dead", queue=queue)
    response = admin_client.get(DEAD, {"queue": "mail"})
    [group] = response.context["lq_groups"]
    assert group["n"] == 2 and "queue=mail" in group["query"]
    assert admin_client.get(f"{DEAD}?{group['query']}").context["cl"].result_count == 2
    bulk = reverse("admin:django_leasequeue_deadletter_bulk", args=["replay"])
    confirm = admin_client.get(f"{bulk}?{group['query']}")
    assert confirm.context["preview"].acting == 2
