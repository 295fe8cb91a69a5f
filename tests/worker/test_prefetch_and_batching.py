"""Prefetched jobs, batched completions, the enqueue fast paths and the epoch-microsecond claim
timestamps at their edges: a prefetched job whose lease was lost, that was cancelled, or that was
released during a renewal is not run and not reported lost; completions lost or refused are
accounted for.

Each prefetch test drives a WorkerService whose threads were never started: the claimed jobs wait
in its pool exactly like prefetched jobs behind busy threads, and ``_run_job`` is called directly
where a thread would take the next job. Deterministic: no sleeps, no wall-clock assertions.
"""

from __future__ import annotations

import pytest
from qa.models import Execution

from django_leasequeue import enqueue_many, store, task
from django_leasequeue.context import JobContext
from django_leasequeue.models import Job
from django_leasequeue.worker import InFlight, WorkerService

pytestmark = pytest.mark.django_db


@task(name="adv2.manual_record", takes_context=True, manual_heartbeat=True, lease=30)
def manual_record(context: JobContext, tag: str = "") -> str:
    Execution.objects.create(job_id=context.job_id, lease_version=context.lease_version, attempt=context.attempt,
                             worker=context.worker_id, tag=tag)
    return tag


def prefetching_worker(concurrency: int = 1, prefetch_max: int = 4) -> WorkerService:
    worker = WorkerService(queues=["default"], concurrency=concurrency, reap=False, notify=False,
                           prefetch_wait=0.05, prefetch_max=prefetch_max)
    worker.pool.avg_runtime = 0.0001  # short jobs: prefetch the maximum
    return worker


def queued(worker: WorkerService) -> list[InFlight]:
    """The pool's queue, in order (what the threads would take next)."""
    items = []
    while not worker.pool.tasks.empty():
        item = worker.pool.tasks.get_nowait()
        if item is not None:
            items.append(item)
    return items


def test_a_prefetched_job_whose_lease_was_lost_is_not_run():
    """A prefetched job can lose its lease while it waits (expired and taken by another worker, or
    released by an operator). The heartbeat notices; a thread must then drop it, not run its
    handler next to the worker that holds the job now."""
    enqueue_many("qa.record", [[f"t{i}"] for i in range(5)])
    worker = prefetching_worker()
    worker.run_once()
    items = queued(worker)
    assert len(items) == 5 and {i.started for i in items} == {False}
    victim = items[1]
    now = store.db_now()
    assert store.job_expire_lease(victim.job.id, victim.job.lease_version, now=now)
    assert [r.id for r in store.job_reap_expired(now=now)] == [victim.job.id]
    (other,) = store.job_claim_ids([victim.job.id], worker_id="other-worker", lease=30, now=now)
    assert other.lease_version == victim.job.lease_version + 2  # reaped (+1), claimed again (+1)
    for item in worker.pool.inflight_snapshot():
        item.next_renewal = 0.0
    worker.heartbeat.run_once()
    assert victim.ctx.lease_lost
    # A thread reaches it: the handler must not run with the stale token.
    worker.pool.run_job(victim)
    assert not Execution.objects.filter(job_id=victim.job.id).exists()
    assert victim.job.id not in {i.job.id for i in worker.pool.inflight_snapshot()}
    row = Job.objects.get(pk=victim.job.id)
    assert (row.status, row.lease_version, row.leased_by) == ("leased", other.lease_version, "other-worker")


def test_a_prefetched_manual_heartbeat_job_is_renewed_while_it_waits():
    """manual_heartbeat means the *handler* renews; before a thread starts it nobody else would,
    so its lease runs out in the pool (and another worker may take and run it while this one
    still holds it). Prefetched jobs are heartbeated while held, whatever the task's mode."""
    enqueue_many(manual_record, [[f"m{i}"] for i in range(3)])
    worker = prefetching_worker()
    worker.run_once()
    items = worker.pool.inflight_snapshot()
    assert len(items) == 3 and {i.manual_heartbeat for i in items} == {True}
    before = {j.id: j.leased_until for j in Job.objects.filter(status="leased")}
    for item in items:
        item.next_renewal = 0.0
    running = items[0]
    with worker.pool.lock:
        running.started = True  # a thread runs this one: its handler renews it, not the heartbeat
    worker.heartbeat.run_once()
    after = {j.id: j.leased_until for j in Job.objects.filter(status="leased")}
    waiting = [i.job.id for i in items[1:]]
    assert all(after[i] > before[i] for i in waiting), (before, after)
    assert after[running.job.id] == before[running.job.id]


