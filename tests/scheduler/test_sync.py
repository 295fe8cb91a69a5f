"""LEASEQUEUE_SCHEDULES is synced into the table: settings own their schedules, admin ones are left
alone, removed ones are disabled, edits take effect from the next occurrence."""

from __future__ import annotations

import logging
import re
from datetime import timedelta

import pytest
from django.core.management import call_command

from django_leasequeue.models import Job, Schedule
from django_leasequeue.scheduler import sync_schedules

from .conftest import NOOP, make_schedule, scheduler, z

pytestmark = pytest.mark.django_db

T0 = z(2026, 5, 4, 10, 0, 30)
NIGHTLY = {"task": NOOP, "cron": "0 2 * * *", "timezone": "Europe/Berlin"}


def test_sync_creates_with_defaults_and_first_occurrence():
    result = sync_schedules({"nightly": NIGHTLY, "minutely": {"task": "invoices.tasks.flaky_sync", "cron": "* * * * *",
                                                              "args": ("x",), "queue": "q", "catch_up": "none"}},
                            now=T0)
    assert (result.created, result.updated, result.disabled) == (["minutely", "nightly"], [], [])
    nightly = Schedule.objects.get(name="nightly")
    assert (nightly.source, nightly.enabled, nightly.catch_up, nightly.catch_up_limit, nightly.queue,
            nightly.args, nightly.kwargs, nightly.priority) == ("settings", True, "latest", 10, "", [], {}, 0)
    assert nightly.next_occurrence_at == z(2026, 5, 5, 0)  # 02:00 CEST
    assert nightly.last_occurrence_at is None
    minutely = Schedule.objects.get(name="minutely")
    assert (minutely.args, minutely.queue, minutely.catch_up) == (["x"], "q", "none")
    assert minutely.next_occurrence_at == z(2026, 5, 4, 10, 1)


def test_priority_defaults_to_the_tasks():
    from django_leasequeue import task

    @task(name="tests.scheduler.urgent", priority=40)
    def urgent() -> None:
        """A task with its own priority."""

    sync_schedules({"u": {"task": "tests.scheduler.urgent", "cron": "* * * * *"},
                    "v": {"task": "tests.scheduler.urgent", "cron": "* * * * *", "priority": -3}}, now=T0)
    assert dict(Schedule.objects.values_list("name", "priority")) == {"u": 40, "v": -3}


def test_resync_is_idempotent_and_keeps_bookkeeping():
    sync_schedules({"nightly": NIGHTLY}, now=T0)
    scheduler().tick(now=z(2026, 5, 5, 0, 0, 1))
    before = Schedule.objects.get(name="nightly")
    assert before.last_occurrence_at == z(2026, 5, 5, 0)
    result = sync_schedules({"nightly": NIGHTLY}, now=z(2026, 5, 5, 1))
    assert (result.created, result.updated, result.unchanged) == ([], [], ["nightly"])
    after = Schedule.objects.get(name="nightly")
    assert (after.pk, after.last_occurrence_at, after.next_occurrence_at, after.updated_at) == (
        before.pk, before.last_occurrence_at, before.next_occurrence_at, before.updated_at)


def test_changed_cron_in_settings_takes_effect_from_the_next_occurrence():
    sync_schedules({"nightly": NIGHTLY}, now=T0)
    scheduler().tick(now=z(2026, 5, 5, 0, 0, 1))  # emitted 2026-05-05 00:00Z
    result = sync_schedules({"nightly": {**NIGHTLY, "cron": "0 * * * *"}}, now=z(2026, 5, 5, 6, 10))
    assert result.updated == ["nightly"]
    schedule = Schedule.objects.get(name="nightly")
    assert schedule.next_occurrence_at == z(2026, 5, 5, 7)  # 09:00 CEST, the first after the sync
    tick = scheduler().tick(now=z(2026, 5, 5, 7, 0, 1))
    assert tick.emitted == [(schedule.pk, z(2026, 5, 5, 7))] and tick.skipped == 0  # no back-fill


def test_changed_zone_in_settings_recomputes_next_occurrence():
    sync_schedules({"nightly": NIGHTLY}, now=T0)
    sync_schedules({"nightly": {**NIGHTLY, "timezone": "America/New_York"}}, now=T0 + timedelta(seconds=1))
    assert Schedule.objects.get(name="nightly").next_occurrence_at == z(2026, 5, 5, 6)  # 02:00 EDT


def test_other_changes_keep_the_next_occurrence():
    sync_schedules({"nightly": NIGHTLY}, now=T0)
    result = sync_schedules({"nightly": {**NIGHTLY, "args": [1], "priority": 9}}, now=z(2026, 5, 4, 23))
    assert result.updated == ["nightly"]
    schedule = Schedule.objects.get(name="nightly")
    assert (schedule.args, schedule.priority, schedule.next_occurrence_at) == ([1], 9, z(2026, 5, 5, 0))


def test_removed_from_settings_is_disabled_not_deleted_and_comes_back_forward():
    sync_schedules({"nightly": NIGHTLY}, now=T0)
    scheduler().tick(now=z(2026, 5, 5, 0, 0, 1))
    result = sync_schedules({}, now=z(2026, 5, 5, 12))
    assert result.disabled == ["nightly"]
    schedule = Schedule.objects.get(name="nightly")
    assert (schedule.enabled, schedule.next_occurrence_at) == (False, None)
    assert Job.objects.filter(schedule=schedule).count() == 1  # history kept
    assert scheduler().tick(now=z(2026, 5, 8)).emitted == []
    # Declared again three days later: same row, from the next occurrence, no catch-up of the gap.
    result = sync_schedules({"nightly": NIGHTLY}, now=z(2026, 5, 8, 12))
    assert result.updated == ["nightly"]
    schedule.refresh_from_db()
    assert (schedule.enabled, schedule.next_occurrence_at) == (True, z(2026, 5, 9, 0))
    tick = scheduler().tick(now=z(2026, 5, 9, 0, 0, 1))
    assert tick.emitted == [(schedule.pk, z(2026, 5, 9, 0))] and tick.skipped == 0


