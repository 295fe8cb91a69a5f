"""The demo project's schedules: a nightly invoice run (Berlin time) and a per-minute heartbeat."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import testproject.settings as demo
from invoices.models import Account
from invoices.tasks import run_monthly_invoices

from django_leasequeue.models import Job, Schedule
from django_leasequeue.scheduler import sync_schedules

from .conftest import scheduler, z

pytestmark = pytest.mark.django_db


def test_nightly_invoice_run_enqueues_each_invoice_once():
    accounts = [Account.objects.create(name=f"a{i}", email=f"a{i}@example.com") for i in range(3)]
    sync_schedules(demo.LEASEQUEUE_SCHEDULES, now=z(2026, 2, 28, 12))
    nightly = Schedule.objects.get(name="nightly-invoice-run")
    assert nightly.next_occurrence_at == z(2026, 3, 1, 1)  # 02:00 CET on March 1st

    result = scheduler().tick(now=z(2026, 3, 1, 1, 0, 0, 400000))
    assert (nightly.pk, z(2026, 3, 1, 1)) in result.emitted
    run = Job.objects.get(schedule=nightly)
    assert run.task == "invoices.tasks.run_monthly_invoices"

    # The run bills the month of its occurrence in Berlin time (March), even when it runs late.
    for _ in range(2):  # a retry (or the next night's run for the same month) adds nothing
        assert run_monthly_invoices.func(SimpleNamespace(job_id=run.id)) == {"period": "2026-03", "accounts": 3}
    keys = sorted(Job.objects.filter(task="invoices.tasks.send_invoice").values_list("unique_key", flat=True))
    assert keys == sorted(f"invoice:{a.pk}:2026-03" for a in accounts)


def test_heartbeat_schedule_runs_every_minute():
    sync_schedules(demo.LEASEQUEUE_SCHEDULES, now=z(2026, 3, 1, 12, 0, 30))
    heartbeat = Schedule.objects.get(name="heartbeat")
    service = scheduler()
    for minute in (1, 2, 3):
        service.tick(now=z(2026, 3, 1, 12, minute, 0, 200000))
    assert list(Job.objects.filter(schedule=heartbeat).order_by("occurrence_at")
                .values_list("occurrence_at", "priority")) == [(z(2026, 3, 1, 12, m), 50) for m in (1, 2, 3)]
