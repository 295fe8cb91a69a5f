"""The worker's fast paths keep their guarantees: batched completion stays fenced per row, the
claim returns exact database times, ASYNC_COMPLETIONS is limited to the completion's own
transaction, and prefetched jobs that no thread started go back to ready (token bumped, no attempt
counted)."""

import time
from datetime import timedelta

import pytest
from django.db import connection
from invoices.tasks import flaky_sync

from django_leasequeue import enqueue_many, store
from django_leasequeue.conf import build, get_settings
from django_leasequeue.models import Job
from django_leasequeue.worker import WorkerService

pytestmark = pytest.mark.django_db


def claim(now, limit=10):
    return store.job_claim(queues=["default"], limit=limit, worker_id="t", lease=30, now=now)


def test_batched_completion_is_fenced_per_row_and_keeps_results():
    jobs = [flaky_sync.enqueue(f"k{i}", failures=0) for i in range(3)]
    now = store.db_now()
    claimed = claim(now)
    assert [c.id for c in claimed] == [j.id for j in jobs]
    a, b, c = claimed
    done = store.job_complete([(a.id, a.lease_version, '"ra"'), (b.id, b.lease_version + 7, '"stale"'),
                               (c.id, c.lease_version, None)], now=now)
    assert done == {a.id, c.id}
    rows = {j.id: (j.status, j.result, j.finished_at) for j in Job.objects.filter(pk__in=[a.id, b.id, c.id])}
    assert rows == {a.id: ("done", "ra", now), b.id: ("leased", None, None), c.id: ("done", None, now)}
    # Nothing left to complete with the same tokens; no results at all is a NULL array.
    assert store.job_complete([(a.id, a.lease_version, None), (c.id, c.lease_version, None)], now=now) == set()


def test_claim_returns_exact_database_times():
    job = flaky_sync.enqueue("k", failures=0)
    now = store.db_now() + timedelta(microseconds=123457)
    (claimed,) = claim(now)
    assert (claimed.claimed_at, claimed.leased_until) == (now, now + timedelta(seconds=30))
    job.refresh_from_db()
    assert (job.attempted_at, job.leased_until) == (now, claimed.leased_until)
    assert (claimed.args, claimed.kwargs) == (["k"], {"failures": 0})


def test_async_completion_turns_synchronous_commit_off_for_its_own_transaction_only():
    flaky_sync.enqueue("k", failures=0)
    now = store.db_now()
    (job,) = claim(now)
    with connection.cursor() as cur:
        cur.execute("SHOW synchronous_commit")
        before = cur.fetchone()[0]
        assert store.job_complete([(job.id, job.lease_version, None)], now=now, synchronous_commit=False) == {job.id}
        cur.execute("SHOW synchronous_commit")  # same (test) transaction: the local setting applies
        assert cur.fetchone()[0] == "off"
    assert before in ("on", "remote_apply", "remote_write", "local")


@pytest.mark.django_db(transaction=True)
def test_async_completion_in_autocommit_leaves_the_session_durable():
    flaky_sync.enqueue("k", failures=0)
    (job,) = claim(None)
    with connection.cursor() as cur:
        cur.execute("SHOW synchronous_commit")
        before = cur.fetchone()[0]
    assert store.job_complete([(job.id, job.lease_version, None)], synchronous_commit=False) == {job.id}
    with connection.cursor() as cur:
        cur.execute("SHOW synchronous_commit")
        assert cur.fetchone()[0] == before
    assert Job.objects.get(pk=job.id).status == "done"


