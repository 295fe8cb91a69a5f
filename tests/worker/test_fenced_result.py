"""A handler that completes through fenced_atomic() still gets its return value stored."""

import pytest
from invoices.models import Account, Invoice
from invoices.tasks import send_invoice

from django_leasequeue import store
from django_leasequeue.conf import get_settings
from django_leasequeue.context import JobContext
from django_leasequeue.executor import Executor

pytestmark = pytest.mark.django_db


def test_return_value_is_stored_after_fenced_atomic():
    account = Account.objects.create(name="a", email="a@example.com")
    job = send_invoice.enqueue(account.pk, "2026-11")
    (claimed,) = store.job_claim(queues=["default"], limit=1, worker_id="t", lease=30)
    ctx = JobContext(job_id=claimed.id, task=claimed.task, queue=claimed.queue, attempt=claimed.attempts,
                     max_attempts=claimed.max_attempts, lease_version=claimed.lease_version, worker_id="t",
                     leased_until=claimed.leased_until, lease_seconds=30)
    completions = []
    executor = Executor(worker_id="t", settings=get_settings(), alias="default",
                        complete=lambda c, r: completions.append((c, r)))
    assert executor.run(claimed, ctx) == "done"
    assert completions == []  # completed inside the fenced transaction, not through the completer
    job.refresh_from_db()
    invoice = Invoice.objects.get()
    assert (job.status, job.result) == ("done", {"invoice": invoice.pk, "created": True})
