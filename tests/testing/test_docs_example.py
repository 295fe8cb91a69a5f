"""The worked example of docs/howto/testing.md, verbatim: tests of the invoice handler written with the
pytest plugin's fixtures. Keep the two in step."""

import pytest
from django.db import transaction
from invoices.models import Account, Invoice
from invoices.tasks import run_monthly_invoices, send_invoice

PERIOD = "2026-11"


@pytest.fixture
def account(db):
    return Account.objects.create(name="ACME", email="billing@acme.example")


def test_send_invoice_writes_one_invoice(account, leasequeue):
    send_invoice.enqueue(account.pk, PERIOD)
    leasequeue.assert_enqueued(send_invoice, args=[account.pk, PERIOD], count=1)

    result = leasequeue.drain()

    assert result.outcomes == {"done": 1}
    invoice = Invoice.objects.get(account=account, period=PERIOD)
    assert invoice.lease_version == result.runs[0].token  # written under the fence


def test_a_producer_retrying_does_not_send_twice(account, leasequeue):
    for _ in range(2):  # an at-least-once producer enqueues the same invoice again
        send_invoice.using(unique_key=f"invoice:{account.pk}:{PERIOD}").enqueue(account.pk, PERIOD)

    leasequeue.assert_enqueued(send_invoice, count=1)
    leasequeue.drain()
    assert Invoice.objects.filter(account=account).count() == 1


def test_monthly_run_enqueues_one_job_per_account(account, leasequeue):
    run_monthly_invoices.enqueue(PERIOD)

    leasequeue.drain(max_jobs=1)  # only the monthly run: it enqueues the invoice jobs
    leasequeue.assert_enqueued(send_invoice, args=[account.pk, PERIOD], status="ready", count=1)
    leasequeue.drain()
    leasequeue.assert_not_enqueued(send_invoice, status=["ready", "leased", "dead"])
    assert Invoice.objects.filter(period=PERIOD).count() == 1


def test_a_job_scheduled_for_later_waits_for_the_clock(account, leasequeue):
    from datetime import timedelta

    send_invoice.using(run_at=timedelta(hours=6)).enqueue(account.pk, PERIOD)

    assert leasequeue.drain().runs == []
    leasequeue.advance_clock(timedelta(hours=6, seconds=1))
    assert leasequeue.drain().outcomes == {"done": 1}


def test_the_invoice_is_written_once_when_a_lease_is_lost(account, leasequeue):
    job = send_invoice.enqueue(account.pk, PERIOD)

    lost = leasequeue.simulate_lost_lease(job)

    assert lost.stale.outcome == "lease_lost"  # the stalled worker's fenced commit was refused
    assert lost.takeover.outcome == "done"
    invoice = Invoice.objects.get(account=account)  # exactly one
    assert invoice.lease_version == lost.takeover.token


def test_eager_runs_the_job_when_the_transaction_commits(account, leasequeue):
    with leasequeue.eager():
        with transaction.atomic():
            send_invoice.enqueue(account.pk, PERIOD)
            assert not Invoice.objects.exists()  # not committed yet: no worker could see the job
        assert Invoice.objects.filter(account=account).count() == 1
