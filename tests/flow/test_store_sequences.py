"""Sequences in the claim statement and at enqueue (store level, real PostgreSQL): one job of a
sequence key at a time, in enqueue order; a retry holds its sequence; a dead job halts or lets it
continue per the task's ``sequence_on_dead``; cancelled jobs never hold it; bad options are refused."""

from __future__ import annotations

import random
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction

from django_leasequeue import store
from django_leasequeue.enqueueing import build_job, enqueue, enqueue_many, task
from django_leasequeue.exceptions import ConfigurationError, EnqueueError
from django_leasequeue.models import Job

pytestmark = pytest.mark.django_db


@task(name="tests.flow.seq_halt", queue="flow", sequence_key="acct-{account}", max_attempts=2)
def seq_halt(account: str, n: int) -> None:
    """A job of account ``account``'s sequence; a dead one halts the sequence (the default)."""


@task(name="tests.flow.seq_continue", queue="flow", sequence_key=lambda account, n: f"acct-{account}",
      sequence_on_dead="continue", max_attempts=1)
def seq_continue(account: str, n: int) -> None:
    """The same sequence key from a callable; a dead one lets the sequence continue."""


@task(name="tests.flow.seq_other_queue", queue="emails", sequence_key="acct-{account}")
def seq_other_queue(account: str, n: int) -> None:
    """The same key on another queue: a sequence is global, not per queue."""


@task(name="tests.flow.plain", queue="flow")
def plain(n: int) -> None:
    """No sequence."""


def claim(limit: int = 50, queues=("flow",), **kw) -> store.ClaimResult:
    return store.job_claim(queues=list(queues) if queues is not None else None, limit=limit, worker_id="t",
                           lease=30, rate_limits={}, **kw)


def complete(jobs) -> None:
    assert store.job_complete([(j.id, j.lease_version, None) for j in jobs]) == {j.id for j in jobs}


def fail(job, *, retry_delay: float | None):
    return store.job_fail(job.id, job.lease_version, {"attempt": job.attempts, "type": "Boom", "message": "x",
                                                      "traceback": "", "worker": "t"}, retry_delay=retry_delay)


def test_the_key_and_policy_are_stored_on_each_row():
    a = seq_halt.enqueue(account="a", n=0)
    b = seq_continue.enqueue(account="a", n=1)
    c = plain.enqueue(n=2)
    rows = {j.id: (j.sequence_key, j.sequence_halts) for j in Job.objects.all()}
    assert rows == {a.id: ("acct-a", True), b.id: ("acct-a", False), c.id: (None, False)}
    assert (a.sequence_key, a.sequence_halts) == ("acct-a", True)  # the returned Job says the same


def test_only_the_head_of_each_sequence_is_claimed_in_id_order():
    # Three accounts interleaved, plus keyless jobs: one claim takes each sequence's head and every
    # keyless job, never two jobs of one key.
    enqueue_many(seq_halt, [([], {"account": acct, "n": n}) for n in range(4) for acct in "abc"])
    enqueue_many(plain, [[n] for n in range(3)])
    order: dict[str, list[int]] = {"a": [], "b": [], "c": []}
    rounds = 0
    while True:
        got = claim(50)
        if not got:
            break
        rounds += 1
        keyed = [j for j in got if j.task == "tests.flow.seq_halt"]
        accounts = [j.kwargs["account"] for j in keyed]
        assert len(accounts) == len(set(accounts)), accounts  # at most one per key per claim
        if rounds == 1:
            assert sorted(j.args[0] for j in got if j.task == "tests.flow.plain") == [0, 1, 2]
        assert claim(50) == []  # the next job of each key waits while its head is leased
        for j in keyed:
            order[j.kwargs["account"]].append(j.kwargs["n"])
        complete(got)
    assert rounds == 4
    assert order == {"a": [0, 1, 2, 3], "b": [0, 1, 2, 3], "c": [0, 1, 2, 3]}
    assert Job.objects.filter(status="done", attempts=1).count() == 15  # waiting cost no attempt


