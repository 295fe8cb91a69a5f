"""The chart counters' ledger, path by path: every statement that moves a job counts its event once,
in the minute of that statement's clock (injected or not); snoozes and releases are claims without
an outcome; a replay counts nothing; nothing a row holds can make the trigger fail a job's UPDATE."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from flowlab.tasks import rated_noop

from django_leasequeue import Workflow, store
from django_leasequeue.enqueueing import build_job
from django_leasequeue.models import Job, JobStat
from django_leasequeue.testing import drain
from tests.workflows.wf_tasks import add, flaky

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)
MINUTE = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def new_jobs(n, *, run_at=T0 - timedelta(seconds=2), max_attempts=5):
    jobs = [build_job(rated_noop, [i], queue="flow", run_at=run_at, max_attempts=max_attempts) for i in range(n)]
    return store.job_insert(jobs, notify=False, channel="unused")


def claim(n, now):
    return store.job_claim(queues=["flow"], limit=n, worker_id="t", lease=30, rate_limits={}, now=now)


def error(n):
    return {"attempt": n, "type": "builtins.ValueError", "message": "bad", "traceback": "", "worker": "t"}


def rows():
    return sorted(JobStat.objects.values_list("bucket", "started", "done", "failed", "dead", "cancelled"))


def test_a_retried_failure_counts_in_the_minute_of_the_failing_statements_clock():
    # The failure's time is its error's "at" (the statement's clock), not the session's clock: with
    # an injected now the claim and the failure land in the same minute, as they do in production.
    new_jobs(1)
    (c,) = claim(1, T0)
    store.job_fail(c.id, c.lease_version, error(1), retry_delay=5, now=T0 + timedelta(seconds=1))
    assert rows() == [(MINUTE, 1, 0, 1, 0, 0)]


def test_a_hand_written_failure_whose_error_has_no_valid_time_still_moves_and_counts_now():
    new_jobs(2)
    claim(2, T0)
    with connection.cursor() as cur:  # a repair by hand: the trigger must not make it fail
        cur.execute("""UPDATE leasequeue_job SET status = 'ready', leased_until = NULL,
                       errors = errors || CASE WHEN id % 2 = 0 THEN '[{"at": "2026-02-31T00:00:00Z"}]'::jsonb
                                               ELSE '[{"at": 5}]'::jsonb END
                       WHERE status = 'leased'""")
        assert cur.rowcount == 2
    (now,) = {r[0] for r in rows() if r[3]}
    assert now > MINUTE + timedelta(days=30)  # the session's clock: the current minute
    assert [r[1:] for r in rows()] == [(2, 0, 0, 0, 0), (0, 0, 2, 0, 0)]


def at(s):
    return MINUTE + timedelta(seconds=1 + s)


def test_every_path_that_moves_a_job_counts_once_in_the_minute_of_its_statement():
    # Seven jobs claimed at once; then: A done; B snoozed; C released; D leased, cancel requested,
    # then its completion (ends cancelled); E cancelled by its handler; F failed (retried); G's lease
    # expires and the reaper retries it. Round two: B and C done, F dead, G fails again (retried)
    # then is cancelled while ready; F is replayed (counts nothing) and done.
    # The ledger: 7 + 4 + 1 claims, done A B C F, failed F G G, dead F, cancelled D E G.
    a, b, c, d, e, f, g = new_jobs(7, max_attempts=3, run_at=MINUTE)
    by = {j.id: j for j in claim(7, at(0))}
    assert len(by) == 7
    v = {i: by[i].lease_version for i in by}
    store.job_complete([(a.id, v[a.id], None)], now=at(1))                       # A done
    assert store.job_snooze(b.id, v[b.id], 0, max_snoozes=5, now=at(1)) == "ready"  # B snoozed
    rel = store.job_release([(c.id, v[c.id])], now=at(1))                        # C released
    assert rel == {c.id}
    store.job_request_cancel([d.id], now=at(1))                                  # D leased: cancel requested
    store.job_complete([(d.id, v[d.id], None)], now=at(2))
    assert store.job_cancel_leased(e.id, v[e.id], now=at(2))                     # E cancelled by its handler
    assert store.job_fail(f.id, v[f.id], error(1), retry_delay=0, now=at(2))[0] == "ready"  # F retried
    # G's lease expires and the reaper takes it back (a failed attempt, retried)
    reaped = store.job_reap_expired(now=at(32), silence=None)
    assert [(r.id, r.status) for r in reaped] == [(g.id, "ready")]
    # second round: B, C, F, G claimed again at 41
    by = {j.id: j for j in claim(7, at(33))}
    assert set(by) == {b.id, c.id, f.id, g.id}
    for i in (b.id, c.id):
        store.job_complete([(i, by[i].lease_version, None)], now=at(34))
    assert store.job_fail(f.id, by[f.id].lease_version, error(2), retry_delay=None, now=at(34))[0] == "dead"
    assert store.job_fail(g.id, by[g.id].lease_version, error(2), retry_delay=0, now=at(34))[0] == "ready"
    store.job_request_cancel([g.id], now=at(35))                                 # G ready: cancelled
    assert store.job_replay([f.id], by="ops", now=at(36)).replayed == [f.id]
    (cf,) = claim(7, at(37))
    store.job_complete([(cf.id, cf.lease_version, None)], now=at(38))
    assert sorted(Job.objects.values_list("status", flat=True)) == ["cancelled"] * 3 + ["done"] * 4
    assert rows() == [(MINUTE, 12, 4, 3, 1, 3)]


def test_the_settle_triggers_cascade_counts_each_cancelled_dependent_once():
    # a dies; its dependents b, c (behind b) and d are cancelled by the settle trigger, inside the
    # statement that dead-letters a (trigger statements inside the failing statement's trigger).
    wf = Workflow(on_dependency_dead="cancel")
    wf.add("a", flaky.step(1, fail=True))
    wf.add("b", add.step(1), depends_on=["a"])
    wf.add("c", add.step(2), depends_on=["b"])
    wf.add("d", add.step(3), depends_on=["a", "side"])
    wf.add("side", add.step(4))
    wf.add("after_side", add.step(5), depends_on=["side"])
    h = wf.enqueue()
    drain(raise_failures=False)
    assert sorted(j.status for j in h.steps().values()) == ["cancelled"] * 3 + ["dead"] + ["done"] * 2
    by_task = {(t.task, t.started, t.done, t.failed, t.dead, t.cancelled)
               for t in store.stat_totals(since=MINUTE - timedelta(days=400))}
    assert by_task == {("tests.wfx.flaky", 1, 0, 0, 1, 0), ("tests.wfx.add", 2, 2, 0, 0, 3)}


def set_zone(zone: str) -> None:
    with connection.cursor() as cur:
        cur.execute(f"SET TIME ZONE '{zone}'")


@pytest.mark.parametrize("zone", ["America/New_York", "Asia/Kathmandu"])
def test_buckets_are_utc_epoch_bins_whatever_the_session_time_zone_and_its_daylight_saving(zone):
    # 2026-11-01 05:30Z and 06:30Z are both 01:30 in New York (daylight saving ends between them);
    # Kathmandu is UTC+5:45. The trigger and the fold run in a session of that zone; minutes, hours
    # and days are UTC bins all the same. (The reads run in UTC: Django decodes timestamps as UTC.)
    first, second = (datetime(2026, 11, 1, h, 30, 10, tzinfo=UTC) for h in (5, 6))
    set_zone(zone)
    try:
        for now in (first, second):
            new_jobs(1, run_at=now)
            (c,) = claim(1, now)
            store.job_fail(c.id, c.lease_version, error(1), retry_delay=0, now=now + timedelta(seconds=1))
            (c,) = claim(1, now + timedelta(seconds=2))
            store.job_complete([(c.id, c.lease_version, None)], now=now + timedelta(seconds=3))
    finally:
        set_zone("UTC")
    since = first.replace(hour=0, minute=0, second=0)
    minutes = [(p.bucket, p.started, p.done, p.failed) for p in store.stat_series(span=60, since=since)]
    assert minutes == [(first.replace(second=0), 2, 1, 1), (second.replace(second=0), 2, 1, 1)]
    set_zone(zone)
    try:
        store.stat_fold(retention=90 * 86400, now=second + timedelta(hours=3))
    finally:
        set_zone("UTC")
    assert [(p.bucket, p.done) for p in store.stat_series(span=3600, since=since)] == [
        (first.replace(minute=0, second=0), 1), (second.replace(minute=0, second=0), 1)]
    set_zone(zone)
    try:
        store.stat_fold(retention=90 * 86400, now=second + timedelta(days=2))
    finally:
        set_zone("UTC")
    [day] = JobStat.objects.all()
    assert (day.span, day.bucket, day.started, day.done, day.failed) == (86400, since, 4, 2, 2)


def test_a_job_finished_by_hand_without_finished_at_counts_done_now_without_a_run_time():
    (job,) = new_jobs(1)
    claim(1, T0)
    with connection.cursor() as cur:
        cur.execute("UPDATE leasequeue_job SET status = 'done', leased_until = NULL, finished_at = NULL WHERE id = %s",
                    [job.id])
    [t] = store.stat_totals(since=MINUTE)
    assert (t.started, t.done, t.run_hist, t.run_sum) == (1, 1, {}, 0.0)  # a mean run time divides by the histogram
    assert [r[0] > MINUTE + timedelta(days=30) for r in rows()] == [False, True]