def test_a_job_cancelled_while_prefetched_is_not_started():
    """An operator cancels a job the worker holds but has not started: the heartbeat brings the
    request back; the thread that reaches the job must not start the handler (nothing ran yet,
    so the job ends cancelled at once)."""
    enqueue_many("qa.record", [[f"c{i}"] for i in range(3)])
    worker = prefetching_worker()
    worker.run_once()
    items = queued(worker)
    victim = items[2]
    counts = store.job_request_cancel([victim.job.id], by="operator")
    assert counts.requested == 1
    for item in worker.pool.inflight_snapshot():
        item.next_renewal = 0.0
    worker.heartbeat.run_once()
    assert victim.ctx.cancel_requested
    worker.pool.run_job(victim)
    assert not Execution.objects.filter(job_id=victim.job.id).exists()
    row = Job.objects.get(pk=victim.job.id)
    assert (row.status, row.leased_until) == ("cancelled", None)
    assert victim.job.id not in {i.job.id for i in worker.pool.inflight_snapshot()}


def test_jobs_released_unstarted_are_not_claimed_again_while_the_threads_stay_busy():
    """Every thread is stuck in a long job: the prefetched jobs are released after
    PREFETCH_RELEASE_AFTER. The release wakes the claim loop; with the allowance still computed from
    the short jobs of before, it claimed the same number again at once, to release them a second
    later: a churn that bumps each job's token and appends a history entry every second for as
    long as the long job runs, and keeps those jobs from idle workers."""
    enqueue_many("qa.record", [[f"r{i}"] for i in range(20)])
    worker = prefetching_worker(concurrency=1, prefetch_max=4)
    worker.run_once()
    items = queued(worker)
    assert len(items) == 5 and worker.claimed == 5
    long_job = items[0]
    with worker.pool.lock:
        long_job.started = True  # the only thread is busy with it
        for item in items[1:]:
            item.claimed_at -= 5.0  # held for 5 s, never started
    assert worker.pool.release_unstarted(older_than=1.0) == 4
    worker.run_once()
    assert worker.claimed == 5, "claimed again while the only thread is still busy"
    assert Job.objects.filter(status="leased").count() == 1


@pytest.mark.parametrize("when", [
    "1969-12-31T23:59:59.999999+00:00",  # one microsecond before the epoch
    "1901-03-04T05:06:07.000001+00:00",  # far before it
    "1970-01-01T00:00:00+00:00",
    "2026-03-08T01:59:59.999999-05:00",  # New York, the last microsecond before the DST jump
    "2026-11-01T01:30:00.5-04:00",  # the repeated hour (first pass)
    "2026-11-01T01:30:00.5-05:00",  # the repeated hour (second pass)
    "2126-11-29T17:00:00.123456+00:00",  # 100 years ahead
])
def test_claim_times_decode_exactly_whatever_the_instant(when):
    from datetime import datetime, timedelta

    now = datetime.fromisoformat(when)
    job = store.job_insert_one(store.NewJob(task="qa.record", queue="default", priority=0, args_json='["x"]',
                                            kwargs_json="{}", max_attempts=3, run_at=now - timedelta(microseconds=1)),
                               notify=False, channel="leasequeue", now=now - timedelta(seconds=3))
    (claimed,) = store.job_claim(queues=["default"], limit=1, worker_id="t", lease=0.000001, now=now)
    assert claimed.id == job.id
    row = Job.objects.get(pk=job.id)
    assert (claimed.claimed_at, claimed.started_at, claimed.created_at, claimed.leased_until) == (
        now, now, now - timedelta(seconds=3), now + timedelta(microseconds=1))
    assert (row.attempted_at, row.started_at, row.created_at, row.leased_until) == (
        claimed.claimed_at, claimed.started_at, claimed.created_at, claimed.leased_until)
    assert claimed.claimed_at.utcoffset() == timedelta(0)


