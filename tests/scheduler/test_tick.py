"""The scheduler tick driven at chosen instants: DST, catch-up, edits, restarts (cases C17, C19-C21).

These run on top of the cron unit tests (tests/leaves/test_cron.py): they check what the scheduler
stores and emits (jobs, unique keys, next occurrences), tick by tick, with the expected UTC
occurrences written out.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from zoneinfo import ZoneInfo

import pytest

from django_leasequeue import store
from django_leasequeue.models import Job, Schedule, WorkerProcess
from django_leasequeue.scheduler import SchedulerService, occurrence_key

from .conftest import assert_jobs_match, drive, jobs_of, make_schedule, scheduler, z

pytestmark = pytest.mark.django_db

BERLIN = "Europe/Berlin"
NEW_YORK = "America/New_York"
MIN = timedelta(minutes=1)

# --------------------------------------------------------------------------------------------------
# DST: Europe/Berlin and America/New_York, spring and autumn, daily and hourly

DST_CASES = [
    # Berlin spring 2026-03-29: 02:00 CET -> 03:00 CEST at 01:00Z. The nonexistent 02:30 fires at
    # the transition instant (03:00 CEST), once.
    pytest.param("30 2 * * *", BERLIN, z(2026, 3, 28), z(2026, 3, 31), 30 * MIN,
                 [z(2026, 3, 28, 1, 30), z(2026, 3, 29, 1, 0), z(2026, 3, 30, 0, 30)], id="berlin-spring-daily"),
    # Hourly: local 01:00 CET (00Z) is followed by 03:00 CEST (01Z); one job per real hour, no gap.
    pytest.param("0 * * * *", BERLIN, z(2026, 3, 28, 22), z(2026, 3, 29, 4), 5 * MIN,
                 [z(2026, 3, 28, 23), z(2026, 3, 29, 0), z(2026, 3, 29, 1), z(2026, 3, 29, 2), z(2026, 3, 29, 3),
                  z(2026, 3, 29, 4)], id="berlin-spring-hourly"),
    # Berlin autumn 2026-10-25: 03:00 CEST -> 02:00 CET at 01:00Z. 02:30 happens twice; the daily
    # schedule fires at the first (00:30Z) only.
    pytest.param("30 2 * * *", BERLIN, z(2026, 10, 24), z(2026, 10, 27), 30 * MIN,
                 [z(2026, 10, 24, 0, 30), z(2026, 10, 25, 0, 30), z(2026, 10, 26, 1, 30)], id="berlin-autumn-daily"),
    # Hourly: local 02:00 twice (00Z CEST and 01Z CET), each once, distinct keys.
    pytest.param("0 * * * *", BERLIN, z(2026, 10, 24, 22), z(2026, 10, 25, 4), 5 * MIN,
                 [z(2026, 10, 24, 23), z(2026, 10, 25, 0), z(2026, 10, 25, 1), z(2026, 10, 25, 2),
                  z(2026, 10, 25, 3), z(2026, 10, 25, 4)], id="berlin-autumn-hourly"),
    # New York spring 2026-03-08: 02:00 EST -> 03:00 EDT at 07:00Z.
    pytest.param("30 2 * * *", NEW_YORK, z(2026, 3, 7), z(2026, 3, 10), 30 * MIN,
                 [z(2026, 3, 7, 7, 30), z(2026, 3, 8, 7, 0), z(2026, 3, 9, 6, 30)], id="newyork-spring-daily"),
    pytest.param("0 * * * *", NEW_YORK, z(2026, 3, 8, 4), z(2026, 3, 8, 10), 5 * MIN,
                 [z(2026, 3, 8, 5), z(2026, 3, 8, 6), z(2026, 3, 8, 7), z(2026, 3, 8, 8), z(2026, 3, 8, 9),
                  z(2026, 3, 8, 10)], id="newyork-spring-hourly"),
    # New York autumn 2026-11-01: 02:00 EDT -> 01:00 EST at 06:00Z. 01:30 twice: first one only.
    pytest.param("30 1 * * *", NEW_YORK, z(2026, 10, 31), z(2026, 11, 3), 30 * MIN,
                 [z(2026, 10, 31, 5, 30), z(2026, 11, 1, 5, 30), z(2026, 11, 2, 6, 30)], id="newyork-autumn-daily"),
    pytest.param("0 * * * *", NEW_YORK, z(2026, 11, 1, 3), z(2026, 11, 1, 8), 5 * MIN,
                 [z(2026, 11, 1, 4), z(2026, 11, 1, 5), z(2026, 11, 1, 6), z(2026, 11, 1, 7), z(2026, 11, 1, 8)],
                 id="newyork-autumn-hourly"),
]


@pytest.mark.parametrize(("expr", "zone", "start", "end", "step", "expected"), DST_CASES)
def test_dst_transitions_emit_expected_utc_occurrences(expr, zone, start, end, step, expected):
    schedule = make_schedule(cron=expr, timezone=zone, last_occurrence_at=start)
    emitted = drive(scheduler(), schedule, start, end, step)
    assert emitted == expected
    assert_jobs_match(schedule, expected)
    schedule.refresh_from_db()
    assert schedule.last_occurrence_at == expected[-1]
    assert schedule.skipped_occurrences == 0


def test_c19_dst_fall_back_new_york():
    """C19: 2026-11-01 04:00Z-08:00Z in America/New_York: fixed time once, wildcard hours per real hour."""
    start, end = z(2026, 11, 1, 4), z(2026, 11, 1, 8)
    daily = make_schedule("daily", "30 1 * * *", timezone=NEW_YORK, last_occurrence_at=start)
    hourly = make_schedule("hourly", "0 * * * *", timezone=NEW_YORK, last_occurrence_at=start)
    quarter = make_schedule("quarter", "*/15 * * * *", timezone=NEW_YORK, last_occurrence_at=start)
    service = scheduler()
    drive(service, quarter, start, end, 5 * MIN)  # one pass ticks all three schedules

    # Daily 01:30: exactly one job, at the first 01:30 (EDT).
    assert_jobs_match(daily, [z(2026, 11, 1, 5, 30)])
    # Hourly: both local 01:00 (05:00Z EDT, 06:00Z EST), each once, with distinct keys.
    assert_jobs_match(hourly, [z(2026, 11, 1, 5), z(2026, 11, 1, 6), z(2026, 11, 1, 7), z(2026, 11, 1, 8)])
    assert len({j.unique_key for j in jobs_of(hourly)}) == 4
    # Quarter-hourly: one job per real 15 minutes, no duplicate, no gap.
    expected = [start + 15 * MIN * i for i in range(1, 17)]
    assert_jobs_match(quarter, expected)


def test_c20_dst_spring_forward_berlin():
    """C20: Europe/Berlin 2026-03-29 (02:00 -> 03:00): no double, no lost day, no stuck loop."""
    start, end = z(2026, 3, 28, 18), z(2026, 3, 30, 23)
    s0230 = make_schedule("0230", "30 2 * * *", timezone=BERLIN, last_occurrence_at=start)
    s0000 = make_schedule("0000", "0 0 * * *", timezone=BERLIN, last_occurrence_at=start)
    s1400 = make_schedule("1400", "0 14 * * *", timezone=BERLIN, last_occurrence_at=start)
    s2h = make_schedule("2h", "0 */2 * * *", timezone=BERLIN, last_occurrence_at=start)
    service = scheduler()
    slowest = 0.0
    t = start
    while t < end:
        t += 30 * MIN
        began = time.perf_counter()
        result = service.tick(now=t)
        slowest = max(slowest, time.perf_counter() - began)
        assert result.errors == {} and result.skipped == 0
    assert slowest < 1.0  # never a stuck loop

    # 02:30 does not exist on 03-29: one job at the transition (03:00 CEST = 01:00Z), then 02:30 CEST.
    assert_jobs_match(s0230, [z(2026, 3, 29, 1), z(2026, 3, 30, 0, 30)])
    # Midnight fires on 03-29 (CET), on 03-30 and 03-31 (CEST).
    assert_jobs_match(s0000, [z(2026, 3, 28, 23), z(2026, 3, 29, 22), z(2026, 3, 30, 22)])
    # 14:00 CEST on the day of the change is 12:00Z.
    assert_jobs_match(s1400, [z(2026, 3, 29, 12), z(2026, 3, 30, 12)])
    # Every two local hours: the nonexistent 02:00 is dropped; strictly increasing occurrences.
    two_hourly = [j.occurrence_at for j in jobs_of(s2h)]
    assert two_hourly[:5] == [z(2026, 3, 28, 19), z(2026, 3, 28, 21), z(2026, 3, 28, 23), z(2026, 3, 29, 2),
                              z(2026, 3, 29, 4)]
    assert all(a < b for a, b in zip(two_hourly, two_hourly[1:], strict=False))


def test_per_second_schedule_six_fields():
    # The sixth field is seconds, LAST (croniter's default): every 20 seconds.
    schedule = make_schedule(cron="* * * * * */20", last_occurrence_at=z(2026, 5, 1, 12))
    emitted = drive(scheduler(), schedule, z(2026, 5, 1, 12), z(2026, 5, 1, 12, 1), timedelta(seconds=5))
    assert emitted == [z(2026, 5, 1, 12, 0, 20), z(2026, 5, 1, 12, 0, 40), z(2026, 5, 1, 12, 1)]


# --------------------------------------------------------------------------------------------------
# Catch-up after a simulated 3-day outage


@pytest.mark.parametrize(("policy", "limit", "emitted", "skipped"), [
    ("latest", 10, [z(2026, 3, 5, 0)], 71),
    ("all", 10, [z(2026, 3, 4, 15) + timedelta(hours=i) for i in range(10)], 62),
    ("all", 100, [z(2026, 3, 2, 1) + timedelta(hours=i) for i in range(72)], 0),
    ("none", 10, [], 72),
])
def test_catch_up_after_three_day_outage(policy, limit, emitted, skipped):
    """Hourly schedule; the scheduler is down from 2026-03-02 00:00:30Z to 2026-03-05 00:30Z, so
    72 occurrences (03-02 01:00Z .. 03-05 00:00Z) were missed."""
    schedule = make_schedule(cron="0 * * * *", timezone="UTC", catch_up=policy, catch_up_limit=limit,
                             last_occurrence_at=z(2026, 3, 1, 23))
    service = scheduler()
    first = service.tick(now=z(2026, 3, 2, 0, 0, 30))
    assert first.emitted == [(schedule.pk, z(2026, 3, 2, 0))]

    back = SchedulerService(sync=False, process_id="test:after-outage")  # a new process
    result = back.tick(now=z(2026, 3, 5, 0, 30))
    assert [o for _, o in result.emitted] == emitted
    assert result.skipped == skipped
    schedule.refresh_from_db()
    assert schedule.skipped_occurrences == skipped
    assert schedule.next_occurrence_at == z(2026, 3, 5, 1)  # the next future occurrence
    assert schedule.last_occurrence_at == (emitted[-1] if emitted else z(2026, 3, 2, 0))
    assert_jobs_match(schedule, [z(2026, 3, 2, 0), *emitted])
    # Back to normal: the next tick emits nothing until the next occurrence, then exactly it.
    assert back.tick(now=z(2026, 3, 5, 0, 59, 59)).emitted == []
    assert back.tick(now=z(2026, 3, 5, 1, 0, 1)).emitted == [(schedule.pk, z(2026, 3, 5, 1))]


def test_c17_three_hour_outage_per_minute_schedule_emits_at_most_one_job():
    """C17(1): a per-minute schedule last fired 3 h ago: one catch-up job, not ~180."""
    now = z(2026, 6, 1, 12, 0, 30)
    schedule = make_schedule(cron="* * * * *", last_occurrence_at=now - timedelta(hours=3, seconds=30),
                             next_occurrence_at=now - timedelta(hours=3, seconds=30) + MIN)
    result = scheduler().tick(now=now)
    assert result.emitted == [(schedule.pk, z(2026, 6, 1, 12, 0))]
    assert result.skipped == 179
    schedule.refresh_from_db()
    assert schedule.next_occurrence_at == z(2026, 6, 1, 12, 1)
    assert schedule.next_occurrence_at > now
    assert Job.objects.filter(schedule=schedule).count() == 1


def test_c17_time_zone_change_recomputes_next_occurrence_forward_without_burst():
    """C17(2): a daily schedule's zone changed from UTC to America/New_York in the admin."""
    service = scheduler()
    now = store.db_now()
    schedule = make_schedule(cron="0 9 * * *", timezone="UTC")
    created_next = schedule.next_occurrence_at
    assert now < created_next <= now + timedelta(days=1)
    # Say it has been firing every day: the last occurrence was today's (or yesterday's) 09:00Z.
    Schedule.objects.filter(pk=schedule.pk).update(last_occurrence_at=created_next - timedelta(days=1))
    schedule.refresh_from_db()

    schedule.timezone = NEW_YORK
    schedule.full_clean()  # what the admin form does
    schedule.save()
    edited_at = store.db_now()
    schedule.refresh_from_db()
    # Recomputed forward: the first 09:00 New York time after the edit.
    local = schedule.next_occurrence_at.astimezone(ZoneInfo(NEW_YORK))
    assert (local.hour, local.minute) == (9, 0)
    assert edited_at < schedule.next_occurrence_at <= edited_at + timedelta(days=1)
    assert schedule.last_occurrence_at == created_next - timedelta(days=1)  # kept
    # No burst: ticks up to just before the new next occurrence emit nothing.
    assert service.tick().emitted == []
    assert service.tick(now=schedule.next_occurrence_at - timedelta(seconds=1)).emitted == []
    assert service.tick(now=schedule.next_occurrence_at).emitted == [(schedule.pk, schedule.next_occurrence_at)]
    assert Job.objects.filter(schedule=schedule).count() == 1


