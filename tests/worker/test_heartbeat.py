"""The heartbeat: one worker renews all its leases in one statement, so nothing that happens to one
job (its row locked by a long transaction) or to the database (an outage) may delay the renewal
of the others beyond their leases.

The renewal skips a row locked by a long ``fenced_atomic()`` transaction of another job of the
same worker (waiting for it would let every other lease expire and those jobs run twice), and
after a database outage renewals resume before the shortest held lease runs out.
"""

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.db.backends.signals import connection_created
from qa.models import Effect, Execution
from qa.tasks import record

from django_leasequeue import enqueue, signals, store
from django_leasequeue.conf import build
from django_leasequeue.models import Job
from django_leasequeue.runtime import ERROR_BACKOFF_MAX, Service, run_services
from django_leasequeue.worker import WorkerService
from tests.support import claim

pytestmark = pytest.mark.django_db(transaction=True)


class RowLock:
    """Hold the lock on a job row in another thread's transaction (as ``fenced_atomic()`` does)
    until :meth:`release`."""

    def __init__(self, job_id: int, version: int) -> None:
        self.locked = threading.Event()
        self._release = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(job_id, version))
        self.thread.start()
        assert self.locked.wait(10), "the row lock was not taken"

    def _run(self, job_id: int, version: int) -> None:
        try:
            with transaction.atomic():
                assert store.job_lock_for_commit(job_id, version) == "held"
                self.locked.set()
                self._release.wait(20)
        finally:
            connections.close_all()

    def release(self) -> None:
        self._release.set()
        self.thread.join(10)


@pytest.fixture
def statement_timeout():
    """A renewal that waits for a lock fails after 5 s instead of hanging the test."""
    with connection.cursor() as cur:
        cur.execute("SET statement_timeout = '5s'")
    yield
    with connection.cursor() as cur:
        cur.execute("RESET statement_timeout")


def test_renewal_skips_a_row_locked_by_another_transaction_and_reports_it_busy(statement_timeout):
    a, b = enqueue("qa.record", ["A"]), enqueue("qa.record", ["B"])
    claimed = {c.id: c for c in claim(limit=2, lease=30)}
    ca, cb = claimed[a.id], claimed[b.id]
    lock = RowLock(a.id, ca.lease_version)
    try:
        now = cb.claimed_at + timedelta(seconds=10)
        renewed = store.job_renew([(a.id, ca.lease_version, 60), (b.id, cb.lease_version, 60)], now=now)
    finally:
        lock.release()
    assert renewed == {
        a.id: store.Renewal(a.id, ca.leased_until, False, busy=True),  # still ours, not renewed this time
        b.id: store.Renewal(b.id, now + timedelta(seconds=60), False, busy=False),
    }
    assert Job.objects.get(pk=a.id).leased_until == ca.leased_until


def test_heartbeat_keeps_a_busy_lease_and_retries_it_within_a_second(statement_timeout):
    worker = WorkerService(concurrency=2, lease=30, notify=False, reap=False)
    a, b = enqueue("qa.record", ["A"]), enqueue("qa.record", ["B"])
    for job in store.job_claim(queues=None, limit=2, worker_id=worker.worker_id, lease=30):
        worker.pool.dispatch(worker.pool.track(job))
    items = {item.job.id: item for item in worker.pool.inflight_snapshot()}
    for item in items.values():
        item.next_renewal = 0.0  # both renewals due
    before = {job_id: item.ctx.leased_until for job_id, item in items.items()}
    lock = RowLock(a.id, items[a.id].job.lease_version)
    try:
        worker.heartbeat.run_once()
        ia, ib = items[a.id], items[b.id]
        assert (ia.ctx.leased_until, ia.ctx.lease_lost) == (before[a.id], False)
        assert ib.next_renewal - ia.next_renewal == pytest.approx(9.0)  # A: again in 1 s; B: in 10 s
        assert ib.ctx.leased_until > before[b.id] and not ib.ctx.lease_lost
    finally:
        lock.release()
    ia.next_renewal = 0.0
    worker.heartbeat.run_once()
    assert ia.ctx.leased_until > before[a.id] and not ia.ctx.lease_lost
    assert Job.objects.get(pk=a.id).leased_until == ia.ctx.leased_until


