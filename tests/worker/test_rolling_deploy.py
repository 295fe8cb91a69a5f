"""Rolling deploys: a worker claims only the tasks it registered, and a job of a task that no live
worker serving its queue knows is dead-lettered as UnknownTask only after UNKNOWN_TASK_GRACE,
judged from the process registry. One transaction per test, time passed explicitly (``now=``)."""

from __future__ import annotations

import sys
from datetime import datetime, timedelta

import pytest

from django_leasequeue import enqueue, reaper, store
from django_leasequeue.conf import ConfigurationError, build, get_settings, parse_rate
from django_leasequeue.exceptions import UnknownTask
from django_leasequeue.models import Job, WorkerProcess

pytestmark = pytest.mark.django_db

GRACE = 300.0
ALIVE = 30.0
OLD_TASKS = ["qa.record"]
NEW_TASKS = ["qa.new_task", "qa.record"]
UNKNOWN_TASK_TYPE = f"{UnknownTask.__module__}.{UnknownTask.__qualname__}"


@pytest.fixture
def t0() -> datetime:
    """The database time just before each test's jobs are enqueued."""
    return store.db_now()


def raw_job(task: str, *, queue: str = "default", priority: int = 0, run_at: datetime | None = None) -> int:
    """Insert a job row naming ``task``, as a newer release (or a forged row) would."""
    new = store.NewJob(task=task, queue=queue, priority=priority, args_json="[]", kwargs_json="{}", max_attempts=3,
                       run_at=run_at)
    (job,) = store.job_insert([new], notify=False, channel="leasequeue")
    return job.id


def register(process_id: str, at: datetime, *, queues: list[str] | None = ["default"],  # noqa: B006
             tasks: list[str] | None = OLD_TASKS) -> None:
    """Register a worker row at ``at`` (``queues=None``: every queue, as ``--queues '*'``)."""
    store.process_register(process_id=process_id, kind="worker", host="h", pid=1, queues=queues, concurrency=1,
                           tasks=tasks, now=at)


def beat(at: datetime, *process_ids: str) -> None:
    for process_id in process_ids:
        assert store.process_heartbeat(process_id, now=at)


def sweep(at: datetime) -> list[int]:
    return [d.id for d in store.job_dead_letter_unknown_tasks(grace=GRACE, alive_within=ALIVE, by="test:0:sweep",
                                                              now=at)]


def state(job_id: int) -> tuple:
    job = Job.objects.get(pk=job_id)
    return job.status, job.attempts, job.lease_version


@pytest.mark.parametrize("queues, rated", [(["default"], False), (None, False), (["default"], True), (None, True)],
                         ids=["queues", "any-queue", "queues-rated", "any-queue-rated"])
def test_a_worker_claims_only_the_tasks_it_registered(t0, queues, rated):
    unknown = raw_job("qa.new_task", priority=50)  # at the head of the queue
    known = enqueue("qa.record", ["k"])
    rate_limits = {"default": parse_rate("100/s")} if rated else {}
    claimed = store.job_claim(queues=queues, limit=10, worker_id="old:1:w", lease=30, tasks=OLD_TASKS,
                              rate_limits=rate_limits)
    assert [c.id for c in claimed] == [known.id]
    assert state(unknown) == ("ready", 0, 0)
    assert Job.objects.get(pk=unknown).errors == []
    # A worker that knows it takes it.
    (taken,) = store.job_claim(queues=queues, limit=10, worker_id="new:1:w", lease=30, tasks=NEW_TASKS,
                               rate_limits=rate_limits)
    assert (taken.id, taken.attempts, taken.lease_version) == (unknown, 1, 1)


def test_the_worker_records_its_task_names(t0):
    register("old:1:w", t0)
    register("new:1:w", t0, tasks=list(reversed(NEW_TASKS)))
    register("legacy:1:w", t0, tasks=None)
    assert dict(WorkerProcess.objects.values_list("id", "tasks")) == {
        "old:1:w": OLD_TASKS, "new:1:w": NEW_TASKS, "legacy:1:w": None}


def test_unknown_task_is_dead_lettered_after_the_grace(t0):
    unknown = raw_job("qa.new_task")
    later = raw_job("qa.new_task", run_at=t0 + timedelta(hours=1))  # not due yet
    known = enqueue("qa.record", ["k"]).id
    register("old:1:w", t0)
    beat(t0 + timedelta(seconds=GRACE - 1), "old:1:w")
    assert sweep(t0 + timedelta(seconds=GRACE - 1)) == []
    at = t0 + timedelta(seconds=GRACE + 1)
    beat(at, "old:1:w")
    assert sweep(at) == [unknown]
    assert state(unknown) == ("dead", 0, 0)  # no attempt was spent on it
    job = Job.objects.get(pk=unknown)
    (error,) = job.errors
    assert (error["type"], error["attempt"], error["worker"]) == (UNKNOWN_TASK_TYPE, 0, "test:0:sweep")
    assert "no task is registered as 'qa.new_task' in any live worker serving queue 'default'" in error["message"]
    assert job.finished_at == at
    assert state(later) == ("ready", 0, 0) and state(known) == ("ready", 0, 0)
    assert sweep(at) == []


@pytest.mark.parametrize("case", ["a live worker knows it", "a worker of an older version (no task list)",
                                  "no live worker serves the queue", "the oldest worker registered recently"])