def test_claim_times_are_naive_like_every_other_read_when_use_tz_is_false():
    """With USE_TZ = False Django reads timestamptz as naive datetimes in the connection's time
    zone (every ORM read, the lease renewal, Job rows). The claim must not hand out aware UTC
    datetimes next to them: a handler comparing context.leased_until with timezone.now(), or with
    its own value after a renewal, would raise TypeError."""
    from django.test import override_settings
    from django.utils import timezone

    enqueue_many("qa.record", [["tz"]])
    with override_settings(USE_TZ=False, TIME_ZONE="America/New_York"):
        (claimed,) = store.job_claim(queues=["default"], limit=1, worker_id="t", lease=30)
        row = Job.objects.get(pk=claimed.id)
        renewal = store.job_renew([(claimed.id, claimed.lease_version, 30.0)])[claimed.id]
        assert row.attempted_at.tzinfo is None and renewal.leased_until.tzinfo is None
        assert (claimed.claimed_at, claimed.started_at, claimed.created_at, claimed.leased_until) == (
            row.attempted_at, row.started_at, row.created_at, row.leased_until)
        assert claimed.leased_until <= renewal.leased_until and claimed.claimed_at <= timezone.now()


def test_enqueue_many_refuses_bad_arguments_as_enqueue_does():
    """The fast path must raise what enqueue() raises for the same job: a keyword argument name
    that is not a str is a PayloadNotSerializable (it cannot be stored), not an ArgumentsMismatch."""
    from django_leasequeue import enqueue
    from django_leasequeue.exceptions import PayloadNotSerializable

    bad = {1: "x"}
    with pytest.raises(PayloadNotSerializable) as one:
        enqueue("qa.record", [], bad)
    with pytest.raises(PayloadNotSerializable) as many:
        enqueue_many("qa.record", [([], {"tag": "ok"}), ([], bad)])
    assert "keyword argument name 1 is not a str" in str(one.value) and "job 1" in str(many.value)
    # Arguments that are not JSON *and* do not bind: the payload error first, as in enqueue().
    with pytest.raises(PayloadNotSerializable):
        enqueue("qa.record", [{1, 2}, 2, 3, 4])
    with pytest.raises(PayloadNotSerializable):
        enqueue_many("qa.record", [[{1, 2}, 2, 3, 4]])
    assert Job.objects.count() == 0


@pytest.mark.parametrize("scope", ["retained", "active"])
def test_enqueue_fast_paths_keep_unique_keys_in_both_scopes(scope):
    now = store.db_now()
    first = store.job_insert_one(store.NewJob(task="qa.record", queue="default", priority=0, args_json="[]",
                                              kwargs_json="{}", max_attempts=3, unique_key="u", unique_scope=scope),
                                 notify=False, channel="leasequeue", now=now)
    assert first is not None
    # Taken while the job is ready, in both scopes, by both fast paths.
    assert enqueue_many("qa.record", [["a"], ["b"]], unique_key="u", unique_scope=scope) == 0
    from django_leasequeue import enqueue

    assert enqueue("qa.record", ["c"], unique_key="u", unique_scope=scope).id == first.id
    (claimed,) = store.job_claim(queues=["default"], limit=1, worker_id="t", lease=30, now=now)
    assert store.job_complete([(claimed.id, claimed.lease_version, None)], now=now) == {claimed.id}
    # Finished: "active" frees the key, "retained" keeps it while the row exists.
    assert enqueue_many("qa.record", [["d"], ["e"]], unique_key="u", unique_scope=scope) == (
        1 if scope == "active" else 0)
    again = enqueue("qa.record", ["f"], unique_key="u", unique_scope=scope)
    assert (again.id == first.id) is (scope == "retained")
    assert Job.objects.filter(unique_key="u").count() == (2 if scope == "active" else 1)


