"""Chaos: the workers' database refuses every connection for 15 s, and for 45 s, while a producer
keeps enqueueing (through this test's own session, the only one the outage spares) and three
workers with a 3 s lease drain both workloads.

No handler is killed or frozen, so the targets are strict: nothing lost, no job whose handler had
returned runs again (the plain workload's completion must survive the outage: a handler that
returned before or during it is completed once the database is back, under its own fencing
token), and never two attempts of one job at once.
"""

import time

import pytest
from qa.models import LedgerEntry

from tests.chaos.harness import (
    Fleet,
    assert_balanced,
    assert_no_overlaps,
    assert_no_reruns,
    db_now,
    enqueue_both,
    finished_count,
    ledger,
    record,
    runs_note,
    scaled,
    seconds,
    statuses,
    wait_settled,
)
from tests.chaos.test_connection_loss import database_refusing_connections
from tests.support import wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.process]

JOBS = scaled(600)  # both workloads together, before the producer's
LEASE = "3"
LONG_SHARE = 0.2
PRODUCE_EVERY = 0.25  # seconds; 2 jobs of each workload each time


def run_outage(spawn, outage: float) -> dict:
    ids: list[int] = []
    seed = [100]

    def produce() -> None:
        seed[0] += 2
        fenced, plain = enqueue_both(2, seed=seed[0], long_share=LONG_SHARE, long_work=(1.0, 3.0))
        ids.extend(fenced + plain)

    # Many handlers 1-3 s long: at any instant most threads are mid-handler, so the outage catches
    # handlers that return while the database is away (their completion must wait for it).
    fenced, plain = enqueue_both(JOBS // 2, seed=11, long_share=LONG_SHARE, long_work=(1.0, 3.0))
    ids.extend(fenced + plain)
    fleet = Fleet(spawn, env={"LEASEQUEUE_LEASE": LEASE})
    fleet.start_reaper()
    members = [fleet.start() for _ in range(3)]
    fleet.wait_registered()
    wait_for(lambda: finished_count() >= JOBS // 6, timeout=120, interval=0.1, what="a sixth of the jobs")

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
    assert len(run["alive"]) == 3, [m.proc.output() for m in run["members"] if not m.running]
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
