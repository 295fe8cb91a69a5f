"""The job page shows the row's flow-control keys: concurrency, sequence, rate and fair."""

import pytest
from django.urls import reverse
from flowlab.tasks import keyed_rate, seq_step, tenant_job

from tests.admin.conftest import client_for, make_user

pytestmark = pytest.mark.django_db


def test_the_job_page_shows_its_sequence_rate_and_fair_keys():
    client = client_for(make_user("ops", "view_job"))
    pages = {job.id: client.get(reverse("admin:django_leasequeue_job_change", args=[job.id]))
             for job in (seq_step.enqueue(account="a", n=1), keyed_rate.enqueue("c42", 1), tenant_job.enqueue("t7", 1))}
    assert [page.status_code for page in pages.values()] == [200, 200, 200]
    texts = [page.content.decode() for page in pages.values()]
    assert all("Flow control" in text for text in texts)
    assert "acct-a" in texts[0]  # sequence_key
    assert "customer-c42" in texts[1]  # rate_key
    assert ">t7<" in texts[2]  # fair_key


def test_the_job_page_shows_why_an_error_decided_the_jobs_fate():
    from django_leasequeue.models import Job

    job = tenant_job.enqueue("t8", 1)
    Job.objects.filter(pk=job.pk).update(status="dead", attempts=1, errors=[{
        "attempt": 1, "type": "shop.InvoiceGone", "message": "invoice 9 no longer exists", "traceback": "",
        "at": "2026-12-02T05:00:00+00:00", "decision": "discarded",
        "reason": "InvoiceGone matches discard_on (InvoiceGone)"}])
    client = client_for(make_user("ops2", "view_job"))
    text = client.get(reverse("admin:django_leasequeue_job_change", args=[job.id])).content.decode()
    assert "discarded: InvoiceGone matches discard_on (InvoiceGone)" in text
