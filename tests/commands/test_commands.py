"""Management commands, in-process: option validation refuses to start, ``runreaper --once``."""

from datetime import UTC, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings

from django_leasequeue import enqueue, store
from django_leasequeue.management.commands.runworker import start_line, tasks_line
from django_leasequeue.models import Job
from tests.store.test_history import history_ids, hot_ids, insert_finished
from tests.support import claim

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--concurrency", "0"], "--concurrency must be >= 1"),
     (["--lease", "-1"], "--lease must be a number of seconds in")],
)
def test_runworker_refuses_bad_options(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("runworker", *args)


@override_settings(LEASEQUEUE={"QUEUES": ["default", "emails"]})
def test_runworker_refuses_unknown_queue_when_restricted():
    with pytest.raises(CommandError, match=r"unknown queue\(s\) \['emial'\]"):
        call_command("runworker", "--queues", "default,emial")


@override_settings(LEASEQUEUE={"LAESE": 5})
def test_runworker_refuses_invalid_settings_with_suggestion():
    with pytest.raises(CommandError, match="did you mean 'LEASE'"):
        call_command("runworker")


def test_runreaper_once_takes_back_expired_leases(db_clock):
    job = enqueue("qa.record")
    claim(store.db_now() + timedelta(seconds=1), lease=1)
    db_clock.advance(5)
    out = StringIO()
    call_command("runreaper", "--once", stdout=out)
    assert "reaped 1 expired lease(s)" in out.getvalue()
    assert "history" not in out.getvalue()  # HISTORY is off
    job.refresh_from_db()
    assert (job.status, job.lease_version, job.errors[0]["type"]) == ("ready", 2, "LeaseExpired")
    assert Job.objects.count() == 1


@override_settings(LEASEQUEUE={"RETENTION": 3 * 86400, "HISTORY": "day", "HISTORY_MOVE_AFTER": 60})
def test_runreaper_once_prints_what_the_history_moved_made_and_dropped(db_clock, caplog):
    # Before, the printed line counted the pruned jobs only: "pruned 0" after a move of 100.
    db_clock.advance(10 * 86400)  # past any partition another test left
    now = store.db_now()
    day = timedelta(days=1)
    history = "leasequeue_job_history_p"
    (old,) = store.history_ensure_partitions("day", back=0, ahead=0, now=now - 20 * day)  # past retention
    moved = insert_finished("done", now - timedelta(hours=2), 100, step=0.01)
    pruned = insert_finished("cancelled", now - 5 * day, 2)  # stays hot, past retention: the pruner's
    out = StringIO()
    with caplog.at_level("INFO", logger="django_leasequeue.reaper"):
        call_command("runreaper", "--once", stdout=out)
    first, last = (f"{history}{(now + d * day).astimezone(UTC):%Y%m%d}" for d in (-3, 2))
    assert out.getvalue() == (
        "reaped 0 expired lease(s), pruned 2 finished job(s), dead-lettered 0 job(s) of tasks no live worker knows\n"
        f"history: moved 100 done job(s), created partitions: 6 ({first} .. {last}), dropped partitions: {old}\n")
    assert history_ids() == moved and hot_ids() == [] and len(pruned) == 2
    # The log line counts the partitions too, with the first and last names (not 171 names).
    assert caplog.messages == [f"history: moved 100 done job(s), created partitions: 6 ({first} .. {last}), "
                               f"dropped partitions: {old}"]
    assert [p.name for p in store.history_partitions()] == [
        f"{history}{(now + d * day).astimezone(UTC):%Y%m%d}" for d in range(-3, 3)]


def test_the_banner_shows_the_async_slots_and_marks_the_async_tasks():
    assert start_line("h:1:A", None, 4, 30.0, "thread", False, async_slots=1000) == (
        "worker h:1:A: queues *, 4 thread(s), async slots 1000, lease 30 s, thread execution; "
        "SIGTERM or Ctrl-C stops gracefully.")
    assert start_line("h:1:A", ["a"], 4, 30.0, "thread", False, async_slots=0) == (
        "worker h:1:A: queues a, 4 thread(s), lease 30 s, thread execution; SIGTERM or Ctrl-C stops gracefully.")
    names = ["a.one", "a.two", "b.three", "b.four", "c.five", "c.six"]
    assert tasks_line(names, 6, async_names={"a.two", "c.six"}) == (
        "6 task(s) registered (6 native, 0 django.tasks; 2 async): a.one, a.two (async), b.three, b.four "
        "and 2 more")
    assert tasks_line(names, 6) == "6 task(s) registered (6 native, 0 django.tasks): a.one, a.two, b.three, b.four " \
                                   "and 2 more"


@override_settings(LEASEQUEUE={"RETENTION": 86400, "HISTORY": "hour", "HISTORY_MOVE_AFTER": 60})
def test_runreaper_once_says_when_the_history_step_failed_and_still_prunes(db_clock):
    # A partition attached by hand where ours would go: creating ours fails; the pruner still runs.
    db_clock.advance(10 * 86400)
    now = store.db_now()
    with connection.cursor() as cur:
        cur.execute("CREATE TABLE leasequeue_job_history_by_hand PARTITION OF leasequeue_job_history "
                    "FOR VALUES FROM (%s) TO (%s)", [now - timedelta(hours=1), now + timedelta(hours=1)])
    insert_finished("done", now - timedelta(days=2), 3)  # past retention: the pruner's
    recent = insert_finished("done", now - timedelta(hours=2), 2)
    out = StringIO()
    call_command("runreaper", "--once", stdout=out)
    assert out.getvalue().splitlines() == [
        "reaped 0 expired lease(s), pruned 3 finished job(s), dead-lettered 0 job(s) of tasks no live worker knows",
        "history: the maintenance failed (logged on django_leasequeue.reaper); the done jobs stay in the job table "
        "until the next one"]
    assert hot_ids() == recent and history_ids() == []
