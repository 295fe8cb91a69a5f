"""Chaos with ``async def`` handlers on a worker's event loop, counted with the execution ledger.

Workers run ``--async-slots`` with the ledgered async tasks of ``qa.async_tasks`` (and a sync one
for mixed workers). Each run checks the books exactly: every job ends in its expected state; a
done job has exactly one execution that returned under its final token; the fenced effects equal
the done fenced jobs, one each, never under a stale token; no job is lost; every charged attempt
has an execution on the ledger; two executions of one job overlap only when a fault forced it,
and then without a double effect.
"""

from __future__ import annotations

import signal
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import pytest
from qa.async_tasks import ASYNC_TASKS
from qa.models import Effect

from django_leasequeue import enqueue_many, registry
from django_leasequeue.models import Job
from tests.support import tasks_registered, wait_for
from tests.support.chaos.harness import CHAOS_ENV, analyse_runs, db_now, read_runs

pytestmark = [pytest.mark.chaos, pytest.mark.process]

for _task in ASYNC_TASKS:
    registry._REGISTRY.pop(_task.name, None)

ENV = {**CHAOS_ENV, "LEASEQUEUE_ASYNC_TASKS": "1"}


@pytest.fixture(autouse=True)
def _registered():
    with tasks_registered(ASYNC_TASKS):
        yield


@dataclass
class Books:
    jobs: int
    statuses: dict[str, int]
    executions: int
    done_returned: Counter  # done job -> executions that returned under its final token
    stale_returned: int  # executions that returned under a token the job did not end under
    effects: int
    fenced_done: int
    bad_effects: list[str]
    attempts_without_execution: list[str]
    overlaps: int
    examples: list[str] = field(default_factory=list)

    def figures(self) -> str:
        return (f"jobs={self.jobs} statuses={self.statuses} executions={self.executions} "
                f"done-with-one-return={sum(1 for n in self.done_returned.values() if n == 1)} "
                f"done-with-other={sum(1 for n in self.done_returned.values() if n != 1)} "
                f"stale-returns={self.stale_returned} effects={self.effects} fenced-done={self.fenced_done} "
                f"bad-effects={len(self.bad_effects)} "
                f"attempts-without-execution={len(self.attempts_without_execution)} "
                f"overlaps={self.overlaps}")


def books(ids: list[int], fenced: set[int], deaths: dict | None = None) -> Books:
    rows = {j["id"]: j for j in Job.objects.filter(id__in=ids).values("id", "status", "attempts", "lease_version")}
    runs = read_runs(ids)
    analysed = analyse_runs(runs, deaths=deaths or {}, now=db_now())
    by_job = defaultdict(list)
    for r in runs:
        by_job[r.job_id].append(r)
    done_returned: Counter = Counter()
    stale = 0
    for job_id, job in rows.items():
        if job["status"] == "done":
            done_returned[job_id] = sum(1 for r in by_job[job_id]
                                        if r.outcome == "returned" and r.token == job["lease_version"])
        stale += sum(1 for r in by_job[job_id] if r.outcome == "returned" and r.token != job["lease_version"])
    bad: list[str] = []
    effects = list(Effect.objects.filter(job_id__in=ids).values_list("job_id", "lease_version"))
    seen = Counter(job_id for job_id, _ in effects)
    for job_id, token in effects:
        job = rows[job_id]
        if job["status"] != "done" or token != job["lease_version"] or seen[job_id] > 1 or job_id not in fenced:
            bad.append(f"job {job_id} token {token}: job {job['status']} under {job['lease_version']}, "
                       f"{seen[job_id]} effects")
    fenced_done = sum(1 for j in fenced if rows[j]["status"] == "done")
    missing = [f"job {job_id}: {job['attempts']} attempts, {len({r.token for r in by_job[job_id]})} executed tokens"
               for job_id, job in rows.items() if job["attempts"] > len({r.token for r in by_job[job_id]})]
    return Books(jobs=len(rows), statuses=dict(Counter(j["status"] for j in rows.values())), executions=len(runs),
                 done_returned=done_returned, stale_returned=stale, effects=len(effects), fenced_done=fenced_done,
                 bad_effects=bad, attempts_without_execution=missing, overlaps=analysed.overlaps,
                 examples=analysed.examples)


def assert_books(b: Books, *, expected: dict[str, int], overlaps_allowed: bool = False) -> None:
    print("\nBOOKS", b.figures(), b.examples)
    assert b.statuses == expected, b.figures()
    assert all(n == 1 for n in b.done_returned.values()), (b.figures(), {k: v for k, v in b.done_returned.items()
                                                                         if v != 1})
    assert b.effects == b.fenced_done, b.figures()
    assert b.bad_effects == [], b.bad_effects
    assert b.attempts_without_execution == [], b.attempts_without_execution
    if not overlaps_allowed:
        assert b.overlaps == 0, b.examples