def test_a_sequence_spans_queues_and_tasks():
    first = seq_other_queue.enqueue(account="a", n=0)
    seq_halt.enqueue(account="a", n=1)
    assert claim(50, queues=("flow",)) == []  # the head is on "emails"; nothing of the key may start
    head = claim(50, queues=("emails",))
    assert [j.id for j in head] == [first.id]
    assert claim(50, queues=None) == []  # the '*' claim applies the same rule
    complete(head)
    assert [j.kwargs["n"] for j in claim(50, queues=None)] == [1]


def test_a_failing_head_holds_its_sequence_until_its_retry_is_due():
    head = seq_halt.enqueue(account="a", n=0)
    seq_halt.enqueue(account="a", n=1)
    [leased] = claim()
    now = store.db_now()
    assert fail(leased, retry_delay=60)[0] == "ready"
    # The head waits out its backoff (ready, run_at in a minute); the job behind it is due but may
    # not start, neither now nor 59 s later.
    assert claim() == []
    assert claim(now=now + timedelta(seconds=59)) == []
    retry = claim(now=now + timedelta(seconds=61))
    assert [(j.id, j.attempts) for j in retry] == [(head.id, 2)]
    complete(retry)
    assert [j.kwargs["n"] for j in claim(now=now + timedelta(seconds=62))] == [1]


def test_a_dead_head_halts_its_sequence_until_replayed():
    head = seq_halt.enqueue(account="a", n=0)
    second = seq_halt.enqueue(account="a", n=1)
    other = seq_halt.enqueue(account="b", n=0)
    [a0, b0] = claim()
    assert fail(a0, retry_delay=None)[0] == "dead"
    complete([b0])
    assert claim() == []  # a's head is dead and halts; b is unaffected but empty
    assert [(h.key, h.job_id, h.waiting) for h in store.sequence_halted()] == [("acct-a", head.id, 1)]
    assert store.job_replay([head.id], by="alice").replayed == [head.id]
    again = claim()
    assert [j.id for j in again] == [head.id]  # same id: the replayed job is the head again
    complete(again)
    assert [j.id for j in claim()] == [second.id]
    assert store.sequence_halted() == []
    assert Job.objects.get(pk=other.id).status == "done"


def test_skipping_a_dead_head_lets_its_sequence_go_on_and_keeps_it_dead():
    head = seq_halt.enqueue(account="a", n=0)
    second = seq_halt.enqueue(account="a", n=1)
    [a0] = claim()
    fail(a0, retry_delay=None)
    assert claim() == []
    assert store.sequence_skip([head.id, second.id, 999_999], by="bob") == [head.id]  # only the halting one
    dead = Job.objects.get(pk=head.id)
    assert (dead.status, dead.sequence_halts, dead.history[-1]["event"], dead.history[-1]["by"]) == \
        ("dead", False, "sequence_skipped", "bob")
    assert [j.id for j in claim()] == [second.id]
    assert store.sequence_skip([head.id]) == []  # already skipped: nothing to do
    # Replayed after the skip, the job is back under its task's policy: dead again, it halts again.
    assert store.job_replay([head.id]).replayed == [head.id]
    assert Job.objects.get(pk=head.id).sequence_halts is True


def test_a_dead_job_of_a_continue_policy_lets_the_next_start():
    head = seq_continue.enqueue(account="a", n=0)
    second = seq_halt.enqueue(account="a", n=1)
    [a0] = claim()
    assert a0.id == head.id
    assert fail(a0, retry_delay=None)[0] == "dead"
    assert [j.id for j in claim()] == [second.id]
    assert store.sequence_halted() == []


def test_cancelled_jobs_never_hold_a_sequence():
    first = seq_halt.enqueue(account="a", n=0)
    second = seq_halt.enqueue(account="a", n=1)
    third = seq_halt.enqueue(account="a", n=2)
    counts = store.job_request_cancel([first.id, second.id])
    assert counts.cancelled == 2
    assert [j.id for j in claim()] == [third.id]


def test_a_replayed_earlier_job_waits_for_the_running_one():
    # A skipped dead job replayed while a later job of its sequence runs: one at a time still holds.
    head = seq_halt.enqueue(account="a", n=0)
    second = seq_halt.enqueue(account="a", n=1)
    [a0] = claim()
    fail(a0, retry_delay=None)
    store.sequence_skip([head.id])
    running = claim()
    assert [j.id for j in running] == [second.id]
    assert store.job_replay([head.id]).replayed == [head.id]
    assert claim() == []  # the replayed job is earlier, but the sequence has a leased job
    complete(running)
    assert [j.id for j in claim()] == [head.id]


