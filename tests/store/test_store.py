"""Store statements in one transaction, with an explicit ``now=``: claim order and limits, the
fencing token on every worker write, reaping, release."""

from datetime import UTC, datetime, timedelta

import pytest

from django_leasequeue import enqueue, store
from django_leasequeue.models import Job, QueueState
from tests.support import claim

pytestmark = pytest.mark.django_db

MICRO = timedelta(microseconds=1)


@pytest.fixture
def now():
    """An instant just after the jobs each test enqueues (by the database clock)."""
    return store.db_now() + timedelta(seconds=1)


def test_enqueue_returns_python_values():
    job = enqueue("qa.record", ["a"], {"sleep": 0.5})
    assert (job.args, job.kwargs, job.errors, job.history) == (["a"], {"sleep": 0.5}, [], [])
    assert (job.status, job.attempts, job.lease_version, job.max_attempts) == ("ready", 0, 0, 3)


def test_claim_complete_roundtrip(now):
    job = enqueue("qa.record", ["k"])
    claimed = claim(now)
    assert [c.id for c in claimed] == [job.id]
    assert (claimed[0].lease_version, claimed[0].attempts, claimed[0].args) == (1, 1, ["k"])
    assert claimed[0].leased_until == now + timedelta(seconds=30)
    assert store.job_complete([(job.id, 1, '"ok"')], now=now) == {job.id}
    job.refresh_from_db()
    assert (job.status, job.result, job.finished_at, job.leased_until) == ("done", "ok", now, None)
    # A second completion with the same (now stale) token changes nothing.
    assert store.job_complete([(job.id, 1, '"again"')], now=now) == set()
    job.refresh_from_db()
    assert job.result == "ok"


def test_claim_order_limit_and_due_time(now):
    low = enqueue("qa.record", run_at=now - timedelta(seconds=10), priority=-5)
    high_late = enqueue("qa.record", run_at=now - timedelta(seconds=1), priority=50)
    high_early = enqueue("qa.record", run_at=now - timedelta(seconds=5), priority=50)
    mid = enqueue("qa.record", run_at=now - timedelta(seconds=5), priority=0)
    future = enqueue("qa.record", run_at=now + timedelta(seconds=60), priority=100)
    first = claim(now, limit=2)
    assert [c.id for c in first] == [high_early.id, high_late.id]
    rest = claim(now, limit=10)
    assert [c.id for c in rest] == [mid.id, low.id]
    assert claim(now) == []
    assert [c.id for c in claim(now + timedelta(seconds=60))] == [future.id]


def test_claim_filters_queues_and_skips_paused(now):
    a = enqueue("qa.record", queue="a")
    b = enqueue("qa.record", queue="b")
    QueueState.objects.create(name="b", paused=True)
    assert [c.id for c in claim(now, queues=["b"])] == []
    assert [c.id for c in claim(now, queues=["a", "b"])] == [a.id]
    assert claim(now) == []  # every queue: b is still paused
    QueueState.objects.filter(name="b").update(paused=False)
    assert [c.id for c in claim(now)] == [b.id]


def test_every_claim_bumps_attempts_and_token(now):
    job = enqueue("qa.record")  # max_attempts=3
    seen = []
    t = now
    for _ in range(3):
        (c,) = claim(t, lease=5)
        t += timedelta(seconds=6)
        (reaped,) = store.job_reap_expired(now=t)
        seen.append((c.attempts, c.lease_version, reaped.status, reaped.lease_version))
    # Each claim and each reap increments the token; the third expiry exhausts the attempts.
    assert seen == [(1, 1, "ready", 2), (2, 3, "ready", 4), (3, 5, "dead", 6)]
    job.refresh_from_db()
    assert (job.status, job.attempts, job.lease_version) == ("dead", 3, 6)
    assert [(e["type"], e["attempt"]) for e in job.errors] == [("LeaseExpired", 1), ("LeaseExpired", 2),
                                                                ("LeaseExpired", 3)]


def test_expired_lease_is_reaped_and_token_bumped(now):
    job = enqueue("qa.record")
    (claimed,) = claim(now, lease=5, worker_id="host:1:w1")
    assert store.job_reap_expired(now=now + timedelta(seconds=4)) == []
    reaped = store.job_reap_expired(now=now + timedelta(seconds=6))
    assert [(r.id, r.status, r.lease_version) for r in reaped] == [(job.id, "ready", 2)]
    # The stale holder's writes are all refused: 0 rows.
    later = now + timedelta(seconds=7)
    assert store.job_renew([(job.id, claimed.lease_version, 5)], now=later) == {}
    assert store.job_complete([(job.id, claimed.lease_version, None)], now=later) == set()
    assert store.job_fail(job.id, claimed.lease_version, {"type": "X"}, retry_delay=1, now=later) is None
    assert store.job_snooze(job.id, claimed.lease_version, 1, max_snoozes=5, now=later) is None
    assert store.job_release([(job.id, claimed.lease_version)], now=later) == set()
    assert store.job_cancel_leased(job.id, claimed.lease_version, now=later) is False
    assert store.job_lock_fenced(job.id, claimed.lease_version) is False
    job.refresh_from_db()
    assert (job.status, job.attempts, job.lease_version, job.run_at) == ("ready", 1, 2, now + timedelta(seconds=6))
    (entry,) = job.errors
    assert (entry["type"], entry["attempt"], entry["worker"]) == ("LeaseExpired", 1, "host:1:w1")