def test_c21_project_time_zone_and_restart_keep_next_occurrence(settings):
    """C21(3): TIME_ZONE="Europe/London", schedule in the project zone (blank timezone), a date in
    BST: 09:00 local is 08:00Z; a new scheduler process computes the same next occurrence."""
    settings.TIME_ZONE = "Europe/London"
    schedule = make_schedule(cron="0 9 * * *", timezone="", last_occurrence_at=z(2026, 6, 30, 8))
    first = scheduler()
    assert first.tick(now=z(2026, 6, 30, 12)).emitted == []
    schedule.refresh_from_db()
    assert schedule.next_occurrence_at == z(2026, 7, 1, 8)  # 09:00 BST
    restarted = SchedulerService(sync=False, process_id="test:restarted")
    assert restarted.tick(now=z(2026, 6, 30, 12, 0, 5)).emitted == []
    schedule.refresh_from_db()
    assert schedule.next_occurrence_at == z(2026, 7, 1, 8)
    assert restarted.tick(now=z(2026, 7, 1, 8, 0, 0, 500000)).emitted == [(schedule.pk, z(2026, 7, 1, 8))]


def test_naive_now_is_refused():
    with pytest.raises(ValueError, match="naive"):
        scheduler().tick(now=z(2026, 1, 1).replace(tzinfo=None))


