"""Chaos: the PostgreSQL server restarts while workers drain the queue.

Every session of every process dies at once and new connections are refused until the server is
back. The workers and the reaper must reconnect with a bounded backoff and go on: no crash, no
crash loop, no lost job, no doubled effect.

The restart runs on a throwaway cluster of this test's own (``tests/support/chaos/cluster.py``: initdb in a
temporary directory, a free port), never on the shared server other test runs use. The test is
skipped, with the reason, where no PostgreSQL server binaries are installed.
"""

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connection
from qa.models import LedgerEntry

from django_leasequeue.models import Job
from tests.conftest import MANAGE, ROOT
from tests.support import wait_for
from tests.support.chaos.cluster import Cluster, throwaway_cluster, unavailable
from tests.support.chaos.harness import (
    Fleet,
    assert_balanced,
    assert_no_overlaps,
    assert_no_reruns,
    db_now,
    enqueue_both,
    finished_count,
    ledger,
    record,
    remaining,
    runs_note,
    scaled,
    seconds,
    statuses,
    wait_drained,
    wait_settled,
)

pytestmark = [pytest.mark.chaos, pytest.mark.process]

JOBS = scaled(1000)
DBNAME = "test_lq_chaos_restart"  # a test database: tests may connect to nothing else


@contextmanager
def default_connection_on(cluster: Cluster, dbname: str) -> Iterator[None]:
    """Point this test's ``default`` connection (the ORM, the store, the ``spawn`` fixture's
    database name) at ``dbname`` on ``cluster``; restore it afterwards."""
    saved = connection.settings_dict
    connection.close()
    connection.settings_dict = {**saved, "HOST": "127.0.0.1", "PORT": str(cluster.port), "NAME": dbname}
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict = saved


def _try_db_now():
    try:
        return db_now()
    except Exception:  # noqa: BLE001 - the server is still starting
        connection.close()
        return None


