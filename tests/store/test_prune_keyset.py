"""The retention pruner walks the finished rows by keyset: each batch starts at the (finished_at, id)
of the first row the previous batch deleted, recorded in the sweep record, so it never walks again
what the batches before that one deleted; a full pass from the oldest row every
``PRUNE_FULL_PASS_EVERY`` seconds deletes what was kept past retention and is no longer read.
Exact ids, counts and places; the walk is measured in buffers, not milliseconds."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.db import connection, transaction

from django_leasequeue import Batch, store
from django_leasequeue.enqueueing import enqueue, task
from django_leasequeue.models import Job, ReaperSweep

pytestmark = pytest.mark.django_db

DAY = 86400.0


@task(name="tests.prune_keyset.member", max_attempts=1)
def member(x=0):
    return x


def insert_finished(status: str, finished_at: datetime, count: int = 1, *, step: float = 0.0) -> list[int]:
    """``count`` rows of ``status`` finished at ``finished_at`` (+ ``step`` seconds each), in one
    statement; their ids in insertion order."""
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO leasequeue_job (task, queue, priority, status, args, kwargs, run_at, attempts, "
            "max_attempts, leased_by, lease_version, unique_scope, cancel_requested, snoozes, errors, history, "
            "created_at, finished_at) SELECT 'qa.record', 'default', 0, %s, '[]', '{}', %s, 1, 3, '', 1, "
            "'retained', false, 0, '[]', '[]', %s, %s + (g - 1) * make_interval(secs => %s) "
            "FROM generate_series(1, %s) AS g ORDER BY g RETURNING id",
            [status, finished_at, finished_at, finished_at, step, count])
        return sorted(r[0] for r in cur.fetchall())


def finish(job_id: int, finished_at: datetime) -> None:
    """Run ``job_id`` to done through the store (claim, complete), then date its finish."""
    (claimed,) = store.job_claim_ids([job_id], worker_id="t", lease=30)
    assert store.job_complete([(claimed.id, claimed.lease_version, "1")]) == {job_id}
    Job.objects.filter(pk=job_id).update(finished_at=finished_at)


def place() -> tuple[datetime | None, int | None, datetime | None]:
    row = ReaperSweep.objects.get()
    return row.prune_from_finished_at, row.prune_from_id, row.prune_pass_started_at


def finished_at(job_id: int) -> datetime:
    return Job.objects.values_list("finished_at", flat=True).get(pk=job_id)


def test_batches_delete_every_eligible_row_once_in_finished_order_and_keep_the_rest():
    now = store.db_now() + timedelta(days=10)
    old = now - timedelta(days=5)
    # 25 done rows finished at the same instant (a completion batch), then done and cancelled rows
    # interleaved, some at the same instant across the two statuses.
    tie = insert_finished("done", old, 25)
    done = insert_finished("done", old + timedelta(seconds=1), 15, step=1)
    cancelled = insert_finished("cancelled", old + timedelta(seconds=1), 10, step=1.5)
    dead = insert_finished("dead", old - timedelta(days=1), 3)  # never pruned by retention
    recent = insert_finished("done", now - timedelta(hours=1), 4)  # within retention
    # Kept past retention, in the middle of the walk: a member of a batch still open, and a job
    # another job still waits on.
    b = Batch.open()
    (open_member,) = b.add(member.step(1))
    finish(open_member, old + timedelta(seconds=3.5))
    waited_on = enqueue(member, [1]).id
    finish(waited_on, old + timedelta(seconds=7.5))
    blocker = enqueue(member, [2]).id  # not finished: the dependent waits
    waiting = enqueue(member, depends_on=[waited_on, blocker]).id
    eligible = list(Job.objects.filter(pk__in=tie + done + cancelled).order_by("finished_at", "id")
                    .values_list("id", flat=True))
    assert len(eligible) == 50
    finish_times = dict(Job.objects.filter(pk__in=eligible).values_list("id", "finished_at"))

    counts, gone = [], []
    while True:
        before = set(Job.objects.values_list("id", flat=True))
        n = store.job_prune(older_than=DAY, limit=7, now=now)
        deleted = before - set(Job.objects.values_list("id", flat=True))
        counts.append(n)
        # Each batch deletes exactly the next rows in (finished_at, id) order, across both statuses
        # and inside the run of 25 equal finish times.
        assert deleted == set(eligible[len(gone):len(gone) + n]) and len(deleted) == n
        gone.extend(eligible[len(gone):len(gone) + n])
        if n:  # the next batch walks from the first row this one deleted
            assert place()[:2] == (finish_times[gone[-n]], gone[-n])
        if n < 7:
            break
    assert counts == [7, 7, 7, 7, 7, 7, 7, 1]
    assert gone == eligible
    assert store.job_prune(older_than=DAY, limit=7, now=now) == 0
    assert sorted(Job.objects.values_list("id", flat=True)) == sorted(
        dead + recent + [open_member, waited_on, blocker, waiting])


def test_the_place_is_the_first_row_of_the_last_batch_and_lives_in_the_sweep_record():
    now = store.db_now() + timedelta(days=10)
    rows = insert_finished("done", now - timedelta(days=3), 10, step=1)
    assert not ReaperSweep.objects.exists()
    assert store.job_prune(older_than=DAY, limit=4, now=now) == 4
    # The pruner created the sweep record as "never swept" (no sweep ran), holding its place.
    record = ReaperSweep.objects.get()
    assert (record.last_sweep_at, record.resumed_at) == (datetime(1970, 1, 1, tzinfo=record.last_sweep_at.tzinfo),
                                                         None)
    assert place() == (now - timedelta(days=3), rows[0], now)
    assert store.job_prune(older_than=DAY, limit=4, now=now) == 4
    assert place() == (now - timedelta(days=3) + timedelta(seconds=4), rows[4], now)
    assert store.job_prune(older_than=DAY, limit=4, now=now) == 2
    assert place() == (now - timedelta(days=3) + timedelta(seconds=8), rows[8], now)
    # A batch that deletes nothing leaves the place alone (and writes nothing).
    assert store.job_prune(older_than=DAY, limit=4, now=now + timedelta(seconds=1)) == 0
    assert place() == (now - timedelta(days=3) + timedelta(seconds=8), rows[8], now)


def test_a_kept_row_that_stops_being_read_is_pruned_by_the_next_full_pass():
    now = store.db_now() + timedelta(days=10)
    old = now - timedelta(days=5)
    b = Batch.open()
    (kept,) = b.add(member.step(1))
    finish(kept, old)
    after = insert_finished("done", old + timedelta(seconds=1), 5, step=1)
    assert store.job_prune(older_than=DAY, now=now) == 5  # the open batch's member is passed over
    assert place()[1] == after[0]
    b.close()  # its only member is done: the workflow is finished, the member no longer read
    assert b.is_finished()

    # Behind the place, the keyset batches do not see it until the next full pass...
    every = store.PRUNE_FULL_PASS_EVERY
    assert store.job_prune(older_than=DAY, now=now) == 0
    assert store.job_prune(older_than=DAY, now=now + timedelta(seconds=every - 1)) == 0
    assert Job.objects.filter(pk=kept).exists()
    # ... which starts from the oldest finished row and deletes it.
    assert store.job_prune(older_than=DAY, now=now + timedelta(seconds=every)) == 1
    assert not Job.objects.filter(pk=kept).exists()
    assert place() == (old, kept, now + timedelta(seconds=every))
    # A clock set back (or an earlier now=) before the recorded pass starts a new pass too.
    late = insert_finished("done", old - timedelta(days=1), 1)
    assert store.job_prune(older_than=DAY, now=now) == 1
    assert not Job.objects.filter(pk__in=late).exists()
    assert place() == (old - timedelta(days=1), late[0], now)


def test_the_place_moves_only_forward_and_only_within_the_pass_it_was_read_in():
    now = store.db_now()
    first, second = insert_finished("done", now - timedelta(days=3), 2, step=1)
    save = store.JOB_PRUNE_SAVE
    with connection.cursor() as cur:
        def record(**params: object) -> None:
            cur.execute(save, {"restart": False, "pass_read": now, "pass_at": now, "from_at": None,
                               "from_id": None, **params})

        record(restart=True, pass_read=None, from_at=finished_at(second), from_id=second)
        assert place() == (finished_at(second), second, now)
        # Another pruner in the same pass, which stopped earlier: the furthest place stays.
        record(from_at=finished_at(first), from_id=first)
        assert place() == (finished_at(second), second, now)
        # A pruner that read an older pass (another one restarted meanwhile) changes nothing.
        record(pass_read=now - timedelta(hours=2), pass_at=now - timedelta(hours=2),
               from_at=finished_at(first) + timedelta(days=1), from_id=first)
        assert place() == (finished_at(second), second, now)
        # A new pass sets the place outright, back to the start when its batch deleted nothing.
        record(restart=True, pass_at=now + timedelta(hours=1))
        assert place() == (None, None, now + timedelta(hours=1))


def scan_buffers(plan: dict, index: str) -> int:
    """Shared buffers (hit + read) of every node of an EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) plan
    that scans ``index``."""
    total = 0
    if plan.get("Index Name") == index:
        total += plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0)
    for child in plan.get("Plans", []):
        total += scan_buffers(child, index)
    return total


def explain_next_batch(now: datetime, limit: int) -> tuple[int, int]:
    """EXPLAIN ANALYZE the next prune batch, rolled back: (buffers read by the scans of the finished
    index, rows it deleted)."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + store.JOB_PRUNE,
                    {"now": now, "age": DAY, "limit": limit, "every": store.PRUNE_FULL_PASS_EVERY})
        plan = cur.fetchone()[0][0]["Plan"]
        transaction.set_rollback(True)
    deleted = [p for p in _nodes(plan) if p["Node Type"] == "ModifyTable" and p.get("Operation") == "Delete"
               and p.get("Relation Name") == "leasequeue_job"]
    return scan_buffers(plan, "leasequeue_job_finished"), sum(p["Actual Rows"] for p in deleted)


