"""Chaos: a worker frozen (SIGSTOP) for three times its lease while others drain the queue, then
resumed (SIGCONT). Its leases expire and are taken back while it is frozen; when it wakes, every
write it makes under the old tokens is refused, and it goes on
working.

A worker holds two kinds of leases: jobs whose handler runs, and jobs it prefetched (claimed
beyond its free threads, leased and heartbeated, waiting for a thread; on by default, see
docs/howto/performance.md). Each frozen worker is caught with a handler that has started (it wrote a
started marker, ``qa.chaos`` with ``mark=True``), and the second one also with prefetched jobs
that no thread had started: those must be taken back and never run under their old tokens."""

import signal
import time

import pytest
from qa.models import Probe

from django_leasequeue.models import Job, WorkerProcess
from tests.support import wait_for
from tests.support.chaos.harness import (
    LEASE,
    Fleet,
    Held,
    Member,
    assert_balanced,
    db_now,
    enqueue_chaos,
    held_by,
    ledger,
    reaped_at,
    record,
    scaled,
    seconds,
    started,
    wait_drained,
)

pytestmark = [pytest.mark.chaos, pytest.mark.process]

JOBS = scaled(800)
FROZEN = 3 * LEASE  # seconds each victim stays stopped
CONCURRENCY = 4
LONG = 2.0  # seconds of work of the jobs a victim is caught in
# The second victim prefetches with a wide window (PREFETCH_WAIT 5 s instead of 50 ms): same code
# path as the default, but it then surely holds prefetched jobs beyond its threads when frozen,
# whatever its recent job durations were.
WIDE_PREFETCH = {"LEASEQUEUE_PREFETCH_WAIT": "5"}


def own_queue(name: str) -> str:
    return f"only-{name}"


def running_long_jobs(name: str, ids: list[int]) -> list[tuple[int, int]]:
    """``(job, token)`` of the ``LONG`` s jobs ``ids`` that worker ``name`` holds, whose handler has
    started (its marker exists under the current token) and which were claimed under 1 s ago: the
    handler is then mid-sleep for at least one more second."""
    now = db_now()
    leased = [(j.id, j.lease_version) for j in Job.objects.filter(
        id__in=ids, status="leased", leased_by__endswith=f":{name}").only("id", "lease_version", "attempted_at")
        if seconds(j.attempted_at, now) < 1.0]
    marks = started(job_id for job_id, _ in leased)
    return [lease for lease in leased if lease in marks]


def catch_in_long_job(name: str, ids: list[int], timeout: float = 60) -> tuple[int, int]:
    """Feed 2 s jobs to the default queue (served by every worker) until worker ``name`` runs one
    (started marker written, claimed under 1 s ago); return it. Its lease then goes to another
    worker while ``name`` is frozen."""
    long: list[int] = []
    deadline = time.monotonic() + timeout
    next_feed = 0.0
    while not (caught := running_long_jobs(name, long)):
        if time.monotonic() > deadline:
            pytest.fail(f"{name} did not start a long job within {timeout:.0f} s")
        if time.monotonic() >= next_feed:
            new = enqueue_chaos(4, seed=len(ids), long_share=1.0, long_work=(LONG, LONG), mark=True)
            long.extend(new)
            ids.extend(new)
            next_feed = time.monotonic() + 0.5
        time.sleep(0.02)
    return caught[0]


def catch_with_prefetched(name: str, ids: list[int], timeout: float = 90) -> tuple[list[tuple[int, int]], list[int]]:
    """Feed worker ``name``'s own queue (at a high priority) with ``CONCURRENCY`` 2 s jobs followed
    by short ones, all marked, until every thread of ``name`` runs one of the 2 s jobs (started
    under 1 s ago) while it also holds leases of that queue no handler started (prefetched).
    Return (the running 2 s leases, the marked jobs fed). No thread is free then, so none of the
    prefetched jobs can start before the freeze."""
    fed: list[int] = []
    long: list[int] = []
    deadline = time.monotonic() + timeout
    next_feed = 0.0
    while True:
        running = running_long_jobs(name, long)
        if len(running) == CONCURRENCY:
            held = [h for h in held_by(name) if h.job_id in fed]
            marks = started(h.job_id for h in held)
            if [h for h in held if (h.job_id, h.token) not in marks]:
                return running, fed
        if time.monotonic() > deadline:
            pytest.fail(f"{name} was not caught running {CONCURRENCY} long jobs with prefetched ones within "
                        f"{timeout:.0f} s")
        if time.monotonic() >= next_feed:
            new_long = enqueue_chaos(CONCURRENCY, seed=len(ids), long_share=1.0, long_work=(LONG, LONG), mark=True,
                                     queue=own_queue(name), priority=10)
            new_short = enqueue_chaos(12, seed=len(ids) + 1, long_share=0.0, short_share=0.0, mark=True,
                                      queue=own_queue(name), priority=10)
            long.extend(new_long)
            fed.extend(new_long + new_short)
            ids.extend(new_long + new_short)
            next_feed = time.monotonic() + LONG + 0.5
        time.sleep(0.02)


