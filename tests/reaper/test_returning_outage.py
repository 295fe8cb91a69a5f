"""Chaos: database outages on the default completion path (plain handlers that return a value and
are marked done by the worker's batched completer, not by ``fenced_atomic()``).

Every handler start and return is written to a ledger file outside the database (``qa.returning``),
so the books hold even while the database refuses connections. Three workers, lease 3 s, each with
its embedded reaper; the server of a throwaway cluster is stopped for 15 s, past every lease.
The targets: nothing lost, and no job whose handler had returned runs again (a returned job is
renewed until its completion is written, and no reaper reads an outage that hit every process as
every worker dying).
"""

from __future__ import annotations

import random
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from django.db import connection

from django_leasequeue import enqueue_many
from django_leasequeue.models import Job
from tests.support import wait_for
from tests.support.chaos.harness import Fleet, record, remaining, scaled
from tests.worker.test_pg_restart import _try_db_now, migrated_cluster

pytestmark = [pytest.mark.chaos, pytest.mark.process]

LEASE = 3
JOBS = scaled(2000)
DBNAME = "test_lq_chaos_restart_returning"  # a test database: tests may connect to nothing else


def read_ledger(directory: Path) -> dict[int, list[tuple[str, int]]]:
    """``{job id: [(event, token), ...]}`` in the order each process wrote them."""
    events: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for path in sorted(directory.glob("*.log")):
        for line in path.read_text().splitlines():
            event, job_id, token = line.split()
            events[int(job_id)].append((event, int(token)))
    return events


def rerun_count(events: dict[int, list[tuple[str, int]]]) -> tuple[int, int, int]:
    """``(executions, re-runs of jobs whose handler had already returned, jobs never returned)``.

    A job's handler returned under token t when a ``return t`` line exists; any start under a
    later token is a re-run of a returned job."""
    executions = reruns = never = 0
    for per_job in events.values():
        starts = sorted(t for e, t in per_job if e == "start")
        returns = sorted(t for e, t in per_job if e == "return")
        executions += len(starts)
        if not returns:
            never += 1
            continue
        reruns += sum(1 for t in starts if t > returns[0])
    return executions, reruns, never


def enqueue_returning(n: int, *, seed: int) -> list[int]:
    rng = random.Random(seed)
    items = [([], {"work": round(rng.uniform(0.005, 0.05), 3)}) for _ in range(n)]
    before = set(Job.objects.filter(task="qa.returning").values_list("id", flat=True))
    assert enqueue_many("qa.returning", items) == n
    return sorted(set(Job.objects.filter(task="qa.returning").values_list("id", flat=True)) - before)


def run_returning(spawn, ledger_dir: Path, *, key: str, fault: str, inject: Callable[[list[int]], None],
                  env: dict[str, str] | None = None) -> None:
    """Drain ``JOBS`` returning jobs with 3 workers (lease 3 s), call ``inject(ids)`` once a tenth
    are done (it may enqueue more into ``ids``), then check the books: every job done, every
    handler returned, no re-run of a job whose handler had returned."""
    ids = enqueue_returning(JOBS, seed=13)
    fleet = Fleet(spawn, env={"LEASEQUEUE_LEASE": str(LEASE), "QA_LEDGER_DIR": str(ledger_dir), **(env or {})})
    members = [fleet.start() for _ in range(3)]
    fleet.wait_registered()
    # Let the fleet get going, so that the fault hits running handlers, returned jobs waiting for
    # their completion flush, and held leases of every worker.
    wait_for(lambda: Job.objects.filter(id__in=ids, status="done").count() >= JOBS // 10, timeout=120,
             interval=0.05, what="a tenth of the jobs to be done")
    inject(ids)
    wait_for(lambda: remaining("qa.returning") == 0, timeout=300, interval=0.25, what="the queue to drain")
    for m in members:
        assert m.running, f"{m.name} died:\n{m.proc.output()}"
    exits = fleet.stop()
    assert all(code == 0 for code, _ in exits.values()), exits

    statuses = dict(Counter(Job.objects.filter(id__in=ids).values_list("status", flat=True)))
    executions, reruns, never = rerun_count(read_ledger(ledger_dir))
    expiries = sum(1 for errors in Job.objects.filter(id__in=ids).values_list("errors", flat=True)
                   for e in errors if e.get("type") == "LeaseExpired")
    record(key, fault=fault, jobs=len(ids), faults=1, books=None, recovery=None, recovery_meaning="",
           notes=f"{executions} handler executions, {reruns} re-runs of returned jobs, {expiries} lease expiries",
           executions=executions, reruns_of_returned=reruns)
    assert statuses == {"done": len(ids)}, statuses
    assert never == 0
    assert reruns == 0, f"{reruns} re-runs of returned jobs ({executions} executions, {expiries} lease expiries)"
    assert executions == len(ids)


@pytest.mark.parametrize("down", [15])
def test_postgresql_restart_reruns_no_returned_job(spawn, tmp_path, down):
    """A fast stop with the server down for 15 s, five leases, before it starts again. (The 15 s and
    45 s outages with a producer, and ``pg_ctl restart -m fast``, run on both workloads with the
    database ledger in ``test_outage.py`` and ``test_pg_restart.py``.)"""
    with migrated_cluster(DBNAME) as (cluster, env):
        def restart(ids: list[int]) -> None:
            if down:
                cluster._run("pg_ctl", "-D", str(cluster.data), "-m", "fast", "-w", "-t", "60", "stop")
                time.sleep(down)
                cluster.start()
            else:
                cluster.restart()
            connection.close()  # this test's session died with the server
            wait_for(_try_db_now, timeout=60, interval=0.1, what="the server to accept connections")

        what = f"fast stop, {down} s down, start" if down else "pg_ctl restart -m fast"
        run_returning(spawn, tmp_path, key=f"pg_restart{down or ''}_returning", env=env, inject=restart,
                      fault=f"PostgreSQL restart ({what}) of a throwaway cluster, 3 workers, lease 3 s, "
                            "plain returning handlers (batched completer)")