def test_prefetch_allowance_follows_recent_job_durations():
    worker = WorkerService(queues=["default"], concurrency=4, reap=False, notify=False,
                           prefetch_wait=0.05, prefetch_max=64)
    assert worker.producer.prefetch_allowance() == 0  # nothing timed yet: claim only for free threads
    worker.pool.avg_runtime = 0.010  # 4 threads x 50 ms / 10 ms
    assert worker.producer.prefetch_allowance() == 20
    worker.pool.avg_runtime = 0.0001
    assert worker.producer.prefetch_allowance() == 64
    worker.pool.avg_runtime = 1.0
    assert worker.producer.prefetch_allowance() == 0
    assert WorkerService(concurrency=4, notify=False, prefetch_wait=0).producer.prefetch_allowance() == 0
    assert get_settings().prefetch_wait == 0.05 and get_settings().prefetch_max == 64
    # Never from a rate-limited queue (the limit counts claims): not when the worker serves one.
    rated = build({"QUEUES": {"default": {}, "partner": {"rate_limit": "10/s"}}})
    for queues, allowance in ((["default"], 64), (["default", "partner"], 0), (None, 0)):
        w = WorkerService(queues=queues, concurrency=4, notify=False, settings=rated)
        w.pool.avg_runtime = 0.0001
        assert w.producer.prefetch_allowance() == allowance, queues


def test_prefetched_jobs_not_started_are_released_with_token_bumped_and_no_attempt():
    enqueue_many(flaky_sync, [[f"k{i}"] for i in range(30)])
    worker = WorkerService(queues=["default"], concurrency=2, reap=False, notify=False,
                           prefetch_wait=0.05, prefetch_max=8)
    worker.pool.avg_runtime = 0.001  # short jobs: hold 2 threads + 8 prefetched
    assert worker.run_once() == 0.0  # threads were never started: every claimed job waits in the pool
    assert worker.claimed == 10 and len(worker.pool.inflight_snapshot()) == 10
    held = Job.objects.filter(status="leased", lease_version=1, attempts=1)
    assert held.count() == 10
    claimed_at = {j.id: j.attempted_at for j in held}
    assert {j.started_at == j.attempted_at for j in held} == {True}
    # The heartbeat renews prefetched jobs like running ones (their lease runs from the claim).
    leased_until = {j.id: j.leased_until for j in held}
    for item in worker.pool.inflight_snapshot():
        assert item.started is False and item.deadline is None
        item.next_renewal = 0.0
    worker.heartbeat.run_once()
    renewed = {j.id: j.leased_until for j in Job.objects.filter(id__in=leased_until)}
    assert all(renewed[i] > leased_until[i] for i in leased_until)
    # Held jobs past the refill mark: the next round claims nothing and waits to be woken.
    assert worker.run_once() == worker.poll_interval and worker.claimed == 10
    assert worker.pool.release_unstarted(older_than=3600) == 0  # none old enough
    assert worker.pool.release_unstarted() == 10
    assert worker.pool.inflight_snapshot() == []
    released = Job.objects.filter(lease_version=2)
    assert released.count() == 10
    assert {(j.status, j.attempts, j.leased_until, j.started_at, j.history[-1]["event"]) for j in released} == {
        ("ready", 0, None, None, "released")}
    # Not a counted attempt: no start time; attempted_at keeps the latest claim.
    assert {j.id: j.attempted_at for j in released} == claimed_at
    # The skipped queue entries are dropped by the threads: nothing runs, nothing is written.
    item = worker.pool.tasks.get_nowait()
    assert worker.pool.run_job(item) is False
    assert Job.objects.filter(status="ready").count() == 30


def test_a_claimed_batch_is_in_claim_order():
    # The worker starts a batch's jobs in list order (one thread: exactly this order), and UPDATE ...
    # RETURNING has none of its own: priority descending, then run_at, then id.
    now = store.db_now()
    late = flaky_sync.using(priority=5, run_at=now - timedelta(seconds=1)).enqueue("late", failures=0)
    early = flaky_sync.using(priority=5, run_at=now - timedelta(seconds=9)).enqueue("early", failures=0)
    low = flaky_sync.using(priority=-1, run_at=now - timedelta(seconds=20)).enqueue("low", failures=0)
    high = flaky_sync.using(priority=50, run_at=now - timedelta(seconds=2)).enqueue("high", failures=0)
    plain = flaky_sync.enqueue("plain", failures=0)
    assert [c.id for c in claim(store.db_now(), limit=10)] == [high.id, early.id, late.id, plain.id, low.id]