def test_a_future_head_holds_the_jobs_behind_it():
    head = seq_halt.using(run_at=timedelta(minutes=5)).enqueue(account="a", n=0)
    seq_halt.enqueue(account="a", n=1)
    assert claim() == []
    later = claim(now=store.db_now() + timedelta(minutes=6))
    assert [j.id for j in later] == [head.id]


def test_using_overrides_the_sequence_key_for_one_enqueue():
    first = plain.using(sequence_key="batch-7").enqueue(1)
    second = seq_halt.using(sequence_key="batch-{n}").enqueue(account="a", n=7)
    third = seq_halt.enqueue(account="a", n=8)
    assert [(j.sequence_key, j.sequence_halts) for j in (first, second, third)] == \
        [("batch-7", True), ("batch-7", True), ("acct-a", True)]
    assert sorted(j.id for j in claim()) == [first.id, third.id]  # second waits behind first
    with pytest.raises(EnqueueError, match=r"using\(sequence_key=...\) must be a non-empty str, got 5"):
        seq_halt.using(sequence_key=5)  # type: ignore[typeddict-item]


def test_bad_sequence_options_are_refused_at_declaration():
    with pytest.raises(ConfigurationError, match="sequence_on_dead must be 'halt' or 'continue', got 'stop'"):
        task(name="tests.flow.bad_policy", sequence_key="k", sequence_on_dead="stop")(lambda: None)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="sequence_key must be a non-empty str.format template"):
        task(name="tests.flow.bad_key", sequence_key="")(lambda: None)
    with pytest.raises(ConfigurationError, match="sequence_key must be a non-empty str.format template"):
        task(name="tests.flow.bad_key2", sequence_key=42)(lambda: None)  # type: ignore[arg-type]


