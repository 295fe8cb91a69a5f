"""Real ``runworker`` processes killed, frozen and crashing (invariants 2, 3, 4; cases C01, C02, C12).

Leases are 2 s (``LEASEQUEUE_LEASE``) and the embedded reaper sweeps every 0.5 s, so recovery is
measured in seconds; process start-up on a busy machine gets generous timeouts.
"""

import signal

import pytest
from django.db.models import Sum
from qa.models import Effect, Execution, Probe

from django_leasequeue import enqueue, store
from django_leasequeue.models import Job, JobStat
from tests.support import job_in, wait_for

pytestmark = [pytest.mark.process]

FAST = {"LEASEQUEUE_LEASE": "2", "LEASEQUEUE_REAPER_INTERVAL": "0.5", "LEASEQUEUE_POLL_INTERVAL": "0.5"}


def name_of(job: Job) -> str:
    """The ``--worker-id`` part of ``leased_by`` (host:pid:name)."""
    return job.leased_by.rsplit(":", 1)[1]


def test_c01_sigkilled_worker_job_completed_by_another_after_lease_expiry(spawn):
    """Case C01: no operator action; recovery depends only on the job's lease. The job carries an
    active-scope unique key: re-enqueueing it while orphaned returns the orphan (case C12)."""
    job = enqueue("qa.record", ["victim"], {"sleep": 3}, unique_key="k2", unique_scope="active")
    workers = {name: spawn("runworker", "--concurrency", "1", "--worker-id", name, env=FAST) for name in ("w1", "w2")}
    leased = wait_for(lambda: job_in(job.id, "leased"), timeout=60, what="a worker to lease the job")
    wait_for(lambda: Execution.objects.filter(job_id=job.id).exists(), timeout=30, what="the handler to start")
    victim_name = name_of(leased)
    survivor_name = ({"w1", "w2"} - {victim_name}).pop()
    workers[victim_name].kill()  # SIGKILL while it holds the job
    assert enqueue("qa.record", ["again"], unique_key="k2", unique_scope="active").id == job.id

    done = wait_for(lambda: job_in(job.id, "done"), timeout=60, what="the survivor to complete the job")
    # claim (token 1) -> reaped (2) -> claimed by the survivor (3).
    assert (done.attempts, done.lease_version, name_of(done)) == (2, 3, survivor_name)
    (error,) = done.errors
    assert (error["type"], error["attempt"], error["worker"].rsplit(":", 1)[1]) == ("LeaseExpired", 1, victim_name)
    runs = list(Execution.objects.filter(job_id=job.id).order_by("attempt").values_list("attempt", "worker"))
    assert [(a, w.rsplit(":", 1)[1]) for a, w in runs] == [(1, victim_name), (2, survivor_name)]
    # The orphan was reaped within lease + a few reaper sweeps of the victim's last renewal.
    assert Job.objects.filter(unique_key="k2").count() == 1
    assert workers[survivor_name].running
    # The chart counters: two claims, the reaped attempt counted as a retried failure, one done.
    counters = JobStat.objects.aggregate(started=Sum("started"), failed=Sum("failed"), done=Sum("done"),
                                         dead=Sum("dead"))
    assert counters == {"started": 2, "failed": 1, "done": 1, "dead": 0}


def test_sigstopped_worker_is_fenced_when_resumed(spawn):
    """A worker frozen past its lease while another takes the job: when it resumes, its heartbeat
    and its fenced completion are refused (0 rows), the job ends done once, one effect."""
    job = enqueue("qa.fenced_effect", ["invoice-7"], {"sleep": 4})
    a = spawn("runworker", "--concurrency", "1", "--worker-id", "a", env=FAST)
    wait_for(lambda: Execution.objects.filter(job_id=job.id, attempt=1).exists(), timeout=60,
             what="worker a to start the handler")
    a.signal(signal.SIGSTOP)
    b = spawn("runworker", "--concurrency", "1", "--worker-id", "b", env=FAST)
    done = wait_for(lambda: job_in(job.id, "done"), timeout=60, what="worker b to complete the job")
    assert (done.attempts, done.lease_version, name_of(done)) == (2, 3, "b")
    assert [e["type"] for e in done.errors] == ["LeaseExpired"]

    a.signal(signal.SIGCONT)
    wait_for(lambda: Probe.objects.filter(job_id=job.id, lease_version=1, kind="fenced").exists(), timeout=30,
             what="worker a to resume and try its fenced completion")
    probes = set(Probe.objects.filter(job_id=job.id).values_list("lease_version", "kind", "ok"))
    assert probes == {(1, "heartbeat", False), (1, "fenced", False), (3, "heartbeat", True), (3, "fenced", True)}
    assert list(Effect.objects.values_list("key", "job_id", "lease_version")) == [("invoice-7", job.id, 3)]
    # The stale token's writes are refused at the store level too: 0 rows.
    assert store.job_renew([(job.id, 1, 2)]) == {}
    assert store.job_complete([(job.id, 1, None)]) == set()
    wait_for(lambda: f"job {job.id} lease_lost" in a.output(), timeout=10, what="worker a to log the lost lease")
    after = Job.objects.get(pk=job.id)
    assert (after.status, after.attempts, after.lease_version, after.finished_at) == (
        "done", 2, 3, done.finished_at)
    assert a.running and b.running
    # The fenced-out completion of the frozen worker counted nothing: one done, from b.
    counters = JobStat.objects.aggregate(started=Sum("started"), failed=Sum("failed"), done=Sum("done"))
    assert counters == {"started": 2, "failed": 1, "done": 1}


def test_c02_handler_killing_its_worker_dead_after_three_lease_expiries(spawn):
    """Case C02: crashes count as attempts (the claim counts them); after the third lease expiry
    the job is dead with "lease expired", not retried forever. max_attempts=1 + ValueError runs once."""
    once = enqueue("qa.fail_once", priority=10)  # runs first, in the first worker
    crash = enqueue("qa.crash")  # max_attempts=3
    env = {**FAST, "LEASEQUEUE_LEASE": "1"}
    for n in range(1, 4):  # a restart loop, as a process supervisor would run it
        w = spawn("runworker", "--concurrency", "1", "--worker-id", f"life{n}", env=env)
        assert w.wait(60) == 1, w.output()  # os._exit(1) in the handler
        assert Execution.objects.filter(job_id=crash.id).count() == n
    spawn("runreaper", "--interval", "0.5", env=env)
    dead = wait_for(lambda: job_in(crash.id, "dead"), timeout=60, what="the reaper to dead-letter the job")
    assert (dead.attempts, dead.lease_version) == (3, 6)
    assert [(e["type"], e["attempt"]) for e in dead.errors] == [("LeaseExpired", 1), ("LeaseExpired", 2),
                                                                ("LeaseExpired", 3)]
    assert "lease expired" in dead.errors[-1]["message"]
    assert Execution.objects.filter(job_id=crash.id).count() == 3
    once = Job.objects.get(pk=once.id)
    assert (once.status, once.attempts, once.errors[0]["type"]) == ("dead", 1, "builtins.ValueError")
    assert Execution.objects.filter(job_id=once.id).count() == 1