def test_enqueue_returns_the_stored_job_and_keeps_unique_keys():
    job = flaky_sync.using(unique_key="k-1").enqueue("k", failures=1)
    stored = Job.objects.get(pk=job.id)
    fields = [f.attname for f in Job._meta.concrete_fields]
    assert {f: getattr(job, f) for f in fields} == {f: getattr(stored, f) for f in fields}
    assert (job.args, job.kwargs, job.status, job.unique_key) == (["k"], {"failures": 1}, "ready", "k-1")
    again = flaky_sync.using(unique_key="k-1").enqueue("other")
    assert again.id == job.id and Job.objects.count() == 1
    plain = flaky_sync.enqueue("p")
    assert (plain.unique_key, plain.args, plain.kwargs) == (None, ["p"], {})


def test_enqueue_many_keeps_order_arguments_and_options():
    later = store.db_now() + timedelta(hours=1)
    n = enqueue_many(flaky_sync, [["a"], (["b"], {"failures": 3}), ["c", 1]], run_at=later, priority=7, queue="bulk")
    assert n == 3
    jobs = list(Job.objects.order_by("id"))
    assert [(j.args, j.kwargs) for j in jobs] == [(["a"], {}), (["b"], {"failures": 3}), (["c", 1], {})]
    assert {(j.queue, j.priority, j.run_at, j.task, j.max_attempts, j.status) for j in jobs} == {
        ("bulk", 7, later, flaky_sync.name, 4, "ready")}
    assert enqueue_many(flaky_sync, []) == 0


def test_enqueue_many_checks_every_job_and_the_payload_limit():
    from django.test import override_settings

    from django_leasequeue.exceptions import PayloadNotSerializable, PayloadTooLarge

    with pytest.raises(PayloadNotSerializable, match=r"job 1 argument 'key'"):
        enqueue_many(flaky_sync, [["ok"], [{1, 2}]])
    with pytest.raises(PayloadNotSerializable, match=r"job 1 keyword argument 'failures'"):
        enqueue_many(flaky_sync, [["ok"], (["ok"], {"failures": float("nan")})])
    # Every chunk of 10,000 is checked before the first is written: a bad job writes nothing.
    with pytest.raises(PayloadNotSerializable, match=r"job 10000 argument 'key'"):
        enqueue_many(flaky_sync, [["ok"]] * 10_000 + [[{1}]])
    assert Job.objects.count() == 0
    with override_settings(LEASEQUEUE={"MAX_PAYLOAD_BYTES": 100}):
        assert enqueue_many(flaky_sync, [["x" * 40]] * 5) == 5  # the chunk is over 100 bytes, no job is
        with pytest.raises(PayloadTooLarge, match=r"job 2"):
            enqueue_many(flaky_sync, [["a"], ["b"], ["x" * 200]])
    assert Job.objects.count() == 5


def test_enqueue_many_with_one_unique_key_inserts_one_job():
    assert enqueue_many(flaky_sync, [["a"], ["b"]], unique_key="same") == 1
    assert enqueue_many(flaky_sync, [["c"]], unique_key="same") == 0
    assert list(Job.objects.values_list("args", flat=True)) == [["a"]]


@pytest.mark.django_db(transaction=True)
def test_enqueue_notifies_once_per_statement_and_due_later_with_the_run_at():
    import psycopg

    from django_leasequeue.notify import listen_connection, parse_payload

    conn = listen_connection("default", "leasequeue")
    try:
        enqueue_many(flaky_sync, [["a"]] * 500)
        flaky_sync.enqueue("b")
        later = flaky_sync.using(run_at=timedelta(hours=1)).enqueue("later")
        enqueue_many(flaky_sync, [["c"]] * 3, run_at=timedelta(hours=1))
        notes = [parse_payload(n.payload) for n in conn.notifies(timeout=0.5, stop_after=10)]
    finally:
        conn.close()
    bulk_at = Job.objects.filter(args=["c"]).values_list("run_at", flat=True).distinct().get()
    # Jobs due later notify "<queue> <run_at>" (one per statement), so sleeping workers wake at that time.
    assert notes == [("default", None), ("default", None), ("default", later.run_at.timestamp()),
                     ("default", bulk_at.timestamp())]
    assert isinstance(conn, psycopg.Connection)


