"""Cancel requests: ready jobs at once, leased jobs at their worker's next write (store level)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from flowlab.tasks import rated_noop

from django_leasequeue import enqueue_many, store
from django_leasequeue.enqueueing import build_job
from django_leasequeue.models import Job

pytestmark = pytest.mark.django_db


def new_jobs(n: int) -> list[Job]:
    return store.job_insert([build_job(rated_noop, [i], queue="flow") for i in range(n)], notify=False,
                            channel="unused")


def claim(n: int):
    return store.job_claim(queues=["flow"], limit=n, worker_id="t", lease=30, rate_limits={})


def test_cancel_of_a_ready_job_is_immediate():
    (job,) = new_jobs(1)
    counts = store.job_request_cancel([job.id], by="alice")
    assert counts == store.CancelCounts(cancelled=1, requested=0, unchanged=0)
    job.refresh_from_db()
    assert (job.status, job.cancel_requested, job.attempts) == ("cancelled", False, 0)
    assert job.finished_at is not None
    assert job.history[-1]["event"] == "cancelled" and job.history[-1]["by"] == "alice"
    assert claim(5) == []


def test_cancel_of_a_leased_job_sets_the_flag_and_the_heartbeat_reports_it():
    (job,) = new_jobs(1)
    (c,) = claim(1)
    assert store.job_request_cancel([job.id]) == store.CancelCounts(0, 1, 0)
    assert store.job_request_cancel([job.id]) == store.CancelCounts(0, 0, 1, {"already asked to stop": 1})
    renewal = store.job_renew([(c.id, c.lease_version, 30)])[c.id]
    assert renewal.cancel_requested is True


@pytest.mark.parametrize("outcome", ["complete", "fail", "snooze", "release", "reap"])
def test_every_later_write_of_that_lease_ends_the_job_cancelled(outcome):
    from datetime import timedelta

    (job,) = new_jobs(1)
    (c,) = claim(1)
    store.job_request_cancel([job.id])
    if outcome == "complete":
        result = store.job_complete([(c.id, c.lease_version, '"the result"')])
        assert result == set() and result.cancelled == {c.id}
    elif outcome == "fail":
        assert store.job_fail(c.id, c.lease_version, {"type": "E", "message": "m"}, retry_delay=1.0)[0] == "cancelled"
    elif outcome == "snooze":
        assert store.job_snooze(c.id, c.lease_version, 5, max_snoozes=10) == "cancelled"
    elif outcome == "release":
        assert store.job_release([(c.id, c.lease_version)]) == {c.id}
    else:
        (reaped,) = store.job_reap_expired(now=store.db_now() + timedelta(seconds=60))
        assert reaped.status == "cancelled"
    job.refresh_from_db()
    assert job.status == "cancelled" and job.result is None and job.finished_at is not None
    # The stale token can write nothing more.
    assert store.job_complete([(c.id, c.lease_version, None)]) == set()


def test_completion_without_cancel_is_unchanged():
    (job,) = new_jobs(1)
    (c,) = claim(1)
    result = store.job_complete([(c.id, c.lease_version, '"ok"')])
    assert result == {c.id} and result.cancelled == set()


def test_lock_for_commit_refuses_after_a_cancel_request():
    (job,) = new_jobs(1)
    (c,) = claim(1)
    assert store.job_lock_for_commit(c.id, c.lease_version) == "held"
    store.job_request_cancel([job.id])
    assert store.job_lock_for_commit(c.id, c.lease_version) == "cancel_requested"
    assert store.job_lock_for_commit(c.id, c.lease_version + 1) == "lost"
    assert store.job_lock_fenced(c.id, c.lease_version) is True  # the old API: lease still held


def test_bulk_cancel_of_10000_ids_is_one_statement():
    enqueue_many(rated_noop, [[i] for i in range(10_000)], queue="flow")
    held = claim(100)
    ids = list(Job.objects.values_list("id", flat=True)) + [-1, -2, 10**12]
    Job.objects.filter(id__in=ids[:10]).exclude(id__in=[c.id for c in held]).update(status="done")
    done_before = Job.objects.filter(status="done").count()
    with CaptureQueriesContext(connection) as queries:
        counts = store.job_request_cancel(ids + ids[:50], by="bulk")  # duplicates are ignored
    assert len(queries) == 1
    assert counts == store.CancelCounts(cancelled=10_000 - 100 - done_before, requested=100,
                                        unchanged=done_before + 3,
                                        skipped={"already done": done_before, "no such job": 3})
    assert Job.objects.filter(status="leased", cancel_requested=True).count() == 100
    assert Job.objects.filter(status="ready").count() == 0
