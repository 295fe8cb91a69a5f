"""Chaos: failover to a streaming standby while a producer enqueues and workers drain the queue.

A throwaway primary and a standby made from it by ``pg_basebackup -R`` (``tests/support/chaos/
cluster.py``, free local ports; never the shared server). The primary of each test is a copy of one
template cluster, migrated once for the module. Every process (the producer, the workers, the
reaper, this test) connects with libpq's multi-host list, primary first, and
``target_session_attrs=read-write``. Mid-run the standby is promoted (``pg_ctl promote``) and the
old primary stopped (``pg_ctl stop -m immediate``), in either order; nobody is told: each process's
next connection skips the dead primary and lands on the new one.

The books are kept outside the database, because the database is what may lose them:

* the producer (``manage.py qa_produce``) appends ``<key> <id> <time>`` to a file, fsynced, once
  an enqueue has committed and returned: the *acknowledged* jobs;
* every handler appends its start and its return (or raise) to another file, fsynced
  (``qa.failover_tasks``): the *executions*, in the order they happened.

A job is named by its unique key, not its id: a failover that loses the sequence's last values
can issue an id twice. *Lost*: acknowledged, absent from the new primary. *Re-run of a returned
job*: a start of a job after a return of it is on file.

With synchronous replication every acknowledged commit (an enqueue, a claim, a completion, a
fenced commit) has been flushed by the standby, so none is lost: 0 lost, 0 re-runs. With
asynchronous replication whatever the standby had not received is gone; the test measures it
and holds only what must hold whatever was lost: every job on the new primary runs to done, each
done job's handler returned at least once, and each fenced job has one effect.

``ASYNC_COMPLETIONS`` commits the worker's completion batches with ``synchronous_commit = off``:
such a commit waits neither for the local WAL flush nor for the synchronous standby. A completion
the old primary acknowledged that had not reached the standby is lost with it, whatever the
replication mode: the new primary holds that job ``leased`` under the token of the returned attempt,
the reaper takes it back when its lease expires, and it runs again. Enqueues, claims and fenced
commits stay synchronous: none is lost.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.db import connection
from qa.management.commands.qa_produce import TASKS
from qa.models import Effect

from django_leasequeue.models import Job
from tests.conftest import MANAGE, ROOT
from tests.support import wait_for
from tests.support.chaos.cluster import Cluster, Pair, throwaway_pair, throwaway_template, unavailable
from tests.support.chaos.harness import FINISHED, Fleet, db_now, remaining, scaled

pytestmark = [pytest.mark.chaos, pytest.mark.process]

JOBS = scaled(300)
# The cases added later (the stop before the promote, ASYNC_COMPLETIONS) run half the workload:
# what they measure happens in the second around the failover, and the slow legs of CI are long.
JOBS_SMALL = scaled(150)
DBNAME = "test_lq_chaos_failover"  # a test database: tests may connect to nothing else
PREFIX = "fo"
RESULTS = ROOT / "build" / "failover.json"


@contextmanager
def default_connection_on(pair: Pair, dbname: str) -> Iterator[None]:
    """Point this test's ``default`` connection at ``dbname`` through the pair's multi-host list
    (as every process of the test connects); restore it afterwards."""
    saved = connection.settings_dict
    connection.close()
    env = pair.env(dbname)
    connection.settings_dict = {**saved, "HOST": env["PGHOST"], "PORT": env["PGPORT"], "NAME": dbname,
                                "OPTIONS": {**saved.get("OPTIONS", {}), "target_session_attrs": "read-write"}}
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict = saved


def _migrate(cluster: Cluster) -> None:
    cluster.createdb(DBNAME)
    migrate = subprocess.run([sys.executable, str(MANAGE), "migrate", "-v", "0"], cwd=str(ROOT),
                             env={**os.environ, **cluster.env(DBNAME)}, capture_output=True, text=True, timeout=300)
    assert migrate.returncode == 0, migrate.stdout + migrate.stderr


@pytest.fixture(scope="module")
def template() -> Iterator[Path]:
    """The data directory of a stopped cluster holding ``DBNAME`` migrated: each test's primary
    starts as a copy of it (a second or so, where an ``initdb`` and a migration take several);
    skips where no cluster can be made."""
    reason = unavailable()
    if reason:
        pytest.skip(f"no throwaway PostgreSQL cluster: {reason}")
    with throwaway_template(_migrate) as data:
        yield data


@contextmanager
def migrated_pair(template: Path, *, synchronous: bool) -> Iterator[Pair]:
    """A primary copied from ``template`` (``DBNAME`` migrated) and a standby streaming from it
    (synchronous or not), this test's connection on them."""
    with throwaway_pair(synchronous=synchronous, template=template) as pair:
        pair.attach_standby()
        with default_connection_on(pair, DBNAME):
            yield pair


