"""Chaos: workers whose system clock is ten days off, ahead and behind, share the queue with a
correct one (only database time counts).

The skew is real for the whole process: ``libfaketime`` (Debian package ``faketime``) is
preloaded with ``FAKETIME=+10d`` / ``-10d``, so ``time.time()``, ``datetime.now()`` and every C
library call reading the wall clock see the wrong time. Where libfaketime is not installed,
``tests/support/chaos/skew/``'s ``sitecustomize`` shifts Python's ``time.time`` and ``datetime`` instead.

If anything in the worker compared its own clock with a lease, a ``run_at`` or a heartbeat, the
skewed workers would lose every lease (ahead) or keep dead ones (behind), run delayed jobs early, or
see leases expire. They must behave exactly like the correct worker: no lease expiry, no refused
write, delayed jobs not before their ``run_at``, long jobs renewed.
"""

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from qa.models import Execution

from django_leasequeue import enqueue, enqueue_many
from django_leasequeue.models import Job
from tests.support.chaos.harness import (
    Fleet,
    assert_balanced,
    assert_no_overlaps,
    assert_no_reruns,
    db_now,
    enqueue_chaos,
    enqueue_plain,
    ledger,
    record,
    runs_note,
    scaled,
    seconds,
    wait_drained,
)

pytestmark = [pytest.mark.chaos, pytest.mark.process]

JOBS = scaled(600)
SKEW_DAYS = 10
LEASE = 4.0
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")
SITECUSTOMIZE = Path(__file__).resolve().parents[1] / "support" / "chaos" / "skew"


def use_libfaketime() -> bool:
    """libfaketime when installed, unless ``LEASEQUEUE_CHAOS_SKEW_METHOD=python`` asks for the fallback."""
    return LIBFAKETIME.exists() and os.environ.get("LEASEQUEUE_CHAOS_SKEW_METHOD", "") != "python"


def skew_env(days: int) -> dict[str, str]:
    """Environment that makes a process's clock ``days`` off (see ``skew/sitecustomize.py``)."""
    path = os.pathsep.join(filter(None, [str(SITECUSTOMIZE), os.environ.get("PYTHONPATH", "")]))
    if use_libfaketime():
        # The monotonic clock stays real: libfaketime's faked one stalls condition waits. It only
        # measures intervals, which a wrong wall clock does not change anyway.
        return {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": f"{days:+d}d", "FAKETIME_DONT_FAKE_MONOTONIC": "1",
                "PYTHONPATH": path, "CHAOS_SLEEP_SHIM": "1"}
    return {"PYTHONPATH": path, "CHAOS_CLOCK_SKEW": str(days * 86400)}


def process_clock_offset(env: dict[str, str]) -> float:
    """Seconds by which a Python process started with ``env`` is off the database clock."""
    out = subprocess.run([sys.executable, "-c", "import datetime, time; print(time.time())"],
                         env={**os.environ, **env}, capture_output=True, text=True, check=True, timeout=60)
    return float(out.stdout.strip()) - db_now().timestamp()


