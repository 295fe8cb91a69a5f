"""End-to-end basics on the real database: enqueue, claim, complete, fail, reap."""

from datetime import timedelta

import pytest
from invoices.tasks import flaky_sync

from django_leasequeue import store

pytestmark = pytest.mark.django_db


def test_claim_complete_roundtrip():
    job = flaky_sync.enqueue("k", failures=0)
    now = store.db_now()
    claimed = store.job_claim(queues=["default"], limit=10, worker_id="t", lease=30, now=now)
    assert [c.id for c in claimed] == [job.id]
    assert claimed[0].lease_version == 1 and claimed[0].attempts == 1
    assert store.job_complete([(job.id, 1, '"ok"')], now=now) == {job.id}
    job.refresh_from_db()
    assert (job.status, job.result) == ("done", "ok")
    # A second completion with the same (now stale) token changes nothing.
    assert store.job_complete([(job.id, 1, '"again"')], now=now) == set()


def test_expired_lease_is_reaped_and_token_bumped():
    job = flaky_sync.enqueue("k")
    now = store.db_now()
    (claimed,) = store.job_claim(queues=["default"], limit=1, worker_id="t", lease=5, now=now)
    assert store.job_reap_expired(now=now + timedelta(seconds=4)) == []
    reaped = store.job_reap_expired(now=now + timedelta(seconds=6))
    assert [(r.id, r.status, r.lease_version) for r in reaped] == [(job.id, "ready", 2)]
    # The stale holder's writes are refused.
    assert store.job_renew([(job.id, claimed.lease_version, 5)], now=now) == {}
    assert store.job_complete([(job.id, claimed.lease_version, None)], now=now) == set()
    job.refresh_from_db()
    assert job.errors[-1]["type"] == "LeaseExpired"


def test_enqueue_returns_decoded_json_fields():
    # The row comes back from a raw INSERT ... RETURNING: JSON columns must be decoded like the ORM does.
    job = flaky_sync.enqueue("k", failures=0)
    assert job.args == ["k"] and job.kwargs == {"failures": 0}
    assert job.errors == [] and job.history == [] and job.result is None