def test_long_fenced_transaction_of_one_job_does_not_let_another_jobs_lease_expire():
    """End to end in an in-process worker: job A holds its row locked in ``fenced_atomic()`` for
    1.5 times its 3 s lease while job B runs as long; B must be renewed all along and run once
    (the old blocking renewal let B's lease expire at 3 s and the embedded reaper take it back)."""
    lost: list[int] = []
    signals.job_lease_lost.connect(lambda sender, job_id, **kw: lost.append(job_id), weak=False,
                                   dispatch_uid="adversarial-hb-lost")
    try:
        a = enqueue("qa.adv_fenced_slow", ["A"], {"inside": 4.5})
        b = enqueue("qa.record", ["B"], {"sleep": 4.5})
        worker = WorkerService(concurrency=2, burst=True, poll_interval=0.05, notify=False, reap=True,
                               settings=build({"LEASE": 3, "REAPER_INTERVAL": 0.2}))
        assert run_services([worker], install_signals=False) == 0
    finally:
        signals.job_lease_lost.disconnect(dispatch_uid="adversarial-hb-lost")
    rows = {j.id: (j.status, j.attempts, j.history) for j in Job.objects.all()}
    assert rows == {a.id: ("done", 1, []), b.id: ("done", 1, [])}
    assert [Execution.objects.filter(job_id=j.id).count() for j in (a, b)] == [1, 1]
    assert list(Effect.objects.values_list("key", flat=True)) == ["A"]
    assert lost == []


def test_heartbeat_error_backoff_is_capped_by_the_shortest_renewal_interval_in_flight():
    worker = WorkerService(concurrency=2, lease=30, notify=False, reap=False)
    assert worker.heartbeat.error_backoff_max == 10.0  # nothing in flight: the worker's lease / 3
    enqueue("qa.record")
    enqueue("qa.record")
    record.using(lease=1.5).enqueue("short")
    for job in store.job_claim(queues=None, limit=3, worker_id=worker.worker_id, lease=30):
        worker.pool.dispatch(worker.pool.track(job))
    assert sorted(item.renew_every for item in worker.pool.inflight_snapshot()) == [0.5, 10.0, 10.0]
    assert worker.heartbeat.error_backoff_max == 0.5
    assert Service().error_backoff_max == ERROR_BACKOFF_MAX == 30.0  # other services keep the general cap


def test_heartbeat_retries_at_least_every_renewal_interval_while_the_database_refuses_renewals(caplog):
    """A real failure: the heartbeat thread's session is read-only (as on a standby after a
    failover), so every renewal fails. The waits between attempts double from 0.1 s but never
    exceed the 0.5 s renewal interval of the 1.5 s lease in flight."""
    record.using(lease=1.5).enqueue("short")
    worker = WorkerService(concurrency=1, lease=30, notify=False, reap=False)
    (job,) = store.job_claim(queues=None, limit=1, worker_id=worker.worker_id, lease=30)
    worker.pool.dispatch(worker.pool.track(job))
    (item,) = worker.pool.inflight_snapshot()
    item.next_renewal = 0.0  # due now, and still due after each failed attempt
    heartbeat = worker.heartbeat
    waits: list[float] = []

    def read_only(sender, connection, **kwargs):
        if threading.current_thread().name == "leasequeue-heartbeat":
            with connection.cursor() as cur:
                cur.execute("SET default_transaction_read_only = on")

    def record_wait(seconds: float) -> None:  # record the backoff, do not sleep it
        waits.append(seconds)
        if len(waits) >= 10:
            heartbeat.stop()
        Service.wait(heartbeat, 0.001)

    heartbeat.wait = record_wait
    connection_created.connect(read_only, dispatch_uid="adversarial-read-only")
    try:
        heartbeat.start()
        assert heartbeat.join(20)
    finally:
        connection_created.disconnect(dispatch_uid="adversarial-read-only")
    assert heartbeat.errors == 10 and heartbeat.crashed is None
    failures = [r for r in caplog.records if r.name == "django_leasequeue.runtime" and r.exc_info]
    assert len(failures) == 10
    assert all("in a read-only transaction" in str(r.exc_info[1]) for r in failures)
    assert waits == [0.1, 0.2, 0.4] + [0.5] * 7
    assert Job.objects.get(pk=job.id).leased_until == job.leased_until  # nothing was renewed