@dataclass
class FailoverBooks:
    """The ledger of one failover run, from the two files and the new primary's rows."""

    acknowledged: int  # enqueues the producer saw commit
    present: int  # of those, jobs on the new primary
    lost: int  # acknowledged, absent from the new primary
    lost_before_failover: int  # of those, acknowledged before the failover (promote or stop) began
    done: int  # present jobs done
    executions: int  # handler starts on file
    returned: int  # handler returns on file
    raised: int  # handler raises on file (a fenced commit cut by the failover; retried)
    reruns: int  # starts of a job after a return of it was on file
    rerun_jobs: int
    reruns_by_task: dict[str, int]  # the same by completion path (qa.failover_plain / _fenced)
    rerun_jobs_lease_expired: int  # re-run jobs whose row holds a LeaseExpired error: the new primary
    # had them leased (the completion the old primary acknowledged never reached it) until the reaper
    # took them back
    run_more_than_once: int  # jobs with more than one start (the retries of raised attempts included)
    done_without_start: int  # done jobs whose handler never started on file (must be 0)
    plain_done_without_return: int  # done plain jobs whose handler never returned on file (must be 0)
    fenced_landed_unacknowledged: int  # done fenced jobs whose handler only raised: its fenced commit
    # was cut by the failover after the standby had it (the outcome unknown to the handler)
    fenced_done: int
    effects: int  # Effect rows of the done fenced jobs
    fenced_with_one_effect: int  # done fenced jobs with exactly one Effect, under their final token
    lease_expiries: int  # LeaseExpired attempts of present jobs (leases the reaper took back)
    sync_gap_s: float | None  # from the last enqueue acknowledged before the stop to the stop's issue
    plain_returns_in_sync_gap: int  # plain handler returns on file from that enqueue to the stop's
    # return: the completions an ASYNC_COMPLETIONS commit could lose (see SYNC_GAP)
    sync_gap_completed_before_stop: int  # of those jobs, done by a completion the old primary
    # committed before the stop was issued (and shipped by a later flush)
    sync_gap_completed_after_stop: int  # of those jobs, done by a completion committed after the
    # stop returned: on the new primary (the worker kept it and wrote it there)
    recovery_s: float | None  # from the old primary's stop to the first job completed on the new primary
    stop_s: float  # how long pg_ctl stop took to return
    stall_s: float | None  # from the last completion before the failover began to the first one after the stop
    first_return_after_stop_s: float | None  # from the stop to the first handler return on file
    lost_keys: list[str]
    rerun_examples: list[str]


def read_acknowledged(path: Path) -> dict[str, tuple[int, float]]:
    """``{key: (id, POSIX time acknowledged)}`` of the producer's file, in the order acknowledged."""
    if not path.exists():
        return {}
    lines = (line.split() for line in path.read_text().splitlines())
    return {key: (int(job_id), float(at)) for key, job_id, at in lines}


def task_of(key: str) -> str:
    """The task the producer enqueued under ``key`` (``<prefix>-<n>``: the tasks in turn)."""
    return TASKS[int(key.rsplit("-", 1)[1]) % len(TASKS)]