def test_workers_with_skewed_clocks_behave_like_the_others(spawn):
    ahead, behind = skew_env(SKEW_DAYS), skew_env(-SKEW_DAYS)
    assert abs(process_clock_offset(ahead) - SKEW_DAYS * 86400) < 120
    assert abs(process_clock_offset(behind) + SKEW_DAYS * 86400) < 120
    method = "libfaketime" if use_libfaketime() else "sitecustomize"

    # Each worker serves the default queue and a queue of its own (for the stamped jobs below).
    fleet = Fleet(spawn, env={"LEASEQUEUE_LEASE": str(LEASE)})
    fleet.start_reaper()
    right = fleet.start(name="right", args=("--queues", "default,only-right"))
    fast = fleet.start(name="ahead", env=ahead, args=("--queues", "default,only-ahead"))
    slow = fleet.start(name="behind", env=behind, args=("--queues", "default,only-behind"))
    fleet.wait_registered()  # all three claiming before any work exists, so each gets a share

    # Long jobs outlive the lease and are renewed. A 4 s lease (renewed every 1.3 s) rather than the
    # suite's 2 s: this test asserts that no lease expires at all, also on a loaded machine.
    ids = enqueue_chaos(JOBS, seed=5, long_share=0.03, long_work=(4.5, 5.5))
    # The second workload: plain handlers that return a value (the default completion path).
    plain = enqueue_plain(JOBS // 2, seed=55, long_share=0.03, long_work=(4.5, 5.5))
    # Delayed jobs, due 3 s from now by the database clock; a worker ten days ahead must not run them early.
    due = db_now() + timedelta(seconds=3)
    assert enqueue_many("qa.chaos", [[] for _ in range(30)], run_at=due) == 30
    delayed = list(Job.objects.filter(task="qa.chaos", run_at=due).values_list("id", flat=True))
    # Jobs that record an Execution row stamped by the worker's own (Python) clock, 20 for each
    # worker on its own queue.
    stamped = [enqueue("qa.record", [f"{name}{i}"], queue=f"only-{name}").id
               for name in ("right", "ahead", "behind") for i in range(20)]
    drained = wait_drained(240, task=None)
    exits = fleet.stop()
    assert all(code == 0 for code, _ in exits.values()), exits

    all_ids = [*ids, *delayed, *plain]
    books = ledger(all_ids, deaths=fleet.deaths)
    assert_balanced(books, done=len(all_ids))
    # Exactly as with correct clocks: no lease expired, no write refused, one attempt each.
    assert (books.lease_expiries, books.refused_tokens, books.failed_attempts, books.retried_jobs) == (0, 0, 0, 0)
    assert not Job.objects.filter(id__in=stamped).exclude(status="done").exists()
    # Every worker did its share, long (heartbeat-renewed) jobs included.
    by = {m.name: Job.objects.filter(id__in=ids, leased_by__endswith=f":{m.name}") for m in (right, fast, slow)}
    for name, jobs in by.items():
        assert jobs.count() > 0, f"{name} completed nothing"
    long_by_skewed = Job.objects.filter(id__in=ids, kwargs__work__gte=4.5).exclude(leased_by__endswith=":right")
    assert long_by_skewed.exists()
    assert set(long_by_skewed.values_list("attempts", flat=True)) == {1}
    # Delayed jobs ran at or after their run_at, by the database clock.
    for job in Job.objects.filter(id__in=delayed):
        assert job.started_at >= job.run_at, (job.id, job.leased_by)
    # The skew was real inside the workers: Execution.created_at is stamped by Python (auto_now_add).
    offsets: dict[str, list[float]] = {}
    for name in ("right", "ahead", "behind"):
        for row in Execution.objects.filter(job_id__in=stamped, worker__endswith=f":{name}"):
            job = Job.objects.get(pk=row.job_id)
            offsets.setdefault(name, []).append(seconds(job.attempted_at, row.created_at))
    assert {name: len(o) for name, o in offsets.items()} == {"right": 20, "ahead": 20, "behind": 20}, offsets
    assert all(abs(o) < 600 for o in offsets["right"]), offsets
    assert all(abs(o - SKEW_DAYS * 86400) < 600 for o in offsets["ahead"]), offsets
    assert all(abs(o + SKEW_DAYS * 86400) < 600 for o in offsets["behind"]), offsets
    record("clock_skew", fault=f"2 of 3 workers with the system clock {SKEW_DAYS} days ahead / behind "
           f"({method})", jobs=len(all_ids) + len(stamped), faults=2, books=books, recovery=None, also=stamped,
           recovery_meaning="nothing to recover: no lease expired, no write was refused",
           notes=f"done by right/ahead/behind: {by['right'].count()}/{by['ahead'].count()}/{by['behind'].count()}; "
                 f"{runs_note(books)}",
           seconds=round(drained, 1))
    assert_no_reruns(books)
    assert_no_overlaps(books)
