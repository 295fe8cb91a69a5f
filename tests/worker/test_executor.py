"""The executor on one claimed job, in-process: outcomes C06 and C25, fenced completion, unique-key
scopes after dead letters and orphans (C12)."""

import enum
from datetime import timedelta

import pytest
from qa.models import Effect, Execution, Probe

from django_leasequeue import LeaseLost, enqueue, store, task
from django_leasequeue.conf import build
from django_leasequeue.models import Job
from django_leasequeue.worker import WorkerService
from tests.support import claim, context_for, run_claimed

pytestmark = pytest.mark.django_db


def later(seconds: float = 1) -> object:
    return store.db_now() + timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("kind", "type_name"),
    [("SystemExit", "builtins.SystemExit"), ("KeyboardInterrupt", "builtins.KeyboardInterrupt"),
     ("CancelledError", "asyncio.exceptions.CancelledError")],
)
def test_c06_base_exception_is_a_failed_attempt(kind, type_name):
    job = enqueue("qa.raise_base", [kind])
    (claimed,) = claim(later())
    assert run_claimed(claimed) == "ready"  # the executor returned: nothing escaped
    job.refresh_from_db()
    assert (job.status, job.attempts, job.leased_until) == ("ready", 1, None)
    assert job.errors[0]["type"] == type_name
    # Retried after the task's 60 s backoff, lease released at once (not left to expire).
    assert job.run_at - store.db_now() > timedelta(seconds=55)


def test_c25_non_json_return_value_is_a_readable_failure():
    job = enqueue("qa.bad_return")
    (claimed,) = claim(later())
    assert run_claimed(claimed) == "dead"
    job.refresh_from_db()
    assert job.status == "dead" and job.errors[0]["type"].endswith("PayloadNotSerializable")
    assert "return value is a builtins.object" in job.errors[0]["message"]


def test_c25_unprintable_exception_is_recorded():
    job = enqueue("qa.unprintable")
    normal = enqueue("qa.record", ["after"])
    first, second = claim(later(), limit=2)
    assert (first.id, second.id) == (job.id, normal.id)
    assert run_claimed(first) == "dead"
    job.refresh_from_db()
    (error,) = job.errors
    assert error["type"] == "qa.tasks.Unprintable"
    assert error["message"] == "<unprintable Unprintable>"
    assert "qa/tasks.py" in error["traceback"] and "raise Unprintable" in error["traceback"]
    # The worker goes on: the next job runs normally.
    assert run_claimed(second) == "done"


def test_fenced_atomic_commits_effect_with_completion():
    job = enqueue("qa.fenced_effect", ["inv-1"])
    (claimed,) = claim(later())
    assert run_claimed(claimed) == "done"
    job.refresh_from_db()
    assert (job.status, job.finished_at is not None) == ("done", True)
    assert list(Effect.objects.values_list("key", "job_id", "lease_version")) == [("inv-1", job.id, 1)]
    assert set(Probe.objects.values_list("kind", "ok")) == {("heartbeat", True), ("fenced", True)}


def test_fenced_atomic_with_stale_token_writes_nothing():
    job = enqueue("qa.fenced_effect", ["inv-2"])
    now = later()
    (stale,) = claim(now, lease=5)
    store.job_reap_expired(now=now + timedelta(seconds=6))  # the lease expired: token 1 -> 2
    (fresh,) = claim(now + timedelta(seconds=6), lease=5)   # another worker: token 3
    assert run_claimed(stale) == "lease_lost"
    assert Effect.objects.count() == 0
    assert set(Probe.objects.values_list("kind", "ok")) == {("heartbeat", False), ("fenced", False)}
    job.refresh_from_db()
    assert (job.status, job.lease_version) == ("leased", 3)  # the stale run changed nothing
    assert run_claimed(fresh) == "done"
    assert list(Effect.objects.values_list("lease_version", flat=True)) == [3]


def test_context_check_lease_and_heartbeat():
    job = enqueue("qa.record")
    now = later()
    (c,) = claim(now, lease=5)
    ctx = context_for(c)
    ctx.check_lease()
    assert ctx.heartbeat() is True and ctx.leased_until > now
    store.job_release([(job.id, c.lease_version)])
    assert ctx.heartbeat() is False and ctx.lease_lost
    with pytest.raises(LeaseLost):
        ctx.check_lease()