def read_events(path: Path) -> list[dict]:
    """The handlers' execution events, in file order (the order they happened)."""
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# SYNC_GAP. A completion committed with synchronous_commit off is shipped to the standby at the next
# WAL flush: the next synchronous commit of any session (WAL is one sequence: a commit the
# synchronous standby has flushed carries every record before it), or the WAL writer's, within
# wal_writer_delay (200 ms here, PostgreSQL's default). The producer's acknowledged enqueues are
# synchronous commits with a time on file: a completion acknowledged before the last of them
# that came before the stop was on the standby; what the stop can take is a completion whose
# handler returned in the gap between that enqueue and the stop (claims, heartbeats and fenced
# commits of the workers may close the gap sooner: the count is an upper bound).

def books_of(acked_file: Path, events_file: Path, *, before_failover: int, began_at: float,
             stopping_at: float, stopped_at: float) -> FailoverBooks:
    """Read the ledger (see the module docstring). ``before_failover``: jobs acknowledged when the
    failover (the promote or the stop, whichever came first) began, at POSIX time ``began_at``;
    ``stopping_at``: when ``pg_ctl stop -m immediate`` was issued (the server is killed within
    milliseconds), ``stopped_at``: when it returned (it polls every 0.1 s), on the same host clock
    the database and the handlers read. Recovery counts from the stop's issue to the first
    completion after its return (surely on the new primary): an upper bound."""
    acked = read_acknowledged(acked_file)
    early = set(list(acked)[:before_failover])
    rows = {r["unique_key"]: r for r in Job.objects.filter(unique_key__startswith=f"{PREFIX}-").values(
        "id", "unique_key", "task", "status", "lease_version", "finished_at", "errors")}
    lost = sorted(set(acked) - set(rows))
    events = read_events(events_file)
    starts: Counter[str] = Counter()
    returned_keys: set[str] = set()
    started_keys = {e["key"] for e in events if e["event"] == "start"}
    reruns: Counter[str] = Counter()
    examples = []
    for e in events:
        if e["event"] == "start":
            starts[e["key"]] += 1
            if e["key"] in returned_keys:
                reruns[e["key"]] += 1
                if len(examples) < 6:
                    examples.append(f"{e['key']} (job {e['job']}) started again under token {e['token']} "
                                    "after its handler had returned")
        elif e["event"] == "returned":
            returned_keys.add(e["key"])
    done = [r for r in rows.values() if r["status"] == "done"]
    fenced_done = [r["id"] for r in done if r["task"] == "qa.failover_fenced"]
    tokens = {r["id"]: r["lease_version"] for r in done}
    effects_of: dict[int, list[int]] = {}
    for job_id, token in Effect.objects.filter(job_id__in=fenced_done).values_list("job_id", "lease_version"):
        effects_of.setdefault(job_id, []).append(token)
    stop, stopping = datetime.fromtimestamp(stopped_at, UTC), datetime.fromtimestamp(stopping_at, UTC)
    first = min((r["finished_at"] for r in done if r["finished_at"] > stop), default=None)
    began = datetime.fromtimestamp(began_at, UTC)
    last_ack = max((at for _, at in acked.values() if at < stopping_at), default=None)
    in_gap = [e["key"] for e in events if e["event"] == "returned" and task_of(e["key"]) == TASKS[0]
              and last_ack is not None and last_ack <= e["at"] <= stopped_at]
    last = max((r["finished_at"] for r in done if r["finished_at"] < began), default=None)
    first_return = min((e["at"] for e in events if e["event"] == "returned" and e["at"] > stopped_at), default=None)
    return FailoverBooks(
        acknowledged=len(acked), present=len(set(acked) & set(rows)), lost=len(lost),
        lost_before_failover=len(early.intersection(lost)), done=len(done), executions=sum(starts.values()),
        returned=sum(1 for e in events if e["event"] == "returned"),
        raised=sum(1 for e in events if e["event"] == "raised"), reruns=sum(reruns.values()), rerun_jobs=len(reruns),
        reruns_by_task=dict(Counter(task_of(k) for k in reruns.elements())),
        rerun_jobs_lease_expired=sum(1 for k in reruns if k in rows
                                     and any(e.get("type") == "LeaseExpired" for e in rows[k]["errors"])),
        run_more_than_once=sum(1 for n in starts.values() if n > 1),
        done_without_start=sum(1 for r in done if r["unique_key"] not in started_keys),
        plain_done_without_return=sum(1 for r in done if r["task"] == "qa.failover_plain"
                                      and r["unique_key"] not in returned_keys),
        fenced_landed_unacknowledged=sum(1 for r in done if r["task"] == "qa.failover_fenced"
                                         and r["unique_key"] not in returned_keys),
        fenced_done=len(fenced_done), effects=sum(len(t) for t in effects_of.values()),
        fenced_with_one_effect=sum(1 for job_id in fenced_done if effects_of.get(job_id) == [tokens[job_id]]),
        lease_expiries=sum(1 for r in rows.values() for e in r["errors"] if e.get("type") == "LeaseExpired"),
        sync_gap_s=None if last_ack is None else round(stopping_at - last_ack, 3),
        plain_returns_in_sync_gap=len(in_gap),
        sync_gap_completed_before_stop=sum(1 for k in in_gap if k in rows and rows[k]["status"] == "done"
                                           and rows[k]["finished_at"] < stopping),
        sync_gap_completed_after_stop=sum(1 for k in in_gap if k in rows and rows[k]["status"] == "done"
                                          and rows[k]["finished_at"] > stop),
        recovery_s=round((first - stopping).total_seconds(), 2) if first else None,
        stall_s=round((first - last).total_seconds(), 2) if first and last else None,
        first_return_after_stop_s=None if first_return is None else round(first_return - stopping_at, 2),
        stop_s=round(stopped_at - stopping_at, 2), lost_keys=lost[:20], rerun_examples=examples)