@contextmanager
def migrated_cluster(dbname: str = DBNAME) -> Iterator[tuple[Cluster, dict[str, str]]]:
    """A throwaway cluster with the project's database ``dbname`` (a ``test_`` name) migrated, this
    test's connection on it; skips the test where no cluster can be made."""
    reason = unavailable()
    if reason:
        pytest.skip(f"no throwaway PostgreSQL cluster: {reason}")
    with throwaway_cluster() as cluster:
        cluster.createdb(dbname)
        env = cluster.env(dbname)
        migrate = subprocess.run([sys.executable, str(MANAGE), "migrate", "-v", "0"], cwd=str(ROOT),
                                 env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
        assert migrate.returncode == 0, migrate.stdout + migrate.stderr
        with default_connection_on(cluster, dbname):
            yield cluster, env


def test_postgresql_restart_mid_run(spawn):
    with migrated_cluster() as (cluster, env):
        run_restart(spawn, cluster, env)


STOPPED = 8.0  # seconds the server stays down in the stop-and-start run: past the 3 s lease
SLOTS = 3 * 4  # threads of its fleet


def test_postgresql_immediate_stop_longer_than_the_lease(spawn):
    """``pg_ctl stop -m immediate`` (a crash, as far as sessions see it), 8 s down, then start,
    while every thread of three workers (lease 3 s) is in a 2-4 s handler of either workload:
    the handlers return while the server is down, and their leases run out before it is back.
    No handler is killed or frozen: nothing lost, no re-run of a returned job, no overlap."""
    with migrated_cluster() as (cluster, env):
        fenced, plain = enqueue_both(JOBS // 2, seed=14)
        ids = fenced + plain
        fleet = Fleet(spawn, env={**env, "LEASEQUEUE_LEASE": "3"})
        fleet.start_reaper()
        members = [fleet.start() for _ in range(3)]
        fleet.wait_registered()
        wait_for(lambda: remaining(None) <= SLOTS, timeout=120, interval=0.1, what="the workload to drain")
        long_fenced, long_plain = enqueue_both(SLOTS // 2, seed=15, long_share=1.0, long_work=(2.0, 4.0))
        long_ids = long_fenced + long_plain
        ids += long_ids
        # Most threads mid-handler is enough for the fault (the assertions below do not depend on
        # how many): waiting for all but two occasionally timed out on a loaded 2-core machine.
        wait_for(lambda: LedgerEntry.objects.filter(job_id__in=long_ids, outcome="").count() >= SLOTS // 2,
                 timeout=120, interval=0.05, what="the long handlers to be running")
        cluster.stop()
        time.sleep(STOPPED)
        cluster.start()
        connection.close()  # this test's session died with the server, like every other one
        wait_for(_try_db_now, timeout=60, interval=0.1, what="the server to accept connections")
        drained = wait_settled(180)
        alive = [m.name for m in members if m.running]
        exits = fleet.stop()
        books = ledger(ids, deaths=fleet.deaths)
        returned_down = LedgerEntry.objects.filter(job_id__in=ids, outcome="returned", returned_clock="local").count()
        record("pg_stop_start", fault=f"PostgreSQL stopped (pg_ctl stop -m immediate) for {STOPPED:.0f} s, past "
               "the 3 s lease, every thread mid-handler (3 workers, both workloads)", jobs=len(ids), faults=1,
               books=books, recovery=drained,
               recovery_meaning="time from the server accepting connections again until every job was finished",
               notes=f"{returned_down} handlers returned while the server was down; {runs_note(books)}")
        assert drained is not None, f"not drained after 180 s: {statuses(ids)}; {runs_note(books)}"
        assert len(alive) == 3, [m.proc.output() for m in members if not m.running]
        assert_balanced(books, done=len(ids))
        assert_no_reruns(books)
        assert_no_overlaps(books)
        assert all(code == 0 for code, _ in exits.values()), exits


def run_restart(spawn, cluster: Cluster, env: dict[str, str]) -> None:
    # Both workloads: fenced jobs and plain handlers that return a value (the default completion).
    fenced, plain = enqueue_both(JOBS // 2, seed=4, long_share=0.02, long_work=(1.0, 2.5))
    ids = fenced + plain
    fleet = Fleet(spawn, env=env)
    fleet.start_reaper()
    members = [fleet.start() for _ in range(2)]
    fleet.wait_registered()
    wait_for(lambda: finished_count() >= JOBS // 8, timeout=120, interval=0.1, what="a quarter of the fenced jobs")

    done_before = Job.objects.filter(id__in=ids, status="done").count()
    started = time.monotonic()
    cluster.restart()
    restart_took = time.monotonic() - started
    connection.close()  # this test's session died with the server, like every other one
    back = wait_for(_try_db_now, timeout=60, interval=0.1, what="the server to accept connections")

    drained = wait_drained(120, task=None)
    for m in members:
        assert m.running, f"{m.name} exited:\n{m.proc.output()}"
    books = ledger(ids, deaths=fleet.deaths)
    assert_balanced(books, done=len(ids))
    recoveries = {}
    failures = {}
    for m in members:
        first = (Job.objects.filter(leased_by__endswith=f":{m.name}", status="done", finished_at__gt=back)
                 .order_by("finished_at").values_list("finished_at", flat=True).first())
        assert first is not None, f"{m.name} completed nothing after the restart"
        recoveries[m.name] = seconds(back, first)
        output = m.proc.output()
        assert "crashed" not in output
        # Reconnection with backoff: the failed iterations while the server was away are a few
        # per service, with growing waits, not a tight loop.
        failures[m.name] = len(re.findall(r"iteration failed; retrying in ([0-9.]+) s", output))
        assert failures[m.name] < 40, output
    exits = fleet.stop()
    assert all(code == 0 for code, _ in exits.values()), exits
    # The stall: from the last job completed before the server went down to the first one
    # completed after it came back (pg_postmaster_start_time() is the new server's start).
    with connection.cursor() as cur:
        cur.execute("SELECT pg_postmaster_start_time()")
        server_start = cur.fetchone()[0]
    finished = Job.objects.filter(id__in=ids)
    last_before = finished.filter(finished_at__lt=server_start).order_by("-finished_at").values_list(
        "finished_at", flat=True).first()
    first_after = finished.filter(finished_at__gt=server_start).order_by("finished_at").values_list(
        "finished_at", flat=True).first()
    assert last_before is not None and first_after is not None
    stall = seconds(last_before, first_after)
    record("pg_restart", fault="PostgreSQL restart (pg_ctl restart -m fast) of a throwaway cluster mid-run",
           jobs=len(ids), faults=1, books=books, recovery=stall,
           recovery_meaning="longest time without a completed job, from the last completion before the restart "
                            "to the first after it (the restart itself included)",
           notes=f"the restart command took {restart_took:.1f} s; {done_before} of {len(ids)} jobs were done before "
                 "it; "
                 f"each worker completed a job within {max(recoveries.values()):.1f} s of the server accepting "
                 f"connections; failed loop iterations logged per worker: {sorted(failures.values())}; "
                 f"{runs_note(books)}",
           seconds=round(drained, 1))
    # No handler is killed or frozen by a restart: no job whose handler returned runs again, and
    # never two attempts of one job at once.
    assert_no_reruns(books)
    assert_no_overlaps(books)