def test_a_lost_async_done_mark_is_a_failed_attempt_dead_on_the_last_one():
    """What docs/howto/performance.md says ASYNC_COMPLETIONS can lose: a PostgreSQL crash that drops a
    committed-but-unflushed completion leaves the row as the claim wrote it (leased, old token)
    while the worker has moved on. The row's fate is then the reaper's: a LeaseExpired attempt,
    and dead-lettered when it was the last one, although the handler succeeded."""
    now = store.db_now()
    job = store.job_insert_one(store.NewJob(task="qa.record", queue="default", priority=0, args_json="[]",
                                            kwargs_json="{}", max_attempts=1), notify=False, channel="leasequeue",
                               now=now)
    (claimed,) = store.job_claim(queues=["default"], limit=1, worker_id="t", lease=30, now=now)
    # (the handler succeeded; its done mark was the lost async commit: the row is untouched)
    assert store.job_expire_lease(claimed.id, claimed.lease_version, now=now)
    (reaped,) = store.job_reap_expired(now=now)
    row = Job.objects.get(pk=job.id)
    assert (reaped.status, row.status, row.errors[-1]["type"]) == ("dead", "dead", "LeaseExpired")
    # And the completion, if it ever came again with that token, is refused (fencing unchanged).
    assert store.job_complete([(claimed.id, claimed.lease_version, None)], now=now,
                              synchronous_commit=False) == set()


@pytest.mark.django_db(transaction=True)
def test_prefetched_jobs_stay_held_and_renewed_when_their_release_fails():
    """The timed release of unstarted jobs fails (the database refuses it, or is briefly away).
    The jobs were already out of the worker's list: nobody renewed them any more, their leases
    expired and the reaper charged each a LeaseExpired attempt (dead on the last one) for jobs
    that never ran, even when the database was back within a second. They must stay held and
    heartbeated, and be released by a later round."""
    from django.db import connection

    enqueue_many("qa.record", [[f"f{i}"] for i in range(5)])
    worker = prefetching_worker()
    worker.run_once()
    items = worker.pool.inflight_snapshot()
    assert len(items) == 5
    with worker.pool.lock:
        items[0].started = True  # the only thread is busy
        for item in items[1:]:
            item.claimed_at -= 5.0
    with connection.cursor() as cur:
        cur.execute("""
            CREATE FUNCTION adv2_refuse_release() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF current_setting('adv2.refuse', true) = 'on' AND NEW.status = 'ready' THEN
                    RAISE EXCEPTION 'adv2: release refused';
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER adv2_refuse_release BEFORE UPDATE ON leasequeue_job
                FOR EACH ROW EXECUTE FUNCTION adv2_refuse_release();
            SELECT set_config('adv2.refuse', 'on', false);
        """)
    try:
        assert worker.pool.release_unstarted(older_than=1.0) == 0
        held = {i.job.id for i in worker.pool.inflight_snapshot()}
        assert held == {i.job.id for i in items}, "unreleased jobs dropped from the heartbeat"
        for item in worker.pool.inflight_snapshot():
            item.next_renewal = 0.0
        worker.heartbeat.run_once()  # its own release attempt fails again; the renewals go through
        assert {i.job.id for i in worker.pool.inflight_snapshot()} == held
        assert not any(i.ctx.lease_lost for i in items)
        with connection.cursor() as cur:
            cur.execute("SELECT set_config('adv2.refuse', 'off', false)")
        assert worker.pool.release_unstarted(older_than=1.0) == 4
        assert Job.objects.filter(status="ready", attempts=0).count() == 4
    finally:
        with connection.cursor() as cur:
            cur.execute("SELECT set_config('adv2.refuse', 'off', false); DROP TRIGGER adv2_refuse_release ON "
                        "leasequeue_job; DROP FUNCTION adv2_refuse_release()")


