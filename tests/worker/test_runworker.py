"""``runworker`` behaviour on real processes: racing workers, wake-up by NOTIFY, ``--burst``,
handlers that raise BaseException or return garbage (C06, C25), heartbeats on long jobs (C03)
and the task timeout that stops them."""

import time
from datetime import datetime

import pytest
from django.db import connection, transaction
from qa.models import Execution

from django_leasequeue import enqueue, store
from django_leasequeue.models import Job, WorkerProcess
from django_leasequeue.store import NewJob
from tests.support import claim, job_in, wait_for

pytestmark = [pytest.mark.process]

FAST = {"LEASEQUEUE_LEASE": "2", "LEASEQUEUE_REAPER_INTERVAL": "0.5", "LEASEQUEUE_POLL_INTERVAL": "0.5"}


def listening_backends() -> int:
    """Connections of this test database that are LISTENing (their last statement was LISTEN)."""
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND query LIKE 'LISTEN %%'")
        return cur.fetchone()[0]


def test_two_worker_processes_racing_on_one_due_job_exactly_one_claim(spawn):
    """Both workers idle and LISTENing; each round commits one job, whose NOTIFY wakes both."""
    for name in ("p1", "p2"):
        spawn("runworker", "--concurrency", "2", "--worker-id", name, env={"LEASEQUEUE_POLL_INTERVAL": "5"})
    wait_for(lambda: WorkerProcess.objects.count() == 2 and listening_backends() == 2, timeout=60,
             what="both workers to listen")
    ids = []
    for n in range(40):
        job = enqueue("qa.record", [f"round {n}"])
        ids.append(job.id)
        wait_for(lambda job=job: job_in(job.id, "done"), timeout=30, what=f"round {n}")
    jobs = Job.objects.filter(pk__in=ids)
    assert {(j.status, j.attempts, j.lease_version) for j in jobs} == {("done", 1, 1)}
    runs = list(Execution.objects.filter(job_id__in=ids).values_list("job_id", flat=True))
    assert sorted(runs) == sorted(ids)  # exactly one execution per job
    winners = {j.leased_by.rsplit(":", 1)[1] for j in jobs}
    assert winners <= {"p1", "p2"}


def test_notify_wakes_an_idle_worker_quickly_and_reaper_keeps_its_own_interval(spawn):
    """Poll interval 30 s: a job must still start within 2 s of its commit (LISTEN/NOTIFY), and
    an expired lease must still be reaped every REAPER_INTERVAL (0.5 s), not every poll."""
    spawn("runworker", "--concurrency", "1",
          env={"LEASEQUEUE_POLL_INTERVAL": "30", "LEASEQUEUE_REAPER_INTERVAL": "0.5"})
    wait_for(lambda: listening_backends() == 1, timeout=60, what="the worker to LISTEN")
    time.sleep(0.5)  # let the worker settle into its 30 s poll wait
    job = enqueue("qa.record", ["wake up"])
    done = wait_for(lambda: job_in(job.id, "done"), timeout=10, what="the job to run")
    # Measured on the database clock: commit of the enqueue to the claim.
    assert (done.started_at - done.created_at).total_seconds() < 2

    # A job claimed by a worker that died at once (1 s lease, never renewed).
    with transaction.atomic():
        orphan = enqueue("qa.record", ["orphan"])
        (claimed,) = claim(limit=1, lease=1, worker_id="gone:1:dead")
        assert claimed.id == orphan.id
    done = wait_for(lambda: job_in(orphan.id, "done"), timeout=25, what="the idle worker to reap and rerun it")
    assert (done.attempts, done.lease_version, [e["type"] for e in done.errors]) == (2, 3, ["LeaseExpired"])
    # Reaped well before the 30 s poll would have: nothing else wakes this idle worker, so only the
    # REAPER_INTERVAL cut of its wait reaps in time (about 1.5 s after the enqueue on a quiet
    # machine; the bound leaves room for a CI machine running every leg at once, where 8 s was seen).
    reaped_at = datetime.fromisoformat(done.errors[0]["at"])
    assert (reaped_at - done.created_at).total_seconds() < 12