def _nodes(plan: dict) -> list[dict]:
    return [plan] + [n for child in plan.get("Plans", []) for n in _nodes(child)]


def test_the_walk_of_a_batch_does_not_grow_with_the_batches_before_it():
    # The deleted rows stay in the index (and in the heap) until vacuum: here never, since this
    # test's transaction deletes them, which makes them the worst case (their entries cannot even
    # be marked dead, so a walk over them visits every heap tuple).
    now = store.db_now() + timedelta(days=10)
    limit = 500
    insert_finished("done", now - timedelta(days=3), 40 * limit, step=0.001)
    with connection.cursor() as cur:
        cur.execute("ANALYZE leasequeue_job")
    for _ in range(2):
        assert store.job_prune(older_than=DAY, limit=limit, now=now) == limit
    early, rows = explain_next_batch(now, limit)
    assert rows == limit
    for _ in range(30):
        assert store.job_prune(older_than=DAY, limit=limit, now=now) == limit
    late, rows = explain_next_batch(now, limit)
    assert rows == limit
    # The same walk after 2 and after 32 batches: the index descent, the previous batch's rows and
    # the batch's own (a handful of buffers' difference where the rows fall across pages), not the
    # 15,000 rows deleted in between (walking them from the oldest row read 558 more buffers here).
    assert abs(late - early) <= 10, (early, late)
