"""Rows that change between the confirmation page and the confirming POST, a double-submitted
confirmation, and the single buttons (Run now, Release) on a job claimed meanwhile: exact counts
and reasons, one LogEntry per confirmed write, and only rows still eligible are touched."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse

from django_leasequeue import store
from django_leasequeue.models import Job

from .factories import make_job, make_jobs

pytestmark = pytest.mark.django_db

JOBS = reverse("admin:django_leasequeue_job_changelist")


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def statuses(ids: list[int]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for status in Job.objects.filter(pk__in=ids).values_list("status", flat=True):
        counts[status] = counts.get(status, 0) + 1
    return counts


def confirm_form(admin_client, ids: list[int]) -> dict:
    """The confirmation page's form as the browser would post it back."""
    page = admin_client.post(JOBS, {"action": "replay_selected", "_selected_action": ids[:1], "select_across": "1",
                                    "index": "0"})
    assert page.context["preview"].acting == len(ids)
    return {"action": "replay_selected", "_selected_action": ids[:1], "select_across": "1", "index": "0",
            "lq_confirm": "yes", "lq_ids": page.context["ids"]}


def test_rows_replayed_and_claimed_after_the_confirmation_are_skipped_with_exact_reasons(admin_client):
    dead = make_jobs(10, "dead")
    form = confirm_form(admin_client, dead)
    # Someone else replays 3 of them meanwhile, and a worker claims 2 of those.
    store.job_replay(dead[:3], by="someone else")
    assert len(store.job_claim_ids(dead[:2], worker_id="w", lease=30)) == 2
    before = LogEntry.objects.count()
    response = admin_client.post(JOBS, form, follow=True)
    assert statuses(dead) == {"ready": 8, "leased": 2}
    assert Job.objects.get(pk=dead[0]).leased_by == "w"  # the claimed rows are untouched
    text = messages_of(response)
    assert text[0] == "Replayed 7 jobs: they are ready and due now."
    assert text[1].startswith("Not replayed: 2 × job is leased")
    assert "1 × job is ready" in text[1]
    assert LogEntry.objects.count() == before + 1
    entry = LogEntry.objects.latest("pk")
    assert entry.change_message.startswith("Replayed 7 jobs (skipped 3: 2 × job is leased")


def test_a_double_submitted_confirmation_replays_once_and_logs_once(admin_client):
    dead = make_jobs(5, "dead")
    form = confirm_form(admin_client, dead)
    first = admin_client.post(JOBS, form, follow=True)
    assert messages_of(first)[0] == "Replayed 5 jobs: they are ready and due now."
    before = LogEntry.objects.count()
    history = {j.pk: len(j.history) for j in Job.objects.filter(pk__in=dead)}
    second = admin_client.post(JOBS, form, follow=True)
    assert statuses(dead) == {"ready": 5}
    assert messages_of(second) == ["Not replayed: 5 × job is ready; only dead or cancelled jobs are replayed "
                                   f"({', '.join(f'#{i}' for i in dead)})."]
    assert LogEntry.objects.count() == before
    assert {j.pk: len(j.history) for j in Job.objects.filter(pk__in=dead)} == history


def test_run_now_on_a_job_claimed_since_the_page_was_shown_is_refused(admin_client):
    now = store.db_now()
    job = make_job("ready", run_at=now + timedelta(hours=1))
    seen = job.lease_version
    # The job becomes due and a worker claims it before the operator clicks.
    Job.objects.filter(pk=job.pk).update(run_at=now - timedelta(seconds=1))
    assert len(store.job_claim_ids([job.pk], worker_id="w", lease=30)) == 1
    before = LogEntry.objects.count()
    response = admin_client.post(reverse("admin:django_leasequeue_job_run_now", args=[job.pk]),
                                 {"lease_version": str(seen)}, follow=True)
    job.refresh_from_db()
    assert (job.status, job.leased_by, job.lease_version) == ("leased", "w", seen + 1)
    assert messages_of(response)[0].startswith("No job was made due: skipped 1: 1 × ")
    assert LogEntry.objects.count() == before


def test_release_with_the_token_of_a_lease_since_reaped_and_reclaimed_is_refused(admin_client):
    now = store.db_now()
    job = make_job("leased", leased_until=now - timedelta(minutes=1))
    seen = job.lease_version
    # The reaper takes it back and another worker claims it (its lease expires at once, too).
    store.job_release_expired([job.pk], by="reaper")
    assert len(store.job_claim_ids([job.pk], worker_id="w2", lease=30)) == 1
    Job.objects.filter(pk=job.pk).update(leased_until=now - timedelta(seconds=1))
    response = admin_client.post(reverse("admin:django_leasequeue_job_release", args=[job.pk]),
                                 {"lease_version": str(seen)}, follow=True)
    job.refresh_from_db()
    assert (job.status, job.leased_by) == ("leased", "w2")
    assert messages_of(response)[0].startswith("No job was released: skipped 1: 1 × ")


def test_select_all_10000_then_confirm_replays_exactly_the_pinned_set_in_one_log_entry(admin_client):
    dead = make_jobs(10_000, "dead")
    form = confirm_form(admin_client, dead)
    assert len(form["lq_ids"]) < 2_621_440  # within Django's DATA_UPLOAD_MAX_MEMORY_SIZE
    make_jobs(5, "dead")  # dead jobs that arrive after the confirmation are not in its set
    before = LogEntry.objects.count()
    response = admin_client.post(JOBS, form, follow=True)
    assert messages_of(response) == ["Replayed 10,000 jobs: they are ready and due now."]
    assert Job.objects.filter(status="dead").count() == 5
    assert Job.objects.filter(pk__in=dead, status="ready").count() == 10_000
    assert LogEntry.objects.count() == before + 1