def test_enqueue_many_splits_a_chunk_whose_json_is_too_large_for_one_jsonb(monkeypatch):
    """A chunk of up to 10,000 jobs of up to MAX_PAYLOAD_BYTES (1 MiB) each went out as ONE jsonb
    value; PostgreSQL refuses any jsonb over 256 MB ("total size of jsonb array elements exceeds
    the maximum"), so e.g. 300 jobs of 1 MB failed where the general path (one text per job)
    worked. The chunk is split by size: here with the threshold lowered to a few jobs' worth,
    every job is written once, in order, with its own arguments. (The full-size reproduction,
    300 MB, is too heavy for the suite: see the review report.)"""
    from django_leasequeue import payload

    monkeypatch.setattr(payload, "MAX_CHUNK_CHARS", 50)
    pairs = [([f"job-{i:03d}"], {"sleep": float(i % 3)}) if i % 4 == 0 else [f"job-{i:03d}"] for i in range(37)]
    assert enqueue_many("qa.record", pairs) == 37
    rows = list(Job.objects.order_by("id").values_list("args", "kwargs"))
    assert rows == [([f"job-{i:03d}"], {"sleep": float(i % 3)} if i % 4 == 0 else {}) for i in range(37)]
    # Errors still name the job by its index in the whole list, wherever the split put it.
    from django_leasequeue.exceptions import PayloadNotSerializable

    with pytest.raises(PayloadNotSerializable, match=r"job 29 argument 'tag'"):
        enqueue_many("qa.record", [[f"ok-{i}"] for i in range(29)] + [[{1}]])


@pytest.mark.skipif(not __import__("os").environ.get("LEASEQUEUE_HEAVY_TESTS"),
                    reason="sends 300 MB to PostgreSQL; set LEASEQUEUE_HEAVY_TESTS=1 to run")
def test_enqueue_many_of_300_one_megabyte_jobs():
    """The full-size reproduction: 300 jobs of 1 MB (the default MAX_PAYLOAD_BYTES is 1 MiB)."""
    blob = "x" * 1_000_000
    assert enqueue_many("qa.record", [[blob]] * 300) == 300
    assert Job.objects.count() == 300


def test_a_prefetched_job_released_during_a_renewal_is_not_reported_lost(monkeypatch):
    """Graceful stop releases the prefetched jobs from the worker's thread while the heartbeat
    thread renews from a snapshot taken just before: the renewal is refused (token bumped by the
    release) and was reported as a lost lease (a lease_lost event and a note in the job's
    history, which the lease report counts as a fence rejection). The heartbeat must only report
    jobs the worker still holds."""
    enqueue_many("qa.record", [[f"s{i}"] for i in range(3)])
    worker = prefetching_worker()
    worker.run_once()
    for item in worker.pool.inflight_snapshot():
        item.next_renewal = 0.0
    renew = store.job_renew

    def release_then_renew(leases, **kwargs):
        # Exactly in the window: the snapshot is taken, the stop releases everything unstarted.
        assert worker.pool.release_unstarted() == 3
        return renew(leases, **kwargs)

    monkeypatch.setattr(store, "job_renew", release_then_renew)
    lost = []
    from django_leasequeue import signals

    def on_lost(**fields):
        lost.append(fields["job_id"])

    signals.job_lease_lost.connect(on_lost, weak=False)
    try:
        worker.heartbeat.run_once()
    finally:
        signals.job_lease_lost.disconnect(on_lost)
    assert lost == []
    assert [e["event"] for j in Job.objects.all() for e in j.history if e["event"] != "released"] == []
    assert set(Job.objects.values_list("status", flat=True)) == {"ready"}


def test_a_held_job_is_not_started_once_its_lease_may_have_run_out_by_the_workers_clock():
    """The heartbeat may be starved of CPU (or the whole process paused) while a job waits in the
    pool: by the time a thread reaches it, its lease may have expired and another worker may run
    it, before any renewal could report the loss. The thread checks the lease against its own
    clock and gives the job back instead of starting it (fenced release: not an attempt)."""
    import time

    enqueue_many("qa.record", [[f"e{i}"] for i in range(3)])
    worker = prefetching_worker()
    worker.run_once()
    items = queued(worker)
    victim = items[1]
    victim.lease_valid_until = time.monotonic() + 0.5  # within the margin (1 s for a 30 s lease)
    worker.pool.run_job(victim)
    assert not Execution.objects.filter(job_id=victim.job.id).exists()
    assert victim.job.id not in {i.job.id for i in worker.pool.inflight_snapshot()}
    row = Job.objects.get(pk=victim.job.id)
    assert (row.status, row.attempts, row.lease_version) == ("ready", 0, victim.job.lease_version + 1)
    # The others, well inside their leases, run as usual.
    worker.pool.run_job(items[0])
    assert Execution.objects.filter(job_id=items[0].job.id).count() == 1