# --------------------------------------------------------------------------------------------------
# Restart, edit, disable, delete


def test_restart_between_two_occurrences_loses_none_and_repeats_none():
    schedule = make_schedule(cron="*/10 * * * *", last_occurrence_at=z(2026, 4, 1, 9, 55))
    a = SchedulerService(sync=False, process_id="test:a")
    assert a.tick(now=z(2026, 4, 1, 10, 0, 1)).emitted == [(schedule.pk, z(2026, 4, 1, 10, 0))]
    assert a.tick(now=z(2026, 4, 1, 10, 3)).emitted == []
    del a  # the scheduler stops between 10:00 and 10:10; all its state is in the table
    b = SchedulerService(sync=False, process_id="test:b")
    assert b.tick(now=z(2026, 4, 1, 10, 7)).emitted == []  # 10:00 is not repeated
    assert b.tick(now=z(2026, 4, 1, 10, 10, 2)).emitted == [(schedule.pk, z(2026, 4, 1, 10, 10))]  # 10:10 not lost
    assert b.tick(now=z(2026, 4, 1, 10, 20)).emitted == [(schedule.pk, z(2026, 4, 1, 10, 20))]
    assert_jobs_match(schedule, [z(2026, 4, 1, 10, 0), z(2026, 4, 1, 10, 10), z(2026, 4, 1, 10, 20)])


