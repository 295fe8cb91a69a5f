"""Chaos: database sessions of running workers killed with ``pg_terminate_backend`` (mid-job,
mid-heartbeat, the LISTEN connection), and a full outage of the workers' database (case C27).

A worker must survive all of it: close the broken connection, reconnect (with a bounded backoff
while the database refuses connections) and go on; a job whose connection died inside the
handler ends as a failed attempt that is retried, or as an expired lease that the reaper returns;
a completion whose reply was lost is recognised as done. Nothing is lost, no effect is doubled.
"""

import random
import re
import time
from contextlib import contextmanager

import psycopg
import pytest
from django.db import connection

from django_leasequeue import enqueue
from django_leasequeue.models import Job
from django_leasequeue.notify import _NOT_LIBPQ
from tests.support import job_in, wait_for
from tests.support.chaos.harness import (
    Fleet,
    assert_balanced,
    assert_no_overlaps,
    assert_no_reruns,
    backends,
    db_now,
    enqueue_both,
    ledger,
    record,
    remaining,
    runs_note,
    scaled,
    seconds,
    terminate,
    wait_drained,
)

pytestmark = [pytest.mark.chaos, pytest.mark.process]

JOBS = scaled(800)
TERMINATIONS = 24
TOP_UP = 200  # jobs added whenever fewer are left before every termination is done

# What a worker session was doing, from pg_stat_activity (its last statement when idle).
RENEW = re.compile(r"SET leased_until = clock\.now \+ make_interval", re.S)


def kind_of(state: str, query: str) -> str:
    """``heartbeat`` (the renewal connection), ``listener`` (LISTEN), ``job`` (a handler inside its
    fenced transaction, or a job/claim statement), ``other``."""
    if RENEW.search(query) or "leasequeue_process" in query:
        return "heartbeat"
    if query.startswith("LISTEN"):
        return "listener"
    if state.startswith("idle in transaction") or "qa_effect" in query or "FOR UPDATE" in query:
        return "job"
    return "other"


def test_pg_terminate_backend_mid_job_and_mid_heartbeat(spawn):
    rng = random.Random(27)
    # Both workloads: fenced jobs and plain handlers that return a value (the default completion).
    fenced, plain = enqueue_both(JOBS // 2, seed=3, long_share=0.03, long_work=(1.0, 2.5))
    ids = fenced + plain
    fleet = Fleet(spawn)
    fleet.start_reaper()
    members = [fleet.start() for _ in range(3)]
    fleet.wait_registered()

    plan = ["job", "heartbeat", "job", "heartbeat", "listener", "other"]  # repeated
    done_kills: list[tuple[str, str, object]] = []  # (kind, worker name, database time)
    next_at = time.monotonic()

    def tick() -> None:
        nonlocal next_at
        if len(done_kills) >= TERMINATIONS:
            return
        if remaining() < TOP_UP:  # keep work in flight until every termination is done
            more = enqueue_both(TOP_UP // 2, seed=3 + len(ids), long_share=0.03, long_work=(1.0, 2.5))
            ids.extend(more[0] + more[1])
        if time.monotonic() < next_at:
            return
        want = plan[len(done_kills) % len(plan)]
        sessions = [(pid, app) for pid, app, state, query in backends() if kind_of(state, query) == want]
        if not sessions:
            return  # none of that kind right now: try again at the next poll
        pid, app = rng.choice(sessions)
        if terminate(pid):
            done_kills.append((want, app.removeprefix("chaos-"), db_now()))
            next_at = time.monotonic() + rng.uniform(0.2, 0.5)

    drained = wait_drained(240, task=None, tick=tick, interval=0.02)
    assert len(done_kills) == TERMINATIONS, f"only {len(done_kills)} terminations before the queue drained"
    for m in members:
        assert m.running, f"{m.name} died:\n{m.proc.output()}"
    exits = fleet.stop()
    books = ledger(ids, deaths=fleet.deaths)
    assert_balanced(books, done=len(ids))
    assert all(code == 0 for code, _ in exits.values()), exits
    kinds = {k: sum(1 for kind, _, _ in done_kills if kind == k) for k in dict.fromkeys(plan)}
    assert kinds["job"] >= TERMINATIONS // 3 and kinds["heartbeat"] >= TERMINATIONS // 3

    # Each worker whose session was cut completed jobs again afterwards (survived, reconnected).
    recoveries = []
    for _, name, at in done_kills:
        if name == "reaper":
            continue
        after = (Job.objects.filter(leased_by__endswith=f":{name}", status="done", finished_at__gt=at)
                 .order_by("finished_at").values_list("finished_at", flat=True).first())
        if after is not None:
            recoveries.append(seconds(at, after))
    assert recoveries
    record("pg_terminate", fault="pg_terminate_backend of a worker session every 0.2-0.5 s (mid-job, "
           "mid-heartbeat, LISTEN)", jobs=len(ids), faults=len(done_kills), books=books, recovery=max(recoveries),
           recovery_meaning="worst time from a killed session until that worker completed a job again",
           notes=", ".join(f"{n} {k}" for k, n in kinds.items()) + f"; {runs_note(books)}",
           seconds=round(drained, 1))
    # A terminated session kills no handler: no job whose handler returned runs again, and never
    # two attempts of one job at once.
    assert_no_reruns(books)
    assert_no_overlaps(books)


@contextmanager
def database_refusing_connections():
    """A full outage of the test database for everyone but this test's own session: new
    connections are refused (``ALLOW_CONNECTIONS false``, set from the server's maintenance
    database, since a session cannot lock out its own database) and every other session is
    terminated. Other databases on the server (other test runs) are not touched."""
    name = connection.settings_dict["NAME"]
    params = {k: v for k, v in connection.get_connection_params().items() if k not in _NOT_LIBPQ}
    admin = psycopg.connect(**{**params, "dbname": "postgres"}, autocommit=True)
    try:
        admin.execute(psycopg.sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS false").format(
            psycopg.sql.Identifier(name)))
        try:
            terminate_all_worker_sessions()
            yield
        finally:
            admin.execute(psycopg.sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS true").format(
                psycopg.sql.Identifier(name)))
    finally:
        admin.close()