def test_sigstopped_workers_are_fenced_when_they_resume(spawn):
    ids = enqueue_chaos(JOBS, seed=2, long_share=0.03, long_work=(1.5, 3.0))
    fleet = Fleet(spawn, concurrency=CONCURRENCY)
    fleet.start_reaper()
    # Each worker serves the default queue and a queue of its own, where the test puts work only
    # that worker can do (to see that a victim claims and completes jobs after it woke up, and to
    # hand the second victim jobs to prefetch).
    members = [fleet.start(name=name, args=("--queues", f"default,{own_queue(name)}"),
                           env=WIDE_PREFETCH if name == "w2" else None) for name in ("w1", "w2", "w3")]
    fleet.wait_registered()

    # (victim, stopped at, resumed at, leases held, the leases whose handler was running)
    stops: list[tuple[Member, object, object, list[Held], list[tuple[int, int]]]] = []
    prefetched: list[Held] = []  # leases of the second victim no handler had started
    for victim in members[:2]:  # freeze two workers, one after the other
        if victim is members[0]:
            running = [catch_in_long_job(victim.name, ids)]
        else:
            running, fed = catch_with_prefetched(victim.name, ids)
        victim.proc.signal(signal.SIGSTOP)
        stopped = db_now()
        time.sleep(0.3)  # statements already sent finish on the server; then the rows hold still
        held = held_by(victim.name)
        if victim is members[1]:
            marks = started(h.job_id for h in held)
            # Every thread runs a 2 s job, so these can only have been claimed, not started.
            assert {(h.job_id, h.token) for h in held if (h.job_id, h.token) in marks} == set(running), held
            prefetched = [h for h in held if (h.job_id, h.token) not in marks]
            assert [h for h in prefetched if h.job_id in fed], held
        time.sleep(FROZEN)
        victim.proc.signal(signal.SIGCONT)
        stops.append((victim, stopped, db_now(), held, running))
    # Work only the first victim can do, after it woke up: it must claim and complete it.
    after_wake = enqueue_chaos(5, seed=21, short_share=1.0, queue=own_queue(members[0].name))
    ids.extend(after_wake)

    drained = wait_drained(240)
    for victim, _, resumed, _, _ in stops:
        assert victim.running, victim.proc.output()
        # It went on after SIGCONT: it beat its registry row again (and, for the first victim,
        # which woke with work left in the queue, claimed and completed jobs: checked below).
        wait_for(lambda v=victim, r=resumed: WorkerProcess.objects.filter(
            id__endswith=f":{v.name}", pid=v.pid, last_heartbeat_at__gt=r).exists(),
            timeout=30, what=f"{victim.name} to beat again")
    exits = fleet.stop()
    books = ledger(ids)
    assert_balanced(books, done=len(ids))
    assert books.statuses == {"done": len(ids)}

    recoveries, refused = [], 0
    for victim, stopped, _resumed, held, running in stops:
        worker_id = held[0].worker  # host:pid:name of the victim
        for job_id, token in running:
            # A handler caught mid-sleep woke up after its lease had been taken back: its fenced
            # commit was refused (a probe row and a lease_lost note under its token), and no
            # effect exists under that token.
            assert Probe.objects.filter(job_id=job_id, lease_version=token, kind="fenced", ok=False).exists()
            job = Job.objects.get(pk=job_id)
            assert job.lease_version > token and job.status == "done"
            notes = [(e["worker"], e["write"]) for e in job.history
                     if e.get("event") == "lease_lost" and e["token"] == token]
            # The note is best-effort and never waits for the row: it is skipped while the row is
            # locked, which happens when the victim itself took the job again on waking (jobs of
            # its own queue) and runs it in fenced_atomic() just then. Others had finished theirs.
            allowed = [[(worker_id, "handler")], [(worker_id, "renew")]]
            if job.leased_by == worker_id:
                allowed.append([])
            assert notes in allowed, (job_id, token, job.leased_by, job.history)
        for lease in held:
            back = reaped_at(lease)
            if back is None:
                # Not reaped: the victim was inside fenced_atomic() with the row locked when it
                # froze (SKIP LOCKED passes over it), so nobody else could take it, and its own
                # commit went through on waking, under its still-current token. Never so for a
                # prefetched job (no handler holds its row).
                assert lease not in prefetched, lease
                row = Job.objects.get(pk=lease.job_id)
                assert (row.status, row.lease_version) == ("done", lease.token), lease
            else:
                assert seconds(stopped, back) < FROZEN  # taken back while the victim was frozen
                recoveries.append(seconds(stopped, back))
        victim_notes = Job.objects.filter(id__in=ids, history__contains=[{"event": "lease_lost", "worker": worker_id}])
        refused += victim_notes.count()
        if victim is members[0]:
            assert set(Job.objects.filter(id__in=after_wake).values_list("leased_by", flat=True)) == {worker_id}
    # The prefetched jobs were taken back while their worker was frozen (checked above) and never
    # run under the tokens they had then: no started marker, no effect, no refused write under them.
    stale = {(h.job_id, h.token) for h in prefetched}
    assert not stale & started(h.job_id for h in prefetched)
    probes = set(Probe.objects.filter(job_id__in=[h.job_id for h in prefetched]).values_list("job_id",
                                                                                              "lease_version"))
    assert not stale & probes
    assert all(Job.objects.get(pk=h.job_id).lease_version > h.token for h in prefetched)
    assert all(code == 0 for code, _ in exits.values()), exits
    record("sigstop", fault=f"SIGSTOP a worker for {FROZEN:.0f} s (3 x lease), then SIGCONT; twice", jobs=len(ids),
           faults=len(stops), books=books, recovery=max(recoveries),
           recovery_meaning="worst time from SIGSTOP until the frozen worker's leases were back in the queue",
           notes=f"{sum(len(r) for *_, r in stops)} handlers frozen mid-job, their fenced commits refused on "
                 f"waking; {len(prefetched)} prefetched jobs not yet started taken back and never run under their "
                 f"old token; {refused} jobs with a refused write by a resumed worker; {len(recoveries)} leases "
                 "taken back", seconds=round(drained, 1))
