"""The tasks framework's behaviour contract, through its public API only (``@task``, ``enqueue``,
``get_result``, ``TaskResult``, the signals), with LeaseQueueBackend and a real worker.

Runs against ``django.tasks`` (Django >= 6.0) and the ``django_tasks`` backport (Django 5.2) alike.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from asgiref.sync import sync_to_async
from django.db import connections, transaction

from django_leasequeue import store
from django_leasequeue.backends import LeaseQueueBackend
from django_leasequeue.compat_tasks import (
    InvalidTask,
    TaskContext,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
    task_finished,
    task_started,
)
from django_leasequeue.exceptions import PayloadNotSerializable
from django_leasequeue.models import Job

from . import fw_tasks
from .conftest import drain

READY, RUNNING = TaskResultStatus.READY, TaskResultStatus.RUNNING
SUCCESSFUL, FAILED = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED


@pytest.mark.django_db
def test_enqueue_returns_a_ready_result_that_get_result_reads_back():
    result = fw_tasks.add.enqueue(2, 3)
    assert isinstance(result.id, str) and result.id.isdigit()
    assert result.status == READY and not result.is_finished
    assert result.args == [2, 3] and result.kwargs == {}
    assert result.enqueued_at is not None and result.enqueued_at.tzinfo is not None
    assert (result.started_at, result.last_attempted_at, result.finished_at) == (None, None, None)
    assert (result.errors, result.worker_ids, result.attempts) == ([], [], 0)
    assert result.backend == "default"
    with pytest.raises(ValueError, match="not finished"):
        _ = result.return_value
    again = fw_tasks.add.get_result(result.id)
    assert (again.id, again.status, again.args, again.enqueued_at) == (result.id, READY, [2, 3], result.enqueued_at)
    assert again.task.func is fw_tasks.add.func
    assert again.task.module_path == "tests.backends.fw_tasks.add"


@pytest.mark.django_db
def test_get_result_of_unknown_ids_raises_does_not_exist():
    with pytest.raises(TaskResultDoesNotExist):
        fw_tasks.add.get_result("999999999")
    with pytest.raises(TaskResultDoesNotExist):
        fw_tasks.add.get_result("not-a-number")


@pytest.mark.django_db
def test_enqueue_is_part_of_the_callers_transaction():
    with pytest.raises(RuntimeError), transaction.atomic():
        result = fw_tasks.add.enqueue(1, 1)
        assert Job.objects.filter(pk=int(result.id)).exists()
        raise RuntimeError("roll back")
    assert Job.objects.count() == 0
    with pytest.raises(TaskResultDoesNotExist):
        fw_tasks.add.get_result(result.id)


@pytest.mark.django_db
def test_unknown_queue_is_rejected():
    with pytest.raises(InvalidTask, match="nope"):
        fw_tasks.add.using(queue_name="nope")
    assert Job.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "kwargs", "named"),
    [
        ((Decimal("1.10"), 2), {}, "argument 'a'"),
        ((1,), {"b": uuid.uuid4()}, "keyword argument 'b'"),
        ((datetime.now(UTC), 1), {}, "argument 'a'"),
        (([(1, 2)], 1), {}, "argument 'a'[0]"),
    ],
)
def test_c23_non_json_arguments_are_rejected_at_enqueue(args, kwargs, named):
    # One documented rule (case C23): a TypeError at enqueue naming the argument, nothing written;
    # never a failure at run time, never a silent Decimal -> float or UUID -> str.
    with pytest.raises(TypeError, match=named.replace("[", r"\[").replace("]", r"\]")):
        fw_tasks.add.enqueue(*args, **kwargs)
    assert Job.objects.count() == 0


@pytest.mark.django_db
def test_c23_run_after_aware_datetime_and_timedelta_are_accepted_naive_is_refused():
    now = store.db_now()
    at = fw_tasks.add.using(run_after=now + timedelta(hours=1)).enqueue(1, 2)
    assert at.status == READY and at.task.run_after == now + timedelta(hours=1)
    later = fw_tasks.add.using(run_after=timedelta(minutes=5)).enqueue(1, 2)
    row = Job.objects.get(pk=int(later.id))
    # Both times come from one statement clock: the delay is exact.
    assert row.run_at - row.created_at == timedelta(minutes=5)
    assert later.task.run_after == later.enqueued_at + timedelta(minutes=5)
    with pytest.raises(InvalidTask, match="aware"):
        fw_tasks.add.using(run_after=datetime(2030, 1, 1, 12, 0))
    with pytest.raises(InvalidTask):
        fw_tasks.add.using(run_after="tomorrow")


@pytest.mark.usefixtures("committed_db")
def test_success_stores_the_return_value_and_the_attempt():
    result = fw_tasks.add.enqueue(2, 3)
    drain()
    done = fw_tasks.add.get_result(result.id)
    assert done.status == SUCCESSFUL and done.is_finished
    assert done.return_value == 5
    assert done.attempts == 1 and len(done.worker_ids) == 1 and done.errors == []
    assert done.enqueued_at <= done.started_at <= done.last_attempted_at <= done.finished_at
    result.refresh()
    assert (result.status, result.return_value, result.finished_at) == (SUCCESSFUL, 5, done.finished_at)


@pytest.mark.usefixtures("committed_db")
def test_get_result_while_running():
    fw_tasks.RUNNING.clear()
    fw_tasks.RELEASE.clear()
    started = []

    def on_started(sender, task_result, **kwargs):
        started.append(task_result)

    result = fw_tasks.hold.enqueue()
    task_started.connect(on_started)
    worker = threading.Thread(target=drain)
    worker.start()
    try:
        assert fw_tasks.RUNNING.wait(20)
        running = fw_tasks.hold.get_result(result.id)
        assert running.status == RUNNING and not running.is_finished
        assert running.started_at is not None and running.finished_at is None
        assert running.attempts == 1
        with pytest.raises(ValueError, match="not finished"):
            _ = running.return_value
    finally:
        task_started.disconnect(on_started)
        fw_tasks.RELEASE.set()
        worker.join(30)
    # task_started of a first attempt is built from the claim, without reading the row: it must
    # equal the row as read while running.
    fields = ("id", "status", "enqueued_at", "started_at", "last_attempted_at", "finished_at", "args", "kwargs",
              "backend", "errors", "worker_ids")
    (signalled,) = started
    assert [getattr(signalled, f) for f in fields] == [getattr(running, f) for f in fields]
    assert (signalled.task.queue_name, signalled.task.priority, signalled.task.run_after) == \
        (running.task.queue_name, running.task.priority, running.task.run_after)
    assert fw_tasks.hold.get_result(result.id).return_value == "released"


@pytest.mark.usefixtures("committed_db")
def test_failure_records_one_error_per_attempt_and_then_fails():
    result = fw_tasks.fail_always.enqueue("bad input")
    drain()
    failed = fw_tasks.fail_always.get_result(result.id)
    assert failed.status == FAILED and failed.is_finished
    assert failed.attempts == 2 and len(failed.errors) == 2
    for error in failed.errors:
        assert error.exception_class_path == "builtins.ValueError"
        assert error.exception_class is ValueError
        assert "ValueError: bad input" in error.traceback and "fail_always" in error.traceback
    assert failed.finished_at is not None
    with pytest.raises(ValueError, match="failed"):
        _ = failed.return_value


@pytest.mark.usefixtures("committed_db")
def test_retry_then_success_keeps_the_failed_attempts_errors():
    result = fw_tasks.flaky.enqueue(f"k-{uuid.uuid4().hex}", failures=1)
    drain()
    done = fw_tasks.flaky.get_result(result.id)
    assert done.status == SUCCESSFUL and done.return_value == "ok after 2"
    assert done.attempts == 2
    assert [e.exception_class_path for e in done.errors] == ["builtins.ConnectionError"]


@pytest.mark.usefixtures("committed_db")
def test_run_after_defers_until_the_database_clock_passes_it(worker_clock):
    deferred = fw_tasks.add.using(run_after=timedelta(hours=1)).enqueue(1, 1)
    at = fw_tasks.add.using(run_after=store.db_now() + timedelta(minutes=30)).enqueue(2, 2)
    due = fw_tasks.add.enqueue(3, 3)
    drain()
    assert fw_tasks.add.get_result(due.id).return_value == 6
    for waiting in (deferred, at):
        assert fw_tasks.add.get_result(waiting.id).status == READY
    worker_clock.advance(31 * 60)
    drain()
    assert fw_tasks.add.get_result(at.id).return_value == 4
    assert fw_tasks.add.get_result(deferred.id).status == READY
    worker_clock.advance(30 * 60)
    drain()
    assert fw_tasks.add.get_result(deferred.id).return_value == 2


@pytest.mark.usefixtures("committed_db")
def test_priority_order():
    results = {p: fw_tasks.add.using(priority=p).enqueue(p, 0) for p in (-5, 10, 0, 100, -100)}
    order: list[str] = []

    def record(sender, task_result, **kwargs):
        order.append(task_result.id)

    task_started.connect(record)
    try:
        drain(concurrency=1)
    finally:
        task_started.disconnect(record)
    by_id = {r.id: p for p, r in results.items()}
    # The order the one thread started them (task_started is sent as each attempt begins). The
    # started_at column is the time of the claim, not of the start: a worker that claims several
    # jobs in one statement (prefetch) gives them equal times, so it cannot show the order.
    assert [by_id[i] for i in order] == [100, 10, 0, -5, -100]
    started = [fw_tasks.add.get_result(results[p].id).started_at for p in (100, 10, 0, -5, -100)]
    assert started == sorted(started)


@pytest.mark.usefixtures("committed_db")
def test_signals_are_sent_in_order():
    seen: list[tuple] = []
    signalled_errors: dict[str, list[tuple[str, str]]] = {}
    lock = threading.Lock()

    def receiver(name):
        def record(sender, task_result, **kwargs):
            assert sender is LeaseQueueBackend
            value = task_result.return_value if task_result.status == SUCCESSFUL else None
            with lock:
                seen.append((task_result.id, name, str(task_result.status), task_result.attempts,
                             len(task_result.errors), task_result.finished_at is not None, value))
                if name == "finished" and task_result.status == FAILED:
                    signalled_errors[task_result.id] = [(e.exception_class_path, e.traceback)
                                                        for e in task_result.errors]
        return record

    receivers = {name: receiver(name) for name in ("enqueued", "started", "finished")}
    task_enqueued.connect(receivers["enqueued"])
    task_started.connect(receivers["started"])
    task_finished.connect(receivers["finished"])
    try:
        ok = fw_tasks.add.enqueue(1, 2)
        bad = fw_tasks.fail_always.enqueue("no")
        drain()
    finally:
        task_enqueued.disconnect(receivers["enqueued"])
        task_started.disconnect(receivers["started"])
        task_finished.disconnect(receivers["finished"])
    by_job = {rid: [s[1:] for s in seen if s[0] == rid] for rid in (ok.id, bad.id)}
    # (signal, status, attempts, errors, finished_at set, return value)
    assert by_job[ok.id] == [
        ("enqueued", "READY", 0, 0, False, None),
        ("started", "RUNNING", 1, 0, False, None),
        ("finished", "SUCCESSFUL", 1, 0, True, 3),
    ]
    # A retried attempt finishes READY (a retry is scheduled); the last one FAILED.
    assert by_job[bad.id] == [
        ("enqueued", "READY", 0, 0, False, None),
        ("started", "RUNNING", 1, 0, False, None), ("finished", "READY", 1, 1, False, None),
        ("started", "RUNNING", 2, 1, False, None), ("finished", "FAILED", 2, 2, True, None),
    ]
    # The signal's errors are the ones stored (built by the same function, without a query).
    stored = fw_tasks.fail_always.get_result(bad.id).errors
    assert signalled_errors[bad.id] == [(e.exception_class_path, e.traceback) for e in stored]


@pytest.mark.usefixtures("committed_db")
def test_takes_context_gets_the_framework_context_with_the_fencing_token():
    result = fw_tasks.inspect_context.enqueue(7)
    drain()
    done = fw_tasks.inspect_context.get_result(result.id)
    value = done.return_value
    assert value["x"] == 7 and value["attempt"] == 1
    assert value["result_id"] == result.id and value["job_id"] == int(result.id)
    assert value["status"] == "RUNNING" and value["is_task_context"] is True
    assert value["token"] == Job.objects.get(pk=int(result.id)).lease_version == 1
    assert value["worker_ids"] == done.worker_ids


@pytest.mark.usefixtures("committed_db")
def test_async_task_runs_and_tuple_return_values_are_normalised():
    a = fw_tasks.async_add.enqueue(20, 22)
    t = fw_tasks.returns_tuple.enqueue()
    drain()
    assert fw_tasks.async_add.get_result(a.id).return_value == 42
    assert fw_tasks.returns_tuple.get_result(t.id).return_value == [1, "two"]


@pytest.mark.usefixtures("committed_db")
def test_c25_non_json_return_value_fails_the_task_readably():
    bad = fw_tasks.returns_object.enqueue()
    good = fw_tasks.add.enqueue(1, 1)
    drain()
    failed = fw_tasks.returns_object.get_result(bad.id)
    assert failed.status == FAILED and failed.attempts == 1
    (error,) = failed.errors
    assert error.exception_class is PayloadNotSerializable
    assert "return value" in error.traceback
    assert fw_tasks.add.get_result(good.id).return_value == 2


@pytest.mark.usefixtures("committed_db")
def test_aenqueue_and_aget_result():
    async def close():  # sync_to_async ran on asgiref's shared thread: close its connection
        await sync_to_async(connections.close_all)()

    try:
        result = asyncio.run(fw_tasks.add.aenqueue(4, 5))
        assert asyncio.run(fw_tasks.add.aget_result(result.id)).status == READY
        drain()
        assert asyncio.run(fw_tasks.add.aget_result(result.id)).return_value == 9
    finally:
        asyncio.run(close())


def test_context_class_is_a_task_context():
    from django_leasequeue.backends import LeaseQueueTaskContext

    assert issubclass(LeaseQueueTaskContext, TaskContext)
