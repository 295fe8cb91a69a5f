"""health.snapshot(): the figures, by database time, on exact seeded states (explicit now)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from invoices.tasks import flaky_sync, poison

from django_leasequeue import health, store
from django_leasequeue.models import QueueState

from .helpers import ago, claim, make_job, queuehealth, run_jobs

pytestmark = pytest.mark.django_db


def test_c30_oldest_ready_age_ignores_scheduled_running_and_backoff_and_dead_rate_is_windowed(now):
    """C30: age and depth must not be polluted by scheduled, running or backing-off jobs, and the
    dead-letter figure counts transitions in the window, not the dead-letter table."""
    # One job due in 10 hours.
    future = flaky_sync.using(run_at=now + timedelta(hours=10)).enqueue("c30-future")
    # One job running for 15 minutes (claimed 15 min ago with a 1 h lease, so not expired).
    running = flaky_sync.using(run_at=ago(now, 16 * 60)).enqueue("c30-running")
    (held,) = claim(now=ago(now, 15 * 60), lease=3600)
    assert held.id == running.id
    # One job in retry backoff: claimed a minute ago, failed, due again in 4 minutes.
    backoff = flaky_sync.using(run_at=ago(now, 120)).enqueue("c30-backoff")
    (attempt,) = claim(now=ago(now, 60))
    assert attempt.id == backoff.id
    assert store.job_fail(backoff.id, attempt.lease_version, {"type": "ConnectionError"}, retry_delay=300,
                          now=ago(now, 60))[0] == "ready"

    first = health.snapshot(now).queue("default")
    assert (first.ready_due, first.oldest_ready_age_seconds) == (0, 0.0)
    assert (first.scheduled, first.leased, first.leased_expired, first.dead) == (2, 1, 0, 0)
    assert future.id != running.id

    # A ready job due 5 minutes ago: its age is measured from run_at, by the database clock.
    make_job(task=flaky_sync.name, run_at=ago(now, 300), at=ago(now, 3600))
    second = health.snapshot(now).queue("default")
    assert (second.ready_due, second.oldest_ready_age_seconds) == (1, 300.0)
    assert (second.scheduled, second.leased) == (2, 1)

    # Old dead letters (2 h ago) stay in the dead count but not in the window's rate.
    for _ in range(4):
        make_job(task=poison.name, status="dead", run_at=ago(now, 7300), finished_at=ago(now, 7200))
    # Ten jobs finish in the window: seven done, three dead-lettered.
    batch = [flaky_sync.using(run_at=ago(now, 90), priority=10).enqueue(f"c30-{i}") for i in range(10)]
    claimed = claim(now=ago(now, 60), limit=10)
    assert {c.id for c in claimed} == {j.id for j in batch}
    assert store.job_complete([(c.id, c.lease_version, None) for c in claimed[:7]], now=ago(now, 30)) == {
        c.id for c in claimed[:7]}
    for c in claimed[7:]:
        assert store.job_fail(c.id, c.lease_version, {"type": "ValueError"}, retry_delay=None,
                              now=ago(now, 30))[0] == "dead"

    third = health.snapshot(now, window_short=300, window_long=3600).queue("default")
    assert (third.dead_recent_short, third.done_recent_short, third.dead_ratio_short) == (3, 7, 0.3)
    assert (third.dead_recent_long, third.done_recent_long) == (3, 7)
    assert third.dead == 7  # the dead-letter table: 4 old + 3 new
    assert (third.ready_due, third.oldest_ready_age_seconds, third.scheduled, third.leased) == (1, 300.0, 2, 1)


def test_windows_count_the_whole_minutes_they_overlap_and_follow_explicit_now(now):
    # The recent counts come from the per-minute counters: a minute counts when it started within
    # the window (now - w, now]. With now 30 s into minute M, the short window (300 s) holds the
    # minutes M - 4 .. M, the same five bars as the minute chart's last five.
    m = now.replace(second=0, microsecond=0)
    now = m + timedelta(seconds=30)
    make_job(status="done", finished_at=m - timedelta(seconds=241))  # minute M - 5: out of the short window
    make_job(status="done", finished_at=m - timedelta(seconds=240))  # minute M - 4 starts: in
    make_job(status="done", finished_at=now + timedelta(seconds=5))  # minute M, after now: in (same minute)
    make_job(status="done", finished_at=m + timedelta(seconds=60))   # minute M + 1 has not started: out
    make_job(status="dead", finished_at=ago(now, 3000))  # in the long window only
    stats = health.snapshot(now).queue("default")
    assert (stats.done_recent_short, stats.done_recent_long) == (2, 3)
    assert (stats.dead_recent_short, stats.dead_recent_long, stats.dead) == (0, 1, 1)
    assert stats.dead_ratio_long == pytest.approx(1 / 4)


def test_a_replay_does_not_lower_the_recent_dead_count_bug_13(now):
    dead = [make_job(status="dead", finished_at=ago(now, 60)) for _ in range(3)]
    make_job(status="done", finished_at=ago(now, 30))
    before = health.snapshot(now).queue("default")
    assert (before.dead_recent_short, before.dead_recent_long, before.dead, before.done_recent_short) == (3, 3, 3, 1)
    assert store.job_replay([j.id for j in dead[:2]], by="ops", now=now).replayed == sorted(j.id for j in dead[:2])
    after = health.snapshot(now).queue("default")
    # The dead-letter table holds one job now, but three were dead-lettered in the window.
    assert (after.dead_recent_short, after.dead_recent_long, after.dead, after.done_recent_short) == (3, 3, 1, 1)


def test_queues_paused_expired_leases_and_explicit_queue_list(now):
    make_job(queue="emails", run_at=ago(now, 10))
    make_job(queue="billing", status="leased", leased_until=ago(now, 1), run_at=ago(now, 100))
    make_job(queue="billing", status="leased", leased_until=now + timedelta(seconds=20), run_at=ago(now, 100))
    QueueState.objects.create(name="reports", paused=True)
    snap = health.snapshot(now)
    assert [q.queue for q in snap.queues] == ["billing", "default", "emails", "reports"]
    assert (snap.queue("billing").leased, snap.queue("billing").leased_expired) == (2, 1)
    assert snap.queue("reports").paused and not snap.queue("emails").paused
    assert snap.queue("emails").oldest_ready_age_seconds == 10.0
    total = snap.total()
    assert (total.queue, total.ready_due, total.leased, total.leased_expired) == ("*", 1, 2, 1)
    only = health.snapshot(now, queues=["emails", "nowhere"])
    assert [(q.queue, q.ready_due) for q in only.queues] == [("emails", 1), ("nowhere", 0)]
    assert only.queue("unknown-queue") == health.QueueStats(queue="unknown-queue")


def test_empty_system_still_reports_the_clock_and_default_queue(now):
    snap = health.snapshot()
    assert snap.now >= now
    assert [q.queue for q in snap.queues] == ["default"]
    assert (snap.workers, snap.workers_alive, snap.scheduler_last_tick_age_seconds) == ([], 0, None)
    assert snap.to_dict()["queues"][0]["dead_ratio_short"] is None


def test_snapshot_rejects_naive_now_and_bad_windows(now):
    with pytest.raises(ValueError, match="aware"):
        health.snapshot(now.replace(tzinfo=None))
    with pytest.raises(ValueError, match="windows"):
        health.snapshot(now, window_short=0)


def test_snapshot_inside_a_transaction_leaves_the_session_untouched(now):
    # pytest-django's test transaction makes this the nested (savepoint) path.
    with connection.cursor() as cur:
        cur.execute("SHOW jit")
        before = cur.fetchone()[0]
    health.snapshot(now)
    health.lease_report(now)
    with connection.cursor() as cur:
        cur.execute("SHOW jit")
        assert cur.fetchone()[0] == before


def test_poison_burst_raises_the_dead_letter_figure(now):
    before = health.snapshot().queue("default")
    assert (before.dead_recent_short, before.dead) == (0, 0)
    assert queuehealth("--max-dead", "3/300").code == 0
    for i in range(5):
        poison.using(max_attempts=1).enqueue({"n": i})
    assert run_jobs(claim()) == ["dead"] * 5
    after = health.snapshot().queue("default")
    assert (after.dead_recent_short, after.dead_recent_long, after.dead, after.dead_ratio_short) == (5, 5, 5, 1.0)
    run = queuehealth("--max-dead", "3/300")
    assert run.code == 2
    assert "5 dead letter(s) in any queue in the last 300 s" in run.output
    assert queuehealth("--max-dead", "3:10/5m").code == 1
    assert queuehealth("--max-dead", "10").code == 0
