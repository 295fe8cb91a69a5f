"""Tasks of the example app: monthly invoices (idempotent and fenced), the nightly invoice run and a
heartbeat (both scheduled in settings.LEASEQUEUE_SCHEDULES), a flaky task, a poison task."""

import time
from zoneinfo import ZoneInfo

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from django_leasequeue import JobContext, task
from django_leasequeue.models import Job

from .models import Account, FlakyAttempt, Invoice

BILLING_ZONE = ZoneInfo("Europe/Berlin")


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


@task(takes_context=True, max_attempts=3)
def run_monthly_invoices(context: JobContext, period: str | None = None) -> dict:
    """Enqueue ``send_invoice`` for every account for ``period`` ("YYYY-MM").

    Scheduled nightly. The period defaults to the month of the schedule's occurrence (Berlin time),
    read from this job's own row, so a run caught up after midnight on the 1st still bills the
    month it was due for. Each invoice job has the unique key ``invoice:<account>:<period>``: the
    first night of a month enqueues them, the other nights (and a retry of this job) add nothing.
    """
    if period is None:
        occurrence = Job.objects.filter(pk=context.job_id).values_list("occurrence_at", flat=True).first()
        period = (occurrence or timezone.now()).astimezone(BILLING_ZONE).strftime("%Y-%m")
    account_ids = list(Account.objects.order_by("pk").values_list("pk", flat=True))
    with transaction.atomic():  # every invoice job of the run, or none
        for account_id in account_ids:
            send_invoice.using(unique_key=f"invoice:{account_id}:{period}").enqueue(account_id, period)
    return {"period": period, "accounts": len(account_ids)}


@task(max_attempts=1)
def heartbeat() -> str:
    """Scheduled every minute: proves the scheduler, the queue and a worker are all alive."""
    return timezone.now().isoformat()
