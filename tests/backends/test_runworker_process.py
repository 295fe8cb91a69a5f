"""A real ``manage.py runworker`` process runs the test project's framework (``@task``) tasks."""

from __future__ import annotations

import re
import signal

import pytest
from invoices import framework_tasks
from invoices.models import Account, Invoice

from django_leasequeue.compat_tasks import TaskResultStatus
from django_leasequeue.models import Job

from ..conftest import wait_for
from .test_backend import _raw_job

pytestmark = pytest.mark.process


def _states(output: str, result_id: str) -> list[str]:
    """The framework's own log lines (sent by its task_started/task_finished receivers) for one job."""
    return re.findall(rf"Task id={result_id} path=\S+ state=(\w+)", output)


def test_runworker_runs_framework_tasks_with_leases_retries_and_dead_letters(spawn, tmp_path):
    account = Account.objects.create(name="Acme", email="billing@acme.test")
    invoice = framework_tasks.send_invoice.enqueue(account.pk, "2026-11")
    flaky = framework_tasks.flaky_sync.enqueue("process-flaky", failures=2)  # max_attempts=4, backoff=0.2
    poison = framework_tasks.poison.enqueue({"id": 1})  # max_attempts=3, backoff=0.1
    forged = _raw_job("os.system", [f"touch {tmp_path / 'pwned'}"])

    worker = spawn("runworker", "--concurrency", "2",
                   env={"LEASEQUEUE_LOG_LEVEL": "INFO", "LEASEQUEUE_POLL_INTERVAL": "0.2",
                        "LEASEQUEUE_UNKNOWN_TASK_GRACE": "0"})

    def finished(task, result):
        return task.get_result(result.id).is_finished

    wait_for(lambda: finished(framework_tasks.send_invoice, invoice), what="send_invoice")
    # Enqueued while the worker runs: LISTEN/NOTIFY wakes it; an async task with priority 10.
    summary = framework_tasks.invoice_summary.enqueue("2026-11")
    for task, result in ((framework_tasks.flaky_sync, flaky), (framework_tasks.poison, poison),
                         (framework_tasks.invoice_summary, summary)):
        wait_for(lambda task=task, result=result: finished(task, result), what=task.name)
    wait_for(lambda: Job.objects.get(pk=forged).status == "dead", what="forged row dead-lettered")
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    output = worker.output()

    pid = f":{worker.pid}:"
    sent = framework_tasks.send_invoice.get_result(invoice.id)
    (row,) = Invoice.objects.all()
    assert sent.status == TaskResultStatus.SUCCESSFUL
    assert sent.return_value == {"invoice": row.pk, "created": True, "attempt": 1}
    assert (row.job_id, row.lease_version) == (int(invoice.id), 1)

    synced = framework_tasks.flaky_sync.get_result(flaky.id)
    assert synced.status == TaskResultStatus.SUCCESSFUL
    assert synced.return_value == "synced process-flaky after 3 tries"
    assert synced.attempts == 3 and all(pid in w for w in synced.worker_ids)
    assert [e.exception_class_path for e in synced.errors] == ["builtins.ConnectionError"] * 2
    assert Job.objects.get(pk=int(flaky.id)).lease_version == 3

    dead = framework_tasks.poison.get_result(poison.id)
    assert dead.status == TaskResultStatus.FAILED and dead.attempts == 3
    assert [e.exception_class for e in dead.errors] == [ValueError] * 3
    assert "missing 'customer'" in dead.errors[-1].traceback
    assert Job.objects.get(pk=int(poison.id)).status == "dead"

    assert framework_tasks.invoice_summary.get_result(summary.id).return_value == {"period": "2026-11", "invoices": 1}

    forged_row = Job.objects.get(pk=forged)
    assert "UnknownTask" in forged_row.errors[0]["type"] and not (tmp_path / "pwned").exists()

    # The framework's signals, in order, as logged by its own receivers in the worker process.
    assert _states(output, flaky.id) == ["RUNNING", "READY", "RUNNING", "READY", "RUNNING", "SUCCESSFUL"]
    assert _states(output, poison.id) == ["RUNNING", "READY", "RUNNING", "READY", "RUNNING", "FAILED"]
    assert _states(output, invoice.id) == ["RUNNING", "SUCCESSFUL"]
