"""Chaos through a real PgBouncer in transaction mode: the bouncer killed and started again on the
same port mid-run, and (another run) ``RECONNECT`` then a short ``PAUSE``/``RESUME`` on its admin
console mid-run.

Two workers (``--no-notify``, 4 threads each) and a standalone reaper reach PostgreSQL only
through the bouncer; half of the jobs complete inside ``fenced_atomic()`` (``qa.chaos``), half by
returning a value (``qa.chaos_plain``, the batched completer). A restart drops every client and
server connection at once, so statements and COMMITs are cut in flight: some commits reach the
server while their reply is lost. The books must be exact all the same:

* jobs in = jobs done (none dead, none left);
* every done job has exactly one execution that returned (``qa.LedgerEntry``), and no job ran
  again after its handler returned, nor two attempts of one job at once;
* one effect per fenced job, under its final token;
* no ``lease_lost`` note under the token that completed the job (a completion whose reply was lost
  is not a lost lease);
* every execution that did not return has its attempt's error entry, and every failed attempt (an
  error entry other than a lease expiry) its execution.

The first runs of this test found two faults of that kind: a ``fenced_atomic()`` COMMIT that
landed while its reply was lost failed the attempt and left a false ``lease_lost`` note on a done
job (now the row is read under the token, ``tests/worker/test_lost_commit_reply.py``), and the
execution ledger lost part of a worker's events (``tests/worker/test_chaos_ledger_writes.py``).
"""

import time
from collections import Counter
from datetime import datetime

import pytest
from qa.models import LedgerEntry

from django_leasequeue.models import Job
from django_leasequeue.worker.producer import LOST_CLAIM_REASON
from tests.support import wait_for
from tests.support.chaos.harness import (
    Fleet,
    Ledger,
    assert_balanced,
    assert_no_overlaps,
    assert_no_reruns,
    db_now,
    enqueue_both,
    ledger,
    record,
    runs_note,
    scaled,
    seconds,
    statuses,
    wait_settled,
)

pytestmark = [pytest.mark.chaos, pytest.mark.process]

JOBS = scaled(400)
PAUSED = 1.0  # seconds the bouncer stays paused
LOGIN_FAILING = "server login has been failing, try again later (server_login_retry)"


EXACT = {"done_without_return": 0, "done_with_several_returns": 0, "false_lease_lost": 0,
         "raised_without_error_entry": 0, "failures_without_execution": 0}


def exact_books(ids: list[int]) -> dict[str, int]:
    """What the harness's ledger does not count, per job and attempt (each must be 0, see
    :data:`EXACT`): done jobs without exactly one returned execution; ``lease_lost`` notes under
    the token a done job was completed with (false: that token's completion landed); executions
    that did not return without an error entry of their attempt, and failed attempts (error
    entries other than a lease expiry) without an execution. Besides: lease expiries of attempts
    whose handler never started (a claim whose reply was lost and that its worker did not give
    back) and of attempts that ran, and the jobs of lost claims that their worker gave back."""
    entries = list(LedgerEntry.objects.filter(job_id__in=ids).values_list("job_id", "attempt", "outcome"))
    returned = Counter(job_id for job_id, _, outcome in entries if outcome == "returned")
    ran = {(job_id, attempt) for job_id, attempt, _ in entries}
    raised = {(job_id, attempt) for job_id, attempt, outcome in entries if outcome != "returned"}
    books = dict.fromkeys(EXACT, 0) | {"expired_unstarted": 0, "expired_started": 0, "lost_claim_released": 0}
    errored: set[tuple[int, int]] = set()
    for job_id, status, token, history, errors in Job.objects.filter(id__in=ids).values_list(
            "id", "status", "lease_version", "history", "errors"):
        books["lost_claim_released"] += sum(1 for e in history if e.get("event") == "released"
                                            and e.get("reason") == LOST_CLAIM_REASON)
        if status == "done":
            books["done_without_return"] += returned[job_id] == 0
            books["done_with_several_returns"] += returned[job_id] > 1
            books["false_lease_lost"] += sum(1 for e in history if e.get("event") == "lease_lost"
                                             and e.get("token") == token)
        for entry in errors:
            attempt = (job_id, entry["attempt"])
            errored.add(attempt)
            if entry["type"] == "LeaseExpired":
                books["expired_started" if attempt in ran else "expired_unstarted"] += 1
            elif attempt not in raised:
                books["failures_without_execution"] += 1
    books["raised_without_error_entry"] = len(raised - errored)
    return books


