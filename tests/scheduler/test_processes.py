"""Real scheduler processes (``manage.py runscheduler`` / ``runworker --with-scheduler``) on a
per-second schedule: exactly one job per occurrence and none missing, with 2 and 4 schedulers
started together, across a restart, and embedded in a worker."""

from __future__ import annotations

import signal
import time
from datetime import timedelta

import pytest

from django_leasequeue import cron
from django_leasequeue.models import Job, WorkerProcess

from ..conftest import wait_for
from .conftest import make_schedule

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]

EVERY_SECOND = "* * * * * *"
ENV = {"LEASEQUEUE_LOG_LEVEL": "DEBUG"}


def per_second_schedule():
    # catch_up="all": a scheduler starved of CPU for a few seconds (2 shared cores, several
    # processes) emits the seconds it missed instead of only the latest, so "none missing" is exact.
    return make_schedule("every-second", cron=EVERY_SECOND, catch_up="all", catch_up_limit=600)


def occurrences_of(schedule) -> list:
    return list(Job.objects.filter(schedule=schedule).order_by("occurrence_at").values_list("occurrence_at", flat=True))


def assert_one_job_per_occurrence(schedule, first_expected) -> list:
    """Every second from the schedule's first occurrence to the last emitted one has exactly one job."""
    emitted = occurrences_of(schedule)
    assert emitted, "nothing emitted"
    assert len(emitted) == len(set(emitted))
    assert len({k for k in Job.objects.filter(schedule=schedule).values_list("unique_key", flat=True)}) == len(emitted)
    expected = list(cron.occurrences(EVERY_SECOND, "UTC", first_expected - timedelta(seconds=1), emitted[-1]))
    assert emitted == expected
    assert all(j.run_at == j.occurrence_at for j in Job.objects.filter(schedule=schedule))
    return emitted


def stop_all(procs) -> list[str]:
    for p in procs:
        p.signal(signal.SIGTERM)
    codes = [p.wait(30) for p in procs]
    outputs = [p.output() for p in procs]
    assert codes == [0] * len(procs), outputs
    for out in outputs:
        assert "ERROR" not in out and "Traceback" not in out, out
    return outputs


@pytest.mark.parametrize("count", [2, 4])
def test_many_schedulers_emit_one_job_per_second(spawn, count):
    schedule = per_second_schedule()
    first = schedule.next_occurrence_at
    procs = [spawn("runscheduler", env=ENV) for _ in range(count)]
    wait_for(lambda: WorkerProcess.objects.filter(kind="scheduler", last_tick_at__isnull=False).count() == count,
             timeout=60, what=f"{count} schedulers ticking")
    wait_for(lambda: occurrences_of(schedule), timeout=30, what="a first job")
    # Every scheduler is up; let them compete for 5 more occurrences.
    target = occurrences_of(schedule)[-1] + timedelta(seconds=5)
    wait_for(lambda: occurrences_of(schedule)[-1] >= target, timeout=30, what="5 more occurrences")
    stop_all(procs)  # exit 0, no ERROR, no traceback in any of them
    emitted = assert_one_job_per_occurrence(schedule, first)
    assert len(emitted) >= 6
    assert WorkerProcess.objects.filter(kind="scheduler").count() == 0  # deregistered on SIGTERM


def test_restarted_scheduler_loses_none_and_repeats_none(spawn):
    schedule = per_second_schedule()
    first = schedule.next_occurrence_at
    a = spawn("runscheduler", env=ENV)
    wait_for(lambda: len(occurrences_of(schedule)) >= 3, timeout=60, what="first jobs")
    stop_all([a])
    stopped_at = occurrences_of(schedule)[-1]
    b = spawn("runscheduler", env=ENV)  # down for a couple of seconds while it boots
    wait_for(lambda: occurrences_of(schedule)[-1] >= stopped_at + timedelta(seconds=4), timeout=60,
             what="jobs after the restart")
    stop_all([b])
    emitted = assert_one_job_per_occurrence(schedule, first)
    assert emitted[-1] > stopped_at


def test_scheduler_embedded_in_worker(spawn):
    schedule = make_schedule("every-second", cron=EVERY_SECOND)
    w = spawn("runworker", "--with-scheduler", "--concurrency", "2", env=ENV)
    wait_for(lambda: Job.objects.filter(schedule=schedule, status="done").count() >= 3, timeout=60,
             what="scheduled jobs done by the same process")
    kinds = set(WorkerProcess.objects.values_list("kind", flat=True))
    assert kinds == {"worker", "scheduler"}
    assert WorkerProcess.objects.get(kind="scheduler").last_tick_at is not None
    stop_all([w])
    done = Job.objects.filter(schedule=schedule, status="done")
    assert all(j.task == "invoices.tasks.noop" and j.occurrence_at is not None for j in done)


def test_settings_schedules_are_synced_at_start(spawn):
    """The test project's demo schedules (nightly invoice run, per-minute heartbeat) are created by
    a starting scheduler and owned by settings."""
    from django_leasequeue.models import Schedule

    p = spawn("runscheduler", env=ENV)
    wait_for(lambda: Schedule.objects.filter(source="settings").count() == 2, timeout=60, what="sync")
    time.sleep(0.2)
    stop_all([p])
    rows = {s.name: s for s in Schedule.objects.all()}
    assert rows["nightly-invoice-run"].task == "invoices.tasks.run_monthly_invoices"
    assert rows["nightly-invoice-run"].timezone == "Europe/Berlin"
    assert rows["heartbeat"].cron == "* * * * *"
    assert all(s.enabled and s.next_occurrence_at is not None for s in rows.values())
