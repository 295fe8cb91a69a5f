"""Tasks of the example app: monthly invoices (idempotent and fenced), a flaky task, a poison task."""

import time

from django.db.models import F

from django_leasequeue import JobContext, task

from .models import Account, FlakyAttempt, Invoice


@task(takes_context=True, max_attempts=5, lease=10)
def send_invoice(context: JobContext, account_id: int, period: str, work_seconds: float = 0.0) -> dict:
    """Send the invoice of ``account_id`` for ``period`` ("YYYY-MM") exactly once.

    Idempotent twice over: the (account, period) unique row makes a re-run a no-op, and
    ``fenced_atomic()`` commits that row together with the job's completion only while this worker
    still holds the lease, so a worker paused past its lease cannot send a second invoice.
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
    return {"invoice": invoice.pk, "created": created}


@task(max_attempts=4, backoff=0.2)
def flaky_sync(key: str, failures: int = 2) -> str:
    """Fail the first ``failures`` attempts (a partner API that times out), then succeed."""
    row, _ = FlakyAttempt.objects.get_or_create(key=key)
    FlakyAttempt.objects.filter(pk=row.pk).update(tries=F("tries") + 1)
    row.refresh_from_db()
    if row.tries <= failures:
        raise ConnectionError(f"partner API timed out (try {row.tries} of {key})")
    return f"synced {key} after {row.tries} tries"


@task(max_attempts=3, backoff=0.1)
def poison(payload: dict) -> None:
    """Always fails: the payload is malformed. Ends in the dead letters, inspectable and replayable."""
    raise ValueError(f"malformed payload: missing 'customer' in {sorted(payload)}")


@task
def noop() -> None:
    """Does nothing: for measuring the queue's own overhead."""