def drain_through_bouncer(spawn, bouncer, fault,
                          *, seed: int) -> tuple[list[int], Ledger, dict[str, int], float | None]:
    """Enqueue both workloads, drain them through ``bouncer`` with ``fault()`` called once a quarter
    of the jobs is done; return the ids, the books, :func:`exact_books` and the seconds from the
    fault until every job was finished (None: not within :func:`settle_within`)."""
    fenced, plain = enqueue_both(JOBS // 2, seed=seed, long_share=0.02, long_work=(1.0, 2.0))
    ids = fenced + plain
    fleet = Fleet(spawn, env=bouncer.env(), args=("--no-notify",))
    fleet.start_reaper()
    members = [fleet.start() for _ in range(2)]
    fleet.wait_registered()
    wait_for(lambda: Job.objects.filter(id__in=ids, status="done").count() >= len(ids) // 4,
             timeout=settle_within(len(ids)), interval=0.05, what="a quarter of the jobs to be done")
    fault()
    drained = wait_settled(settle_within(len(ids)))
    alive = [m.name for m in members if m.running]
    exits = fleet.stop()
    books = ledger(ids, deaths=fleet.deaths)
    assert len(alive) == 2, [m.proc.output() for m in members if not m.running]
    assert all(code == 0 for code, _ in exits.values()), exits
    return ids, books, exact_books(ids), drained


def settle_within(jobs: int) -> float:
    """Seconds a run of ``jobs`` jobs gets to finish after its fault (about 80 jobs/s here)."""
    return 60 + jobs / 20


def assert_exact(ids: list[int], books: Ledger, exact: dict[str, int], drained: float | None) -> None:
    assert drained is not None, (f"not drained {settle_within(len(ids)):.0f} s after the fault: {statuses(ids)}; "
                                 f"{runs_note(books)}")
    assert_balanced(books, done=len(ids))
    assert {key: exact[key] for key in EXACT} == EXACT, exact
    assert_no_reruns(books)
    assert_no_overlaps(books)
    runs = books.runs
    assert runs is not None and runs.returned == len(ids)
    assert (runs.open_ended, runs.unknown_end) == (0, 0), runs  # every execution returned or raised


def figures(books: Ledger, exact: dict[str, int]) -> str:
    """The run's figures on one line (printed with ``-s``; the row's notes say the same)."""
    runs = books.runs
    assert runs is not None
    return (f"{books.statuses}; effects {books.effects}; executions {runs.executions} ({runs.returned} returned); "
            f"failed attempts {books.failed_attempts}; lease expiries {books.lease_expiries}; refused writes "
            f"{books.refused_tokens}; re-runs {runs.reruns}; overlaps {runs.overlaps}; {exact}")


def notes(books: Ledger, exact: dict[str, int]) -> str:
    return (f"done jobs without exactly one returned execution: "
            f"{exact['done_without_return'] + exact['done_with_several_returns']}; lease_lost notes under the "
            f"completing token: {exact['false_lease_lost']}; lease expiries of claims whose reply was lost (no "
            f"handler ran): {exact['expired_unstarted']}, of running attempts: {exact['expired_started']}; jobs of "
            f"claims whose reply was lost, given back by their worker: {exact['lost_claim_released']}; "
            f"{runs_note(books)}")


def test_pgbouncer_killed_and_restarted_on_the_same_port_mid_run(spawn, pgbouncer):
    """SIGKILL the bouncer and start it again on the same port: every client and server connection
    drops at once, statements and COMMITs in flight included."""
    bouncer = pgbouncer("transaction")
    closed: list[float] = []
    ids, books, exact, drained = drain_through_bouncer(spawn, bouncer, lambda: closed.append(bouncer.restart()),
                                                       seed=40)
    print(f"pgbouncer_restart: {figures(books, exact)}")
    record("pgbouncer_restart", fault="PgBouncer (transaction mode) killed and started again on the same port "
           "mid-run; 2 workers --no-notify and the reaper through it, both workloads", jobs=len(ids), faults=1,
           books=books, recovery=drained,
           recovery_meaning="time from PgBouncer accepting connections again until every job was finished",
           notes=f"the port was closed {closed[0]:.2f} s; {notes(books, exact)}")
    assert_exact(ids, books, exact, drained)
    assert books.failed_attempts > 0, "the kill cut no handler's connection: it hit nothing"


def test_pgbouncer_reconnect_then_pause_and_resume_mid_run(spawn, pgbouncer):
    """``RECONNECT`` (every server connection closed once its client releases it), then ``PAUSE``
    (returns once every server connection is released; clients then wait) for 1 s, and
    ``RESUME``: the workers wait; nothing completes while paused.

    In some runs PgBouncer 1.18 then refuses clients for up to ``server_login_retry`` (15 s):
    a PAUSE that closes a server connection still logging in (one RECONNECT had just reopened)
    marks the pool's logins as failing. The statements cut so fail their attempts (or, when even
    the failure cannot be written, the lease expires): the books must be exact all the same."""
    bouncer = pgbouncer("transaction")
    window: list[tuple[datetime, datetime]] = []

    def fault() -> None:
        bouncer.admin("RECONNECT")
        bouncer.admin("PAUSE")
        paused_at = db_now()  # this test's own connection goes to PostgreSQL directly
        time.sleep(PAUSED)
        resumed_at = db_now()
        bouncer.admin("RESUME")
        window.append((paused_at, resumed_at))

    ids, books, exact, drained = drain_through_bouncer(spawn, bouncer, fault, seed=42)
    paused_at, resumed_at = window[0]
    during = Job.objects.filter(id__in=ids, finished_at__gt=paused_at, finished_at__lt=resumed_at).count()
    refused = bouncer.output().count(f"pooler error: {LOGIN_FAILING}")
    print(f"pgbouncer_reconnect_pause: {figures(books, exact)}; {during} jobs finished while paused; "
          f"{refused} client connections closed by PgBouncer")
    record("pgbouncer_reconnect_pause", fault=f"PgBouncer RECONNECT, then PAUSE for {PAUSED:.0f} s and RESUME, "
           "mid-run (transaction mode; 2 workers --no-notify and the reaper through it, both workloads)",
           jobs=len(ids), faults=2, books=books, recovery=drained,
           recovery_meaning="time from the RESUME until every job was finished",
           notes=f"paused {seconds(paused_at, resumed_at):.2f} s, {during} jobs finished meanwhile; PgBouncer "
                 f"closed {refused} client connections with '{LOGIN_FAILING}'; {notes(books, exact)}")
    assert_exact(ids, books, exact, drained)
    assert during == 0, "jobs were completed while PgBouncer was paused: the pause held nothing"
