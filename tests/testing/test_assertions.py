"""assert_enqueued / assert_not_enqueued / enqueued_jobs on the invoice tasks."""

from unittest.mock import ANY

import pytest
from invoices import framework_tasks
from invoices.tasks import flaky_sync, send_invoice

from django_leasequeue.testing import assert_enqueued, assert_not_enqueued, drain, enqueued_jobs
from tests.testing.conftest import PERIOD


def test_assert_enqueued_matches_task_args_kwargs_queue_and_count(accounts):
    first = send_invoice.enqueue(accounts[0].pk, PERIOD)
    send_invoice.enqueue(accounts[1].pk, PERIOD, work_seconds=0.5)
    flaky_sync.using(queue="invoices").enqueue("partner", failures=0)

    assert assert_enqueued(send_invoice, args=[accounts[0].pk, PERIOD]) == [first]
    assert_enqueued(send_invoice, count=2)
    assert_enqueued("invoices.tasks.send_invoice", args=(accounts[1].pk, PERIOD), kwargs={"work_seconds": 0.5})
    assert_enqueued(send_invoice, args=[ANY, PERIOD], count=2)
    assert_enqueued(flaky_sync, kwargs={"failures": ANY}, queue="invoices", count=1)
    assert_enqueued(count=3)
    assert_not_enqueued(send_invoice, args=[accounts[2].pk, PERIOD])
    assert_not_enqueued(flaky_sync, queue="default")
    assert [j.pk for j in enqueued_jobs(send_invoice, kwargs={})] == [first.pk]


def test_failure_messages_list_the_jobs_that_exist(accounts):
    send_invoice.enqueue(accounts[0].pk, PERIOD)

    with pytest.raises(AssertionError) as missing:
        assert_enqueued(send_invoice, args=[accounts[0].pk, "2026-12"])
    message = str(missing.value)
    assert "expected at least one job of invoices.tasks.send_invoice args=" in message
    assert f"args=[{accounts[0].pk}, '2026-11'] kwargs={{}}" in message and "ready" in message

    with pytest.raises(AssertionError, match="exactly 2 job"):
        assert_enqueued(send_invoice, count=2)
    with pytest.raises(AssertionError, match="expected no job of invoices.tasks.send_invoice, found 1"):
        assert_not_enqueued(send_invoice)


def test_enqueued_means_written_during_the_test_whatever_happened_since(accounts):
    send_invoice.enqueue(accounts[0].pk, PERIOD)
    drain()

    assert_enqueued(send_invoice, count=1)
    assert_enqueued(send_invoice, status="done", count=1)
    assert_not_enqueued(send_invoice, status=["ready", "leased"])


def test_django_tasks_framework_tasks(accounts):
    framework_tasks.send_invoice.enqueue(accounts[0].pk, PERIOD)

    [job] = assert_enqueued(framework_tasks.send_invoice, args=[accounts[0].pk, PERIOD], queue="invoices")
    assert job.task == framework_tasks.send_invoice.module_path


def test_bad_task_argument(db):
    with pytest.raises(TypeError, match="expected a task or a task name"):
        enqueued_jobs(42)
