"""The admin on rows whose ``trace_context`` cannot be read (written by raw SQL: nested 4,000 levels
deep, 5 MB, not an object, a traceparent that is not a string).

Every page that lists jobs answered 500 for every user while one such row was on the page (the
list read ``trace_context`` through JSONField, whose decoder hit ``RecursionError``), and read a
5 MB value per list row. Now every list defers the column (its statement does not name it), the
job's own page shows the value "unreadable: <reason>" with its first bytes, and a good carrier as
JSON."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_leasequeue.models import Job

from .factories import make_job

pytestmark = pytest.mark.django_db

JOBS = reverse("admin:django_leasequeue_job_changelist")
DEAD = reverse("admin:django_leasequeue_deadletter_changelist")
HALTED = reverse("admin:django_leasequeue_haltedsequence_changelist")
PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
BAD = {
    "deep": "'" + '{"a":' * 4000 + "1" + "}" * 4000 + "'",
    "deep_small": "'" + "[" * 2000 + "]" * 2000 + "'",
    "string": f"'\"{PARENT}\"'",
    "array": f"'[\"{PARENT}\"]'",
    "number": "'42'",
    "huge": f"jsonb_build_object('traceparent', '{PARENT}', 'x', repeat('y', 5000000))",
    "wrong_type": "'{\"traceparent\": 7}'",
}


def _bad_dead_job(literal: str, **fields) -> Job:
    job = make_job("dead", **fields)
    with connection.cursor() as cur:
        cur.execute(f"UPDATE leasequeue_job SET trace_context = {literal}::jsonb WHERE id = %s", [job.pk])
    return job


def _job_statements(ctx: CaptureQueriesContext) -> list[str]:
    """The statements that read job rows for the list (their task column), not counts or choices."""
    return [q["sql"] for q in ctx.captured_queries if '"leasequeue_job"."task"' in q["sql"]]


@pytest.mark.parametrize("kind", list(BAD))
def test_every_job_list_answers_200_and_never_reads_trace_context(admin_client, kind):
    job = _bad_dead_job(BAD[kind], sequence_key="seq-1", sequence_halts=True)
    for url in (JOBS, f"{JOBS}?status__exact=dead", f"{JOBS}?q={job.pk}", DEAD, f"{DEAD}?queue=default",
                HALTED):
        with CaptureQueriesContext(connection) as ctx:
            response = admin_client.get(url)
        assert response.status_code == 200, url
        assert f">{job.pk}<" in response.content.decode(), url  # the row is on the page
        reads = _job_statements(ctx)
        assert reads, url
        assert [sql for sql in reads if "trace_context" in sql] == [], url


@pytest.mark.parametrize("kind", list(BAD))
def test_the_job_pages_answer_200_and_say_the_value_is_unreadable(admin_client, kind):
    job = _bad_dead_job(BAD[kind])
    for url in (reverse("admin:django_leasequeue_job_change", args=[job.pk]),
                reverse("admin:django_leasequeue_deadletter_change", args=[job.pk])):
        response = admin_client.get(url)
        assert response.status_code == 200, url
        assert "unreadable: trace_context" in response.content.decode(), url
    for name in ("replay", "cancel", "release", "retry_now", "run_now"):
        assert admin_client.get(reverse(f"admin:django_leasequeue_job_{name}", args=[job.pk])).status_code != 500


def test_the_job_page_shows_a_good_trace_context_and_none_without_one(admin_client):
    traced = make_job("done", trace_context={"traceparent": PARENT})
    page = admin_client.get(reverse("admin:django_leasequeue_job_change", args=[traced.pk])).content.decode()
    assert "Trace context" in page and PARENT in page and "unreadable" not in page
    plain = make_job("done")
    page = admin_client.get(reverse("admin:django_leasequeue_job_change", args=[plain.pk])).content.decode()
    assert "Trace context" not in page