def test_worker_heartbeat_uses_the_job_rows_lease():
    """A job enqueued with using(lease=2) on a task declared with lease=10 is claimed for 2 s, so
    the heartbeat must renew it every 2/3 s, not every 10/3 s (or the lease expires in between)."""
    from invoices.tasks import send_invoice

    job = send_invoice.using(lease=2).enqueue(1, "2026-11")
    assert Job.objects.get(pk=job.pk).lease_seconds == 2
    worker = WorkerService(concurrency=1, lease=30, notify=False)
    (claimed,) = store.job_claim(queues=None, limit=1, worker_id=worker.worker_id, lease=30, now=later())
    assert claimed.lease_seconds == 2
    worker.pool.dispatch(worker.pool.track(claimed))
    (item,) = worker.pool.inflight_snapshot()
    assert (item.lease, item.ctx.lease_seconds, item.renew_every) == (2, 2, 2 / 3)


def test_worker_honours_heartbeat_interval_setting():
    job = enqueue("qa.record")  # no lease of its own: the worker's 30 s
    worker = WorkerService(concurrency=1, notify=False, settings=build({"LEASE": 30, "HEARTBEAT_INTERVAL": 0.5}))
    (claimed,) = store.job_claim(queues=None, limit=1, worker_id=worker.worker_id, lease=worker.lease, now=later())
    assert (claimed.id, claimed.lease_seconds) == (job.id, 30)
    worker.pool.dispatch(worker.pool.track(claimed))
    (item,) = worker.pool.inflight_snapshot()
    assert item.renew_every == 0.5


class TestUniqueKeyScopes:
    """Case C12: both scopes exist; a dead or orphaned keyed job never blocks forever."""

    def test_c12_retained_scope_returns_the_dead_job(self):
        first = enqueue("qa.fail_once", unique_key="k")
        (c,) = claim(later())
        assert run_claimed(c) == "dead"
        again = enqueue("qa.fail_once", unique_key="k")
        assert again.id == first.id and again.status == "dead"
        assert Job.objects.count() == 1

    def test_c12_active_scope_releases_the_key_on_dead_and_done(self):
        first = enqueue("qa.fail_once", unique_key="k", unique_scope="active")
        assert enqueue("qa.fail_once", unique_key="k", unique_scope="active").id == first.id  # ready: same
        (c,) = claim(later())
        assert enqueue("qa.fail_once", unique_key="k", unique_scope="active").id == first.id  # leased: same
        assert run_claimed(c) == "dead"
        second = enqueue("qa.fail_once", unique_key="k", unique_scope="active")
        assert second.id != first.id and second.status == "ready"
        (c,) = claim(later())
        store.job_complete([(c.id, c.lease_version, None)])
        third = enqueue("qa.fail_once", unique_key="k", unique_scope="active")
        assert third.id not in (first.id, second.id)
        assert Job.objects.filter(unique_key="k").count() == 3

    def test_scopes_do_not_collide(self):
        retained = enqueue("qa.record", unique_key="same")
        active = enqueue("qa.record", unique_key="same", unique_scope="active")
        assert retained.id != active.id

    @pytest.mark.parametrize("scope", ["retained", "active"])
    def test_c12_orphaned_job_dedupes_then_runs_after_reaping(self, scope):
        orphan = enqueue("qa.record", unique_key="k2", unique_scope=scope)
        now = later()
        claim(now, lease=3)  # its worker is SIGKILLed: nobody renews or completes
        assert enqueue("qa.record", unique_key="k2", unique_scope=scope).id == orphan.id
        (reaped,) = store.job_reap_expired(now=now + timedelta(seconds=4))
        assert (reaped.id, reaped.status) == (orphan.id, "ready")
        (c,) = claim(now + timedelta(seconds=4))
        assert c.id == orphan.id and run_claimed(c) == "done"
        assert Execution.objects.filter(job_id=orphan.id).count() == 1
        later_job = enqueue("qa.record", unique_key="k2", unique_scope=scope)
        assert (later_job.id == orphan.id) is (scope == "retained")


def test_enum_return_value_is_stored_as_its_value():
    job = enqueue("tests.returns_enum")
    (c,) = claim(later())
    assert run_claimed(c) == "done"
    job.refresh_from_db()
    assert job.result == {"level": 3}


@task(name="tests.returns_enum")
def returns_enum():
    return {"level": Level.HIGH}


class Level(enum.IntEnum):
    HIGH = 3
