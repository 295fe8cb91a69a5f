"""Helpers of the scheduler tests: schedules, and driving ``tick(now=...)`` step by step.

Every test starts with an empty ``LEASEQUEUE_SCHEDULES`` (the test project declares demo
schedules); tests about the setting set their own.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from django_leasequeue.models import Job, Schedule
from django_leasequeue.scheduler import SchedulerService, occurrence_key

NOOP = "invoices.tasks.noop"


@pytest.fixture(autouse=True)
def _no_settings_schedules(settings):
    settings.LEASEQUEUE_SCHEDULES = {}


def z(*args: int) -> datetime:
    """An aware UTC datetime ("Z" time)."""
    return datetime(*args, tzinfo=UTC)


def make_schedule(name: str = "s", cron: str = "* * * * *", **fields) -> Schedule:
    """Create a schedule of the noop task (through ``save()``, so it is validated)."""
    fields.setdefault("task", NOOP)
    return Schedule.objects.create(name=name, cron=cron, **fields)


def scheduler() -> SchedulerService:
    """A scheduler service that is not started (tests call ``tick``); no settings sync."""
    return SchedulerService(sync=False, process_id="test:scheduler")


def drive(service: SchedulerService, schedule: Schedule, start: datetime, end: datetime,
          step: timedelta) -> list[datetime]:
    """Tick at ``start + step``, ``start + 2 step``, ... up to ``end`` (included).

    Asserts on every tick: no error, nothing skipped (steps are shorter than the schedule's
    shortest interval), and the stored next occurrence is after the tick and never goes back (the
    loop always advances). Returns the occurrences emitted for ``schedule``, in order.
    """
    emitted: list[datetime] = []
    previous_next = None
    t = start
    while t < end:
        t = min(t + step, end)
        result = service.tick(now=t)
        assert result.errors == {}
        assert result.skipped == 0, f"skipped at {t}"
        emitted += [o for sid, o in result.emitted if sid == schedule.pk]
        schedule.refresh_from_db()
        assert schedule.next_occurrence_at > t
        assert previous_next is None or schedule.next_occurrence_at >= previous_next
        previous_next = schedule.next_occurrence_at
    return emitted


def jobs_of(schedule: Schedule) -> list[Job]:
    """The schedule's jobs, by occurrence."""
    return list(Job.objects.filter(schedule=schedule).order_by("occurrence_at"))


def assert_jobs_match(schedule: Schedule, expected: list[datetime]) -> None:
    """Exactly one job per expected occurrence: occurrence_at, run_at and unique key."""
    jobs = jobs_of(schedule)
    assert [j.occurrence_at for j in jobs] == expected
    assert [j.run_at for j in jobs] == expected
    assert [j.unique_key for j in jobs] == [occurrence_key(schedule.pk, o) for o in expected]
