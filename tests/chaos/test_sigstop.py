"""Chaos: a worker frozen (SIGSTOP) for three times its lease while others drain the queue, then
resumed (SIGCONT). Its leases expire and go to other workers; when it wakes, every write it makes
under the old tokens is refused (DESIGN.md invariants 2 and 3), and it goes on working."""

import signal
import time

import pytest
from qa.models import Probe

from django_leasequeue.models import Job, WorkerProcess
from tests.chaos.harness import (
    LEASE,
    Fleet,
    assert_balanced,
    db_now,
    enqueue_chaos,
    held_by,
    ledger,
    reaped_at,
    record,
    scaled,
    seconds,
    wait_drained,
)
from tests.support import wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.process]

JOBS = scaled(800)
FROZEN = 3 * LEASE  # seconds each victim stays stopped


def own_queue(name: str) -> str:
    return f"only-{name}"


def long_job_in_sleep(name: str, ids: list[int]) -> tuple[int, int] | None:
    """One of the 2 s jobs ``ids`` that worker ``name`` claimed under 0.5 s ago: freezing the
    worker then catches its handler mid-job for sure."""
    now = db_now()
    for job in Job.objects.filter(id__in=ids, status="leased", leased_by__endswith=f":{name}").only(
            "id", "lease_version", "attempted_at"):
        if seconds(job.attempted_at, now) < 0.5:
            return job.id, job.lease_version
    return None


def catch_in_long_job(name: str, ids: list[int], timeout: float = 60) -> tuple[int, int]:
    """Feed 2 s jobs to the default queue (served by every worker) until worker ``name`` has just
    started one; return it. Its lease then goes to another worker while ``name`` is frozen."""
    long: list[int] = []
    deadline = time.monotonic() + timeout
    next_feed = 0.0
    while (caught := long_job_in_sleep(name, long)) is None:
        if time.monotonic() > deadline:
            pytest.fail(f"{name} did not start a long job within {timeout:.0f} s")
        if time.monotonic() >= next_feed:
            new = enqueue_chaos(4, seed=len(ids), long_share=1.0, long_work=(2.0, 2.0))
            long.extend(new)
            ids.extend(new)
            next_feed = time.monotonic() + 0.5
        time.sleep(0.02)
    return caught


def test_sigstopped_workers_are_fenced_when_they_resume(spawn):
    ids = enqueue_chaos(JOBS, seed=2, long_share=0.03, long_work=(1.5, 3.0))
    fleet = Fleet(spawn)
    fleet.start_reaper()
    # Each worker serves the default queue and a queue of its own, where the test puts work only
    # that worker can do (to see that a victim claims and completes jobs after it woke up).
    members = [fleet.start(name=name, args=("--queues", f"default,{own_queue(name)}")) for name in ("w1", "w2", "w3")]
    fleet.wait_registered()

    stops = []  # (victim, stopped at, resumed at, leases held, the mid-job lease)
    for victim in members[:2]:  # freeze two workers, one after the other
        caught = catch_in_long_job(victim.name, ids)
        victim.proc.signal(signal.SIGSTOP)
        stopped = db_now()
        time.sleep(0.3)  # statements already sent finish on the server; then the rows hold still
        held = held_by(victim.name)
        time.sleep(FROZEN)
        victim.proc.signal(signal.SIGCONT)
        stops.append((victim, stopped, db_now(), held, caught))
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
    for victim, stopped, _resumed, held, (job_id, token) in stops:
        worker_id = next(h.worker for h in held if h.job_id == job_id)  # host:pid:name of the victim
        # The handler caught mid-sleep woke up after its lease had gone to another worker: its
        # fenced commit was refused (a probe row and a lease_lost note under its token), and no
        # effect exists under that token.
        assert Probe.objects.filter(job_id=job_id, lease_version=token, kind="fenced", ok=False).exists()
        job = Job.objects.get(pk=job_id)
        assert job.lease_version > token and job.status == "done"
        notes = [e for e in job.history if e.get("event") == "lease_lost" and e["token"] == token]
        assert [(n["worker"], n["write"]) for n in notes] in ([(worker_id, "handler")], [(worker_id, "renew")])
        for lease in held:
            back = reaped_at(lease)
            if back is None:
                # Not reaped: the victim was inside fenced_atomic() with the row locked when it
                # froze (SKIP LOCKED passes over it), so nobody else could take it, and its own
                # commit went through on waking, under its still-current token.
                row = Job.objects.get(pk=lease.job_id)
                assert (row.status, row.lease_version) == ("done", lease.token), lease
            else:
                assert seconds(stopped, back) < FROZEN  # taken back while the victim was frozen
                recoveries.append(seconds(stopped, back))
        victim_notes = Job.objects.filter(id__in=ids, history__contains=[{"event": "lease_lost", "worker": worker_id}])
        refused += victim_notes.count()
        if victim is members[0]:
            assert set(Job.objects.filter(id__in=after_wake).values_list("leased_by", flat=True)) == {worker_id}
    assert all(code == 0 for code, _ in exits.values()), exits
    record("sigstop", fault=f"SIGSTOP a worker for {FROZEN:.0f} s (3 x lease), then SIGCONT; twice", jobs=len(ids),
           faults=len(stops), books=books, recovery=max(recoveries),
           recovery_meaning="worst time from SIGSTOP until the frozen worker's leases were back in the queue",
           notes=f"{refused} jobs with a refused write by a resumed worker; {len(recoveries)} leases taken back",
           seconds=round(drained, 1))
