"""LeaseQueueBackend beyond the framework's contract: registration and security, per-task options,
configuration checks, fencing through the framework's TaskContext, the reaper's view."""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import pytest
from django.test import override_settings
from invoices import framework_tasks
from invoices.models import Account, Invoice
from invoices.tasks import flaky_sync as native_flaky_sync

from django_leasequeue import reaper, registry, store
from django_leasequeue.backends import LeaseQueueBackend, registered_framework_tasks
from django_leasequeue.compat_tasks import (
    InvalidTask,
    InvalidTaskBackend,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
    task_finished,
)
from django_leasequeue.exceptions import LeaseExpired, UnknownTask
from django_leasequeue.models import Job

from . import fw_tasks
from .conftest import drain
from .fw_tasks import TASK_KWARGS

TASKS = {"default": {"BACKEND": "django_leasequeue.backends.LeaseQueueBackend", "QUEUES": ["default", "invoices"]}}


def _raw_job(task_name: str, args: list) -> int:
    """Insert a job row naming ``task_name`` directly, as a forged or stale row would be."""
    import json

    new = store.NewJob(task=task_name, queue="default", priority=0, args_json=json.dumps(args), kwargs_json="{}",
                       max_attempts=3)
    (job,) = store.job_insert([new], notify=False, channel="leasequeue")
    return job.id


# ---- only registered framework tasks run ----------------------------------------------------


def test_decoration_registers_the_task_for_workers():
    # Task.__post_init__ -> LeaseQueueBackend.validate_task -> registered, on both frameworks.
    names = registered_framework_tasks()
    assert names["tests.backends.fw_tasks.add"] is fw_tasks.add
    assert names["invoices.framework_tasks.send_invoice"] is framework_tasks.send_invoice
    spec = registry.get_task("tests.backends.fw_tasks.add")
    assert spec.name == "tests.backends.fw_tasks.add" and spec.takes_context


def test_using_copies_do_not_replace_the_decorated_task():
    fw_tasks.unique_report.using(max_attempts=2, priority=5)
    assert registered_framework_tasks()["tests.backends.fw_tasks.unique_report"] is fw_tasks.unique_report


@pytest.mark.usefixtures("committed_db")
def test_unregistered_paths_are_dead_lettered_and_never_imported(tmp_path):
    marker = tmp_path / "pwned"
    system_id = _raw_job("os.system", [f"touch {marker}"])
    module_id = _raw_job("tests.backends.never_imported.boom", [])
    assert "tests.backends.never_imported" not in sys.modules
    worker = drain()
    # The worker claims only the tasks it registered: the rows stay ready, no attempt spent.
    for job_id in (system_id, module_id):
        assert Job.objects.filter(pk=job_id).values_list("status", "attempts").get() == ("ready", 0)
    assert "tests.backends.never_imported" not in sys.modules
    # The reaper's sweep dead-letters them once no live worker of the queue knows the task.
    worker.register()
    dead = store.job_dead_letter_unknown_tasks(grace=0, alive_within=30, by="test:0:sweep")
    assert {d.id for d in dead} == {system_id, module_id}
    for job_id in (system_id, module_id):
        job = Job.objects.get(pk=job_id)
        assert (job.status, job.attempts) == ("dead", 0)
        (error,) = job.errors
        assert error["type"] == f"{UnknownTask.__module__}.{UnknownTask.__qualname__}"
        assert "only registered tasks run" in error["message"]
    assert not marker.exists()
    assert "tests.backends.never_imported" not in sys.modules
    assert "LEASEQUEUE_TEST_NEVER_IMPORTED" not in os.environ
    # get_result does not import it either: such a job has no framework result.
    with pytest.raises(TaskResultDoesNotExist, match="not a Django task"):
        fw_tasks.add.get_result(str(module_id))
    assert "tests.backends.never_imported" not in sys.modules


@pytest.mark.django_db
def test_native_jobs_have_no_framework_result():
    job = native_flaky_sync.enqueue("k")
    with pytest.raises(TaskResultDoesNotExist):
        fw_tasks.add.get_result(str(job.id))


# ---- per-task options -----------------------------------------------------------------------


@pytest.mark.django_db
def test_task_options_reach_the_job_row():
    row = Job.objects.get(pk=int(fw_tasks.unique_report.enqueue("2026-11-30").id))
    assert (row.max_attempts, row.lease_seconds, row.unique_key) == (7, 45.0, "report:2026-11-30")
    spec = registry.get_task("tests.backends.fw_tasks.unique_report")
    assert (spec.lease, spec.timeout) == (45.0, 120.0)
    # OPTIONS["MAX_ATTEMPTS"] = 5 in the test project; the LEASEQUEUE lease applies (no lease_seconds).
    row = Job.objects.get(pk=int(fw_tasks.add.enqueue(1, 2).id))
    assert (row.max_attempts, row.lease_seconds, row.unique_key) == (5, None, None)
    # Django 6.0 style: @task_options under @task.
    row = Job.objects.get(pk=int(fw_tasks.with_function_options.enqueue().id))
    assert (row.max_attempts, row.lease_seconds) == (9, 12.5)
    # Per enqueue: using(max_attempts=...).
    row = Job.objects.get(pk=int(fw_tasks.add.using(max_attempts=2).enqueue(1, 2).id))
    assert row.max_attempts == 2