def test_reap_dead_letters_when_attempts_exhausted(now):
    job = enqueue("qa.record", max_attempts=1)
    claim(now, lease=5)
    (reaped,) = store.job_reap_expired(now=now + timedelta(seconds=6))
    assert reaped.status == "dead"
    job.refresh_from_db()
    assert (job.status, job.finished_at, job.errors[-1]["type"]) == ("dead", now + timedelta(seconds=6), "LeaseExpired")


def test_renewal_extends_lease_by_database_time(now):
    job = enqueue("qa.record")
    (c,) = claim(now, lease=5)
    renewed = store.job_renew([(job.id, c.lease_version, 5)], now=now + timedelta(seconds=4))
    assert renewed[job.id].leased_until == now + timedelta(seconds=9)
    assert store.job_reap_expired(now=now + timedelta(seconds=8)) == []
    assert len(store.job_reap_expired(now=now + timedelta(seconds=10))) == 1


def test_release_is_not_a_failed_attempt_and_bumps_token(now):
    job = enqueue("qa.record")
    (c,) = claim(now)
    assert store.job_release([(job.id, c.lease_version)], now=now + timedelta(seconds=1)) == {job.id}
    job.refresh_from_db()
    assert (job.status, job.attempts, job.lease_version, job.errors) == ("ready", 0, 2, [])
    assert job.run_at == now + timedelta(seconds=1)
    assert job.history[-1]["event"] == "released"
    # The releasing worker's late completion is refused.
    assert store.job_complete([(job.id, c.lease_version, None)], now=now) == set()


def test_fail_retries_then_dead_letters(now):
    job = enqueue("qa.record", max_attempts=2)
    (c,) = claim(now)
    status, run_at = store.job_fail(job.id, c.lease_version, {"type": "E", "attempt": 1}, retry_delay=3, now=now)
    assert (status, run_at) == ("ready", now + timedelta(seconds=3))
    (c,) = claim(run_at)
    status, _ = store.job_fail(job.id, c.lease_version, {"type": "E", "attempt": 2}, retry_delay=3, now=run_at)
    assert status == "dead"
    job.refresh_from_db()
    assert (job.attempts, [e["attempt"] for e in job.errors], job.finished_at) == (2, [1, 2], run_at)


def test_prune_keeps_dead_and_recent(now):
    old_done, recent_done, dead = (enqueue("qa.record", max_attempts=1) for _ in range(3))
    assert len(claim(now)) == 3
    store.job_complete([(old_done.id, 1, None)], now=now - timedelta(days=8))
    store.job_complete([(recent_done.id, 1, None)], now=now)
    store.job_fail(dead.id, 1, {"type": "E"}, retry_delay=None, now=now - timedelta(days=30))
    assert store.job_prune(older_than=7 * 86400, now=now) == 1
    assert set(Job.objects.values_list("id", flat=True)) == {recent_done.id, dead.id}


def test_release_lost_claims_takes_only_the_workers_rows_leased_after_the_clock(now):
    """``job_release_lost_claims``: the rows a worker's claims leased after ``since_us`` (a claim
    whose reply it lost) go back as a release of unstarted jobs; its rows leased at or before it (the
    jobs it holds: its claims' results carried that clock) and other workers' rows stay leased."""
    held, lost, other = enqueue("qa.record"), enqueue("qa.record"), enqueue("qa.record")
    first = store.job_claim(queues=None, limit=1, worker_id="host:1:w", lease=30, now=now)
    assert [c.id for c in first] == [held.id]
    assert first.clock_us == store.claim_clock_us(now=now) == (now - datetime(1970, 1, 1, tzinfo=UTC)) // MICRO
    later = now + timedelta(microseconds=1)
    assert [c.id for c in claim(later, limit=1, worker_id="host:1:w")] == [lost.id]
    assert [c.id for c in claim(later, limit=1, worker_id="host:2:w")] == [other.id]
    none_left = store.job_claim(queues=None, limit=1, worker_id="host:1:w", lease=30, now=later)
    assert none_left.clock_us is None
    released = store.job_release_lost_claims("host:1:w", since_us=first.clock_us, reason="claim reply lost",
                                             now=later)
    assert released == {lost.id}
    rows = {j.id: (j.status, j.attempts, j.lease_version, j.started_at) for j in Job.objects.all()}
    assert rows == {held.id: ("leased", 1, 1, now), lost.id: ("ready", 0, 2, None), other.id: ("leased", 1, 1, later)}
    history = Job.objects.get(pk=lost.id).history
    assert [e["reason"] for e in history if e["event"] == "released"] == ["claim reply lost"]
    assert store.job_release_lost_claims("host:1:w", since_us=first.clock_us, now=later) == set()