def terminate_all_worker_sessions() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        return cur.fetchone()[0]


def test_c27_connection_lost_mid_job_while_idle_and_in_a_ten_second_outage(spawn):
    """Case C27: every session of a worker terminated while a 5 s job runs, again while it idles,
    then its database refuses connections for 10 s. The worker survives each; the 5 s job ends
    done exactly once; jobs enqueued during and after the outage run within seconds of recovery."""
    fleet = Fleet(spawn, concurrency=2)
    w = fleet.start()
    fleet.wait_registered()

    # 1. Mid-job: a 5 s handler; cut every session 1 s in (heartbeat, listener, claim loop).
    long = enqueue("qa.chaos", kwargs={"work": 5})
    wait_for(lambda: job_in(long.id, "leased"), timeout=30, what="the 5 s job to start")
    time.sleep(1)
    assert terminate_all_worker_sessions() >= 1
    done = wait_for(lambda: job_in(long.id, "done"), timeout=60, what="the 5 s job to finish")
    mid_job = ledger([long.id])
    assert_balanced(mid_job, done=1)

    # 2. Idle: cut every session while the worker waits for work, then enqueue.
    time.sleep(1)
    assert terminate_all_worker_sessions() >= 1
    time.sleep(0.5)
    start = time.monotonic()
    idle_jobs = [enqueue("qa.chaos").id for _ in range(5)]
    wait_for(lambda: Job.objects.filter(id__in=idle_jobs, status="done").count() == 5, timeout=30,
             what="jobs enqueued after the idle cut")
    idle_latency = time.monotonic() - start

    # 3. Outage: 10 s without the database; a job running into it, jobs enqueued during it.
    running = enqueue("qa.chaos", kwargs={"work": 3}).id
    wait_for(lambda: job_in(running, "leased"), timeout=30, what="a job to be running when the outage starts")
    with database_refusing_connections():
        during = [enqueue("qa.chaos").id for _ in range(20)]
        time.sleep(10)
        assert w.running, w.proc.output()
    back = time.monotonic()
    back_db = db_now()
    wait_for(lambda: Job.objects.filter(id__in=during, status="done").count() == 20, timeout=60,
             what="the jobs enqueued during the outage")
    outage_recovery = time.monotonic() - back
    after = [enqueue("qa.chaos").id for _ in range(5)]
    wait_for(lambda: Job.objects.filter(id__in=[*after, running], status__in=["done"]).count() == 6, timeout=60,
             what="jobs enqueued after recovery")

    all_ids = [long.id, *idle_jobs, running, *during, *after]
    books = ledger(all_ids)
    assert_balanced(books, done=len(all_ids))
    assert w.running
    output = w.proc.output()
    # Bounded backoff, not a crash loop: the failed iterations during 10 s are a handful per
    # service (0.1, 0.2, 0.4, ... s), not hundreds, and nothing crashed.
    failures = len(re.findall(r"iteration failed; retrying in", output))
    assert failures < 60, failures
    assert "crashed" not in output
    exits = fleet.stop()
    assert all(code == 0 for code, _ in exits.values()), exits
    record("c27_outage", fault="C27: all worker sessions terminated mid-job and idle, then 10 s with the "
           "database refusing connections", jobs=len(all_ids), faults=3, books=books,
           recovery=outage_recovery,
           recovery_meaning="time from the database accepting connections again until the 20 jobs enqueued "
                            "during the outage were done",
           notes=f"5 s job done with attempts {done.attempts}; jobs after an idle cut ran in {idle_latency:.1f} s; "
                 f"{failures} failed loop iterations logged", database_back_at=str(back_db))