def save(key: str, books: FailoverBooks, **extra: object) -> None:
    """Keep this run's figures in ``build/failover.json`` (the deploy how-to quotes them)."""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    try:
        data = json.loads(RESULTS.read_text())
    except (FileNotFoundError, ValueError):
        data = {}
    data[key] = {**asdict(books), **extra, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                 "load_average": round(os.getloadavg()[0], 2)}
    RESULTS.write_text(json.dumps(data, indent=2, sort_keys=True))


def _try_db_now() -> datetime | None:
    try:
        return db_now()
    except Exception:  # noqa: BLE001 - the new primary is not reachable yet
        connection.close()
        return None


def run_failover(spawn, pair: Pair, tmp_path: Path, key: str, *, jobs: int = JOBS, stop_first: bool = False,
                 window: float = 0.0, worker_env: dict[str, str] | None = None) -> FailoverBooks:
    """Producer, reaper and two workers on the pair; the failover once a third of the ``jobs`` are
    acknowledged and a sixth are done: the standby promoted, then the old primary stopped ``window``
    seconds later, or with ``stop_first`` the old primary stopped, then the standby promoted; wait
    until the producer is through and nothing is left to run. ``worker_env``: settings of the
    workers (``LEASEQUEUE_ASYNC_COMPLETIONS``). Returns the books (and saves them under ``key``)."""
    acked_file, events_file = tmp_path / "acknowledged.txt", tmp_path / "executions.jsonl"
    env = {**pair.env(DBNAME), "QA_EXECUTIONS_FILE": str(events_file)}
    fleet = Fleet(spawn, env={**env, **(worker_env or {})})
    fleet.start_reaper()
    members = [fleet.start() for _ in range(2)]
    fleet.wait_registered()
    producer = spawn("qa_produce", "--count", str(jobs), "--out", str(acked_file), "--prefix", PREFIX,
                     "--interval", "0.02", "--seed", "18", env=env)
    wait_for(lambda: len(read_acknowledged(acked_file)) >= jobs // 3
             and Job.objects.filter(status="done").count() >= jobs // 6, timeout=60, interval=0.05,
             what="a third of the jobs acknowledged and a sixth done")
    at_failover = len(read_acknowledged(acked_file))
    began_at = time.time()
    if stop_first:
        # Nothing can commit anywhere from here until the promote is through: the old primary is
        # gone and the standby is read-only, which target_session_attrs=read-write skips.
        stopping_at = began_at
        pair.primary.stop()
        stopped_at = promoting_at = time.time()
        pair.standby.promote()
        promoted_at = time.time()
    else:
        promoting_at = began_at
        pair.standby.promote()
        promoted_at = time.time()
        # Until the stop, the old primary still takes sessions (it is first in everyone's host list)
        # and, without its synchronous standby, hangs every synchronous commit; asynchronous (or
        # with synchronous_commit off), it commits what is lost.
        time.sleep(window)
        stopping_at = time.time()
        pair.primary.stop()
        stopped_at = time.time()
    connection.close()  # this test's session died with the old primary, like every other one
    wait_for(_try_db_now, timeout=30, interval=0.05, what="the new primary to accept connections")
    with connection.cursor() as cur:  # the host list led this session to the promoted standby
        cur.execute("SELECT inet_server_port(), pg_is_in_recovery()")
        assert cur.fetchone() == (pair.standby.port, False)
    assert producer.wait(60) == 0, producer.output()
    wait_for(lambda: remaining(None) == 0, timeout=60, interval=0.1, what="the queue to drain on the new primary")
    alive = [m.name for m in members if m.running]
    # Each worker reconnected by itself: a few failed loop iterations with growing waits, not a loop.
    failures = {m.name: len(re.findall(r"iteration failed; retrying in", m.proc.output())) for m in members}
    exits = fleet.stop()
    books = books_of(acked_file, events_file, before_failover=at_failover, began_at=began_at,
                     stopping_at=stopping_at, stopped_at=stopped_at)
    statuses = dict(Counter(Job.objects.values_list("status", flat=True)))
    save(key, books, synchronous=pair.synchronous, worker_env=worker_env or {},
         order="stop, then promote" if stop_first else "promote, then stop", jobs=jobs,
         acknowledged_at_failover=at_failover, promote_s=round(promoted_at - promoting_at, 2),
         stop_after_promote_s=None if stop_first else round(stopping_at - promoted_at, 2),
         statuses=statuses, producer=producer.output().splitlines()[-1:], worker_failed_iterations=failures)
    print(f"{key}: {books}; {at_failover} acknowledged at the failover; promote {promoted_at - promoting_at:.2f} s; "
          f"statuses {statuses}; failed iterations {failures}")
    assert len(alive) == 2, [m.proc.output() for m in members if not m.running]
    # The banner says whether the workers commit their completions asynchronously.
    async_completions = (worker_env or {}).get("LEASEQUEUE_ASYNC_COMPLETIONS") == "1"
    assert [("(ASYNC_COMPLETIONS)" in m.proc.output()) for m in members] == [async_completions] * 2
    assert all(n < 40 for n in failures.values()), failures
    assert all(code == 0 for code, _ in exits.values()), exits
    # What must hold whatever the standby lacked: the producer went on to the end, every job on the
    # new primary ran to done, each done job's handler ran (at-least-once), each done plain job's
    # handler returned (its completion is written only then), and each done fenced job has exactly
    # one effect, under the token its completion was committed with.
    assert books.acknowledged == jobs, books
    assert set(statuses) <= set(FINISHED) and statuses.get("done", 0) == books.done == books.present, statuses
    assert books.done_without_start == 0, books
    assert books.plain_done_without_return == 0, books
    assert books.effects == books.fenced_with_one_effect == books.fenced_done, books
    assert books.recovery_s is not None, "no job was completed on the new primary"
    return books


