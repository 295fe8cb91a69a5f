"""Chaos: the workers' database refuses every connection for 15 s, and for 45 s, while a producer
keeps enqueueing (through this test's own session, the only one the outage spares) and three
workers with a 3 s lease drain both workloads. When the database goes away, every thread is in
the middle of a 2-4 s handler: the handlers return during the outage, and their leases run out
before the database is back.

No handler is killed or frozen, so the targets are strict: nothing lost, no job whose handler had
returned runs again (the plain workload's completion must survive the outage: a handler that
returned before or during it is completed once the database is back, under its own fencing
token), and never two attempts of one job at once.
"""

import time

import pytest
from qa.models import LedgerEntry

from tests.support import wait_for
from tests.support.chaos.harness import (
    Fleet,
    assert_balanced,
    assert_no_overlaps,
    assert_no_reruns,
    db_now,
    enqueue_both,
    ledger,
    record,
    remaining,
    runs_note,
    scaled,
    seconds,
    statuses,
    wait_settled,
)
from tests.worker.test_connection_loss import database_refusing_connections

pytestmark = [pytest.mark.chaos, pytest.mark.process]

JOBS = scaled(400)  # both workloads together, before the producer's
LEASE = "3"
WORKERS, CONCURRENCY = 3, 4
SLOTS = WORKERS * CONCURRENCY
PRODUCE_EVERY = 0.25  # seconds; 2 jobs of each workload each time


def run_outage(spawn, outage: float) -> dict:
    ids: list[int] = []
    seed = [100]

    def produce() -> None:
        seed[0] += 2
        fenced, plain = enqueue_both(2, seed=seed[0], long_share=0.05)
        ids.extend(fenced + plain)

    # The workload first (short jobs, a few 1-3 s long).
    fenced, plain = enqueue_both(JOBS // 2, seed=11, long_share=0.03, long_work=(1.0, 3.0))
    ids.extend(fenced + plain)
    fleet = Fleet(spawn, concurrency=CONCURRENCY, env={"LEASEQUEUE_LEASE": LEASE})
    fleet.start_reaper()
    members = [fleet.start() for _ in range(WORKERS)]
    fleet.wait_registered()
    wait_for(lambda: remaining(None) <= SLOTS, timeout=180, interval=0.1, what="the workload to drain")
    # Then every thread of every worker busy with a 2-4 s handler of either workload when the
    # database goes away: they return during the outage, so their completions (and the fenced
    # ones' commits) must wait for it, while leases run out.
    long_fenced, long_plain = enqueue_both(SLOTS // 2, seed=12, long_share=1.0, long_work=(2.0, 4.0))
    long_ids = long_fenced + long_plain
    ids.extend(long_ids)
    wait_for(lambda: LedgerEntry.objects.filter(job_id__in=long_ids, outcome="").count() >= SLOTS - 2,
             timeout=60, interval=0.05, what="the long handlers to be running")

    produced_during = len(ids)
    with database_refusing_connections():
        down = db_now()
        end = time.monotonic() + outage
        while time.monotonic() < end:
            produce()
            time.sleep(PRODUCE_EVERY)
        produced_during = len(ids) - produced_during
    back = db_now()
    after_until = time.monotonic() + 5
    next_at = [time.monotonic()]

    def tick() -> None:
        if time.monotonic() < after_until and time.monotonic() >= next_at[0]:
            produce()
            next_at[0] = time.monotonic() + PRODUCE_EVERY

    drained = wait_settled(240, tick=tick)
    alive = [m.name for m in members if m.running]
    exits = fleet.stop()
    books = ledger(ids, deaths=fleet.deaths)
    # Handlers that returned while the database was away (their ledger row carries the worker's
    # clock, written once the database was back): the completions the outage held up.
    returned_during = LedgerEntry.objects.filter(job_id__in=ids, outcome="returned", returned_clock="local").count()
    return {"returned_during": returned_during, "ids": ids, "books": books, "drained": drained, "alive": alive,
            "exits": exits, "during": produced_during, "outage_s": seconds(down, back), "members": members}


def notes(run: dict) -> str:
    return (f"{run['during']} jobs enqueued during the outage, {run['returned_during']} handlers returned during "
            f"it; {runs_note(run['books'])}")


def check(run: dict) -> None:
    books = run["books"]
    assert run["drained"] is not None, f"not drained after 240 s: {statuses(run['ids'])}; {runs_note(books)}"
    assert len(run["alive"]) == WORKERS, [m.proc.output() for m in run["members"] if not m.running]
    assert_balanced(books, done=len(run["ids"]))
    assert_no_reruns(books)
    assert_no_overlaps(books)
    assert all(code == 0 for code, _ in run["exits"].values()), run["exits"]


def test_fifteen_second_outage_with_a_producer(spawn):
    run = run_outage(spawn, 15)
    books = run["books"]
    record("outage_15s", fault="15 s with the database refusing connections, a producer enqueueing throughout "
           "(3 workers, lease 3 s, both workloads)", jobs=len(run["ids"]), faults=1, books=books,
           recovery=run["drained"], recovery_meaning="time from the database accepting connections again until "
           "every job was finished", notes=notes(run),
           outage_s=round(run["outage_s"], 1))
    check(run)


def test_forty_five_second_outage_with_a_producer(spawn):
    run = run_outage(spawn, 45)
    books = run["books"]
    record("outage_45s", fault="45 s with the database refusing connections, a producer enqueueing throughout "
           "(3 workers, lease 3 s, both workloads)", jobs=len(run["ids"]), faults=1, books=books,
           recovery=run["drained"], recovery_meaning="time from the database accepting connections again until "
           "every job was finished", notes=notes(run),
           outage_s=round(run["outage_s"], 1))
    check(run)