@pytest.mark.django_db
def test_unique_key_returns_the_existing_job_without_a_second_enqueued_signal():
    sent = []

    def receiver(sender, task_result, **kwargs):
        sent.append(task_result.id)

    from django_leasequeue.compat_tasks import task_enqueued

    task_enqueued.connect(receiver)
    try:
        first = fw_tasks.unique_report.enqueue("2026-12-01")
        second = fw_tasks.unique_report.enqueue("2026-12-01")
        other = fw_tasks.unique_report.using(unique_key="custom:{0}").enqueue("2026-12-01")
    finally:
        task_enqueued.disconnect(receiver)
    assert first.id == second.id != other.id
    assert sent == [first.id, other.id]
    assert Job.objects.count() == 2


@pytest.mark.skipif(not TASK_KWARGS, reason="Django 6.0's @task does not pass extra keywords to task_class")
def test_invalid_task_options_are_refused_at_decoration():
    from django_leasequeue.compat_tasks import task

    def bad(x):
        return x

    bad.__module__, bad.__qualname__ = fw_tasks.__name__, "bad"  # looks module-level to the framework
    with pytest.raises(InvalidTask, match="max_attempts"):
        task(max_attempts=0)(bad)
    with pytest.raises(InvalidTask, match="lease"):
        task(lease=-1)(bad)
    with pytest.raises(InvalidTask, match="unique_scope"):
        task(unique_scope="forever")(bad)
    with pytest.raises(InvalidTask, match="backoff"):
        task(backoff="soon")(bad)
    assert "tests.backends.fw_tasks.bad" not in registered_framework_tasks()


def test_using_refuses_per_task_options():
    with pytest.raises(TypeError, match="per task"):
        fw_tasks.add.using(lease=10)


# ---- configuration ----------------------------------------------------------------------------


def test_bad_options_and_queues_are_system_check_errors():
    backend = LeaseQueueBackend("x", {"QUEUES": "default", "OPTIONS": {"LEASE": 0, "MAX_ATTEMPS": 3}})
    messages = backend.check()
    assert [m.id for m in messages] == ["leasequeue.E102", "leasequeue.E102"]
    assert "QUEUES" in messages[0].msg
    assert "did you mean 'MAX_ATTEMPTS'?" in messages[1].msg
    with pytest.raises(InvalidTaskBackend):
        backend.get_result("1")
    good = LeaseQueueBackend("y", {"OPTIONS": {"LEASE": timedelta(minutes=2), "BACKOFF": {"base": 3, "max": 90},
                                               "MAX_ATTEMPTS": 4, "TIMEOUT": 600}})
    assert good.check() == []
    assert (good.defaults.lease, good.defaults.timeout, good.defaults.max_attempts) == (120.0, 600.0, 4)
    assert (good.defaults.backoff.base, good.defaults.backoff.max) == (3, 90)


def test_queues_that_leasequeue_refuses_are_reported():
    with override_settings(LEASEQUEUE={"QUEUES": ["default"]}):
        backend = LeaseQueueBackend("z", {"QUEUES": ["default", "invoices"]})
        assert [(m.id, "invoices" in m.msg) for m in backend.check()] == [("leasequeue.E103", True)]


def test_check_reports_a_missing_app():
    from django.conf import settings

    apps_without = [a for a in settings.INSTALLED_APPS if a != "django_leasequeue"]
    with override_settings(INSTALLED_APPS=apps_without, TASKS=TASKS):
        backend = task_backends["default"]
        assert [m.id for m in backend.check()] == ["leasequeue.E101"]


# ---- fencing and the reaper through the framework --------------------------------------------


@pytest.mark.usefixtures("committed_db")
def test_fenced_atomic_through_the_framework_context_stores_the_return_value():
    account = Account.objects.create(name="Acme", email="billing@acme.test")
    result = framework_tasks.send_invoice.enqueue(account.pk, "2026-11")
    drain()
    done = framework_tasks.send_invoice.get_result(result.id)
    invoice = Invoice.objects.get()
    assert done.status == TaskResultStatus.SUCCESSFUL
    # Completed inside fenced_atomic(); the value is written afterwards, fenced on the same token.
    assert done.return_value == {"invoice": invoice.pk, "created": True, "attempt": 1}
    assert (invoice.job_id, invoice.lease_version) == (int(result.id), 1)


@pytest.mark.django_db
def test_reaped_attempt_reports_lease_expired_and_finishes_ready():
    finished = []

    def receiver(sender, task_result, **kwargs):
        finished.append((task_result.id, str(task_result.status)))

    result = fw_tasks.add.enqueue(1, 1)
    now = store.db_now()
    (claimed,) = store.job_claim(queues=["default"], limit=1, worker_id="host:1:dead", lease=5, now=now)
    assert fw_tasks.add.get_result(result.id).status == TaskResultStatus.RUNNING
    task_finished.connect(receiver)
    try:
        reaper.reap_once(now=now + timedelta(seconds=6))
    finally:
        task_finished.disconnect(receiver)
    assert finished == [(result.id, "READY")]
    again = fw_tasks.add.get_result(result.id)
    assert again.status == TaskResultStatus.READY and again.worker_ids == ["host:1:dead"]
    (error,) = again.errors
    assert error.exception_class is LeaseExpired
    assert "lease expired" in error.traceback


def test_manage_py_check_reports_a_misconfigured_backend():
    # In a fresh process nothing has imported the tasks framework yet; our AppConfig must load it
    # so that its system check (which calls LeaseQueueBackend.check()) runs at all.
    import subprocess

    from ..conftest import MANAGE, ROOT

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "testproject")])}
    proc = subprocess.run([sys.executable, str(MANAGE), "check", "--settings", "tests.backends.misconfigured_settings"],
                          cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "leasequeue.E102" in proc.stderr and "did you mean 'MAX_ATTEMPTS'?" in proc.stderr
