"""The schedule admin shows ``when_paused`` and the occurrences a paused queue skipped or coalesced."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from django_leasequeue import store
from django_leasequeue.models import Job, Schedule
from django_leasequeue.scheduler import SchedulerService

pytestmark = pytest.mark.django_db

NOOP = "invoices.tasks.noop"
SCHEDULES = reverse("admin:django_leasequeue_schedule_changelist")
ADD = reverse("admin:django_leasequeue_schedule_add")
START = datetime(2026, 7, 1, 9, 0, tzinfo=UTC)
MIN = timedelta(minutes=1)


@pytest.fixture(autouse=True)
def _no_settings_schedules(settings):
    settings.LEASEQUEUE_SCHEDULES = {}


def change_url(schedule: Schedule) -> str:
    return reverse("admin:django_leasequeue_schedule_change", args=[schedule.pk])


def form_data(**overrides) -> dict:
    data = {"name": "s", "task": NOOP, "cron": "* * * * *", "timezone": "UTC", "args": "[]", "kwargs": "{}",
            "queue": "reports", "priority": "0", "enabled": "on", "catch_up": "latest", "catch_up_limit": "10",
            "when_paused": "skip"}
    data.update(overrides)
    return data


def paused_ticks(schedule: Schedule, minutes: int) -> None:
    store.queue_pause(schedule.queue)
    service = SchedulerService(sync=False, process_id="test:scheduler")
    for m in range(1, minutes + 1):
        assert service.tick(now=START + m * MIN + timedelta(seconds=5)).errors == {}


def test_change_page_shows_the_policy_field_with_its_choices(admin_client):
    s = Schedule.objects.create(name="s", task=NOOP, cron="* * * * *", when_paused="skip")
    response = admin_client.get(change_url(s))
    form = response.context["adminform"].form
    assert form["when_paused"].value() == "skip"
    assert [value for value, _ in form.fields["when_paused"].choices if value] == ["latest", "skip", "all"]
    html = response.content.decode()
    assert 'name="when_paused"' in html and '<option value="skip" selected>' in html
    assert "While the queue is paused" in html


def test_add_and_change_the_policy_through_the_form(admin_client):
    assert admin_client.post(ADD, form_data()).status_code == 302
    s = Schedule.objects.get(name="s")
    assert s.when_paused == "skip"
    assert admin_client.post(change_url(s), form_data(when_paused="all")).status_code == 302
    s.refresh_from_db()
    assert s.when_paused == "all"
    # A post without the field (a script older than it) keeps the stored policy.
    data = form_data()
    del data["when_paused"]
    assert admin_client.post(change_url(s), data).status_code == 302
    s.refresh_from_db()
    assert s.when_paused == "all"
    data["name"] = "new"
    assert admin_client.post(ADD, data).status_code == 302
    assert Schedule.objects.get(name="new").when_paused == "latest"


def test_a_bad_policy_is_refused_on_its_field(admin_client):
    response = admin_client.post(ADD, form_data(when_paused="sometimes"))
    assert response.status_code == 200
    assert "sometimes" in " ".join(response.context["adminform"].form.errors["when_paused"])
    assert not Schedule.objects.exists()


def test_list_and_page_show_the_skipped_and_coalesced_occurrences(admin_client):
    latest = Schedule.objects.create(name="latest-one", task=NOOP, cron="* * * * *", queue="reports",
                                     last_occurrence_at=START)
    skip = Schedule.objects.create(name="skip-one", task=NOOP, cron="* * * * *", queue="reports",
                                   last_occurrence_at=START, when_paused="skip")
    paused_ticks(latest, 3)
    listing = admin_client.get(SCHEDULES)
    rows = {s.name: s for s in listing.context["cl"].result_list}
    admin = listing.context["cl"].model_admin
    assert admin.paused_record(rows["latest-one"]) == "0 / 2"
    assert admin.paused_record(rows["skip-one"]) == "3 / 0"
    html = listing.content.decode()
    assert "while paused: skipped / coalesced" in html.lower() and "0 / 2" in html and "3 / 0" in html

    cancelled = list(Job.objects.filter(schedule=latest, status="cancelled").order_by("occurrence_at"))
    assert len(cancelled) == 2
    page = admin_client.get(change_url(latest)).content.decode()
    assert "recent skipped or coalesced occurrences" in page.lower()
    for job in cancelled:
        assert f'href="{reverse("admin:django_leasequeue_job_change", args=[job.pk])}">#{job.pk}</a>' in page
        assert job.occurrence_at.isoformat() in page
    assert page.count("<td>coalesced</td>") == 2
    page = admin_client.get(change_url(skip)).content.decode()
    assert page.count("<td>skipped</td>") == 3
    for m in (1, 2, 3):
        assert (START + m * MIN).isoformat() in page
