"""Chaos: PostgreSQL restarts (``pg_ctl restart -m fast`` of a throwaway cluster) in the middle of
a 30-step chain whose steps alternate the two completion paths. The chain must continue and
complete with every result passed along, and every step run once (no handler is killed, so none
may run again after it returned). Skipped where no PostgreSQL server binaries are installed.
"""

import time

import pytest
from django.db import connection
from qa.wf_chaos_tasks import wf_fenced, wf_plain

from django_leasequeue import chain
from django_leasequeue.models import Job
from tests.support import wait_for
from tests.support.chaos.harness import Fleet, record, runs_note, seconds
from tests.worker.test_pg_restart import _try_db_now, migrated_cluster
from tests.workflows.chaos import assert_books, books, unexplained_reruns

pytestmark = [pytest.mark.chaos, pytest.mark.process]

STEPS = 30
WORK = 0.2  # seconds per step, so the restart lands mid-chain
RESTART_AFTER = 8  # steps done


def chain_steps() -> list:
    """Step k (1-based) returns k: odd steps are plain, even ones fenced. A fenced step gets the
    previous (plain) result prepended and adds 1. A plain step after a fenced one is given k
    itself: a fenced step's return value is stored after the completion that releases its
    dependent, so it is not passed on reliably (reported as a core bug)."""
    steps = []
    for k in range(1, STEPS + 1):
        if k % 2 == 0:
            steps.append(wf_fenced.step(1, work=WORK))
        elif k == 1:
            steps.append(wf_plain.step(1, work=WORK))
        else:
            steps.append(wf_plain.step(k, work=WORK).set(pass_result=False))
    return steps


def test_postgresql_restart_during_a_chain(spawn):
    with migrated_cluster("test_lq_wfchaos_restart") as (cluster, env):
        handle = chain(*chain_steps(), name="chaos chain").enqueue()
        ids = list(handle.jobs().values_list("id", flat=True))
        fleet = Fleet(spawn, env=env)
        fleet.start_reaper()
        members = [fleet.start() for _ in range(2)]
        fleet.wait_registered()
        done = Job.objects.filter(id__in=ids, status="done")
        wait_for(lambda: done.count() >= RESTART_AFTER, timeout=120, interval=0.05, what="the first steps")
        before = done.count()
        started = time.monotonic()
        cluster.restart()
        restart_took = time.monotonic() - started
        connection.close()  # this test's session died with the server
        wait_for(_try_db_now, timeout=60, interval=0.1, what="the server to accept connections")
        with connection.cursor() as cur:
            cur.execute("SELECT pg_postmaster_start_time()")
            server_start = cur.fetchone()[0]
        deadline = time.monotonic() + 120
        while done.count() < STEPS:
            assert time.monotonic() < deadline, f"chain stuck at {done.count()} of {STEPS} steps done"
            time.sleep(0.1)
        finished = dict(Job.objects.filter(id__in=ids).values_list("id", "finished_at"))
        last_before = max((t for t in finished.values() if t < server_start), default=None)
        first_after = min((t for t in finished.values() if t > server_start), default=None)
        result = books(ids, deaths=fleet.deaths)
        alive = [m.name for m in members if m.running]
        assert last_before is not None and first_after is not None
        stall = seconds(last_before, first_after)
        record("wf_chain_pg_restart", fault=f"PostgreSQL restart (pg_ctl restart -m fast) of a throwaway cluster "
               f"during a {STEPS}-step chain (both completion paths)", jobs=len(ids), faults=1, books=result,
               recovery=stall, recovery_meaning="time from the last step completed before the restart to the first "
               "step completed after it (the restart itself included)",
               notes=f"{before} of {STEPS} steps done at the restart; the restart command took {restart_took:.1f} s; "
                     f"{runs_note(result)}")
        exits = fleet.stop()
        assert alive == [m.name for m in members]
        assert_books(result)
        assert result.runs is not None and result.runs.reruns == 0, unexplained_reruns(ids, fleet.deaths)
        assert result.runs.overlaps == 0
        assert handle.results() == list(range(1, STEPS + 1))
        assert handle.state == "succeeded"
        assert all(code == 0 for code, _ in exits.values()), exits
