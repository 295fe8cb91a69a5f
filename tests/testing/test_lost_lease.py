"""simulate_lost_lease(): a stale worker and the worker that took its lease over run the same job;
only the takeover's fenced writes may commit."""

from datetime import timedelta

import pytest
from django.db import transaction
from invoices.models import Invoice
from invoices.tasks import send_invoice
from qa.models import Effect, Execution, Probe

from django_leasequeue import JobContext, enqueue, task
from django_leasequeue.testing import simulate_lost_lease
from tests.testing.conftest import PERIOD


@task(name="tests.fence_inside_own_transaction", takes_context=True)
def fence_inside_own_transaction(context: JobContext) -> None:
    with transaction.atomic(), context.fenced_atomic():
        Effect.objects.create(key="nested", job_id=context.job_id, lease_version=context.lease_version)


def test_the_invoice_is_written_once_by_the_worker_that_holds_the_lease(accounts):
    job = send_invoice.enqueue(accounts[0].pk, PERIOD)

    lost = simulate_lost_lease(job)

    # Worker A stalled on entering fenced_atomic(); the reaper took the job back (token 2) and
    # worker B claimed it (token 3) and sent the invoice. A's fenced commit was then refused.
    assert lost.interrupted_at == "fenced_atomic"
    assert (lost.stale.outcome, lost.takeover.outcome) == ("lease_lost", "done")
    assert lost.tokens == (1, 3)
    assert (lost.stale.attempt, lost.takeover.attempt) == (1, 2)
    invoice = Invoice.objects.get(account=accounts[0], period=PERIOD)  # exactly one
    assert (invoice.job_id, invoice.lease_version) == (job.pk, 3)
    assert lost.job.status == "done" and lost.job.lease_version == 3
    assert [e["type"] for e in lost.job.errors] == ["LeaseExpired"]  # A's attempt, as the reaper saw it
    notes = [h for h in lost.job.history if h.get("event") == "lease_lost"]
    assert [(n["token"], n["write"]) for n in notes] == [(1, "handler")]
    assert lost.stale.worker != lost.takeover.worker


def test_stale_worker_that_wakes_after_the_job_is_done(accounts):
    job = send_invoice.enqueue(accounts[0].pk, PERIOD)

    lost = simulate_lost_lease(job, at="start")

    assert lost.interrupted_at == "start"
    assert (lost.stale.outcome, lost.takeover.outcome) == ("lease_lost", "done")
    assert Invoice.objects.get().lease_version == lost.takeover.token == 3


def test_unfenced_writes_happen_twice(db):
    """qa.record writes its Execution row outside any fence and completes by returning: the stale
    worker stalls when it returns its result, its completion is refused, but its row stays. This is
    what the helper is for: it shows which writes a handler must make idempotent."""
    job = enqueue("qa.record", ["tag"])

    lost = simulate_lost_lease(job)

    assert lost.interrupted_at == "complete"
    assert (lost.stale.outcome, lost.takeover.outcome) == ("lease_lost", "done")
    assert sorted(Execution.objects.values_list("lease_version", flat=True)) == [1, 3]
    assert lost.job.result == "tag"


def test_heartbeat_and_fence_both_refused(db):
    job = enqueue("qa.fenced_effect", ["k"])  # heartbeat, then an Effect in fenced_atomic()

    lost = simulate_lost_lease(job)

    assert lost.interrupted_at == "heartbeat"
    assert lost.stale.outcome == "lease_lost"
    assert list(Effect.objects.values_list("lease_version", flat=True)) == [3]
    probes = sorted(Probe.objects.values_list("lease_version", "kind", "ok"))
    assert probes == [(1, "fenced", False), (1, "heartbeat", False), (3, "fenced", True), (3, "heartbeat", True)]


def test_a_handler_that_fails_before_any_fenced_write(db):
    job = enqueue("qa.poison", [])
    with pytest.raises(AssertionError, match="before any fenced write, so the lease was never lost"):
        simulate_lost_lease(job)

    job = enqueue("qa.poison", [])
    lost = simulate_lost_lease(job, at="start")  # the takeover fails on its own; A's failure is refused
    assert (lost.stale.outcome, lost.takeover.outcome) == ("lease_lost", "ready")
    assert [e["type"] for e in lost.job.errors] == ["LeaseExpired", "builtins.ValueError"]


def test_a_fence_inside_the_handlers_own_transaction_needs_at_start(db):
    job = fence_inside_own_transaction.enqueue()
    with pytest.raises(RuntimeError, match="inside a transaction of its own"):
        simulate_lost_lease(job)

    # fenced_atomic() is durable: inside the handler's own atomic() block it refuses to run (its
    # commit would only release a savepoint), so neither run writes and the attempt fails loudly.
    job = fence_inside_own_transaction.enqueue()
    lost = simulate_lost_lease(job, at="start")
    assert lost.takeover.outcome in ("ready", "dead")
    assert "RuntimeError" in lost.job.errors[-1]["type"]
    assert not Effect.objects.filter(job_id=job.pk).exists()


def test_the_job_must_be_claimable(accounts):
    job = send_invoice.using(run_at=timedelta(hours=1)).enqueue(accounts[0].pk, PERIOD)
    with pytest.raises(ValueError, match=f"job {job.pk} cannot be claimed now: it is ready, run_at"):
        simulate_lost_lease(job)
    with pytest.raises(ValueError, match="at must be"):
        simulate_lost_lease(job, at="later")
