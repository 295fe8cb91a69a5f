"""The invoice example written with Django's own ``@task`` (django.tasks, or the backport on 5.2).

``settings.TASKS`` points the framework at ``django_leasequeue.backends.LeaseQueueBackend``, so these
run on ``manage.py runworker`` with leases, heartbeats, retries with backoff and dead letters. The
queue's options (``max_attempts``, ``backoff``, ``lease``) are given with ``@task_options(...)`` under
``@task``, which every supported Django accepts: Django 6.0's ``@task`` takes no extra keywords (6.1
and the backport also accept ``@task(max_attempts=5, ...)``).
"""

import time

from django.db.models import F

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task

from django_leasequeue.backends import task_options

from .models import Account, FlakyAttempt, Invoice


@task(takes_context=True, queue_name="invoices")
@task_options(max_attempts=5, lease=10)
def send_invoice(context, account_id: int, period: str, work_seconds: float = 0.0) -> dict:
    """Send the invoice of ``account_id`` for ``period`` ("YYYY-MM") exactly once.

    ``context`` is the framework's TaskContext (``context.attempt``, ``context.task_result``) with
    our lease on top: ``context.fenced_atomic()`` commits the invoice row and the job's completion
    together, only while this worker still holds the lease (fencing token ``context.lease_version``).
    """
    if work_seconds:
        time.sleep(work_seconds)  # rendering the PDF, talking to the payment provider...
    account = Account.objects.get(pk=account_id)
    with context.fenced_atomic():
        invoice, created = Invoice.objects.get_or_create(
            account=account, period=period,
            defaults={"amount_cents": 1000 + account_id % 9000, "job_id": context.job_id,
                      "lease_version": context.lease_version},
        )
    return {"invoice": invoice.pk, "created": created, "attempt": context.attempt}


@task
@task_options(max_attempts=4, backoff=0.2)
def flaky_sync(key: str, failures: int = 2) -> str:
    """Fail the first ``failures`` attempts (a partner API that times out), then succeed."""
    row, _ = FlakyAttempt.objects.get_or_create(key=key)
    FlakyAttempt.objects.filter(pk=row.pk).update(tries=F("tries") + 1)
    row.refresh_from_db()
    if row.tries <= failures:
        raise ConnectionError(f"partner API timed out (try {row.tries} of {key})")
    return f"synced {key} after {row.tries} tries"


@task
@task_options(max_attempts=3, backoff=0.1)
def poison(payload: dict) -> None:
    """Always fails: the payload is malformed. Ends in the dead letters, inspectable and replayable."""
    raise ValueError(f"malformed payload: missing 'customer' in {sorted(payload)}")


@task(priority=10)
async def invoice_summary(period: str) -> dict:
    """An async task: count the period's invoices (the worker runs it with the framework's Task.call)."""
    count = await Invoice.objects.filter(period=period).acount()
    return {"period": period, "invoices": count}
