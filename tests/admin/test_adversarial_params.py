"""Hand-edited URLs and tampered form fields: a Unicode digit (``"²"``, which ``str.isdigit``
accepts and ``int()`` refuses), a number past bigint or past Python's 4300-digit limit, or a NUL
byte (which PostgreSQL text cannot hold) get a page with no match or an ignored field, never a 500,
and a tampered confirmation pins nothing: no row changes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse

from django_leasequeue import store
from django_leasequeue.models import Job, QueueState

from .factories import make_job, make_jobs

pytestmark = pytest.mark.django_db

JOBS = reverse("admin:django_leasequeue_job_changelist")
DEAD = reverse("admin:django_leasequeue_deadletter_changelist")
WORKFLOWS = reverse("admin:django_leasequeue_workflow_changelist")
HALTED = reverse("admin:django_leasequeue_haltedsequence_changelist")


@pytest.mark.parametrize("url", [
    JOBS + "?q=%C2%B2", JOBS + "?q=%23%C2%B2", DEAD + "?q=%C2%B2", WORKFLOWS + "?q=%C2%B2", HALTED + "?q=%C2%B2",
    JOBS + "?queue=%00", JOBS + "?task=%00", DEAD + "?queue=%00",
    JOBS + "?q=" + "9" * 5000,
])
def test_a_search_or_name_filter_that_matches_nothing_shows_an_empty_list(admin_client, url):
    make_jobs(3, "dead")
    response = admin_client.get(url)
    assert response.status_code == 200
    assert response.context["cl"].result_count == 0


def test_a_nul_in_the_search_box_is_dropped_by_django_and_lists_everything(admin_client):
    make_jobs(3, "dead")
    response = admin_client.get(JOBS + "?q=%00")
    assert response.status_code == 200
    assert response.context["cl"].result_count == 3


def test_a_unicode_digit_in_the_workflow_filter_is_an_incorrect_lookup_not_a_500(admin_client):
    make_jobs(2, "dead")
    response = admin_client.get(JOBS + "?workflow__id__exact=%C2%B2")
    assert response.status_code == 302
    assert response["Location"].endswith("?e=1")


def test_a_unicode_digit_as_refresh_interval_turns_refresh_off(admin_client):
    response = admin_client.get(reverse("admin:django_leasequeue_dashboard_changelist") + "?refresh=%C2%B2")
    assert response.status_code == 200
    assert response.context["live_interval"] == 5  # the default interval


@pytest.mark.parametrize("token", ["\u00b2", "99999999999999999999", "-1", "1" * 5000])
@pytest.mark.parametrize("button", ["run_now", "release"])
def test_a_tampered_fencing_token_is_ignored(admin_client, button, token):
    now = store.db_now()
    if button == "run_now":
        job = make_job("ready", run_at=now + timedelta(hours=1))
    else:
        job = make_job("leased", leased_until=now - timedelta(minutes=5))
    response = admin_client.post(reverse(f"admin:django_leasequeue_job_{button}", args=[job.pk]),
                                 {"lease_version": token})
    assert response.status_code == 302
    # Without a token the button acts as it does without one: the job is made due / released.
    job.refresh_from_db()
    assert job.status == "ready"
    assert job.run_at <= store.db_now()


@pytest.mark.parametrize("pinned", ["99999999999999999999", "\u00b2", "1" * 5000, "x"])
def test_a_tampered_confirmation_pins_nothing(admin_client, pinned):
    dead = make_jobs(2, "dead")
    response = admin_client.post(JOBS, {"action": "replay_selected", "_selected_action": dead, "select_across": "0",
                                        "index": "0", "lq_confirm": "yes", "lq_ids": f"{dead[0]},{pinned}"})
    assert response.status_code == 302
    assert list(Job.objects.filter(pk__in=dead).values_list("status", flat=True)) == ["dead", "dead"]


def test_a_nul_in_a_queue_name_is_no_queue_on_every_queue_url(admin_client):
    dashboard = reverse("admin:django_leasequeue_dashboard_changelist")
    assert admin_client.get(reverse("admin:django_leasequeue_dashboard_pause") + "?queue=a%00").status_code == 404
    assert admin_client.get(reverse("admin:django_leasequeue_queue", args=["a\x00"])).status_code == 404
    for view in ("pause", "resume"):
        response = admin_client.post(reverse(f"admin:django_leasequeue_dashboard_{view}"),
                                     {"queue": "a\x00", "_from": "queue"}, follow=True)
        assert response.redirect_chain == [(dashboard, 302)]
        assert [str(m) for m in response.context["messages"]] == ["No queue given."]
    assert not QueueState.objects.exists()


@pytest.mark.parametrize("object_id", ["abc", "%C2%B2", "1" * 5000, "99999999999999999999"])
def test_schedule_run_now_on_an_id_that_is_no_number_is_a_404(admin_client, object_id):
    response = admin_client.post(f"/admin/django_leasequeue/schedule/{object_id}/run-now/")
    assert response.status_code == 404
    assert not Job.objects.exists()
