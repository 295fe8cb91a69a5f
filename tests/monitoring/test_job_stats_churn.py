"""The chart counters under churn: writers on their own connections claim, complete and fail jobs
while two folders fold everything (a far-future now rolls every row into day rows) in tight loops
and a reader sums the totals; a held counter row (a fenced_atomic() transaction not yet committed)
is skipped by the fold. No event is ever counted twice or lost: every read is at most the final
totals, the totals only grow, and the final totals equal the ledger of what the writers did."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connections, transaction
from flowlab.tasks import rated_noop

from django_leasequeue import store
from django_leasequeue.enqueueing import build_job
from django_leasequeue.models import Job, JobStat

pytestmark = pytest.mark.django_db(transaction=True)

SINCE = datetime(2000, 1, 1, tzinfo=UTC)
RETENTION = 400 * 86400.0
WRITERS, ROUNDS, BATCH = 3, 15, 20


def fields(rows: list[store.StatTotals]) -> tuple[int, int, int, int]:
    return (sum(r.started for r in rows), sum(r.done for r in rows), sum(r.failed for r in rows),
            sum(sum(r.run_hist.values()) for r in rows))


def error() -> dict:
    return {"attempt": 1, "type": "builtins.ValueError", "message": "bad", "traceback": "", "worker": "w"}


def test_sums_stay_exact_while_writers_fold_and_read_concurrently():
    far = store.db_now() + timedelta(days=30)  # every row is past: the fold rolls all into days
    stop = threading.Event()
    errors: list[BaseException] = []
    reads: list[tuple[int, int, int, int]] = []
    folds = {"locked": 0, "skipped": 0, "moved": 0}
    ledger = {"started": 0, "done": 0, "failed": 0}
    lock = threading.Lock()

    def guarded(fn):
        def run(*args):
            try:
                fn(*args)
            except BaseException as exc:  # reported after the join
                errors.append(exc)
                stop.set()
            finally:
                connections.close_all()
        return run

    @guarded
    def writer(n: int) -> None:
        queue = f"churn{n}"
        for r in range(ROUNDS):
            with transaction.atomic():
                store.job_insert([build_job(rated_noop, [i], queue=queue) for i in range(BATCH)],
                                 notify=False, channel="unused")
            claimed = store.job_claim(queues=[queue], limit=BATCH, worker_id=f"w{n}", lease=60, rate_limits={})
            fail, done = claimed[:2], claimed[2:]
            for c in fail:
                assert store.job_fail(c.id, c.lease_version, error(), retry_delay=0)[0] == "ready"
            if r % 3 == 0:  # a fenced_atomic()-like transaction: its counter row is held a moment
                with transaction.atomic(durable=True):
                    store.job_complete([(c.id, c.lease_version, None) for c in done])
                    store.stat_totals(since=SINCE)  # a statement or two while the row is held
                    store.stat_totals(since=SINCE)
            else:
                store.job_complete([(c.id, c.lease_version, None) for c in done])
            again = store.job_claim(queues=[queue], limit=BATCH, worker_id=f"w{n}", lease=60, rate_limits={})
            store.job_complete([(c.id, c.lease_version, None) for c in again])
            with lock:
                ledger["started"] += len(claimed) + len(again)
                ledger["done"] += len(done) + len(again)
                ledger["failed"] += len(fail)

    @guarded
    def folder() -> None:
        while not stop.is_set():
            fold = store.stat_fold(retention=RETENTION, now=far)
            with lock:
                folds["locked" if fold.locked else "skipped"] += 1
                folds["moved"] += fold.moved

    @guarded
    def reader() -> None:
        while not stop.is_set():
            reads.append(fields(store.stat_totals(since=SINCE)))

    writers = [threading.Thread(target=writer, args=(n,)) for n in range(WRITERS)]
    others = [threading.Thread(target=folder), threading.Thread(target=folder), threading.Thread(target=reader)]
    for t in writers + others:
        t.start()
    for t in writers:
        t.join(timeout=300)
    stop.set()
    for t in others:
        t.join(timeout=60)
    assert errors == []

    jobs = WRITERS * ROUNDS * BATCH
    assert ledger == {"started": jobs + WRITERS * ROUNDS * 2, "done": jobs, "failed": WRITERS * ROUNDS * 2}
    assert Job.objects.filter(status="done").count() == jobs
    final = fields(store.stat_totals(since=SINCE))
    assert final == (ledger["started"], ledger["done"], ledger["failed"], ledger["done"])
    assert folds["locked"] > 10 and folds["moved"] > 0
    assert reads and all(all(a <= b for a, b in zip(read, final, strict=True)) for read in reads)
    assert all(all(a <= b for a, b in zip(x, y, strict=True)) for x, y in zip(reads, reads[1:], strict=False))
    # One last fold takes what the last writes left in shards: then only day rows of shard 0 remain.
    store.stat_fold(retention=RETENTION, now=far)
    assert set(JobStat.objects.values_list("span", "shard")) == {(86400, 0)}
    assert fields(store.stat_totals(since=SINCE)) == final


def test_a_fold_skips_a_counter_row_a_writer_holds_and_takes_it_once_committed():
    (job,) = store.job_insert([build_job(rated_noop, [1], queue="held")], notify=False, channel="unused")
    far = store.db_now() + timedelta(days=30)
    other = connections.create_connection("default")
    try:
        other.connect()
        with other.cursor() as cur:
            # The claim, committed by the other connection: its counter row (its shard) exists.
            cur.execute("UPDATE leasequeue_job SET status = 'leased', attempts = 1, lease_version = 1, "
                        "attempted_at = leasequeue_now(), started_at = leasequeue_now(), leased_by = 'w', "
                        "leased_until = leasequeue_now() + interval '1 minute' WHERE id = %s", [job.id])
            # Its fenced transaction completes the job (same minute, same row) and is not yet committed.
            cur.execute("BEGIN")
            cur.execute("UPDATE leasequeue_job SET status = 'done', finished_at = leasequeue_now(), "
                        "leased_until = NULL WHERE id = %s", [job.id])
            fold = store.stat_fold(retention=RETENTION, now=far)
            assert (fold.locked, fold.moved) == (True, 0)  # the held row is skipped, not waited for
            assert list(JobStat.objects.values_list("span", "started", "done")) == [(60, 1, 0)]
            cur.execute("COMMIT")
    finally:
        other.close()
    assert list(JobStat.objects.values_list("span", "started", "done")) == [(60, 1, 1)]
    assert store.stat_fold(retention=RETENTION, now=far).moved == 1
    assert list(JobStat.objects.values_list("span", "shard", "started", "done")) == [(86400, 0, 1, 1)]
