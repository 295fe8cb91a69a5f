"""Unique-key modes under concurrency: 16 threads, each with its own connection and transaction,
enqueue one key at once with each mode; and a claim racing a replace, in both orders."""

import threading
from datetime import timedelta

import pytest
from django.db import OperationalError, connection, transaction
from qa.models import Execution

from django_leasequeue import enqueue
from django_leasequeue.models import Job
from django_leasequeue.notify import listen_connection
from tests.support import claim, in_threads, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

THREADS = 16

MODES = {
    "replace": dict(unique_mode="replace", run_at=timedelta(seconds=600)),
    "debounce": dict(unique_mode="debounce", debounce=30, debounce_max_wait=60),
    "throttle": dict(unique_mode="throttle", throttle=3600),
}


# Throttle takes the retained scope only (the active one is refused).
@pytest.mark.parametrize(("mode", "scope"), [(m, s) for m in sorted(MODES) for s in ("retained", "active")
                                             if (m, s) != ("throttle", "active")])
def test_sixteen_threads_one_key_each_mode(mode, scope):
    barrier = threading.Barrier(THREADS, timeout=30)

    def enqueuer(i: int) -> int:
        with transaction.atomic():
            barrier.wait()
            job = enqueue("qa.record", [f"from {i}"], unique_key="k", unique_scope=scope, **MODES[mode])
            # A follow-up write in the same transaction: it fails if the enqueue aborted the transaction.
            Execution.objects.create(job_id=job.id, lease_version=0, attempt=0, worker=f"thread {i}")
        return job.id

    ids = in_threads(THREADS, enqueuer)
    jobs = list(Job.objects.all())
    if mode == "throttle" and len(jobs) == 2:  # the hour turned during the test: one job per window
        assert len({j.unique_key for j in jobs}) == 2
        return
    (job,) = jobs
    assert ids == [job.id] * THREADS
    assert Execution.objects.filter(job_id=job.id).count() == THREADS  # every transaction committed
    assert (job.status, job.lease_version, job.attempts) == ("ready", 0, 0)
    submitted = [[f"from {i}"] for i in range(THREADS)]
    assert job.args in submitted
    if mode == "throttle":
        assert job.unique_key.startswith("k@") and job.unique_key.endswith(":00:00Z")
    else:
        assert job.unique_key == "k"
    if mode == "replace":
        assert job.created_at + timedelta(seconds=599) < job.run_at <= job.created_at + timedelta(seconds=601)
    if mode == "debounce":
        # Pushed by the later enqueues, but never past the max wait from the first one. Each
        # enqueue reads the clock when its statement starts: one that started a moment before the
        # first insert (and then waited for its unique-index lock) debounces from a time slightly
        # earlier than the holder's created_at, hence the lower bound's second of slack.
        assert job.created_at + timedelta(seconds=29) <= job.run_at <= job.created_at + timedelta(seconds=60)


def _blocked_on_lock(main_pid: int) -> bool:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND pid <> %s", [main_pid])
        return cur.fetchone()[0] == 1


@pytest.mark.parametrize("scope", ["retained", "active"])
def test_claim_committed_first_wins_over_a_waiting_replace(scope):
    """The claim locks the holder and leases it; a replace waits on that lock, then finds the
    holder leased (re-checked on its latest version) and returns it unchanged."""
    first = enqueue("qa.record", ["old"], unique_key="k", unique_scope=scope, unique_mode="replace")
    claimed, release = threading.Event(), threading.Event()
    main_pid = connection.cursor().connection.info.backend_pid

    def racer(i: int):
        if i == 0:
            with transaction.atomic():
                (c,) = claim()
                claimed.set()
                assert release.wait(30)
            return c.lease_version
        assert claimed.wait(30)
        with transaction.atomic():
            job = enqueue("qa.record", ["new"], unique_key="k", unique_scope=scope, unique_mode="replace")
        return job.id

    result: list = []
    runner = threading.Thread(target=lambda: result.append(in_threads(2, racer)))
    runner.start()
    try:
        wait_for(lambda: _blocked_on_lock(main_pid), timeout=30, what="the replace waiting on the claim's lock")
    finally:
        release.set()
        runner.join(60)
    (token, returned_id) = result[0]
    (row,) = Job.objects.all()
    assert (returned_id, token) == (first.id, 1)
    assert (row.status, row.args, row.lease_version, row.run_at) == ("leased", ["old"], 1, first.run_at)


def test_replace_committed_first_then_the_claim_takes_the_new_values():
    """A replace holds the holder's row lock until its transaction ends: a claim meanwhile skips
    the row (SKIP LOCKED), and the claim after the commit runs the new arguments."""
    enqueue("qa.record", ["old"], unique_key="k", unique_mode="replace")
    updated, release = threading.Event(), threading.Event()

    def replacer(i: int):
        with transaction.atomic():
            job = enqueue("qa.record", ["new"], unique_key="k", unique_mode="replace")
            updated.set()
            assert release.wait(30)
        return job.args

    result: list = []
    runner = threading.Thread(target=lambda: result.append(in_threads(1, replacer)))
    runner.start()
    try:
        assert updated.wait(30)
        assert claim() == []  # locked by the uncommitted replace: skipped, not waited for
    finally:
        release.set()
        runner.join(60)
    assert result == [[["new"]]]
    (c,) = claim()
    assert (c.args, c.lease_version) == (["new"], 1)


def test_replace_under_repeatable_read_is_a_serialization_failure_when_the_key_came_after_the_snapshot():
    """As for keep (docs/howto/idempotency.md, isolation levels): the holder committed after the
    caller's snapshot cannot be updated at REPEATABLE READ; the caller's retry updates it."""
    def elsewhere(i: int) -> int:
        return enqueue("qa.record", ["other"], unique_key="k", unique_mode="replace").id

    with pytest.raises(OperationalError, match="could not serialize access"):
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                cur.execute("SELECT count(*) FROM leasequeue_job")
            (other_id,) = in_threads(1, elsewhere)
            enqueue("qa.record", ["mine"], unique_key="k", unique_mode="replace")
    with transaction.atomic():  # the retry, with a new snapshot
        mine = enqueue("qa.record", ["mine"], unique_key="k", unique_mode="replace")
    (row,) = Job.objects.all()
    assert (mine.id, row.id, row.args) == (other_id, other_id, ["mine"])


def test_a_replace_that_makes_the_holder_due_wakes_the_workers_at_commit():
    """A future job replaced with one due now sends the queue's NOTIFY (at commit); a replace that
    leaves it in the future sends none (as for a future insert)."""
    enqueue("qa.record", ["a"], unique_key="k", unique_mode="replace", run_at=timedelta(hours=1))
    listener = listen_connection("default", "leasequeue")
    try:
        with transaction.atomic():
            enqueue("qa.record", ["b"], unique_key="k", unique_mode="replace", run_at=timedelta(hours=2))
        assert list(listener.notifies(timeout=0.3)) == []
        with transaction.atomic():
            enqueue("qa.record", ["c"], unique_key="k", unique_mode="replace", queue="invoices")
            assert list(listener.notifies(timeout=0.3)) == []  # nothing before the commit
        notes = list(listener.notifies(timeout=1.0))
    finally:
        listener.close()
    assert [(n.channel, n.payload) for n in notes] == [("leasequeue", "invoices")]
    (row,) = Job.objects.all()
    assert (row.args, row.queue) == (["c"], "invoices")
