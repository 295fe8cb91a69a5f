"""drain(): runs the test project's jobs in the test's process, through the real claim/executor path,
inside the test's own transaction (pytest-django ``db``) and with real commits (``transactional_db``)."""

from datetime import timedelta

import pytest
from invoices.models import FlakyAttempt, Invoice
from invoices.tasks import flaky_sync, poison, run_monthly_invoices, send_invoice

from django_leasequeue import enqueue, store
from django_leasequeue.models import Job
from django_leasequeue.testing import JobFailed, drain
from tests.testing.conftest import PERIOD


def test_drain_runs_invoice_jobs_in_the_test_transaction(accounts):
    jobs = [send_invoice.enqueue(a.pk, PERIOD) for a in accounts]

    result = drain()

    assert result.outcomes == {"done": 3}
    assert result.job_ids == [j.pk for j in jobs]  # same priority: oldest run_at first
    assert [r.attempt for r in result] == [1, 1, 1]
    assert [r.token for r in result] == [1, 1, 1]
    assert sorted(Invoice.objects.values_list("account_id", flat=True)) == [a.pk for a in accounts]
    assert set(Job.objects.values_list("status", flat=True)) == {"done"}
    # fenced_atomic() committed the invoice with the job's completion, under token 1.
    invoice = Invoice.objects.get(account=accounts[0])
    assert invoice.lease_version == 1 and invoice.job_id == jobs[0].pk
    assert drain().runs == []  # nothing left


def test_drain_respects_run_at_until_the_clock_moves(accounts, leasequeue_clock):
    job = send_invoice.using(run_at=timedelta(hours=1)).enqueue(accounts[0].pk, PERIOD)

    assert drain().runs == []
    leasequeue_clock.advance(3599)
    assert drain().runs == []
    leasequeue_clock.advance(2)
    result = drain()

    assert [(r.job_id, r.outcome) for r in result] == [(job.pk, "done")]
    assert Invoice.objects.count() == 1


def test_include_future_runs_scheduled_jobs_now(accounts):
    send_invoice.using(run_at=timedelta(days=30)).enqueue(accounts[0].pk, PERIOD)

    result = drain(include_future=True)

    assert result.outcomes == {"done": 1}
    assert Invoice.objects.count() == 1


def test_a_failed_attempt_waits_for_its_backoff_and_raises_by_default(db, leasequeue_clock):
    job = flaky_sync.enqueue("partner-1", failures=2)  # backoff=0.2 s base

    with pytest.raises(JobFailed) as failure:
        drain()

    assert "ConnectionError: partner API timed out (try 1 of partner-1)" in str(failure.value)
    assert [r.outcome for r in failure.value.result] == ["ready"]
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.attempts, len(row.errors)) == ("ready", 1, 1)
    assert row.run_at > leasequeue_clock.now()  # the retry is scheduled after the backoff
    # Not due yet: nothing runs; once the clock passes the backoff, the retry runs.
    assert drain().runs == []
    leasequeue_clock.advance(60)
    assert [r.outcome for r in drain(raise_failures=False)] == ["ready"]
    leasequeue_clock.advance(60)
    assert [(r.attempt, r.outcome) for r in drain()] == [(3, "done")]
    assert FlakyAttempt.objects.get(key="partner-1").tries == 3
    assert Job.objects.get(pk=job.pk).result == "synced partner-1 after 3 tries"


def test_include_future_overrides_backoff_until_done(db):
    flaky_sync.enqueue("partner-2", failures=2)

    result = drain(include_future=True, raise_failures=False)

    assert [(r.attempt, r.outcome) for r in result] == [(1, "ready"), (2, "ready"), (3, "done")]
    assert [r.token for r in result] == [1, 2, 3]


def test_poison_ends_in_the_dead_letters(db):
    job = poison.enqueue({"row": 1})  # max_attempts=3

    result = drain(include_future=True, raise_failures=False)

    assert [r.outcome for r in result] == ["ready", "ready", "dead"]
    assert [r.job_id for r in result.failed] == [job.pk] * 3
    row = Job.objects.get(pk=job.pk)
    assert row.status == "dead" and row.attempts == 3
    assert [e["type"] for e in row.errors] == ["builtins.ValueError"] * 3


def test_max_jobs_and_queues(db):
    for i in range(3):
        enqueue(flaky_sync, [f"k{i}", 0])
    enqueue(flaky_sync, ["other", 0], queue="invoices")

    assert [r.queue for r in drain(queues=["default"], max_jobs=2)] == ["default", "default"]
    assert Job.objects.filter(status="ready").count() == 2
    assert [r.queue for r in drain(queues=["invoices"])] == ["invoices"]
    assert [r.queue for r in drain()] == ["default"]


def test_jobs_enqueued_by_a_handler_run_in_the_same_drain(accounts):
    run_monthly_invoices.enqueue(PERIOD)

    result = drain()

    assert [r.task for r in result] == ["invoices.tasks.run_monthly_invoices"] + ["invoices.tasks.send_invoice"] * 3
    assert Invoice.objects.filter(period=PERIOD).count() == 3


def test_an_expired_lease_is_reaped_and_run_again(accounts, leasequeue_clock):
    job = send_invoice.enqueue(accounts[0].pk, PERIOD)
    # A worker claimed it and died (SIGKILL): its lease of 10 s (the task's) runs out.
    [claimed] = store.job_claim(queues=None, limit=1, worker_id="dead-host:1:w", lease=30)
    assert claimed.lease_seconds == 10
    assert drain().runs == []  # still leased
    leasequeue_clock.advance(11)

    result = drain()

    assert result.reaped == 1
    assert [(r.attempt, r.token, r.outcome) for r in result] == [(2, 3, "done")]
    row = Job.objects.get(pk=job.pk)
    assert [e["type"] for e in row.errors] == ["LeaseExpired"]
    assert Invoice.objects.get().lease_version == 3


def test_now_runs_the_drain_at_that_database_time(accounts, leasequeue_clock):
    later = leasequeue_clock.now() + timedelta(days=3)
    job = send_invoice.using(run_at=later).enqueue(accounts[0].pk, PERIOD)

    assert drain(now=later - timedelta(seconds=5)).runs == []
    result = drain(now=later + timedelta(seconds=1))

    assert [r.job_id for r in result] == [job.pk]
    row = Job.objects.get(pk=job.pk)
    assert row.finished_at >= later  # every statement of the drain saw the same clock
    assert abs(leasequeue_clock.offset) < 1e-9  # restored


@pytest.mark.django_db(transaction=True)
def test_drain_with_real_commits(accounts):
    send_invoice.enqueue(accounts[1].pk, PERIOD)

    assert drain().outcomes == {"done": 1}
    assert Invoice.objects.get().account_id == accounts[1].pk


def test_drain_and_eager_do_not_enforce_a_tasks_timeout(db):
    """docs/howto/testing.md says so: the helpers run the handler inline, with no heartbeat to time it
    out, so a handler past its ``timeout`` ends done (a worker would record JobTimedOut)."""
    import time

    from django_leasequeue import task
    from django_leasequeue.testing import eager

    @task(name="tests.testing_helpers.slow_past_timeout", timeout=0.05)
    def slow() -> str:
        time.sleep(0.2)
        return "finished"

    job = slow.enqueue()
    assert drain().outcomes == {"done": 1}
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.result, row.errors) == ("done", "finished", [])
    with eager():
        eager_job = slow.enqueue()
    assert Job.objects.get(pk=eager_job.pk).status == "done"