@pytest.mark.parametrize("window", [0.0, 3.0], ids=["stop-at-once", "stop-after-the-lease"])
def test_failover_to_a_synchronous_standby_loses_nothing_and_reruns_nothing(spawn, template, tmp_path, window):
    """Every commit acknowledged by the old primary was flushed by the standby first: 0 lost, 0
    re-runs of returned jobs, on both completion paths. ``stop-after-the-lease``: the old primary
    hangs every commit for 3 s, past the 2 s lease, before it is stopped; the reaper on the new
    primary reads the silence as an outage and leaves the expired leases to their holders."""
    with migrated_pair(template, synchronous=True) as pair:
        books = run_failover(spawn, pair, tmp_path, f"synchronous_{window:g}s", window=window)
    assert books.lost == 0, books.lost_keys
    assert books.present == JOBS, books
    assert books.reruns == 0, books.rerun_examples


def test_stopping_the_old_primary_before_the_promote_loses_nothing_and_reruns_nothing(spawn, template, tmp_path):
    """The order the deploy how-to recommends: the old primary stopped first, then the standby
    promoted. Between the two nothing accepts writes (every process fails its statements and backs
    off); afterwards the new primary holds every commit the old one acknowledged: 0 lost, 0
    re-runs of returned jobs. The recovery time (the stop to the first completion on the new
    primary) includes the promote."""
    with migrated_pair(template, synchronous=True) as pair:
        books = run_failover(spawn, pair, tmp_path, "synchronous_stop_first", jobs=JOBS_SMALL, stop_first=True)
    assert books.lost == 0, books.lost_keys
    assert books.present == JOBS_SMALL, books
    assert books.reruns == 0, books.rerun_examples