def test_unknown_task_is_kept_while_a_worker_may_still_run_it(t0, case):
    unknown = raw_job("qa.new_task")
    at = t0 + timedelta(seconds=GRACE + 1)
    if case == "a live worker knows it":
        register("old:1:w", t0)
        register("new:1:w", t0, tasks=NEW_TASKS)
        beat(at, "old:1:w", "new:1:w")
    elif case == "a worker of an older version (no task list)":
        register("old:1:w", t0)
        register("legacy:1:w", t0, tasks=None)
        beat(at, "old:1:w", "legacy:1:w")
    elif case == "no live worker serves the queue":
        register("other:1:w", t0, queues=["other"])
        beat(at, "other:1:w")
    else:  # every old worker restarted a minute ago: a newer one may be starting too
        register("old:1:w", at - timedelta(seconds=60))
        beat(at, "old:1:w")
    assert sweep(at) == []
    assert state(unknown) == ("ready", 0, 0)


def test_the_grace_counts_live_workers_only_and_any_queue_workers_serve_every_queue(t0):
    unknown = raw_job("qa.new_task", queue="reports")
    register("star:1:w", t0, queues=None)  # --queues '*'
    register("new:1:w", t0, tasks=NEW_TASKS, queues=["reports"])
    at = t0 + timedelta(seconds=GRACE + 1)
    beat(at, "star:1:w")  # the worker that knew the task stopped beating (died, or rolled back)
    assert sweep(at) == [unknown]
    assert state(unknown) == ("dead", 0, 0)


def test_an_import_path_is_dead_lettered_and_never_imported(t0):
    module = "tests.backends.never_imported"
    job_id = raw_job(f"{module}.boom")
    register("old:1:w", t0)
    at = t0 + timedelta(seconds=GRACE + 1)
    beat(at, "old:1:w")
    assert store.job_claim(queues=None, limit=10, worker_id="old:1:w", lease=30, tasks=OLD_TASKS, now=at) == []
    assert sweep(at) == [job_id]
    assert state(job_id) == ("dead", 0, 0)
    assert module not in sys.modules


def test_the_reaper_sweep_follows_the_setting(t0, settings):
    unknown = raw_job("qa.new_task")
    register("old:1:w", t0)
    at = t0 + timedelta(seconds=3600)
    beat(at, "old:1:w")
    settings.LEASEQUEUE = {**settings.LEASEQUEUE, "UNKNOWN_TASK_GRACE": None}
    assert reaper.dead_letter_unknown_tasks(get_settings(), now=at) == []
    settings.LEASEQUEUE = {**settings.LEASEQUEUE, "UNKNOWN_TASK_GRACE": 3000}
    assert [d.id for d in reaper.dead_letter_unknown_tasks(get_settings(), now=at, by="test:0:r")] == [unknown]
    assert state(unknown) == ("dead", 0, 0)


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf"), "5m"])
def test_unknown_task_grace_is_validated(value):
    with pytest.raises(ConfigurationError, match="UNKNOWN_TASK_GRACE"):
        build({"UNKNOWN_TASK_GRACE": value})
    assert build({}).unknown_task_grace == 300.0
    assert build({"UNKNOWN_TASK_GRACE": timedelta(minutes=2)}).unknown_task_grace == 120.0


def test_runreaper_once_dead_letters_after_the_grace_by_the_database_clock(db_clock):
    from io import StringIO

    from django.core.management import call_command

    unknown = raw_job("qa.new_task")
    store.process_register(process_id="old:1:w", kind="worker", host="h", pid=1, queues=["default"], concurrency=1,
                           tasks=OLD_TASKS)
    grace = get_settings().unknown_task_grace
    assert grace == GRACE
    outputs = []
    for seconds in (grace - 5, 10):  # just before the grace, then past it
        db_clock.advance(seconds)
        assert store.process_heartbeat("old:1:w")  # the old worker is alive throughout
        out = StringIO()
        call_command("runreaper", "--once", stdout=out)
        outputs.append(out.getvalue().strip())
    assert outputs[0].endswith("dead-lettered 0 job(s) of tasks no live worker knows")
    assert outputs[1].endswith("dead-lettered 1 job(s) of tasks no live worker knows")
    assert state(unknown) == ("dead", 0, 0)
    assert Job.objects.get(pk=unknown).errors[0]["type"] == UNKNOWN_TASK_TYPE


def test_a_task_registered_after_start_is_recorded_before_it_is_claimed():
    from django_leasequeue import registry, task
    from django_leasequeue.worker import WorkerService

    worker = WorkerService(concurrency=1, notify=False, reap=False, worker_name="late")
    worker.register()
    assert "qa.late_task" not in WorkerProcess.objects.get(pk=worker.worker_id).tasks
    job_id = raw_job("qa.late_task")
    assert store.job_claim(queues=None, limit=5, worker_id=worker.worker_id, lease=30,
                           tasks=worker.claim_tasks()) == []

    @task(name="qa.late_task")
    def late_task() -> None:  # a module imported after the worker started
        pass

    try:
        names = worker.claim_tasks()
        assert "qa.late_task" in names
        assert WorkerProcess.objects.get(pk=worker.worker_id).tasks == names  # recorded first
        (claimed,) = store.job_claim(queues=None, limit=5, worker_id=worker.worker_id, lease=30, tasks=names)
        assert (claimed.id, claimed.attempts) == (job_id, 1)
    finally:
        registry._REGISTRY.pop("qa.late_task", None)
