"""eager(): each job enqueued inside the block runs when the enqueuing transaction commits."""

from datetime import timedelta

import pytest
from django.db import transaction
from invoices.models import Invoice
from invoices.tasks import flaky_sync, poison, run_monthly_invoices, send_invoice

from django_leasequeue import enqueue_many
from django_leasequeue.models import Job
from django_leasequeue.testing import JobFailed, eager
from tests.testing.conftest import PERIOD


def test_outside_a_transaction_the_job_runs_before_enqueue_returns(accounts):
    with eager() as result:
        job = send_invoice.enqueue(accounts[0].pk, PERIOD)
        assert Invoice.objects.filter(account=accounts[0]).count() == 1
        assert job.status == "ready"  # the object enqueue() returned was read before the run
        job.refresh_from_db()
        assert job.status == "done"

    assert [(r.job_id, r.outcome, r.attempt) for r in result] == [(job.pk, "done", 1)]


def test_inside_atomic_the_job_runs_when_the_block_commits(accounts):
    with eager() as result:
        with transaction.atomic():
            send_invoice.enqueue(accounts[0].pk, PERIOD)
            with transaction.atomic():
                send_invoice.enqueue(accounts[1].pk, PERIOD)
            # An inner block's end is not a commit: nothing ran yet.
            assert Invoice.objects.count() == 0
            assert result.runs == []
        assert Invoice.objects.count() == 2
    assert result.outcomes == {"done": 2}


def test_a_rolled_back_enqueue_never_runs(accounts):
    with eager() as result:
        with pytest.raises(ZeroDivisionError):
            with transaction.atomic():
                send_invoice.enqueue(accounts[0].pk, PERIOD)
                raise ZeroDivisionError
        with transaction.atomic():
            with pytest.raises(ZeroDivisionError), transaction.atomic():
                send_invoice.enqueue(accounts[1].pk, PERIOD)  # rolled back with its savepoint
                raise ZeroDivisionError
            send_invoice.enqueue(accounts[2].pk, PERIOD)
    assert [r.outcome for r in result] == ["done"]
    assert list(Invoice.objects.values_list("account_id", flat=True)) == [accounts[2].pk]
    assert Job.objects.count() == 1


def test_jobs_enqueued_by_a_handler_run_after_it(accounts):
    with eager() as result:
        run_monthly_invoices.enqueue(PERIOD)  # enqueues send_invoice per account in an atomic block

    assert [r.task.rsplit(".", 1)[1] for r in result] == ["run_monthly_invoices"] + ["send_invoice"] * 3
    assert Invoice.objects.count() == 3


def test_bulk_enqueue_and_scheduled_jobs(accounts):
    with eager() as result:
        enqueue_many(send_invoice, [[a.pk, PERIOD] for a in accounts[:2]])
        later = send_invoice.using(run_at=timedelta(hours=1)).enqueue(accounts[2].pk, PERIOD)

    assert result.outcomes == {"done": 2}
    assert result.not_due == [later.pk]  # left ready for drain() or a worker
    assert Job.objects.get(pk=later.pk).status == "ready"


def test_a_failed_attempt_fails_the_block_with_its_traceback(db):
    with pytest.raises(JobFailed, match="malformed payload: missing 'customer'") as failure:
        with eager():
            poison.enqueue({"row": 1})
    assert "tasks.py" in str(failure.value)  # the recorded traceback is in the message
    # Recorded as a worker would: a failed attempt, retried after its backoff (not by eager).
    assert [r.outcome for r in failure.value.result] == ["ready"]


def test_failures_can_be_inspected_instead(db):
    with eager(raise_failures=False) as result:
        flaky_sync.enqueue("p", failures=1)
    assert [(r.attempt, r.outcome) for r in result.failed] == [(1, "ready")]


def test_the_block_stops_running_jobs_when_it_ends(accounts):
    with eager():
        pass
    send_invoice.enqueue(accounts[0].pk, PERIOD)
    assert Invoice.objects.count() == 0


def test_fixture_runs_jobs_for_the_whole_test(accounts, leasequeue_eager):
    send_invoice.enqueue(accounts[0].pk, PERIOD)
    assert Invoice.objects.count() == 1
    assert leasequeue_eager.outcomes == {"done": 1}


@pytest.mark.django_db(transaction=True)
def test_with_real_commits(accounts):
    with eager() as result:
        with transaction.atomic():
            send_invoice.enqueue(accounts[0].pk, PERIOD)
            assert result.runs == []
        assert Invoice.objects.count() == 1
    assert result.outcomes == {"done": 1}