def test_c06_c25_burst_worker_survives_base_exceptions_bad_outcomes_unknown_tasks(spawn, tmp_path):
    """One ``--burst`` worker with one thread: jobs raising SystemExit, KeyboardInterrupt and
    CancelledError (C06), returning a non-JSON value or raising an unprintable exception (C25),
    and rows naming unregistered tasks, run first; the normal jobs after them must still run, and
    the worker exits 0 once no due job is left."""
    base = {kind: enqueue("qa.raise_base", [kind], priority=50)
            for kind in ("SystemExit", "KeyboardInterrupt", "CancelledError")}
    bad_return = enqueue("qa.bad_return", priority=40)
    unprintable = enqueue("qa.unprintable", priority=40)
    marker = tmp_path / "pwned"
    rows = store.job_insert([NewJob(task=name, queue="default", priority=40, args_json=f'["touch {marker}"]',
                                    kwargs_json="{}", max_attempts=5) for name in ("os.system", "evil.module.run")],
                            notify=False, channel="leasequeue")
    normal = [enqueue("qa.record", [str(i)]) for i in range(5)]
    # UNKNOWN_TASK_GRACE 0: the worker's first reaper sweep dead-letters the rows of unknown tasks
    # (it never claims them), before the burst worker finds nothing left to claim and exits.
    w = spawn("runworker", "--burst", "--concurrency", "1", env={"LEASEQUEUE_UNKNOWN_TASK_GRACE": "0"})
    assert w.wait(60) == 0, w.output()

    for kind, job in base.items():
        job = Job.objects.get(pk=job.id)
        assert (job.status, job.attempts, job.leased_until) == ("ready", 1, None), kind
        assert job.errors[0]["type"].rsplit(".", 1)[1] == kind
        assert (job.run_at - job.attempted_at).total_seconds() > 55  # retry after the 60 s backoff
    bad_return = Job.objects.get(pk=bad_return.id)
    assert (bad_return.status, bad_return.attempts) == ("dead", 1)
    assert "return value is a builtins.object" in bad_return.errors[0]["message"]
    unprintable = Job.objects.get(pk=unprintable.id)
    assert (unprintable.status, unprintable.errors[0]["message"]) == ("dead", "<unprintable Unprintable>")
    for row in rows:
        row = Job.objects.get(pk=row.id)
        assert (row.status, row.attempts, row.errors[0]["type"]) == (
            "dead", 0, "django_leasequeue.exceptions.UnknownTask")
        assert f"no task is registered as {row.task!r}" in row.errors[0]["message"]
    assert {Job.objects.get(pk=j.id).status for j in normal} == {"done"}
    assert Execution.objects.filter(job_id__in=[j.id for j in normal]).count() == 5
    assert not marker.exists()


def test_c03_heartbeat_keeps_long_jobs_and_timeout_abandons_hung_one(spawn):
    """Lease 2 s. A 6 s sleeping job and a 5 s CPU-bound job are renewed and never reclaimed
    (attempts 1, C03). A task with ``timeout=1`` that hangs 8 s is marked timed out after 1 s,
    but a thread cannot be stopped: the worker keeps its lease until the handler returns, then
    records the attempt as ``JobTimedOut`` and the retry runs (never beside the first attempt)."""
    sleeper = enqueue("qa.record", ["sleeper"], {"sleep": 6})
    spinner = enqueue("qa.busy", [5])
    hung = enqueue("qa.hang", [8])
    spawn("runworker", "--concurrency", "3", env=FAST)
    done = wait_for(lambda: Job.objects.filter(pk__in=[sleeper.id, spinner.id, hung.id], status="done").count() == 3,
                    timeout=90, what="all three jobs to finish")
    assert done
    for job in (sleeper, spinner):
        job = Job.objects.get(pk=job.id)
        assert (job.attempts, job.lease_version, job.errors) == (1, 1, []), job.task
        assert Execution.objects.filter(job_id=job.id).count() == 1
    hung = Job.objects.get(pk=hung.id)
    assert (hung.attempts, hung.lease_version) == (2, 2)
    assert [e["type"] for e in hung.errors] == ["django_leasequeue.exceptions.JobTimedOut"]
    assert [h["token"] for h in hung.history if h["event"] == "timed_out"] == [1]
    runs = list(Execution.objects.filter(job_id=hung.id).order_by("id").values_list("created_at", flat=True))
    assert len(runs) == 2 and (runs[1] - runs[0]).total_seconds() >= 8  # the retry began after the hang ended
