"""Time-partitioned history (LEASEQUEUE["HISTORY"]): done jobs move from the hot table into the
partitions of leasequeue_job_history, one statement per batch, and retention drops whole
partitions. Exact ids and counts: no job is lost or duplicated by a move, also against concurrent
moves and completions; partitions are made and dropped by an injected clock."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import DatabaseError, connection, connections, transaction

from django_leasequeue import Batch, store
from django_leasequeue.conf import ConfigurationError, build
from django_leasequeue.enqueueing import enqueue, task
from django_leasequeue.models import Job, ReaperSweep
from django_leasequeue.reaper import prune_once

DAY = 86400.0
H = store.HISTORY_TABLE


@task(name="tests.history.member", max_attempts=1)
def member(x=0):
    return x


def insert_finished(status: str, finished_at: datetime, count: int = 1, *, step: float = 0.0,
                    unique_key: str | None = None) -> list[int]:
    """``count`` rows of ``status`` finished at ``finished_at`` (+ ``step`` seconds each), result
    ``{"n": g}``; their ids in insertion order."""
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO leasequeue_job (task, queue, priority, status, args, kwargs, run_at, attempts, "
            "max_attempts, leased_by, lease_version, unique_key, unique_scope, cancel_requested, snoozes, errors, "
            "history, created_at, finished_at, result) SELECT 'qa.record', 'default', 0, %s, '[]', '{}', %s, 1, 3, "
            "'', 1, %s, 'retained', false, 0, '[]', '[]', %s, %s + (g - 1) * make_interval(secs => %s), "
            "jsonb_build_object('n', g) FROM generate_series(1, %s) AS g ORDER BY g RETURNING id",
            [status, finished_at, unique_key, finished_at, finished_at, step, count])
        return sorted(r[0] for r in cur.fetchall())


def finish(job_id: int, finished_at: datetime) -> None:
    (claimed,) = store.job_claim_ids([job_id], worker_id="t", lease=30)
    assert store.job_complete([(claimed.id, claimed.lease_version, "1")]) == {job_id}
    Job.objects.filter(pk=job_id).update(finished_at=finished_at)


def hot_ids() -> list[int]:
    return sorted(Job.objects.values_list("id", flat=True))


def history_ids() -> list[int]:
    with connection.cursor() as cur:
        cur.execute(f"SELECT id FROM {H} ORDER BY id")
        return [r[0] for r in cur.fetchall()]


def columns(table: str) -> list[tuple[str, str, str, str | None]]:
    with connection.cursor() as cur:
        cur.execute("SELECT column_name, data_type, is_nullable, column_default FROM information_schema.columns "
                    "WHERE table_name = %s ORDER BY ordinal_position", [table])
        return cur.fetchall()


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.django_db
def test_the_history_table_has_every_column_of_the_job_table_in_the_same_order():
    # A migration that changes a job column must change the history table alike (0020): a moved
    # row is the same row. The id default (an identity) is the hot table's alone.
    job = [c for c in columns("leasequeue_job") if c[0] != "id"]
    history = [c for c in columns(H) if c[0] != "id"]
    assert history == job
    assert [c[:3] for c in columns(H) if c[0] == "id"] == [("id", "bigint", "NO")]


@pytest.mark.django_db
def test_partitions_are_made_back_to_retention_and_ahead_once_and_never_overlap():
    now = at("2031-03-10T17:25:00")
    created = store.history_ensure_partitions("day", back=3 * DAY, ahead=2, now=now)
    assert created == [f"{H}_p20310307", f"{H}_p20310308", f"{H}_p20310309", f"{H}_p20310310",
                       f"{H}_p20310311", f"{H}_p20310312"]
    assert store.history_ensure_partitions("day", back=3 * DAY, ahead=2, now=now) == []
    # Hours: only the hours no day partition covers (a change of HISTORY keeps the old partitions).
    created = store.history_ensure_partitions("hour", back=None, ahead=2, now=at("2031-03-12T23:10:00"))
    assert created == [f"{H}_p2031031300", f"{H}_p2031031301"]
    parts = store.history_partitions()
    assert [(p.lower, p.upper) for p in parts][-3:] == [
        (at("2031-03-12T00:00:00"), at("2031-03-13T00:00:00")),
        (at("2031-03-13T00:00:00"), at("2031-03-13T01:00:00")),
        (at("2031-03-13T01:00:00"), at("2031-03-13T02:00:00"))]
    with pytest.raises(ValueError, match="history period must be one of"):
        store.history_ensure_partitions("week", back=None, now=now)


def test_the_move_window_is_one_unbroken_run_of_partitions_within_retention():
    def part(a: str, b: str) -> store.HistoryPartition:
        return store.HistoryPartition(at(a), at(b), "x")

    parts = [part("2031-03-01T00:00", "2031-03-02T00:00"), part("2031-03-03T00:00", "2031-03-04T00:00"),
             part("2031-03-04T00:00", "2031-03-05T00:00")]
    now = at("2031-03-04T12:00")
    # The gap on March 2 ends the run: March 1 is not in the window.
    assert store.history_window(parts, now=now, after=3600, retention=None) == (at("2031-03-03T00:00"),
                                                                               at("2031-03-04T11:00"))
    assert store.history_window(parts, now=now, after=3600, retention=DAY) == (at("2031-03-03T12:00"),
                                                                              at("2031-03-04T11:00"))
    # No partition holds now - after: nothing moves.
    assert store.history_window(parts, now=at("2031-03-06T00:00"), after=60, retention=None) is None


@pytest.mark.django_db
def test_done_jobs_move_in_batches_once_each_and_what_is_still_read_stays_hot():
    now = store.db_now() + timedelta(days=10)
    old = now - timedelta(hours=5)
    tie = insert_finished("done", old, 12)  # a completion batch: one finish instant
    done = insert_finished("done", old + timedelta(seconds=1), 9, step=1)
    recent = insert_finished("done", now - timedelta(seconds=30), 2)  # within HISTORY_MOVE_AFTER
    dead = insert_finished("dead", old, 2)  # replayable: stays
    cancelled = insert_finished("cancelled", old, 2)  # replayable: stays
    keyed = insert_finished("done", old, 1, unique_key="k1")  # a retained key keeps refusing duplicates
    b = Batch.open()
    (in_workflow,) = b.add(member.step(1))
    finish(in_workflow, old)
    waited_on = enqueue(member, [1]).id
    finish(waited_on, old)
    dependent = enqueue(member, depends_on=[waited_on]).id
    finish(dependent, old)
    movable = tie + done

    run = store.history_maintain("hour", move_after=60, retention=DAY, batch=5, now=now)
    assert run.moved == len(movable) == 21
    assert run.dropped == []
    assert history_ids() == sorted(movable)
    assert hot_ids() == sorted(recent + dead + cancelled + keyed + [in_workflow, waited_on, dependent])
    # Nothing more to move; the second run changes nothing.
    assert store.history_maintain("hour", move_after=60, retention=DAY, batch=5, now=now).moved == 0
    assert history_ids() == sorted(movable)
    # The moved row is the row: its result, status and times, read by id (the backend's get_result).
    moved = store.job_get(tie[3])
    assert (moved.status, moved.result, moved.finished_at) == ("done", {"n": 4}, old)
    assert store.job_get(dead[0]).status == "dead"
    assert store.job_get(10**15) is None


@pytest.mark.django_db
def test_a_late_result_reaches_a_job_that_moved_meanwhile_under_its_fence_only():
    # fenced_atomic() completed the job; the handler returned after HISTORY_MOVE_AFTER, when the job
    # had moved: its result is written in the history, fenced on the token as in the job table.
    now = store.db_now() + timedelta(days=10)
    job_id = enqueue(member, [1]).id
    (claimed,) = store.job_claim_ids([job_id], worker_id="t", lease=30)
    assert store.job_complete([(claimed.id, claimed.lease_version, None)]) == {job_id}
    Job.objects.filter(pk=job_id).update(finished_at=now - timedelta(hours=1))
    assert store.history_maintain("hour", move_after=60, retention=DAY, now=now).moved == 1
    assert store.job_set_result(job_id, claimed.lease_version + 1, '"stale"') is False
    assert store.job_set_result(job_id, claimed.lease_version, '"late"') is True
    assert hot_ids() == [] and store.job_get(job_id).result == "late"


@pytest.mark.django_db
def test_a_batch_moves_exactly_the_next_rows_in_finish_order_from_its_start():
    now = store.db_now() + timedelta(days=10)
    old = now - timedelta(hours=3)
    rows = insert_finished("done", old, 10, step=0.5)
    store.history_ensure_partitions("hour", back=DAY, now=now)
    lower, upper = store.history_window(store.history_partitions(), now=now, after=60, retention=DAY)
    step = store.history_move(lower=lower, upper=upper, limit=4)
    assert (step.count, step.first_at, step.first_id) == (4, old, rows[0])
    assert history_ids() == rows[:4]
    step = store.history_move(lower=step.first_at, upper=upper, from_id=step.first_id, limit=4)
    assert (step.count, step.first_at, step.first_id) == (4, old + timedelta(seconds=2), rows[4])
    assert history_ids() == rows[:8]
    # The upper bound is exclusive: the last row stays until the window passes it.
    step = store.history_move(lower=step.first_at, upper=old + timedelta(seconds=4.5), from_id=step.first_id, limit=4)
    assert step.count == 1 and history_ids() == rows[:9] and hot_ids() == rows[9:]
    with pytest.raises(ValueError, match="limit must be 1 or more"):
        store.history_move(lower=lower, upper=upper, limit=0)


def history_place() -> tuple[datetime | None, int | None, datetime | None]:
    row = ReaperSweep.objects.get()
    return row.history_from_finished_at, row.history_from_id, row.history_pass_started_at


@pytest.mark.django_db
def test_the_move_continues_from_its_place_in_the_sweep_record_and_a_new_pass_starts_at_the_bottom():
    now = store.db_now() + timedelta(days=10)
    old = now - timedelta(hours=3)
    # Done jobs that stay (a retained unique key each) at the bottom of the window: a maintenance
    # that started there every time would walk them all, every time.
    for i in range(4):
        insert_finished("done", old, 1, unique_key=f"stays-{i}")
    rows = insert_finished("done", old + timedelta(seconds=10), 7, step=1)
    assert store.history_maintain("hour", move_after=60, retention=DAY, batch=3, now=now).moved == 7
    # The place: the first row of the last batch that moved (batches of 3, 3 and 1).
    assert history_place() == (old + timedelta(seconds=16), rows[6], now)
    # A job finished behind the place (a clock set back) is passed over by the next maintenance of
    # the same pass, which starts at the place ...
    behind = insert_finished("done", old + timedelta(seconds=5), 1)
    later = now + timedelta(minutes=1)
    assert store.history_maintain("hour", move_after=60, retention=DAY, batch=3, now=later).moved == 0
    assert history_place() == (old + timedelta(seconds=16), rows[6], now)
    # ... and moved by the next pass, from the bottom, once the full-pass interval has passed.
    full = now + timedelta(seconds=store.PRUNE_FULL_PASS_EVERY)
    assert store.history_maintain("hour", move_after=60, retention=DAY, batch=3, now=full).moved == 1
    assert history_place() == (old + timedelta(seconds=5), behind[0], full)
    assert history_ids() == sorted(rows + behind)


@pytest.mark.django_db
def test_a_row_outside_every_partition_fails_the_whole_statement_and_nothing_moves():
    now = store.db_now() + timedelta(days=10)
    rows = insert_finished("done", now - timedelta(hours=2), 3, step=1)
    # No partition at all: the INSERT finds none for the first row and the DELETE is undone with it.
    with pytest.raises(DatabaseError, match="no partition of relation"), transaction.atomic():
        store.history_move(lower=now - timedelta(days=1), upper=now, limit=10)
    assert hot_ids() == rows and history_ids() == []


@pytest.mark.django_db
def test_retention_drops_whole_partitions_and_the_pruner_takes_what_stayed_hot():
    start = store.db_now() + timedelta(days=30)
    start = start.replace(hour=12, minute=0, second=0, microsecond=0)
    first = insert_finished("done", start - timedelta(days=1, hours=6), 3)  # day D-1
    second = insert_finished("done", start - timedelta(hours=6), 4)  # day D
    cancelled = insert_finished("cancelled", start - timedelta(days=1, hours=6), 1)
    run = store.history_maintain("day", move_after=60, retention=3 * DAY, now=start)
    assert run.moved == 7 and history_ids() == sorted(first + second)
    # Three days later day D-1's partition is wholly past retention: dropped with its rows; day D's
    # upper bound is still inside retention.
    later = start + timedelta(days=3)
    run = store.history_maintain("day", move_after=60, retention=3 * DAY, now=later)
    d_minus_1 = (start - timedelta(days=1)).strftime("%Y%m%d")
    assert f"{H}_p{d_minus_1}" in run.dropped
    assert all(name <= f"{H}_p{d_minus_1}" for name in run.dropped)
    assert history_ids() == sorted(second)
    assert all(p.upper > later - timedelta(days=3) for p in store.history_partitions())
    # The cancelled job stayed hot and is the ordinary pruner's.
    assert hot_ids() == cancelled
    assert store.job_prune(older_than=3 * DAY, now=later) == 1 and hot_ids() == []
    with pytest.raises(ValueError, match="older_than must be 0 or more"):
        store.history_drop_partitions(older_than=-1, now=later)


@pytest.mark.django_db
def test_prune_once_moves_when_history_is_on_and_leaves_everything_when_off():
    now = store.db_now() + timedelta(days=10)
    rows = insert_finished("done", now - timedelta(hours=2), 5)
    off = build({"RETENTION": DAY})
    assert off.history is None
    assert prune_once(off, now=now) == 0 and hot_ids() == rows and history_ids() == []
    on = build({"RETENTION": DAY, "HISTORY": "hour", "HISTORY_MOVE_AFTER": 60})
    assert prune_once(on, now=now) == 0
    assert history_ids() == rows and hot_ids() == []


@pytest.mark.django_db
def test_a_failed_history_step_is_logged_and_the_pruner_still_runs(caplog):
    # A partition attached by hand where ours would go: creating ours fails (it would overlap), and
    # the pruner after it still deletes what is past retention.
    now = store.db_now() + timedelta(days=10)
    with connection.cursor() as cur:
        cur.execute(f"CREATE TABLE {H}_by_hand PARTITION OF {H} FOR VALUES FROM (%s) TO (%s)",
                    [now - timedelta(hours=1), now + timedelta(hours=1)])
    insert_finished("done", now - timedelta(days=2), 3)  # past retention: the pruner's
    recent = insert_finished("done", now - timedelta(hours=2), 2)
    on = build({"RETENTION": DAY, "HISTORY": "hour", "HISTORY_MOVE_AFTER": 60})
    assert prune_once(on, now=now) == 3
    assert hot_ids() == recent and history_ids() == []
    assert "the maintenance of the time-partitioned history failed" in caplog.text


def test_settings_refuse_bad_history_values():
    with pytest.raises(ConfigurationError, match="'HISTORY'] must be None"):
        build({"HISTORY": "week"})
    with pytest.raises(ConfigurationError, match="HISTORY_MOVE_AFTER'] must be a finite"):
        build({"HISTORY": "day", "HISTORY_MOVE_AFTER": -1})
    with pytest.raises(ConfigurationError, match="must be below RETENTION"):
        build({"HISTORY": "day", "HISTORY_MOVE_AFTER": 3600, "RETENTION": 600})
    with pytest.raises(ConfigurationError, match="more than 1000 partitions"):
        build({"HISTORY": "hour", "RETENTION": 1001 * 3600})
    assert build({"HISTORY": "hour", "RETENTION": 1000 * 3600}).history == "hour"
    assert build({"HISTORY": "day", "HISTORY_MOVE_AFTER": 30, "RETENTION": None}).history_move_after == 30.0


@pytest.fixture
def drop_partitions(transactional_db):
    """Transactional tests commit their partitions: drop them (and their rows) afterwards."""
    yield
    with connection.cursor() as cur:
        for part in store.history_partitions():
            cur.execute(f"DROP TABLE {part.name}")


def test_a_row_locked_or_changed_meanwhile_is_passed_over_not_moved(drop_partitions):
    now = store.db_now() + timedelta(days=10)
    rows = insert_finished("done", now - timedelta(hours=2), 6)
    store.history_ensure_partitions("hour", back=DAY, now=now)
    window = store.history_window(store.history_partitions(), now=now, after=60, retention=DAY)
    other = connections.create_connection("default")
    try:
        with other.cursor() as cur:
            cur.execute("BEGIN")
            cur.execute("SELECT id FROM leasequeue_job WHERE id = %s FOR UPDATE", [rows[2]])
            step = store.history_move(lower=window[0], upper=window[1], limit=100)
            cur.execute("UPDATE leasequeue_job SET result = '\"edited\"' WHERE id = %s", [rows[2]])
            cur.execute("COMMIT")
    finally:
        other.close()
    assert step.count == 5 and hot_ids() == [rows[2]]
    # The next move takes it, with the edit: never an old copy.
    step = store.history_move(lower=window[0], upper=window[1], limit=100)
    assert step.count == 1 and store.job_get(rows[2]).result == "edited"
    assert history_ids() == rows and hot_ids() == []


def test_concurrent_moves_and_completions_lose_and_duplicate_nothing(drop_partitions):
    # Two maintenances move at once (a cron runreaper --once beside the elected worker) while a
    # worker claims and completes jobs into the window: every job ends exactly once, in one table.
    now = store.db_now() + timedelta(days=1)
    insert_finished("done", now - timedelta(hours=3), 3000, step=0.001)
    ready = [enqueue(member, [i]).id for i in range(300)]
    store.history_ensure_partitions("hour", back=DAY, now=now)
    errors: list[BaseException] = []

    def mover() -> None:
        try:
            for _ in range(5):
                store.history_maintain("hour", move_after=0, retention=DAY, batch=200, now=now)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    def worker() -> None:
        try:
            left = 300
            while left:
                claims = store.job_claim_ids(ready, worker_id="w", lease=30)
                ready[:] = [i for i in ready if i not in {c.id for c in claims}]
                store.job_complete([(c.id, c.lease_version, "2") for c in claims])
                left -= len(claims)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=mover), threading.Thread(target=mover), threading.Thread(target=worker)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    # The worker's completions finish by the real clock, a day before the injected one: those
    # that committed after the movers' place passed them are behind it, and wait for a new pass
    # from the bottom of the window (full_pass_every=0: this one).
    store.history_maintain("hour", move_after=0, retention=DAY, batch=200, now=now, full_pass_every=0)
    hot, history = hot_ids(), history_ids()
    assert len(history) == len(set(history)) and not set(hot) & set(history)
    assert hot == [] and len(history) == 3300
    with connection.cursor() as cur:
        cur.execute(f"SELECT status, count(*) FROM {H} GROUP BY status")
        assert cur.fetchall() == [("done", 3300)]