def test_emitted_job_fields():
    schedule = make_schedule(cron="0 * * * *", task="invoices.tasks.flaky_sync", args=["nightly"],
                             kwargs={"failures": 0}, queue="reports", priority=7,
                             last_occurrence_at=z(2026, 2, 1, 9))
    result = scheduler().tick(now=z(2026, 2, 1, 10, 0, 3))
    assert result.emitted == [(schedule.pk, z(2026, 2, 1, 10))]
    (job,) = jobs_of(schedule)
    assert (job.task, job.args, job.kwargs, job.queue, job.priority, job.status) == (
        "invoices.tasks.flaky_sync", ["nightly"], {"failures": 0}, "reports", 7, "ready")
    assert job.max_attempts == 4  # the task's own option
    assert job.unique_key == f"leasequeue:schedule:{schedule.pk}:2026-02-01T10:00:00Z"
    assert job.unique_key == occurrence_key(schedule.pk, z(2026, 2, 1, 10))
    assert job.unique_scope == "retained"
    assert job.occurrence_at == job.run_at == z(2026, 2, 1, 10)  # the cron instant, not the tick's time


def test_queue_defaults_to_task_queue():
    schedule = make_schedule(cron="0 * * * *", last_occurrence_at=z(2026, 2, 1, 9))
    scheduler().tick(now=z(2026, 2, 1, 10))
    assert jobs_of(schedule)[0].queue == "default"


