"""Every path that writes a job sends exactly one ``enqueued`` event per job it writes, and none for
a job it did not write (a unique key already taken): the admin's "run schedule now" and the
scheduler's firing go through the same insert path as ``enqueue()``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from django_leasequeue import signals
from django_leasequeue.models import Job, Schedule
from django_leasequeue.scheduler import SchedulerService

pytestmark = pytest.mark.django_db

NOOP = "invoices.tasks.noop"


@pytest.fixture(autouse=True)
def _no_settings_schedules(settings):
    settings.LEASEQUEUE_SCHEDULES = {}


@pytest.fixture
def enqueued():
    """The keyword arguments of every ``enqueued`` signal sent during the test, in order."""
    seen: list[dict] = []

    def receiver(sender, event, signal, **kwargs):
        seen.append(kwargs)

    signals.SIGNALS["enqueued"].connect(receiver, dispatch_uid="enqueue-events-test")
    yield seen
    signals.SIGNALS["enqueued"].disconnect(dispatch_uid="enqueue-events-test")


def test_admin_run_now_sends_one_enqueued_event(admin_client, enqueued):
    schedule = Schedule.objects.create(name="nightly", task=NOOP, cron="30 2 * * *", timezone="UTC",
                                       queue="default")
    url = reverse("admin:django_leasequeue_schedule_run_now", args=[schedule.pk])
    admin_client.post(url, {"nonce": "n1"})
    (job,) = Job.objects.filter(schedule=schedule)
    assert enqueued == [{"job_id": job.id, "task": NOOP, "queue": "default", "attempt": 0, "token": 0}]
    admin_client.post(url, {"nonce": "n1"})  # the same form posted again: no new job, no event
    assert Job.objects.filter(schedule=schedule).count() == 1
    assert len(enqueued) == 1


def test_scheduler_sends_one_enqueued_event_per_occurrence(enqueued):
    start = datetime(2026, 7, 1, 9, 0, tzinfo=UTC)
    schedule = Schedule.objects.create(name="every-5", task=NOOP, cron="*/5 * * * *", timezone="UTC",
                                       catch_up="all", catch_up_limit=10, last_occurrence_at=start)
    service = SchedulerService(sync=False, process_id="test:scheduler")
    result = service.tick(now=start + timedelta(minutes=16))
    occurrences = [start + timedelta(minutes=m) for m in (5, 10, 15)]
    assert result.emitted == [(schedule.pk, o) for o in occurrences]
    jobs = {j.occurrence_at: j.id for j in Job.objects.filter(schedule=schedule)}
    assert enqueued == [{"job_id": jobs[o], "task": NOOP, "queue": "default", "attempt": 0, "token": 0,
                         "schedule": "every-5", "occurrence_at": o.isoformat()} for o in occurrences]
    # A second scheduler firing the same occurrences writes nothing and sends nothing.
    Schedule.objects.filter(pk=schedule.pk).update(last_occurrence_at=start, next_occurrence_at=occurrences[0])
    again = SchedulerService(sync=False, process_id="test:scheduler-2").tick(now=start + timedelta(minutes=16))
    assert again.duplicates == [(schedule.pk, o) for o in occurrences]
    assert len(enqueued) == 3