def test_prune_deletes_old_done_and_cancelled_jobs_oldest_first_in_batches():
    now = store.db_now()
    enqueue_many(flaky_sync, [[f"k{i}"] for i in range(8)])
    ids = list(Job.objects.order_by("id").values_list("id", flat=True))
    ages = {ids[0]: ("done", 50), ids[1]: ("done", 40), ids[2]: ("cancelled", 45), ids[3]: ("dead", 90),
            ids[4]: ("done", 5), ids[5]: ("cancelled", 1), ids[6]: ("done", 30)}  # ids[7] stays ready
    for job_id, (status, hours) in ages.items():
        Job.objects.filter(pk=job_id).update(status=status, finished_at=now - timedelta(hours=hours))
    assert store.job_prune(older_than=20 * 3600, limit=2, now=now) == 2
    # The oldest done job and the (only old) cancelled one went first; dead jobs are never pruned.
    left = set(Job.objects.values_list("id", flat=True))
    assert ids[0] not in left and ids[3] in left and len(left) == 6
    assert store.job_prune(older_than=20 * 3600, limit=2, now=now) == 2
    assert store.job_prune(older_than=20 * 3600, limit=2, now=now) == 0
    assert sorted(Job.objects.values_list("id", flat=True)) == [ids[3], ids[4], ids[5], ids[7]]


def test_prune_walks_the_finished_index():
    from django.db import connection

    # A table of recently finished jobs (none due yet): the usual state between two prunes.
    enqueue_many(flaky_sync, [["x"]] * 3000)
    Job.objects.update(status="done", finished_at=store.db_now())
    with connection.cursor() as cur:
        cur.execute("ANALYZE leasequeue_job")
        cur.execute("EXPLAIN " + store.JOB_PRUNE, {"now": None, "age": 3600.0, "limit": 1000,
                                                   "every": store.PRUNE_FULL_PASS_EVERY})
        plan = "\n".join(r[0] for r in cur.fetchall())
    # Both per-status subqueries (j_1, j_2) walk the index; the outer DELETE of a tiny table may
    # hash-join it, which is the planner's business.
    assert plan.count("leasequeue_job_finished") >= 2 and "Seq Scan on leasequeue_job j_" not in plan, plan


def test_a_short_claim_pauses_the_next_claim_briefly_and_a_wake_cuts_the_pause_short():
    """A claim that got fewer jobs than free threads (an idle worker woken for one job) waits
    AFTER_SHORT_CLAIM before claiming again, so its handler thread starts first; a full claim goes
    again at once, and a wake (a NOTIFY) ends the pause at once."""
    from django_leasequeue.worker.producer import AFTER_SHORT_CLAIM

    flaky_sync.enqueue("k0", failures=0)
    worker = WorkerService(queues=["default"], concurrency=2, reap=False, notify=False, prefetch_wait=0)
    assert worker.run_once() == AFTER_SHORT_CLAIM  # 1 job for 2 threads (never started: held)
    assert worker.claimed == 1 and worker.producer.short_claim
    worker.pool.inflight.clear()  # the held job is not run here: free both threads again
    flaky_sync.enqueue("k1", failures=0)
    flaky_sync.enqueue("k2", failures=0)
    assert worker.run_once() == 0.0  # 2 jobs for 2 threads: maybe more are due, claim again now
    assert worker.claimed == 3 and not worker.producer.short_claim
    worker.wake()  # what the listener does on a NOTIFY: the loop's wait (here 10 s) ends at once
    started = time.monotonic()
    worker.wait(10.0)
    assert time.monotonic() - started < 5.0