@pytest.mark.parametrize("stop_first", [True, False], ids=["stop-then-promote", "promote-then-stop"])
def test_async_completions_lose_only_completions_in_a_failover_to_a_synchronous_standby(
        spawn, template, tmp_path, stop_first):
    """``ASYNC_COMPLETIONS`` under synchronous replication. Enqueues stay synchronous: 0 lost. A
    completion batch committed with ``synchronous_commit = off`` that the standby had not received
    is lost: those plain jobs run again after their lease expires (measured, not bounded). A fenced
    completion commits in the handler's own, synchronous, transaction: no fenced job runs again.
    ``stop-then-promote``: only what was not yet flushed at the stop is exposed (the next
    synchronous commit or the WAL writer ships it); ``promote-then-stop``: every completion the old
    primary commits after the standby stopped receiving."""
    order = "stop_first" if stop_first else "promote_first"
    with migrated_pair(template, synchronous=True) as pair:
        books = run_failover(spawn, pair, tmp_path, f"synchronous_async_completions_{order}", jobs=JOBS_SMALL,
                             stop_first=stop_first, worker_env={"LEASEQUEUE_ASYNC_COMPLETIONS": "1"})
    assert books.lost == 0, books.lost_keys
    assert books.present == JOBS_SMALL, books
    assert books.reruns_by_task.get("qa.failover_fenced", 0) == 0, books.rerun_examples
    # Each job that ran again after its handler had returned is one whose completion the new
    # primary never had: its claim was synchronous, so the new primary held the job leased under
    # the returned attempt's token until the reaper took it back. (With an asynchronous standby a
    # lost claim can instead leave the job ready, and its token is issued again.)
    assert books.rerun_jobs_lease_expired == books.rerun_jobs, books


def test_failover_to_an_asynchronous_standby_runs_every_surviving_job(spawn, template, tmp_path):
    """What the standby had not received is lost with the old primary: enqueues (lost jobs) and
    completions (re-runs of returned jobs) are measured, not bounded; every job that survived runs
    to done."""
    with migrated_pair(template, synchronous=False) as pair:
        books = run_failover(spawn, pair, tmp_path, "asynchronous")
    assert books.present + books.lost == JOBS, books