def enqueue(task: str, n: int, seconds: float, **kwargs: object) -> list[int]:
    last = Job.objects.order_by("-id").values_list("id", flat=True).first() or 0
    assert enqueue_many(task, [([seconds], kwargs)] * n) == n
    return list(Job.objects.filter(id__gt=last, task=task).order_by("id").values_list("id", flat=True))


def split(n: int, task: str = "qa.async_ledger", seconds: float = 1.0, **kwargs: object) -> tuple[list[int], set[int]]:
    plain = enqueue(task, n, seconds, **kwargs)
    fenced = enqueue(task, n, seconds, fenced=True, **kwargs)
    return plain + fenced, set(fenced)


def settle(ids: list[int], workers: list, timeout: float = 90) -> None:
    """Wait until every job of ``ids`` is finished, then stop ``workers`` gracefully."""
    wait_for(lambda: Job.objects.filter(id__in=ids, status__in=["done", "dead", "cancelled"]).count() == len(ids),
             timeout=timeout, what="every job finished")
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(30) == 0, worker.output()


def running(task: str, n: int) -> None:
    wait_for(lambda: Job.objects.filter(task=task, status="leased").count() >= n, timeout=60,
             what=f"{n} {task} jobs running")


def test_sigkill_mid_run_and_a_restart(spawn):
    ids, fenced = split(50, seconds=3.0)
    victim = spawn("runworker", "--concurrency", "1", "--async-slots", "200", env=ENV)
    running("qa.async_ledger", 100)
    time.sleep(1.0)
    victim.kill()
    deaths = {victim.pid: db_now()}
    rescuer = spawn("runworker", "--concurrency", "1", "--async-slots", "200", env=ENV)
    settle(ids, [rescuer])
    b = books(ids, fenced, deaths)
    assert_books(b, expected={"done": 100})


@pytest.mark.parametrize("swallow", [0.0, 1.0])
def test_sigstop_past_the_lease_then_sigcont(spawn, swallow):
    # swallow: the handlers swallow the CancelledError of the lost lease and go on (then their
    # fenced write must be refused all the same).
    ids, fenced = split(50, seconds=3.0, swallow=swallow)
    victim = spawn("runworker", "--concurrency", "1", "--async-slots", "100", env=ENV)
    running("qa.async_ledger", 100)
    time.sleep(0.5)
    victim.signal(signal.SIGSTOP)
    rescuer = spawn("runworker", "--concurrency", "1", "--async-slots", "200", env=ENV)
    # The rescuer takes every job back once the leases expire, and runs them (3 s each).
    wait_for(lambda: Job.objects.filter(id__in=ids, lease_version__gt=2).count() == 100 or
             Job.objects.filter(id__in=ids, status="done").count() == 100, timeout=60, what="the jobs taken over")
    time.sleep(1.0)  # the new attempts are mid-run
    victim.signal(signal.SIGCONT)
    wait_for(lambda: Job.objects.filter(id__in=ids, status="done").count() == 100, timeout=60, what="all done")
    rescuer.signal(signal.SIGTERM)
    assert rescuer.wait(30) == 0, rescuer.output()
    # The resumed victim has all its slots back: it runs 100 new jobs at once (none leaked).
    more = enqueue("qa.async_ledger", 100, 2.0)
    wait_for(lambda: Job.objects.filter(id__in=more, status="leased").count() == 100, timeout=30,
             what="the victim running 100 new jobs at once")
    settle(ids + more, [victim])
    b = books(ids, fenced)
    # The SIGSTOP is a fault: overlaps may exist, double effects may not.
    assert_books(b, expected={"done": 100}, overlaps_allowed=True)
    assert_books(books(more, set()), expected={"done": 100})


def test_timeouts_with_handlers_that_swallow_the_cancel(spawn):
    # 1 s timeout, 2 attempts: each attempt sleeps 3 s, swallows the cancel and goes on 2 s more.
    ids, fenced = split(20, task="qa.async_ledger_short", seconds=3.0, swallow=2.0)
    worker = spawn("runworker", "--burst", "--concurrency", "1", "--async-slots", "100", env=ENV)
    assert worker.wait(120) == 0, worker.output()
    b = books(ids, fenced)
    assert_books(b, expected={"dead": 40})
    assert b.executions == 80


