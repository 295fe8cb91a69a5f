"""Chaos: handlers that run past their task's timeout, under a per-key concurrency limit of 1.

``qa.chaos_keyed`` has ``timeout=1`` and ``concurrency_limit=1`` per ``key``. For each of 6 keys,
one job sleeps 6 s on its first attempt (past the timeout; its retries return at once), queued
ahead of short jobs of the same key; both workloads run beside them. A thread past its timeout
cannot be stopped, so the handler goes on to its end: until then neither its own retry nor another
job of its key may start, anywhere (the ledger shows every handler's real interval).

Targets (every fault): never two attempts of one job at once, never more than one handler of a
key at once, never more handlers at once in one worker than its ``--concurrency``; nothing lost.
"""

import pytest

from django_leasequeue import enqueue_many
from django_leasequeue.models import Job
from tests.support.chaos.harness import (
    Fleet,
    assert_balanced,
    assert_no_overlaps,
    assert_no_reruns,
    enqueue_both,
    execution_books,
    ledger,
    record,
    runs_note,
    scaled,
    statuses,
    wait_settled,
)

pytestmark = [pytest.mark.chaos, pytest.mark.process]

KEYS = 6  # one slow job per key: most of the two workers' 8 threads time out at once
SHORT_PER_KEY = max(5, scaled(10, workload=False))
SLOW = 6.0  # seconds: the first attempt's run time, past the 1 s timeout and past the 2 s lease
JOBS = scaled(200)  # both workloads together
CONCURRENCY = 4


def keyed_ids() -> list[int]:
    return sorted(Job.objects.filter(task="qa.chaos_keyed").values_list("id", flat=True))


def test_timed_out_handlers_under_a_key_limit_of_one(spawn):
    # The slow job of each key first (higher priority), then its short ones.
    enqueue_many("qa.chaos_keyed", [([], {"key": f"k{k}", "work": SLOW}) for k in range(KEYS)], priority=10)
    enqueue_many("qa.chaos_keyed", [([], {"key": f"k{k}", "work": 0.05}) for k in range(KEYS)
                                    for _ in range(SHORT_PER_KEY)])
    keyed = keyed_ids()
    fenced, plain = enqueue_both(JOBS // 2, seed=41)
    workload = fenced + plain
    # Up to all 4 threads of a worker may be stuck at once here; by default (STUCK_HANDLERS_MAX = the
    # concurrency) that worker would exit with status 3 for its supervisor to restart it
    # (tests/worker/test_timeouts_process.py). This fault measures the limits with workers that stay.
    fleet = Fleet(spawn, concurrency=CONCURRENCY, env={"LEASEQUEUE_STUCK_HANDLERS_MAX": str(CONCURRENCY + 1)})
    fleet.start_reaper()
    fleet.start()
    fleet.start()
    fleet.wait_registered()
    drained = wait_settled(120)
    alive = [m.name for m in fleet.live()]
    exits = fleet.stop(timeout=30)
    keyed_books = ledger(keyed, deaths=fleet.deaths)
    books = ledger(workload, deaths=fleet.deaths)
    runs = keyed_books.runs
    assert runs is not None
    # Handlers running at once per worker process, keyed and workload jobs together: a handler past
    # its timeout still occupies its thread, so it still counts against --concurrency.
    every = execution_books(keyed + workload, deaths=fleet.deaths)
    per_worker = max(every.max_per_process.values())
    record("timeout_key_limit", fault=f"{KEYS} handlers run {SLOW:.0f} s past their timeout=1 s under "
           f"concurrency_limit=1 per key, {SHORT_PER_KEY} short jobs per key, both workloads (2 workers)",
           jobs=len(keyed) + len(workload), faults=KEYS, books=keyed_books, recovery=None,
           recovery_meaning="no recovery time: the limits must hold throughout",
           notes=f"keyed jobs: {runs_note(keyed_books)}; most handlers of one key at once {runs.max_per_key}; "
                 f"workload: {runs_note(books)}; most handlers at once in one worker {per_worker} (--concurrency "
           f"{CONCURRENCY})", also=workload, max_per_key_each=runs.max_per_key, max_per_worker=per_worker,
           workload_overlaps=books.runs.overlaps if books.runs else None)

    assert drained is not None, f"not drained after 120 s: {statuses(keyed + workload)}"
    assert len(alive) == 2
    assert_balanced(books, done=len(workload))
    assert_no_overlaps(books)
    assert statuses(keyed) == {"done": len(keyed)}, statuses(keyed)
    assert_no_overlaps(keyed_books, key_limit=1)
    # A timed-out attempt's late return is discarded (ledger outcome "timed_out"): its retry is no
    # re-run of a returned job, and no keyed job that returned in time ran again.
    assert_no_reruns(keyed_books)
    assert per_worker <= CONCURRENCY, every.max_per_process
    assert all(code == 0 for code, _ in exits.values()), exits