def test_bad_sequence_keys_are_refused_at_enqueue_before_anything_is_written():
    with pytest.raises(EnqueueError, match="sequence_key failed on these arguments: KeyError"):
        build_job(seq_halt, [], {"n": 1, "acct": "typo"}, check_signature=False)
    with pytest.raises(EnqueueError, match="sequence_key"):
        seq_halt.enqueue(account="x" * 300, n=0)
    with pytest.raises(EnqueueError, match="sequence_key"):
        enqueue_many(seq_halt, [([], {"account": "ok", "n": 0}), ([], {"account": "y" * 300, "n": 1})])
    assert Job.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_16_threads_enqueueing_one_key_claim_in_commit_order():
    """16 threads enqueue one job each of key "acct-race" in their own transactions, pausing at
    random between the insert and the commit. A counter row updated just before each commit records
    the commit order (its row lock is held to the commit). The claim must run the jobs in that
    order: ids follow commit order because the enqueue lock serialises the key's enqueuers."""
    with connection.cursor() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS lq_seq_commit_order (job_id bigint PRIMARY KEY, n bigint)")
        cur.execute("CREATE SEQUENCE IF NOT EXISTS lq_seq_commit_counter")
    errors: list[BaseException] = []
    barrier = threading.Barrier(16)

    def enqueue_one(i: int) -> None:
        rng = random.Random(i)
        try:
            barrier.wait(10)
            with transaction.atomic():
                job = enqueue(seq_halt, kwargs={"account": "race", "n": i})
                time.sleep(rng.uniform(0, 0.02))
                with connection.cursor() as cur:
                    # Taken last, held until the commit: the order of these values is the commit order.
                    cur.execute("LOCK TABLE lq_seq_commit_order IN SHARE ROW EXCLUSIVE MODE")
                    cur.execute("INSERT INTO lq_seq_commit_order VALUES (%s, nextval('lq_seq_commit_counter'))",
                                [job.id])
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
        finally:
            connections.close_all()

    try:
        threads = [threading.Thread(target=enqueue_one, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert errors == []
        with connection.cursor() as cur:
            cur.execute("SELECT job_id FROM lq_seq_commit_order ORDER BY n")
            commit_order = [r[0] for r in cur.fetchall()]
        assert len(commit_order) == 16
        claimed = []
        while got := claim(50):
            assert len(got) == 1  # one at a time
            claimed.append(got[0].id)
            complete(got)
        assert claimed == commit_order
        assert claimed == sorted(claimed)  # and that is id order
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS lq_seq_commit_order")
            cur.execute("DROP SEQUENCE IF EXISTS lq_seq_commit_counter")


def _nodes(plan: dict) -> list[dict]:
    """Every node of a JSON plan, depth first."""
    found = [plan]
    for child in plan.get("Plans", []):
        found.extend(_nodes(child))
    return found


def test_the_sequence_probes_read_only_the_sequence_indexes():
    """With 2,000 keyed jobs (some leased, some dead) and fresh statistics, the claim's candidate
    scan reads the job table only through the ready index and the two sequence indexes: no
    sequential scan (a leased probe spelled so that no partial index fits became a Seq Scan of the
    whole table once per claim) and no BitmapOr over the dead-letter index."""
    enqueue_many(seq_halt, [([], {"account": str(i % 100), "n": i}) for i in range(2000)])
    got = claim(20)
    for job in got[:5]:
        fail(job, retry_delay=None)
    with connection.cursor() as cur:
        cur.execute("ANALYZE leasequeue_job")
        cur.execute("EXPLAIN (FORMAT JSON) " + store.JOB_CLAIM,
                    {"now": None, "limit": 50, "worker": "w", "lease": 30.0, "claim": "c", "queues": ["flow"],
                     "tasks": None, "all_tasks": True})
        plan = cur.fetchone()[0][0]["Plan"]
    picked = next(n for n in _nodes(plan) if n.get("Subplan Name") == "CTE picked")
    nodes = _nodes(picked)
    indexes = {n["Index Name"] for n in nodes if "Index Name" in n}
    assert indexes == {"leasequeue_job_ready", "leasequeue_job_seq_order", "leasequeue_job_seq_leased"}, indexes
    assert not [n for n in nodes if n["Node Type"] in ("Seq Scan", "BitmapOr")]


def test_a_template_naming_an_argument_passed_by_position_says_how_to_fix_it():
    from flowlab.tasks import seq_step

    before = Job.objects.count()
    with pytest.raises(EnqueueError, match=r"KeyError\('account'\) \(a key template is formatted with the "
                                           r"enqueue's own arguments: keyword arguments by name, positional ones "
                                           r"by index, '\{0\}' for the first"):
        seq_step.enqueue("a", 1)
    assert Job.objects.count() == before


@task(name="tests.flow.seq_keyed", queue="flow", sequence_key="acct-{account}", concurrency_key="acct-{account}",
      concurrency_limit=1)
def seq_keyed(account: str, n: int) -> None:
    """A sequence whose jobs also share a concurrency key (limit 1)."""


@task(name="tests.flow.seq_rated", queue="flow", sequence_key="acct-{account}", rate_key="acct-{account}",
      rate_limit="2/h")
def seq_rated(account: str, n: int) -> None:
    """A sequence whose jobs also share a per-key rate limit (2 per hour)."""


@pytest.mark.parametrize("spec", [seq_keyed, seq_rated], ids=["concurrency-key", "rate-key"])
@pytest.mark.parametrize("fair", [False, True], ids=["plain-claim", "fair-claim"])
def test_a_waiting_job_that_sorts_first_takes_no_slot_of_its_key(spec, fair):
    # The successors sort ahead of the head (a higher priority; a retried head has the same effect
    # through its later run_at). The sequence rule runs first, so they take no concurrency slot and
    # spend no rate allowance: the head is claimed, alone, and the rate log counts it once.
    head = spec.enqueue(account="a", n=0)
    behind = [spec.using(priority=10).enqueue(account="a", n=i) for i in (1, 2, 3)]
    jobs = claim(10, fair_queues=("flow",) if fair else ())
    assert [j.id for j in jobs] == [head.id]
    assert Job.objects.filter(id__in=[b.id for b in behind], status="ready", attempts=0).count() == 3
    if spec is seq_rated:
        assert sum(c for _, c in store.rate_key_log("acct-a") or []) == 1