def test_cancel_requests_mid_run(spawn):
    from django_leasequeue import store

    ids, fenced = split(30, seconds=2.0)
    worker = spawn("runworker", "--concurrency", "1", "--async-slots", "100", env=ENV)
    running("qa.async_ledger", 60)
    store.job_request_cancel(ids[::2], by="test")
    wait_for(lambda: Job.objects.filter(id__in=ids, status__in=["done", "cancelled"]).count() == 60, timeout=60,
             what="all settled")
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    b = books(ids, fenced)
    assert_books(b, expected={"done": 30, "cancelled": 30})


def test_sigterm_with_jobs_in_flight_then_another_worker(spawn):
    ids, fenced = split(40, seconds=2.5)
    first = spawn("runworker", "--concurrency", "1", "--async-slots", "200",
                  env={**ENV, "LEASEQUEUE_SHUTDOWN_GRACE": "1"})
    running("qa.async_ledger", 80)
    first.signal(signal.SIGTERM)
    second = spawn("runworker", "--concurrency", "1", "--async-slots", "200", env=ENV)
    assert first.wait(30) == 0, first.output()
    settle(ids, [second])
    b = books(ids, fenced)
    assert_books(b, expected={"done": 80})


def test_a_handler_that_blocks_the_loop(spawn):
    ids, fenced = split(20, seconds=0.5)
    blockers = enqueue("qa.async_ledger", 2, 0.1, block=3.0)  # 3 s time.sleep on the loop, each
    worker = spawn("runworker", "--burst", "--concurrency", "1", "--async-slots", "100", env=ENV)
    assert worker.wait(120) == 0, worker.output()
    b = books(ids + blockers, fenced)
    assert_books(b, expected={"done": 42})
    assert "has been blocked for" in worker.output()


def test_mixed_sync_and_async_on_one_worker_with_sigkill(spawn):
    ids, fenced = split(40, seconds=2.0)
    sync_plain = enqueue("qa.sync_ledger", 10, 0.5)
    sync_fenced = enqueue("qa.sync_ledger", 10, 0.5, fenced=True)
    all_ids = ids + sync_plain + sync_fenced
    victim = spawn("runworker", "--concurrency", "4", "--async-slots", "100", env=ENV)
    running("qa.async_ledger", 40)
    time.sleep(0.8)
    victim.kill()
    deaths = {victim.pid: db_now()}
    rescuer = spawn("runworker", "--concurrency", "4", "--async-slots", "100", env=ENV)
    settle(all_ids, [rescuer])
    b = books(all_ids, fenced | set(sync_fenced), deaths)
    assert_books(b, expected={"done": 100})


def test_max_attempts_one_jobs_under_sigkill(spawn):
    ids, fenced = split(30, task="qa.async_ledger_once", seconds=3.0)
    victim = spawn("runworker", "--concurrency", "1", "--async-slots", "100", env=ENV)
    running("qa.async_ledger_once", 60)
    time.sleep(0.5)
    victim.kill()
    deaths = {victim.pid: db_now()}
    rescuer = spawn("runworker", "--concurrency", "1", "--async-slots", "100", env=ENV)
    settle(ids, [rescuer])
    b = books(ids, fenced, deaths)
    # Killed mid-run with one attempt allowed: the lease expiry dead-letters each job.
    assert_books(b, expected={"dead": 60})


def test_sigterm_ends_the_coroutines_before_it_releases_their_jobs(spawn):
    from datetime import datetime

    from qa.models import LedgerEntry

    ids = enqueue("qa.async_ledger", 20, 60.0)
    worker = spawn("runworker", "--concurrency", "1", "--async-slots", "50",
                   env={**ENV, "LEASEQUEUE_SHUTDOWN_GRACE": "1"})
    wait_for(lambda: LedgerEntry.objects.filter(job_id__in=ids).count() == 20, timeout=60, what="20 handlers started")
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output()
    rows = {j.id: j for j in Job.objects.filter(id__in=ids)}
    assert {(j.status, j.attempts, j.interruptions) for j in rows.values()} == {("ready", 0, 1)}
    runs = list(LedgerEntry.objects.filter(job_id__in=ids))
    assert len(runs) == 20
    assert {r.outcome for r in runs} == {"raised"}  # cancelled: ended by the CancelledError
    # Each handler had ended when its job was given back (the next attempt could start at once).
    released = {j.id: datetime.fromisoformat([e for e in j.history if e["event"] == "released"][-1]["at"])
                for j in rows.values()}
    late = [(r.job_id, r.returned_at, released[r.job_id]) for r in runs if r.returned_at > released[r.job_id]]
    assert late == []
