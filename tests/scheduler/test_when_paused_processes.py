"""A real scheduler process and a real worker process on a per-second schedule into a paused queue.

``latest``: while paused, exactly one job is pending (the latest occurrence), every earlier
occurrence is accounted for as coalesced, nothing runs; after the resume exactly that one job runs.
``skip``: while paused no job exists and every occurrence is counted as skipped; after the resume
the schedule's later occurrences run, none of the skipped ones.
"""

from __future__ import annotations

import signal
from datetime import datetime, timedelta

import pytest

from django_leasequeue import cron, store
from django_leasequeue.models import Job, Schedule

from ..conftest import wait_for
from .conftest import make_schedule

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]

EVERY_SECOND = "* * * * * *"
QUEUE = "reports"
ENV = {"LEASEQUEUE_LOG_LEVEL": "DEBUG", "LEASEQUEUE_POLL_INTERVAL": "0.2"}


def start(spawn, policy: str) -> tuple[Schedule, list]:
    # catch_up="all": a scheduler starved of CPU (2 shared cores) still plans every second it
    # missed, so each occurrence is accounted for exactly.
    schedule = make_schedule("every-second", cron=EVERY_SECOND, queue=QUEUE, catch_up="all", catch_up_limit=600,
                             when_paused=policy)
    assert store.queue_pause(QUEUE)
    procs = [spawn("runscheduler", "--no-sync", env=ENV),
             spawn("runworker", "--queues", QUEUE, "--concurrency", "2", env=ENV)]
    return schedule, procs


def counted(schedule: Schedule, field: str) -> int:
    return int(Schedule.objects.values_list(field, flat=True).get(pk=schedule.pk))


def disable(schedule: Schedule) -> Schedule:
    """Stop the schedule (waits for a tick holding its row), so the figures below are final."""
    row = Schedule.objects.get(pk=schedule.pk)
    row.enabled = False
    row.save()
    return Schedule.objects.get(pk=schedule.pk)


def stop_all(procs) -> None:
    for p in procs:
        p.signal(signal.SIGTERM)
    codes = [p.wait(30) for p in procs]
    outputs = [p.output() for p in procs]
    assert codes == [0] * len(procs), outputs
    for out in outputs:
        assert "ERROR" not in out and "Traceback" not in out, out


def test_latest_keeps_one_pending_job_and_runs_it_once_after_the_resume(spawn):
    schedule, procs = start(spawn, "latest")
    first = schedule.next_occurrence_at
    wait_for(lambda: counted(schedule, "paused_coalesced") >= 3, timeout=30, what="three coalesced occurrences")
    row = disable(schedule)
    jobs = list(Job.objects.filter(schedule=schedule).order_by("occurrence_at"))
    (pending,) = [j for j in jobs if j.status == "ready"]
    assert pending.occurrence_at == jobs[-1].occurrence_at == row.last_occurrence_at  # the latest one
    assert {j.status for j in jobs[:-1]} <= {"cancelled"}
    assert all(j.history[-1]["event"] == "coalesced" for j in jobs[:-1])
    # Every second from the first occurrence to the kept one: one kept, the others coalesced.
    due = list(cron.occurrences(EVERY_SECOND, "UTC", first - timedelta(seconds=1), pending.occurrence_at))
    assert row.paused_coalesced == len(due) - 1
    assert len({j.occurrence_at for j in jobs}) == len(jobs)  # one row per occurrence at most
    assert not Job.objects.filter(schedule=schedule, status__in=["leased", "done"]).exists()

    assert store.queue_resume(QUEUE)
    wait_for(lambda: Job.objects.filter(schedule=schedule, status="done").exists(), timeout=20, what="the run")
    stop_all(procs)
    assert list(Job.objects.filter(schedule=schedule, status="done").values_list("id", flat=True)) == [pending.pk]
    assert Job.objects.filter(schedule=schedule).exclude(status__in=["done", "cancelled"]).count() == 0
    assert Job.objects.filter(schedule=schedule, status="cancelled").count() == len(jobs) - 1


def test_skip_emits_nothing_while_paused_and_runs_later_occurrences_after_the_resume(spawn):
    schedule, procs = start(spawn, "skip")
    first = schedule.next_occurrence_at
    wait_for(lambda: counted(schedule, "paused_skipped") >= 3, timeout=30, what="three skipped occurrences")
    row = disable(schedule)
    assert not Job.objects.filter(schedule=schedule).exists()
    last_skipped = datetime.fromisoformat(row.paused_log[-1]["occurrence"])
    due = list(cron.occurrences(EVERY_SECOND, "UTC", first - timedelta(seconds=1), last_skipped))
    assert row.paused_skipped == len(due)
    assert row.last_occurrence_at is None  # nothing was emitted

    assert store.queue_resume(QUEUE)
    row.enabled = True
    row.save()  # from now on: the next occurrence is emitted and runs
    wait_for(lambda: Job.objects.filter(schedule=schedule, status="done").count() >= 2, timeout=20, what="runs")
    disable(schedule)
    stop_all(procs)
    jobs = Job.objects.filter(schedule=schedule)
    assert not jobs.filter(occurrence_at__lte=last_skipped).exists()
    assert counted(schedule, "paused_skipped") == len(due)

