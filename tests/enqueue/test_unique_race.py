"""Unique keys under concurrency: 16 threads enqueueing one key inside their own transactions get
one row and its id, and none of their transactions is aborted; a racing insert that rolls back never
blocks the survivor."""

import threading

import pytest
from django.db import connection, transaction
from qa.models import Execution

from django_leasequeue import enqueue, store
from django_leasequeue.models import Job
from tests.support import claim, in_threads, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

THREADS = 16


@pytest.mark.parametrize("scope", ["retained", "active"])
def test_sixteen_threads_one_key_one_row_no_aborted_transaction(scope):
    barrier = threading.Barrier(THREADS, timeout=30)

    def enqueuer(i: int) -> int:
        with transaction.atomic():
            barrier.wait()
            job = enqueue("qa.record", [f"from {i}"], unique_key="invoice-42", unique_scope=scope)
            # A follow-up write in the same transaction: it fails if the enqueue aborted the transaction.
            Execution.objects.create(job_id=job.id, lease_version=0, attempt=0, worker=f"thread {i}")
        return job.id

    ids = in_threads(THREADS, enqueuer)
    (job,) = Job.objects.filter(unique_key="invoice-42")
    assert ids == [job.id] * THREADS
    assert Execution.objects.filter(job_id=job.id).count() == THREADS  # every transaction committed
    assert job.unique_scope == scope


@pytest.mark.parametrize("scope", ["retained", "active"])
def test_racing_rolled_back_insert_never_blocks_the_survivor(scope):
    """T1 inserts the key and holds its transaction open; T2's enqueue waits on it; T1 rolls back:
    T2 then inserts its own job and commits. Exactly one row, T2's."""
    inserted, release = threading.Event(), threading.Event()
    main_pid = connection.cursor().connection.info.backend_pid

    class Rollback(Exception):
        pass

    def racer(i: int):
        if i == 0:
            try:
                with transaction.atomic():
                    job = enqueue("qa.record", ["t1"], unique_key="k", unique_scope=scope)
                    inserted.set()
                    assert release.wait(30)
                    raise Rollback(job.id)
            except Rollback as rb:
                return rb.args[0]
        assert inserted.wait(30)
        with transaction.atomic():
            job = enqueue("qa.record", ["t2"], unique_key="k", unique_scope=scope)  # waits on T1
            Execution.objects.create(job_id=job.id, lease_version=0, attempt=0, worker="t2")
        return job.id

    def blocked_on_lock() -> bool:
        with connection.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND wait_event_type = 'Lock' AND pid <> %s", [main_pid])
            return cur.fetchone()[0] == 1

    result: list = []
    runner = threading.Thread(target=lambda: result.append(in_threads(2, racer)))
    runner.start()
    try:
        wait_for(blocked_on_lock, timeout=30, what="T2 waiting on T1's uncommitted key")
    finally:
        release.set()
        runner.join(60)
    (t1_id, t2_id) = result[0]
    assert t2_id != t1_id
    (job,) = Job.objects.filter(unique_key="k")
    assert (job.id, job.args) == (t2_id, ["t2"])
    assert Execution.objects.filter(job_id=t2_id).count() == 1


def test_active_scope_key_free_again_after_done_under_concurrency():
    first = enqueue("qa.record", unique_key="a", unique_scope="active")
    (c,) = claim()
    store.job_complete([(c.id, c.lease_version, None)])
    barrier = threading.Barrier(8, timeout=30)

    def enqueuer(i: int) -> int:
        with transaction.atomic():
            barrier.wait()
            return enqueue("qa.record", unique_key="a", unique_scope="active").id

    ids = set(in_threads(8, enqueuer))
    assert len(ids) == 1 and first.id not in ids
    assert Job.objects.filter(unique_key="a", status="ready").count() == 1
