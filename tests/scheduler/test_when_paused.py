"""A schedule whose target queue is paused: ``when_paused`` decides what its occurrences become.

The scheduler is driven through N minutely occurrences with an injected ``now`` while the queue is
paused, then the queue is resumed and drained: ``latest`` leaves one pending job (the latest
occurrence, the older ones cancelled as coalesced) and one run, ``skip`` emits nothing and runs
nothing, ``all`` keeps every job and runs them all. The schedule's counters and ``paused_log``
record every skipped or coalesced occurrence.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from django_leasequeue import store
from django_leasequeue.exceptions import ConfigurationError
from django_leasequeue.models import PAUSED_LOG_SIZE, Job, Schedule
from django_leasequeue.scheduler import load_settings_schedules, occurrence_key, sync_schedules
from django_leasequeue.testing import drain

from .conftest import NOOP, jobs_of, make_schedule, scheduler, z

pytestmark = pytest.mark.django_db

MIN = timedelta(minutes=1)
START = z(2026, 7, 1, 9, 0)
QUEUE = "reports"
N = 10


def tick_minutes(service, minutes, start=START):
    """Tick 5 s after each of the given minutes past ``start``; every tick must be clean."""
    results = [service.tick(now=start + m * MIN + timedelta(seconds=5)) for m in minutes]
    assert all(r.errors == {} and r.skipped == 0 for r in results)
    return results


def occurrences(count, start=START):
    return [start + m * MIN for m in range(1, count + 1)]


def paused_schedule(**fields):
    schedule = make_schedule(cron="* * * * *", queue=QUEUE, last_occurrence_at=START, **fields)
    assert store.queue_pause(QUEUE)
    return schedule


def test_latest_is_the_default_and_keeps_one_pending_job():
    """The default policy: N occurrences into a paused queue leave exactly one ready job, the
    latest occurrence's; the N-1 older ones are cancelled as coalesced (each keeps its occurrence's
    unique key, so none is emitted twice) and recorded; after the resume exactly one job runs."""
    schedule = paused_schedule()
    assert schedule.when_paused == "latest"
    results = tick_minutes(scheduler(), range(1, N + 1))
    expected = occurrences(N)
    jobs = jobs_of(schedule)
    assert [(j.occurrence_at, j.status) for j in jobs] == [(o, "cancelled") for o in expected[:-1]] + [
        (expected[-1], "ready")]
    assert [j.unique_key for j in jobs] == [occurrence_key(schedule.pk, o) for o in expected]
    assert [j.queue for j in jobs] == [QUEUE] * N
    # Each tick emitted its occurrence and coalesced the previous one (none on the first tick).
    assert [r.emitted for r in results] == [[(schedule.pk, o)] for o in expected]
    assert [r.coalesced for r in results] == [[]] + [[(schedule.pk, o)] for o in expected[:-1]]
    for job, kept in zip(jobs[:-1], expected[1:], strict=True):
        (entry,) = job.history
        assert (entry["event"], entry["by"], entry["kept_occurrence"]) == ("coalesced", "scheduler",
                                                                             kept.isoformat())
        assert job.finished_at == kept + timedelta(seconds=5)
    schedule.refresh_from_db()
    assert (schedule.paused_coalesced, schedule.paused_skipped) == (N - 1, 0)
    assert schedule.last_occurrence_at == expected[-1]
    assert [(e["occurrence"], e["action"], e["queue"], e["job"]) for e in schedule.paused_log] == [
        (o.isoformat(), "coalesced", QUEUE, j.pk) for o, j in zip(expected[:-1], jobs[:-1], strict=True)]

    assert store.queue_resume(QUEUE)
    result = drain([QUEUE])
    assert [run.job_id for run in result.runs] == [jobs[-1].pk]
    assert Job.objects.filter(schedule=schedule, status="done").count() == 1
    assert Job.objects.filter(schedule=schedule, status="cancelled").count() == N - 1


def test_skip_emits_nothing_while_paused_and_resumes_on_the_next_occurrence():
    schedule = paused_schedule(when_paused="skip")
    results = tick_minutes(scheduler(), range(1, N + 1))
    expected = occurrences(N)
    assert jobs_of(schedule) == []
    assert [r.paused_skipped for r in results] == [[(schedule.pk, o)] for o in expected]
    assert all(r.emitted == [] for r in results)
    schedule.refresh_from_db()
    assert (schedule.paused_skipped, schedule.paused_coalesced, schedule.skipped_occurrences) == (N, 0, 0)
    assert schedule.last_occurrence_at == START  # nothing was emitted
    assert schedule.next_occurrence_at == START + (N + 1) * MIN
    assert [(e["occurrence"], e["action"], e["job"], e["kept"]) for e in schedule.paused_log] == [
        (o.isoformat(), "skipped", None, None) for o in expected]

    assert store.queue_resume(QUEUE)
    assert drain([QUEUE]).runs == []
    # The next occurrence after the resume is emitted as usual, and runs.
    tick_minutes(scheduler(), [N + 1])
    (job,) = jobs_of(schedule)
    assert (job.occurrence_at, job.status) == (START + (N + 1) * MIN, "ready")
    assert [run.job_id for run in drain([QUEUE]).runs] == [job.pk]
    schedule.refresh_from_db()
    assert schedule.paused_skipped == N


def test_all_keeps_every_occurrence():
    schedule = paused_schedule(when_paused="all")
    tick_minutes(scheduler(), range(1, N + 1))
    jobs = jobs_of(schedule)
    assert [(j.occurrence_at, j.status) for j in jobs] == [(o, "ready") for o in occurrences(N)]
    schedule.refresh_from_db()
    assert (schedule.paused_skipped, schedule.paused_coalesced, schedule.paused_log) == (0, 0, [])
    assert store.queue_resume(QUEUE)
    assert sorted(run.job_id for run in drain([QUEUE]).runs) == [j.pk for j in jobs]


def test_a_running_queue_is_untouched_by_the_policy():
    """Only the paused queue counts: the same policies on a running queue emit every occurrence."""
    schedules = [make_schedule(f"s-{p}", queue="other", last_occurrence_at=START, when_paused=p)
                 for p in ("latest", "skip", "all")]
    store.queue_pause(QUEUE)
    tick_minutes(scheduler(), range(1, 4))
    for s in schedules:
        assert [(j.occurrence_at, j.status) for j in jobs_of(s)] == [(o, "ready") for o in occurrences(3)]
        s.refresh_from_db()
        assert (s.paused_skipped, s.paused_coalesced, s.paused_log) == (0, 0, [])


def test_latest_catch_up_in_one_tick_inserts_only_the_newest():
    """A scheduler that comes back with 5 occurrences due (catch_up="all") into a paused queue
    inserts only the newest; the 4 others are recorded as coalesced without a job."""
    schedule = paused_schedule(catch_up="all")
    (result,) = tick_minutes(scheduler(), [5])
    expected = occurrences(5)
    (job,) = jobs_of(schedule)
    assert (job.occurrence_at, job.status) == (expected[-1], "ready")
    assert result.emitted == [(schedule.pk, expected[-1])]
    assert result.coalesced == [(schedule.pk, o) for o in expected[:-1]]
    schedule.refresh_from_db()
    assert schedule.paused_coalesced == 4
    assert [(e["occurrence"], e["job"], e["kept"]) for e in schedule.paused_log] == [
        (o.isoformat(), None, expected[-1].isoformat()) for o in expected[:-1]]


def test_latest_never_supersedes_a_job_that_spent_an_attempt():
    """A job that already ran once (waiting for its retry) is not pending: it stays ready; only
    never-started jobs are coalesced."""
    schedule = paused_schedule()
    service = scheduler()
    tick_minutes(service, [1])
    (first,) = jobs_of(schedule)
    Job.objects.filter(pk=first.pk).update(attempts=1)  # as after a failed attempt
    tick_minutes(service, [2, 3])
    assert [(j.occurrence_at, j.status) for j in jobs_of(schedule)] == [
        (START + MIN, "ready"), (START + 2 * MIN, "cancelled"), (START + 3 * MIN, "ready")]
    schedule.refresh_from_db()
    assert schedule.paused_coalesced == 1


def test_a_job_paused_before_its_queue_is_coalesced_too():
    """An occurrence emitted while the queue ran, still pending when it was paused, is superseded
    by the next occurrence: one pending job whatever came first."""
    schedule = make_schedule(cron="* * * * *", queue=QUEUE, last_occurrence_at=START)
    service = scheduler()
    tick_minutes(service, [1])
    store.queue_pause(QUEUE)
    tick_minutes(service, [2])
    assert [(j.occurrence_at, j.status) for j in jobs_of(schedule)] == [
        (START + MIN, "cancelled"), (START + 2 * MIN, "ready")]


def test_paused_log_keeps_the_newest_entries():
    schedule = paused_schedule(when_paused="skip")
    count = PAUSED_LOG_SIZE + 5
    tick_minutes(scheduler(), range(1, count + 1))
    schedule.refresh_from_db()
    assert schedule.paused_skipped == count
    newest = occurrences(count)[-PAUSED_LOG_SIZE:]
    assert [e["occurrence"] for e in schedule.paused_log] == [o.isoformat() for o in newest]


def test_saving_a_schedule_keeps_the_paused_record():
    """The record is the scheduler's bookkeeping: a copy saved from a form loaded earlier does not
    write it back."""
    schedule = paused_schedule(when_paused="skip")
    stale = Schedule.objects.get(pk=schedule.pk)
    tick_minutes(scheduler(), [1, 2])
    stale.priority = 5
    stale.save()
    assert (stale.paused_skipped, len(stale.paused_log)) == (2, 2)
    schedule.refresh_from_db()
    assert (schedule.priority, schedule.paused_skipped, len(schedule.paused_log)) == (5, 2, 2)


def test_bad_when_paused_is_refused_on_the_field():
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError) as info:
        make_schedule(when_paused="sometimes")
    assert "sometimes" in str(info.value.message_dict["when_paused"])
    assert not Schedule.objects.exists()


# ---- LEASEQUEUE_SCHEDULES ------------------------------------------------------------------------


def test_settings_schedule_takes_when_paused_and_a_change_is_synced():
    sync_schedules({"nightly": {"task": NOOP, "cron": "0 2 * * *", "when_paused": "skip"}})
    assert Schedule.objects.get(name="nightly").when_paused == "skip"
    result = sync_schedules({"nightly": {"task": NOOP, "cron": "0 2 * * *", "when_paused": "all"}})
    assert result.updated == ["nightly"]
    assert Schedule.objects.get(name="nightly").when_paused == "all"
    result = sync_schedules({"nightly": {"task": NOOP, "cron": "0 2 * * *"}})  # back to the default
    assert result.updated == ["nightly"]
    assert Schedule.objects.get(name="nightly").when_paused == "latest"


@pytest.mark.parametrize(("value", "message"), [
    ("sometimes", "when_paused must be one of 'latest', 'skip', 'all', got 'sometimes'"),
    (True, "when_paused must be a str, got True"),
])
def test_settings_schedule_with_a_bad_when_paused_is_refused(value, message):
    with pytest.raises(ConfigurationError) as info:
        load_settings_schedules({"nightly": {"task": NOOP, "cron": "0 2 * * *", "when_paused": value}})
    assert f"LEASEQUEUE_SCHEDULES['nightly']: {message}" in str(info.value)


def test_settings_schedule_with_a_misspelt_option_gets_a_hint():
    with pytest.raises(ConfigurationError) as info:
        load_settings_schedules({"nightly": {"task": NOOP, "cron": "0 2 * * *", "when_pause": "skip"}})
    assert "when_paused" in str(info.value)


def test_runscheduler_once_reports_the_skipped_occurrence(capsys):
    from django.core.management import call_command

    due_at = store.db_now().replace(second=0, microsecond=0)
    schedule = make_schedule(cron="* * * * *", queue=QUEUE, when_paused="skip")
    Schedule.objects.filter(pk=schedule.pk).update(last_occurrence_at=due_at - MIN, next_occurrence_at=due_at)
    store.queue_pause(QUEUE)
    call_command("runscheduler", "--once", "--no-sync")
    lines = capsys.readouterr().out.splitlines()
    assert "emitted 0 job(s)" in lines[0]
    assert lines[1] == "  paused queue: skipped 1, coalesced 0 occurrence(s) (see each schedule's when_paused)"
    assert not Job.objects.exists()
