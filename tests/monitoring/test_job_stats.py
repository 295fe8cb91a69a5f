"""The charts' outcome counters (leasequeue_job_stat): the trigger counts every move of a job once,
by the statement's clock; the reaper's fold keeps every sum exact while it folds shards and rolls
minutes into hours and days; a replay changes no past count."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection, connections
from flowlab.tasks import rated_noop

from django_leasequeue import store
from django_leasequeue.enqueueing import build_job
from django_leasequeue.models import STAT_BOUNDS, Job, JobStat

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)  # 30 s into a minute
MINUTE = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def new_jobs(n: int, *, run_at: datetime = T0 - timedelta(seconds=2), max_attempts: int = 5) -> list[Job]:
    jobs = [build_job(rated_noop, [i], queue="flow", run_at=run_at, max_attempts=max_attempts) for i in range(n)]
    return store.job_insert(jobs, notify=False, channel="unused")


def claim(n: int, now: datetime):
    return store.job_claim(queues=["flow"], limit=n, worker_id="t", lease=30, rate_limits={}, now=now)


def totals() -> dict[str, int]:
    [row] = store.stat_totals(since=MINUTE - timedelta(days=400)) or [None]
    if row is None:
        return {}
    return {"started": row.started, "done": row.done, "failed": row.failed, "dead": row.dead,
            "cancelled": row.cancelled, "waits": sum(row.wait_hist.values()), "runs": sum(row.run_hist.values())}


def error(n: int) -> dict:
    return {"attempt": n, "type": "builtins.ValueError", "message": "bad", "traceback": "", "worker": "t"}


def test_the_trigger_counts_claims_completions_failures_dead_letters_and_cancels_once():
    jobs = new_jobs(5, max_attempts=1)
    claimed = claim(4, T0)
    assert len(claimed) == 4
    done = store.job_complete([(c.id, c.lease_version, None) for c in claimed[:3]], now=T0 + timedelta(seconds=0.2))
    assert len(done) == 3
    assert store.job_fail(claimed[3].id, claimed[3].lease_version, error(1), retry_delay=5,
                          now=T0 + timedelta(seconds=1))[0] == "dead"  # max_attempts=1
    store.job_request_cancel([jobs[4].id], now=T0 + timedelta(seconds=2))
    store.job_renew([(c.id, c.lease_version, 30) for c in claimed], now=T0 + timedelta(seconds=3))  # no moves

    assert totals() == {"started": 4, "done": 3, "failed": 0, "dead": 1, "cancelled": 1, "waits": 4, "runs": 3}
    [row] = JobStat.objects.all()
    assert (row.bucket, row.span, row.queue, row.task) == (MINUTE, 60, "flow", rated_noop.name)
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        assert row.shard == cur.fetchone()[0]
    # Waits of 2 s (due 2 s before the claim), runs of 0.2 s: one histogram bucket each.
    assert row.wait_hist == [4 if i == STAT_BOUNDS.index(2.5) else 0 for i in range(len(STAT_BOUNDS) + 1)]
    assert row.run_hist == [3 if i == STAT_BOUNDS.index(0.25) else 0 for i in range(len(STAT_BOUNDS) + 1)]
    assert row.wait_sum == pytest.approx(8.0) and row.run_sum == pytest.approx(0.6)


def test_a_retried_failure_counts_as_failed_and_its_replay_changes_no_past_count():
    (job,) = new_jobs(1, max_attempts=2)
    (c,) = claim(1, T0)
    assert store.job_fail(c.id, c.lease_version, error(1), retry_delay=1, now=T0 + timedelta(minutes=3))[0] == "ready"
    # The retried failure is counted in the minute of the statement's clock (the injected now).
    assert list(JobStat.objects.filter(failed__gt=0).values_list("bucket", "failed")) == [
        (MINUTE + timedelta(minutes=3), 1)]
    (c,) = claim(1, T0 + timedelta(minutes=3, seconds=5))
    assert store.job_fail(c.id, c.lease_version, error(2), retry_delay=1,
                          now=T0 + timedelta(minutes=3, seconds=6))[0] == "dead"
    before = totals()
    assert before == {"started": 2, "done": 0, "failed": 1, "dead": 1, "cancelled": 0, "waits": 2, "runs": 0}

    assert store.job_replay([job.id], by="ops", now=T0 + timedelta(minutes=3, seconds=9)).replayed == [job.id]
    assert totals() == before  # dead -> ready counts nothing: the dead-letter rate stays what it was
    (c,) = claim(1, T0 + timedelta(minutes=3, seconds=10))
    store.job_complete([(c.id, c.lease_version, None)], now=T0 + timedelta(minutes=3, seconds=11))
    assert totals() == {**before, "started": 3, "done": 1, "waits": 3, "runs": 1}


def test_the_fold_moves_shards_into_shard_0_and_rolls_minutes_into_hours_and_days_keeping_every_sum():
    for minute in range(3):  # three minutes of 2 jobs each
        at = T0 + timedelta(minutes=minute)
        new_jobs(2, run_at=at - timedelta(seconds=1))
        claimed = claim(2, at)
        store.job_complete([(c.id, c.lease_version, None) for c in claimed], now=at + timedelta(seconds=1))
    expected = {"started": 6, "done": 6, "failed": 0, "dead": 0, "cancelled": 0, "waits": 6, "runs": 6}
    assert totals() == expected
    assert sorted(JobStat.objects.values_list("span", "shard").distinct())[0][1] != 0

    # At 12:04:30 the minutes before 12:02 are past (no worker writes them): 12:00 and 12:01 fold.
    fold = store.stat_fold(retention=90 * 86400, now=T0 + timedelta(minutes=4))
    assert (fold.locked, fold.moved, fold.expired) == (True, 2, 0)
    assert totals() == expected
    assert list(JobStat.objects.filter(shard=0).order_by("bucket").values_list("span", "bucket", "done")) == [
        (60, MINUTE, 2), (60, MINUTE + timedelta(minutes=1), 2)]
    assert JobStat.objects.exclude(shard=0).get().bucket == MINUTE + timedelta(minutes=2)

    # Two hours on: the whole hour of minute rows becomes one hour row.
    store.stat_fold(retention=90 * 86400, now=T0 + timedelta(hours=2, minutes=30))
    assert list(JobStat.objects.values_list("span", "bucket", "shard", "done")) == [
        (3600, MINUTE.replace(minute=0), 0, 6)]
    assert totals() == expected

    # Three days on: the day's hour rows become one day row, with merged histograms.
    store.stat_fold(retention=90 * 86400, now=T0 + timedelta(days=3))
    [day] = JobStat.objects.all()
    assert (day.span, day.bucket, day.shard, day.done) == (86400, MINUTE.replace(hour=0, minute=0), 0, 6)
    assert sum(day.wait_hist) == 6 and sum(day.run_hist) == 6 and len(day.wait_hist) == len(STAT_BOUNDS) + 1
    assert totals() == expected
    # Nothing moves when nothing is due.
    assert store.stat_fold(retention=90 * 86400, now=T0 + timedelta(days=3)).moved == 0

    # Past the retention (whole days), the day row goes.
    fold = store.stat_fold(retention=2 * 86400, now=T0 + timedelta(days=4))
    assert (fold.moved, fold.expired) == (1, 1)
    assert JobStat.objects.count() == 0


def test_the_series_sums_every_span_into_the_asked_buckets():
    for minute in (0, 1, 61):  # 12:00, 12:01 and 13:01
        at = T0 + timedelta(minutes=minute)
        new_jobs(1, run_at=at)
        (c,) = claim(1, at)
        store.job_complete([(c.id, c.lease_version, None)], now=at)
    store.stat_fold(retention=90 * 86400, now=T0 + timedelta(minutes=125))  # 12:00 hour rolled, 13:xx kept
    assert sorted(JobStat.objects.values_list("span", flat=True)) == [60, 3600]

    hourly = store.stat_series(span=3600, since=MINUTE)
    assert [(p.bucket.hour, p.done) for p in hourly] == [(12, 2), (13, 1)]
    minutely = store.stat_series(span=60, since=MINUTE)
    assert [(p.bucket.strftime("%H:%M"), p.done) for p in minutely] == [("13:01", 1)]  # 12:xx is hours now
    assert store.stat_series(span=3600, since=MINUTE, queue="other") == []


def test_a_fold_skips_while_another_reaper_folds():
    new_jobs(1)
    (c,) = claim(1, T0)
    store.job_complete([(c.id, c.lease_version, None)], now=T0)
    other = connections.create_connection("default")  # another reaper, holding the fold's lock
    try:
        with other.cursor() as cur:
            cur.execute("SELECT current_database(), pg_try_advisory_lock(%s)", [store.STAT_FOLD_LOCK])
            assert cur.fetchone() == (connection.settings_dict["NAME"], True)
        assert store.stat_fold(retention=90 * 86400, now=T0 + timedelta(hours=3)) == store.StatFold(False, 0, 0, 0)
        assert JobStat.objects.get().span == 60
        with other.cursor() as cur:
            cur.execute("SELECT pg_advisory_unlock(%s)", [store.STAT_FOLD_LOCK])
    finally:
        other.close()
    assert store.stat_fold(retention=90 * 86400, now=T0 + timedelta(hours=3)).moved == 1


def test_the_migration_counts_over_the_bounds_of_the_model():
    migration = Path(__file__).resolve().parents[2] / "django_leasequeue/migrations/0015_job_stats.py"
    arrays = set(re.findall(r"^BOUNDS = \"'\{([^}]*)\}'::float8\[\]\"$", migration.read_text(), re.M))
    assert arrays == {",".join(f"{b:g}" for b in STAT_BOUNDS)}