def test_cron_edit_takes_effect_from_next_occurrence():
    service = scheduler()
    schedule = make_schedule(cron="0 3 * * *")  # daily at 03:00 UTC, next computed at creation
    now = store.db_now()
    schedule.cron = "* * * * *"
    schedule.save()
    schedule.refresh_from_db()
    # The first minute after the save, not a back-fill since the last occurrence.
    assert now < schedule.next_occurrence_at <= store.db_now() + MIN
    assert schedule.next_occurrence_at.second == 0
    result = service.tick(now=schedule.next_occurrence_at + timedelta(seconds=1))
    assert result.emitted == [(schedule.pk, schedule.next_occurrence_at)] and result.skipped == 0


def test_disabling_stops_emission_and_reenabling_does_not_back_fill():
    service = scheduler()
    schedule = make_schedule(cron="* * * * *")
    first = schedule.next_occurrence_at
    assert service.tick(now=first).emitted == [(schedule.pk, first)]
    schedule.refresh_from_db()
    schedule.enabled = False
    schedule.save()
    schedule.refresh_from_db()
    assert schedule.next_occurrence_at is None
    assert service.tick(now=first + 10 * MIN).emitted == []
    assert Job.objects.filter(schedule=schedule).count() == 1
    # Re-enabled: from the next occurrence after the save (database time), nothing for the pause.
    schedule.enabled = True
    schedule.save()
    schedule.refresh_from_db()
    resumed = schedule.next_occurrence_at
    assert resumed >= first
    # (The first occurrence after the save can be ``first`` itself, already emitted above because
    # this test ran the scheduler ahead of the real clock: the unique bookkeeping skips it.)
    result = service.tick(now=resumed + MIN)
    assert [o for _, o in result.emitted] == [resumed + MIN]
    assert result.skipped == (0 if resumed == first else 1)
    assert [j.occurrence_at for j in jobs_of(schedule)] == [first, resumed + MIN]


def test_deleting_a_schedule_keeps_its_jobs():
    schedule = make_schedule(cron="0 * * * *", last_occurrence_at=z(2026, 2, 1, 9))
    scheduler().tick(now=z(2026, 2, 1, 11))
    (job,) = jobs_of(schedule)
    schedule.delete()
    job.refresh_from_db()
    assert (job.schedule_id, job.occurrence_at, job.status) == (None, z(2026, 2, 1, 11), "ready")


def test_stale_form_save_does_not_rewind_the_scheduler():
    """An admin form loaded before the scheduler advanced saves an unrelated field: the schedule's
    last/next occurrence stay where the scheduler put them."""
    service = scheduler()
    schedule = make_schedule(cron="0 * * * *", last_occurrence_at=z(2026, 2, 1, 9))
    stale = Schedule.objects.get(pk=schedule.pk)
    service.tick(now=z(2026, 2, 1, 10, 0, 1))
    stale.priority = 5
    stale.save()
    schedule.refresh_from_db()
    assert (schedule.last_occurrence_at, schedule.next_occurrence_at, schedule.priority) == (
        z(2026, 2, 1, 10), z(2026, 2, 1, 11), 5)
    assert service.tick(now=z(2026, 2, 1, 10, 0, 2)).emitted == []


# --------------------------------------------------------------------------------------------------
# Broken schedules