def test_disabled_in_settings():
    sync_schedules({"nightly": NIGHTLY}, now=T0)
    sync_schedules({"nightly": {**NIGHTLY, "enabled": False}}, now=T0)
    schedule = Schedule.objects.get(name="nightly")
    assert (schedule.enabled, schedule.next_occurrence_at, schedule.source) == (False, None, "settings")


def test_admin_schedules_are_left_alone():
    make_schedule("reports", cron="0 8 * * 1")
    sync_schedules({"nightly": NIGHTLY}, now=T0)
    sync_schedules({}, now=T0)
    admin_after = Schedule.objects.get(name="reports")
    assert (admin_after.source, admin_after.enabled, admin_after.cron) == ("admin", True, "0 8 * * 1")


def test_settings_win_over_an_admin_schedule_of_the_same_name(caplog):
    admin = make_schedule("nightly", cron="0 5 * * *", last_occurrence_at=z(2026, 5, 4, 5))
    with caplog.at_level(logging.WARNING, logger="django_leasequeue.scheduler"):
        result = sync_schedules({"nightly": NIGHTLY}, now=T0)
    assert result.taken_over == ["nightly"] and result.updated == ["nightly"]
    assert "'nightly'" in caplog.text and "settings win" in caplog.text
    schedule = Schedule.objects.get(name="nightly")
    assert (schedule.pk, schedule.source, schedule.cron, schedule.timezone) == (
        admin.pk, "settings", "0 2 * * *", "Europe/Berlin")
    assert schedule.last_occurrence_at == z(2026, 5, 4, 5)  # kept: nothing is emitted twice
    assert schedule.next_occurrence_at == z(2026, 5, 5, 0)


def test_syncschedules_command(settings, capsys):
    settings.LEASEQUEUE_SCHEDULES = {"nightly": NIGHTLY}
    call_command("syncschedules")
    assert "created: nightly" in capsys.readouterr().out
    call_command("syncschedules")
    assert "unchanged: nightly" in capsys.readouterr().out
    call_command("syncschedules", "--check")
    assert "1 valid schedule(s)" in capsys.readouterr().out
    settings.LEASEQUEUE_SCHEDULES = {}
    call_command("syncschedules")
    assert "disabled: nightly" in capsys.readouterr().out


def test_runscheduler_once_syncs_and_ticks(settings, capsys):
    settings.LEASEQUEUE_SCHEDULES = {"nightly": NIGHTLY}
    call_command("runscheduler", "--once")
    out = capsys.readouterr().out
    assert "emitted 0 job(s)" in out and "0 error(s)" in out
    assert Schedule.objects.get(name="nightly").source == "settings"
    from django_leasequeue.models import WorkerProcess

    assert not WorkerProcess.objects.exists()  # a one-shot run leaves no process row behind
    assert "next occurrence: nightly @ " in out


def test_runscheduler_once_reports_what_it_emitted_and_the_next_occurrence(capsys):
    from django_leasequeue import store
    from django_leasequeue.models import WorkerProcess

    # Due: the occurrence at the last minute boundary (a cron instant), the one before it emitted.
    due_at = store.db_now().replace(second=0, microsecond=0)
    due = Schedule.objects.create(name="minutely", task=NOOP, cron="* * * * *")
    Schedule.objects.filter(pk=due.pk).update(last_occurrence_at=due_at - timedelta(minutes=1),
                                              next_occurrence_at=due_at)
    Schedule.objects.create(name="off", task=NOOP, cron="* * * * *", enabled=False)
    call_command("runscheduler", "--once", "--no-sync")
    lines = capsys.readouterr().out.splitlines()
    (job,) = Job.objects.all()
    # (skipped 1 only if a minute boundary passed since due_at was read: catch_up "latest")
    assert re.search(r": 1 enabled schedule\(s\), 1 due, emitted 1 job\(s\), 0 already emitted, skipped [01] "
                     r"occurrence\(s\), 0 error\(s\)$", lines[0]), lines[0]
    assert lines[1] == f"  emitted minutely @ {job.occurrence_at.isoformat()}"
    nxt = Schedule.objects.get(pk=due.pk).next_occurrence_at
    assert lines[2].startswith(f"next occurrence: minutely @ {nxt.isoformat()} (in ")
    assert len(lines) == 3 and not WorkerProcess.objects.exists()
    Schedule.objects.filter(pk=due.pk).update(enabled=False)
    call_command("runscheduler", "--once", "--no-sync")
    assert capsys.readouterr().out.splitlines()[1:] == ["next occurrence: none (no enabled schedule)"]


def test_runscheduler_once_deregisters_even_when_the_tick_fails(monkeypatch):
    from django_leasequeue.models import WorkerProcess
    from django_leasequeue.scheduler import SchedulerService

    def broken_tick(self, now=None):
        assert WorkerProcess.objects.filter(kind="scheduler").count() == 1  # registered while it ticks
        raise RuntimeError("tick failed")

    monkeypatch.setattr(SchedulerService, "tick", broken_tick)
    with pytest.raises(RuntimeError, match="tick failed"):
        call_command("runscheduler", "--once", "--no-sync")
    assert not WorkerProcess.objects.exists()
