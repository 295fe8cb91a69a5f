"""The database clock helpers: run_at, lease expiry and schedules move without sleeping."""

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.db import transaction
from invoices.models import Invoice
from invoices.tasks import send_invoice

from django_leasequeue import store
from django_leasequeue.models import Job, Schedule
from django_leasequeue.testing import Clock, advance_clock, drain, tick_schedules
from tests.testing.conftest import PERIOD


def test_advance_moves_the_clock_every_store_statement_reads(db):
    clock = Clock()
    before = store.db_now()

    after = clock.advance(timedelta(hours=2))

    assert timedelta(hours=2) <= after - before < timedelta(hours=2, seconds=5)
    assert clock.offset == pytest.approx(7200)
    assert advance_clock(30) - after >= timedelta(seconds=30)
    assert clock.offset == pytest.approx(7230)
    clock.reset()
    assert clock.offset == 0.0
    assert clock.now() - before < timedelta(seconds=5)


def test_set_and_at(db):
    clock = Clock()
    when = (store.db_now() + timedelta(days=40)).replace(microsecond=0)

    clock.set(when)
    assert timedelta(0) <= clock.now() - when < timedelta(seconds=5)
    with clock.at(when - timedelta(days=400)):
        assert clock.now().year == (when - timedelta(days=400)).year
    assert timedelta(0) <= clock.now() - when < timedelta(seconds=5)
    with pytest.raises(ValueError, match="naive"):
        clock.set(when.replace(tzinfo=None))


def test_the_offset_is_part_of_the_transaction(db):
    clock = Clock()
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        clock.advance(3600)
        raise ZeroDivisionError
    assert clock.offset == 0.0  # rolled back with the savepoint, like the rest of a db test


def test_env_and_connection_options(db):
    clock = Clock()
    clock.advance(90)
    assert clock.env()["LEASEQUEUE_CLOCK_OFFSET"].startswith("90.")
    assert clock.connection_options()["options"].startswith("-c leasequeue.clock_offset=90.")


def test_lease_expiry_with_the_fixture(accounts, leasequeue):
    send_invoice.enqueue(accounts[0].pk, PERIOD)
    store.job_claim(queues=None, limit=1, worker_id="crashed:1:w", lease=30)  # the task's lease is 10 s

    leasequeue.advance_clock(9)
    assert leasequeue.drain().runs == []
    leasequeue.advance_clock(2)
    result = leasequeue.drain()

    assert result.reaped == 1 and result.outcomes == {"done": 1}


def test_nightly_invoice_schedule_fires_when_the_clock_reaches_it(accounts, leasequeue):
    """LEASEQUEUE_SCHEDULES has "nightly-invoice-run" at 02:00 Europe/Berlin (catch_up latest)."""
    berlin = ZoneInfo("Europe/Berlin")
    leasequeue.clock.set(datetime(2031, 3, 10, 12, 0, tzinfo=berlin))  # mid-month, whatever today is
    first = leasequeue.tick_schedules()  # syncs the schedules; nothing nightly is due yet
    nightly = Schedule.objects.get(name="nightly-invoice-run")
    assert nightly.pk not in {sid for sid, _ in first.emitted}
    due = nightly.next_occurrence_at
    assert due == datetime(2031, 3, 11, 2, 0, tzinfo=berlin)

    leasequeue.clock.set(due + timedelta(seconds=1))
    tick = leasequeue.tick_schedules()

    assert (nightly.pk, due) in tick.emitted
    leasequeue.assert_enqueued("invoices.tasks.run_monthly_invoices", count=1)
    leasequeue.drain()
    assert sorted(Invoice.objects.filter(period="2031-03").values_list("account_id", flat=True)) == [
        a.pk for a in accounts]
    # The next night's tick emits the next occurrence; the invoice jobs' unique keys make it a no-op.
    leasequeue.advance_clock(timedelta(days=1))
    leasequeue.tick_schedules()
    leasequeue.drain()
    assert Invoice.objects.count() == 3
    assert Job.objects.filter(task="invoices.tasks.run_monthly_invoices", status="done").count() == 2


def test_tick_schedules_without_sync(db):
    assert tick_schedules(sync=False).emitted == []
    assert drain().runs == []