def test_unregistered_task_at_tick_is_emitted_and_warned_once(caplog):
    """A schedule whose task disappeared from the code (saved while it existed): the job is emitted
    anyway (a worker dead-letters it with the reason), with one WARNING per scheduler process."""
    schedule = make_schedule(cron="0 * * * *", last_occurrence_at=z(2026, 2, 1, 9))
    Schedule.objects.filter(pk=schedule.pk).update(task="gone.tasks.removed")
    service = scheduler()
    with caplog.at_level(logging.DEBUG, logger="django_leasequeue"):
        service.tick(now=z(2026, 2, 1, 10))
        service.tick(now=z(2026, 2, 1, 11))
    assert [j.task for j in jobs_of(schedule)] == ["gone.tasks.removed"] * 2
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "gone.tasks.removed" in warnings[0].getMessage()


def test_schedule_whose_arguments_no_longer_fit_the_task_is_still_emitted():
    """enqueue() refuses arguments that do not bind to the handler; the scheduler does not check:
    its signature may be older than the workers' (a rolling deploy), as for unknown tasks."""
    schedule = make_schedule(cron="0 * * * *", last_occurrence_at=z(2026, 2, 1, 9), args=[1, 2])  # noop()
    scheduler().tick(now=z(2026, 2, 1, 10))
    assert [j.args for j in jobs_of(schedule)] == [[1, 2]]


def test_broken_schedule_is_reported_once_and_does_not_stop_others(caplog):
    good = make_schedule("good", cron="0 * * * *", last_occurrence_at=z(2026, 2, 1, 9))
    bad = make_schedule("bad", cron="0 * * * *", last_occurrence_at=z(2026, 2, 1, 9))
    Schedule.objects.filter(pk=bad.pk).update(cron="99 * * * *")  # written past validation
    service = scheduler()
    with caplog.at_level(logging.DEBUG, logger="django_leasequeue"):
        first = service.tick(now=z(2026, 2, 1, 10))
        second = service.tick(now=z(2026, 2, 1, 11))
    assert first.emitted == [(good.pk, z(2026, 2, 1, 10))] and second.emitted == [(good.pk, z(2026, 2, 1, 11))]
    assert set(first.errors) == {bad.pk} and "99 * * * *" in first.errors[bad.pk]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "'bad'" in errors[0].getMessage()
    assert first.next_due == z(2026, 2, 1, 11)  # the broken one does not make the loop spin
    # Fixed: it resumes under its catch-up policy.
    Schedule.objects.filter(pk=bad.pk).update(cron="0 * * * *")
    assert service.tick(now=z(2026, 2, 1, 11, 0, 1)).emitted == [(bad.pk, z(2026, 2, 1, 11))]


def test_run_once_records_the_tick_and_waits_until_the_next_occurrence():
    service = SchedulerService(sync=False, process_id="test:run-once", interval=30)
    service.register()
    schedule = make_schedule(cron="* * * * * *")  # every second
    wait = service.run_once()
    assert 0.05 <= wait <= 1.01
    row = WorkerProcess.objects.get(pk="test:run-once")
    assert row.kind == "scheduler" and row.last_tick_at is not None
    assert schedule.pk  # created before the tick
    service.on_stop()
    assert not WorkerProcess.objects.filter(pk="test:run-once").exists()


def test_cron_edit_never_recomputes_an_occurrence_already_emitted():
    """The scheduler ran ahead of the database clock (``tick(now=...)``, or a scheduler host whose
    clock is ahead) and emitted the next full hour H. A cron edit to every 30 minutes recomputes
    the next occurrence after the later of now and H: H + 30 min, never H itself (already emitted;
    emitted again once its finished job is pruned) or H - 30 min (behind it)."""
    service = scheduler()
    schedule = make_schedule(cron="0 * * * *")
    hour = schedule.next_occurrence_at
    assert service.tick(now=hour + timedelta(seconds=1)).emitted == [(schedule.pk, hour)]
    schedule.refresh_from_db()
    schedule.cron = "*/30 * * * *"
    schedule.save()
    schedule.refresh_from_db()
    assert schedule.last_occurrence_at == hour
    assert schedule.next_occurrence_at == hour + timedelta(minutes=30)
    Job.objects.filter(schedule=schedule).delete()  # pruned
    assert service.tick(now=hour + timedelta(seconds=2)).emitted == []
