"""The console's chart data (health.charts): zero-filled series aligned to the clock, latency
percentiles estimated from the counters' histograms, one statement per read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from flowlab.tasks import rated_noop

from django_leasequeue import health, store
from django_leasequeue.enqueueing import build_job
from django_leasequeue.health import Quantile, histogram_quantile
from django_leasequeue.models import STAT_BOUNDS

T0 = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)  # 30 s into a minute
BOUNDS = STAT_BOUNDS


def error(n: int) -> dict:
    return {"attempt": n, "type": "builtins.ValueError", "message": "bad", "traceback": "", "worker": "t"}


def run_jobs(at: datetime, *, done: int = 0, dead: int = 0, failed: int = 0, queue: str = "flow",
             wait: float = 2.0, run: float = 0.2) -> None:
    """Claim jobs due ``wait`` seconds before ``at`` and finish them ``run`` seconds later."""
    n = done + dead + failed
    jobs = [build_job(rated_noop, [i], queue=queue, run_at=at - timedelta(seconds=wait),
                      max_attempts=1 if i < done + dead else 3) for i in range(n)]
    store.job_insert(jobs, notify=False, channel="unused")
    claimed = store.job_claim(queues=[queue], limit=n, worker_id="t", lease=30, rate_limits={}, now=at)
    assert len(claimed) == n
    end = at + timedelta(seconds=run)
    claimed.sort(key=lambda c: c.id)
    if done:
        store.job_complete([(c.id, c.lease_version, None) for c in claimed[:done]], now=end)
    for c in claimed[done:]:
        store.job_fail(c.id, c.lease_version, error(1), retry_delay=60, now=end)


# -- histogram_quantile ---------------------------------------------------------------------------

def test_the_quantile_interpolates_linearly_inside_its_bucket():
    i = BOUNDS.index(2.5)  # [1.0, 2.5)
    assert histogram_quantile(0.5, {i: 4}) == Quantile(1.0 + 1.5 * 0.5)
    assert histogram_quantile(0.95, {i: 4}) == Quantile(pytest.approx(1.0 + 1.5 * 0.95))
    # 10 values below 10 ms (from 0), 10 in [0.1, 0.25): the median is the top of the first bucket.
    assert histogram_quantile(0.5, {0: 10, BOUNDS.index(0.25): 10}) == Quantile(0.01)
    # p95: rank 19 of 20, 9 into the second bucket's 10.
    assert histogram_quantile(0.95, {0: 10, BOUNDS.index(0.25): 10}) == Quantile(pytest.approx(0.1 + 0.15 * 0.9))
    assert histogram_quantile(0.25, {0: 10, 3: 10}) == Quantile(pytest.approx(0.005))


def test_the_open_last_bucket_reads_at_least_the_last_bound_and_an_empty_histogram_none():
    last = len(BOUNDS)
    assert histogram_quantile(0.95, {0: 1, last: 19}) == Quantile(3600.0, open=True)
    assert str(histogram_quantile(0.95, {0: 1, last: 19})) == ">= 1.0 h"
    assert histogram_quantile(0.5, {0: 1, last: 19}) == Quantile(3600.0, open=True)
    assert histogram_quantile(0.01, {0: 1, last: 19}) == Quantile(pytest.approx(0.002))
    assert histogram_quantile(0.5, {}) is None
    assert histogram_quantile(0.5, {3: 0}) is None
    with pytest.raises(ValueError):
        histogram_quantile(1.5, {0: 1})


# -- throughput -------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_the_minute_series_is_60_zero_filled_points_ending_at_the_minute_of_now():
    run_jobs(T0, done=3, dead=1)
    # (A retried failure is counted by the trigger at the database clock, not at an injected now,
    # so the retried failures' bucket is covered by tests/monitoring/test_job_stats.py.)
    run_jobs(T0 + timedelta(minutes=5), done=2, dead=2)
    run_jobs(T0 + timedelta(minutes=5), done=1, queue="other")
    now = T0 + timedelta(minutes=10, seconds=5)
    with CaptureQueriesContext(connection) as ctx:
        series = health.throughput("hour", now=now)
    assert len(ctx.captured_queries) == 1
    assert len(series.points) == 60 and series.span == 60
    assert series.points[-1].bucket == datetime(2026, 6, 1, 12, 10, tzinfo=UTC)
    assert series.start == datetime(2026, 6, 1, 11, 11, tzinfo=UTC)
    assert series.end == datetime(2026, 6, 1, 12, 11, tzinfo=UTC)
    by_bucket = {p.bucket: (p.done, p.failed, p.dead) for p in series.points if p.total}
    assert by_bucket == {datetime(2026, 6, 1, 12, 0, tzinfo=UTC): (3, 0, 1),
                         datetime(2026, 6, 1, 12, 5, tzinfo=UTC): (3, 0, 2)}
    assert series.totals().started == 9 and not series.empty
    only = health.throughput("hour", now=now, queue="other")
    assert [(p.bucket.minute, p.done) for p in only.points if p.total] == [(5, 1)]


@pytest.mark.django_db
def test_the_hour_and_day_series_sum_minutes_hours_and_days_whatever_the_fold_did():
    run_jobs(T0, done=2)
    run_jobs(T0 + timedelta(hours=3), dead=1)
    run_jobs(T0 + timedelta(days=2), done=4)
    now = T0 + timedelta(days=2, minutes=30)
    store.stat_fold(retention=90 * 86400, now=now)  # rolls the first two into a day row
    day = health.throughput("day", now=now)
    assert len(day.points) == 24 and day.points[-1].bucket == datetime(2026, 6, 3, 12, tzinfo=UTC)
    assert [(p.bucket, p.done) for p in day.points if p.total] == [(datetime(2026, 6, 3, 12, tzinfo=UTC), 4)]
    month = health.throughput("month", now=now)
    assert len(month.points) == 30 and month.points[-1].bucket == datetime(2026, 6, 3, tzinfo=UTC)
    assert [(p.bucket.day, p.done, p.dead) for p in month.points if p.total] == [(1, 2, 1), (3, 4, 0)]
    empty = health.throughput("hour", now=now + timedelta(days=1))
    assert empty.empty and len(empty.points) == 60
    with pytest.raises(ValueError):
        health.throughput("week", now=now)
    with pytest.raises(ValueError):
        health.throughput("hour", now=datetime(2026, 6, 1))


# -- latency ----------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_latency_gives_counts_means_and_percentiles_per_queue_and_task_in_one_statement():
    run_jobs(T0, done=4, wait=2.0, run=0.2)        # waits in [1, 2.5), runs in [0.1, 0.25)
    run_jobs(T0 + timedelta(minutes=1), done=1, dead=1, wait=4000.0, run=20.0)
    run_jobs(T0, done=1, queue="other", wait=0.0, run=0.0)
    now = T0 + timedelta(minutes=30)
    with CaptureQueriesContext(connection) as ctx:
        rows = health.latency("hour", now=now)
    assert len(ctx.captured_queries) == 1
    assert [(r.queue, r.task) for r in rows] == [("flow", None), ("flow", rated_noop.name),
                                                ("other", None), ("other", rated_noop.name)]
    flow = rows[0]
    assert (flow.started, flow.done, flow.dead, flow.failed) == (6, 5, 1, 0)
    assert flow.wait.count == 6 and flow.wait.mean == pytest.approx((4 * 2 + 2 * 4000) / 6)
    # Rank 3 of 6 waits: 3 of the 4 in [1, 2.5); rank 5.7 falls in the open bucket (>= 3600 s).
    assert flow.wait.p50 == Quantile(pytest.approx(1.0 + 1.5 * 3 / 4))
    assert flow.wait.p95 == Quantile(3600.0, open=True)
    # Runs: 4 of 0.2 s and one of 20 s. Rank 2.5 of 5 is 2.5 into [0.1, 0.25), rank 4.75 is 0.75
    # into the one run of [10, 30).
    assert flow.run.count == 5 and flow.run.mean == pytest.approx((4 * 0.2 + 20) / 5)
    assert flow.run.p50 == Quantile(pytest.approx(0.1 + 0.15 * 2.5 / 4))
    assert flow.run.p95 == Quantile(pytest.approx(10 + 20 * 0.75))
    other = rows[2]
    assert other.wait.p50 == Quantile(pytest.approx(0.005)) and other.run.count == 1
    # Past the hour the minute rows fall out of the window; the day window still has them.
    later = T0 + timedelta(minutes=62)
    assert [r.done for r in health.latency("hour", now=later) if r.task is None] == []
    assert [r.done for r in health.latency("day", now=later, queue="flow")] == [5, 5]
    with pytest.raises(ValueError):
        health.latency("week", now=now)
