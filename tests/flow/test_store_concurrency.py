"""Per-key concurrency limits in the claim statement (store level, real PostgreSQL)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections
from flowlab.tasks import customer_job, rated_noop

from django_leasequeue import store
from django_leasequeue.enqueueing import build_job, task
from django_leasequeue.models import Job

pytestmark = pytest.mark.django_db


@task(name="tests.flow.keyed_one", queue="flow", concurrency_key=lambda key, i: key, concurrency_limit=1)
def keyed_one(key: str, i: int) -> None:
    """Limit 1 per key (the key is the first argument)."""


def insert(jobs) -> list[Job]:
    return store.job_insert(list(jobs), notify=False, channel="unused")


def claim(limit: int, queues=("flow",), **kw):
    return store.job_claim(queues=list(queues) if queues is not None else None, limit=limit, worker_id="t",
                           lease=30, rate_limits={}, **kw)


def test_limit_holds_within_one_batch():
    insert(build_job(customer_job, [], {"customer": "a", "seq": i}) for i in range(5))
    claimed = claim(10)
    assert [c.kwargs["seq"] for c in claimed] == [0, 1]
    assert claim(10) == []  # still 2 leased: nothing more for customer a
    assert Job.objects.filter(status="ready", attempts=0).count() == 3  # waiting costs no attempt


def test_over_limit_key_is_skipped_and_the_scan_keeps_looking():
    # 50 jobs of a busy key come first in claim order; keyless jobs and other keys are behind it.
    insert(build_job(keyed_one, ["busy", i]) for i in range(50))
    insert(build_job(customer_job, [], {"customer": "b", "seq": i}) for i in range(3))
    insert(build_job(rated_noop, [i], queue="flow") for i in range(3))
    claimed = claim(10)
    got = sorted((c.task, c.args[0] if c.args else c.kwargs["customer"]) for c in claimed)
    assert got == [("flowlab.customer_job", "b"), ("flowlab.customer_job", "b"), ("flowlab.rated_noop", 0),
                   ("flowlab.rated_noop", 1), ("flowlab.rated_noop", 2), ("tests.flow.keyed_one", "busy")]
    # The busy key's backlog was examined without being locked or charged an attempt.
    assert Job.objects.filter(concurrency_key="busy", status="ready", attempts=0).count() == 49


def test_completion_frees_the_slot():
    insert(build_job(customer_job, [], {"customer": "a", "seq": i}) for i in range(3))
    first = claim(10)
    assert len(first) == 2
    done = store.job_complete([(first[0].id, first[0].lease_version, None)])
    assert done == {first[0].id}
    again = claim(10)
    assert [c.kwargs["seq"] for c in again] == [2]


def test_key_limit_spans_queues_and_any_queue_claim():
    insert([build_job(customer_job, [], {"customer": "a", "seq": 0}, queue="flow"),
            build_job(customer_job, [], {"customer": "a", "seq": 1}, queue="other"),
            build_job(customer_job, [], {"customer": "a", "seq": 2}, queue="other")])
    assert len(claim(10, queues=("flow",))) == 1
    assert len(claim(10, queues=None)) == 1  # '*' claim: one slot left for customer a
    assert claim(10, queues=None) == []


def test_two_claims_in_one_transaction_do_not_double_count():
    insert(build_job(customer_job, [], {"customer": "a", "seq": i}) for i in range(4))
    # The test runs in one transaction: the second claim sees the first one's leased rows in its
    # fresh count, and must not also remember them as admitted by this claim.
    assert len(claim(1)) == 1
    assert len(claim(1)) == 1
    assert claim(1) == []


@pytest.mark.django_db(transaction=True)
def test_simultaneous_claimers_never_exceed_the_limit():
    """8 threads (8 connections) claim at the same instant, 25 rounds: a key never exceeds 2.

    Half the threads claim from queue ``flow``, half from ``other``, and both queues hold jobs of
    the same keys: their scans then never meet each other's locked rows, so only the per-key
    serialisation in leasequeue_conc_admit() keeps them from both taking the last slots (without
    the advisory lock this test sees 4 leased for one key).
    """
    for queue in ("flow", "other"):
        insert(build_job(customer_job, [], {"customer": "hot", "seq": i}, queue=queue) for i in range(40))
        insert(build_job(customer_job, [], {"customer": "cold", "seq": i}, queue=queue) for i in range(40))
    threads, rounds = 8, 25
    barrier = threading.Barrier(threads)
    results: list[list[int]] = [[] for _ in range(rounds)]
    lock = threading.Lock()
    errors: list[BaseException] = []

    def claimer(queue: str) -> None:
        try:
            for r in range(rounds):
                barrier.wait(10)
                jobs = claim(2, queues=(queue,))
                with lock:
                    results[r].extend(j.id for j in jobs)
                barrier.wait(10)
                if jobs:  # give them back (not an attempt) so the next round competes again
                    store.job_release([(j.id, j.lease_version) for j in jobs])
                barrier.wait(10)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
            barrier.abort()
        finally:
            connections.close_all()

    pool = [threading.Thread(target=claimer, args=("flow" if i % 2 else "other",)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(60)
    assert not errors, errors
    for ids in results:
        by_key: dict[str, int] = {}
        for job in Job.objects.filter(id__in=ids):
            by_key[job.concurrency_key] = by_key.get(job.concurrency_key, 0) + 1
        assert max(by_key.values()) <= 2, by_key
    # Every round handed out work (the per-key lock is skipped, never waited on, so no claimer blocks).
    assert all(len(ids) >= 1 for ids in results)
    connection.close()


def test_plain_claim_plan_keeps_the_predicate_inside_the_locked_scan():
    """EXPLAIN: the admission filter is on the index scan under LockRows."""
    params = {"now": None, "limit": 4, "worker": "t", "lease": 30.0, "claim": "x", "queues": ["flow"], "tasks": None,
              "all_tasks": True}
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (COSTS OFF) " + store.JOB_CLAIM, params)
        plan = [r[0] for r in cur.fetchall()]
    lock = next(i for i, line in enumerate(plan) if "LockRows" in line)
    filt = next(i for i, line in enumerate(plan) if "leasequeue_conc_admit" in line)
    assert filt > lock and "Index Scan" in plan[filt - 2]
