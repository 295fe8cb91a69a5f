"""No admin page answers 500 on a row with odd values.

Rows written by hand or by an older version (enqueue refuses these values): a 5,000-digit
integer in args, kwargs, result, errors or history; times at the edges of what can be stored;
null-ish JSON. The job and dead-letter change pages and the replay page answer 200 and show the
stored value; the replay form answers a form error on a posted 5,000-digit integer and writes
nothing; the dashboard's queue links are URL-encoded.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.urls import reverse

from django_leasequeue.models import Job

from .factories import make_job

pytestmark = pytest.mark.django_db

BIG = "9" * 5000
JOBS = reverse("admin:django_leasequeue_job_changelist")
DEAD = reverse("admin:django_leasequeue_deadletter_changelist")
DASHBOARD = reverse("admin:django_leasequeue_dashboard_changelist")

ODD = {
    "args_5000_digits": f"args = '[{BIG}, -{BIG}]'",
    "kwargs_5000_digits": f"kwargs = '{{\"n\": {BIG}}}'",
    "result_5000_digits": f"result = '{BIG}'",
    "errors_5000_digits": f"errors = '[{{\"type\": {BIG}, \"message\": null, \"at\": 5}}]'",
    "history_5000_digits": f"history = '[{{\"event\": {BIG}}}, 3, null]'",
    "times_at_the_top": "run_at = '9999-12-30 23:00+00', created_at = '9999-12-30 23:00+00', "
                        "finished_at = '9999-12-30 23:00+00', started_at = '9999-12-30 23:00+00'",
    "times_at_the_bottom": "run_at = '0001-01-02 00:00+00', created_at = '0001-01-02 00:00+00', "
                           "finished_at = '0001-01-02 00:00+00'",
    "null_ish": "errors = '[null, 1, \"x\", {}]', result = 'null', kwargs = '{}', args = '[]', leased_by = '', "
                "history = '[{}]', lease_seconds = NULL, unique_key = '', concurrency_key = ''",
}


def _odd_dead_job(assignment: str) -> Job:
    job = make_job("dead")
    with connection.cursor() as cur:
        cur.execute(f"UPDATE leasequeue_job SET {assignment} WHERE id = %s", [job.pk])
    return job


@pytest.mark.parametrize("kind", list(ODD))
def test_every_page_answers_200_on_a_row_with_odd_values(admin_client, kind):
    job = _odd_dead_job(ODD[kind])
    pages = {
        "job list": JOBS, "job list search": f"{JOBS}?q={job.pk}", "dead letters": DEAD,
        "dead letters of the queue": f"{DEAD}?queue=default", "dashboard": DASHBOARD,
        "job page": reverse("admin:django_leasequeue_job_change", args=[job.pk]),
        "dead letter page": reverse("admin:django_leasequeue_deadletter_change", args=[job.pk]),
        "replay form": reverse("admin:django_leasequeue_job_replay", args=[job.pk]),
    }
    answers = {name: admin_client.get(url).status_code for name, url in pages.items()}
    assert answers == dict.fromkeys(pages, 200)


def test_the_job_page_shows_a_5000_digit_integer_as_stored(admin_client):
    job = _odd_dead_job(ODD["args_5000_digits"])
    page = admin_client.get(reverse("admin:django_leasequeue_job_change", args=[job.pk])).content.decode()
    assert f"  {BIG},\n  -{BIG}\n" in page  # main: the page redirected, "job does not exist"
    replay = admin_client.get(reverse("admin:django_leasequeue_job_replay", args=[job.pk])).content.decode()
    assert f"  {BIG},\n  -{BIG}\n" in replay


def test_the_replay_form_answers_a_form_error_on_a_5000_digit_integer(admin_client):
    job = make_job("dead")
    url = reverse("admin:django_leasequeue_job_replay", args=[job.pk])
    response = admin_client.post(url, {"args": f"[{BIG}]", "kwargs": "{}"})  # main: 500 (ValueError)
    assert response.status_code == 200
    assert "Exceeds the limit (4300 digits)" in response.content.decode()
    assert "pass such a number as a JSON string" in response.content.decode()
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.args, row.history) == ("dead", [], [])  # nothing written
    deep = "[" * 100_000 + "]" * 100_000
    response = admin_client.post(url, {"args": deep, "kwargs": "{}"})
    assert response.status_code == 200 and Job.objects.get(pk=job.pk).status == "dead"


def test_the_dashboards_queue_links_are_url_encoded(admin_client):
    make_job("ready", queue="a&b c#d")  # a name written before queue names had a grammar
    page = admin_client.get(DASHBOARD).content.decode()
    assert "queue=a%26b+c%23d" in page  # main: ?status=ready&amp;queue=a&amp;b c#d
    assert "queue=a&amp;b c#d" not in page


def test_pausing_a_queue_name_outside_the_grammar_is_refused(admin_client):
    from django_leasequeue.models import QueueState

    url = reverse("admin:django_leasequeue_dashboard_pause")
    response = admin_client.post(url, {"queue": "a,b"}, follow=True)  # main: paused a queue --queues cannot name
    assert "contains &#x27;,&#x27;, which a queue name cannot hold" in response.content.decode()
    assert not QueueState.objects.filter(paused=True).exists()
    admin_client.post(url, {"queue": "emails"})
    assert list(QueueState.objects.filter(paused=True).values_list("name", flat=True)) == ["emails"]
