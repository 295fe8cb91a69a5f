"""Invariant 1, no double claim: claimers on their own connections, released together by a barrier,
over many iterations; and the races between a completion and the reaper."""

import threading
from datetime import timedelta

import pytest
from django.db import connection

from django_leasequeue import enqueue, enqueue_many, store
from django_leasequeue.models import Job
from tests.support import claim, in_threads

pytestmark = pytest.mark.django_db(transaction=True)

ITERATIONS = 150
CLAIMERS = 4


def test_racing_claimers_on_one_due_job_exactly_one_wins():
    """Each iteration commits one due job, then releases the claimers together: one claim only."""
    barrier = threading.Barrier(CLAIMERS + 1, timeout=30)
    wins: list[list[tuple[int, int, int]]] = [[] for _ in range(ITERATIONS)]
    lock = threading.Lock()

    def participant(i: int) -> list[int]:
        enqueued = []
        for it in range(ITERATIONS):
            if i == CLAIMERS:  # the driver: commit this iteration's job (autocommit)
                enqueued.append(enqueue("qa.record").id)
            barrier.wait()  # the job is committed; go
            if i < CLAIMERS:
                got = claim(limit=1, worker_id=f"t{i}")
                with lock:
                    wins[it].extend((i, c.id, c.lease_version) for c in got)
            barrier.wait()  # everyone has tried
        return enqueued

    ids = in_threads(CLAIMERS + 1, participant)[CLAIMERS]
    assert [len(w) for w in wins] == [1] * ITERATIONS
    assert [w[0][1] for w in wins] == ids
    assert {w[0][2] for w in wins} == {1}
    assert len({w[0][0] for w in wins}) > 1, "one thread won every time: the claims did not race"
    assert Job.objects.filter(status="leased", attempts=1, lease_version=1).count() == ITERATIONS


def test_batch_claimers_drain_a_backlog_without_duplicates():
    total = enqueue_many("qa.record", [[str(i)] for i in range(600)])
    assert total == 600
    barrier = threading.Barrier(8, timeout=30)

    def claimer(i: int) -> list[int]:
        barrier.wait()
        mine = []
        while batch := claim(limit=7, worker_id=f"t{i}"):
            mine.extend(c.id for c in batch)
        return mine

    claimed = [job_id for ids in in_threads(8, claimer) for job_id in ids]
    assert len(claimed) == 600 and len(set(claimed)) == 600
    assert set(claimed) == set(Job.objects.values_list("id", flat=True))


def test_completion_racing_the_reaper_exactly_one_wins():
    """A completion arriving just as its lease expires: either the job is done (the reaper found
    nothing to take back) or it was reaped (the completion was refused), never both."""
    rounds = 60
    barrier = threading.Barrier(3, timeout=30)
    plan: list[tuple[int, int, object]] = []  # (job id, token, an instant past the lease)
    results: list[list] = [[None, None] for _ in range(rounds)]

    def participant(i: int) -> None:
        for n in range(rounds):
            if i == 2:  # the driver: a leased job whose lease has expired at `at`
                enqueue("qa.record", queue=f"race-{n}")
                now = store.db_now() + timedelta(seconds=1)
                (c,) = claim(now, lease=1, queues=[f"race-{n}"])
                plan.append((c.id, c.lease_version, now + timedelta(seconds=2)))
            barrier.wait()
            job_id, token, at = plan[n]
            if i == 0:
                results[n][0] = store.job_complete([(job_id, token, None)], now=at)
            elif i == 1:
                results[n][1] = store.job_reap_expired(now=at)
            barrier.wait()

    in_threads(3, participant)
    jobs = {j.id: j for j in Job.objects.all()}
    for (job_id, _, _), (completed, reaped) in zip(plan, results, strict=True):
        assert bool(completed) != bool(reaped), (job_id, completed, reaped)
        job = jobs[job_id]
        assert (job.status, job.lease_version) == (("done", 1) if completed else ("ready", 2))


def test_claim_sees_only_committed_jobs():
    """Case C08: a worker cannot claim a job before the enqueuing transaction commits."""
    from django.db import transaction

    with transaction.atomic():
        job = enqueue("qa.record")
        assert connection.in_atomic_block
        assert in_threads(1, lambda i: claim(limit=10)) == [[]]
    (got,) = in_threads(1, lambda i: claim(limit=10))
    assert [c.id for c in got] == [job.id]
