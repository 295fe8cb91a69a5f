"""Chaos: one handler returns a result too big to store, among normal jobs of both workloads.

The result is a string of 280,000,000 characters: above what a jsonb value can hold (a jsonb
string is at most 2^28 - 1 = 268,435,455 bytes), so PostgreSQL refuses it whatever limit the
queue itself sets. One such job only, with ``max_attempts=2``: each attempt costs about 1 GB of
memory in the worker and the server, on a shared machine.

No handler is killed or frozen: nothing lost, no returned job runs again, no two attempts of one
job at once; and the huge job ends finished (not leased forever) with its real error recorded,
not only ``LeaseExpired``.
"""

import pytest
from qa.models import LedgerEntry

from django_leasequeue.models import Job
from tests.support import wait_for
from tests.support.chaos.harness import (
    Fleet,
    assert_balanced,
    assert_no_overlaps,
    assert_no_reruns,
    enqueue_both,
    enqueue_plain,
    finished_count,
    ledger,
    record,
    runs_note,
    scaled,
    statuses,
    wait_settled,
)

pytestmark = [pytest.mark.chaos, pytest.mark.process]

JOBS = scaled(600)  # both workloads together
HUGE = 280_000_000  # characters: over jsonb's 268,435,455-byte limit


def test_one_huge_result_among_normal_jobs(spawn):
    fenced, plain = enqueue_both(JOBS // 4, seed=21)
    ids = fenced + plain
    fleet = Fleet(spawn, concurrency=4)
    fleet.start_reaper()
    fleet.start()
    fleet.start()
    fleet.wait_registered()
    wait_for(lambda: finished_count() >= JOBS // 8, timeout=120, interval=0.1, what="the first jobs")
    # The huge job lands in the middle of the run; once its handler has returned (its completion
    # is being written, or refused), the second half of the workload arrives, so that the
    # completion of other jobs queues up behind it.
    (huge,) = enqueue_plain(1, seed=22, size=HUGE, max_attempts=2, short_share=0, long_share=0)
    wait_for(lambda: LedgerEntry.objects.filter(job_id=huge, outcome="returned").exists(), timeout=120,
             interval=0.1, what="the huge handler to return")
    more_fenced, more_plain = enqueue_both(JOBS // 4, seed=23, long_share=0.05)
    ids += more_fenced + more_plain

    drained = wait_settled(180)
    alive = [m.name for m in fleet.live()]
    exits = fleet.stop()
    books = ledger(ids, deaths=fleet.deaths)
    big = Job.objects.values("status", "attempts", "errors").get(pk=huge)
    big_errors = [e.get("type") for e in big["errors"]]
    record("huge_result", fault="one handler returns 280,000,000 characters (over jsonb's limit) among normal "
           "jobs of both workloads (2 workers)", jobs=len(ids) + 1, faults=1, books=books, recovery=None,
           recovery_meaning="no recovery time: the huge job must fail alone, at once",
           notes=f"huge job: {big['status']} after {big['attempts']} attempts, errors {big_errors}; "
                 f"{runs_note(books)}", also=[huge], huge_job=big["status"], huge_errors=big_errors)

    assert drained is not None, f"not drained after 180 s: {statuses(ids + [huge])}; {runs_note(books)}"
    assert len(alive) == 2
    assert_balanced(books, done=len(ids))
    assert_no_reruns(books)
    assert_no_overlaps(books)
    assert big["status"] == "dead", big
    assert big_errors and set(big_errors) != {"LeaseExpired"}, big_errors
    assert all(code == 0 for code, _ in exits.values()), exits
