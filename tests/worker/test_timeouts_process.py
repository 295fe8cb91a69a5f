"""Handlers past their task's timeout, on real ``runworker`` processes.

Thread mode cannot stop a handler. A handler past its timeout keeps its thread's slot and its
job's lease until it returns, so the worker never runs more handlers than ``--concurrency``, the
job's retry never starts beside it, and a key limit holds. The attempt is recorded as timed out
(a ``timed_out`` history entry, shown by queuehealth, the metrics and the dashboard) and ends as a
``JobTimedOut`` failure. Stuck handlers past a bound make the worker exit with status 3. Process
mode kills the handler at its timeout, even one that holds the GIL. Interrupted attempts are
refunded at most ``MAX_INTERRUPTIONS`` times.

The ledger: ``qa.overlap`` writes an Execution row at the start and at the return of every
handler, outside any transaction, so the rows show which handlers ran at the same time.
"""

import signal
from collections import Counter

import pytest
from django.db import connection
from qa.models import Effect, Execution, Probe

from django_leasequeue import enqueue, health, metrics
from django_leasequeue.models import Job
from tests.monitoring.helpers import queuehealth
from tests.support import job_in, wait_for

pytestmark = [pytest.mark.process]

FAST = {"LEASEQUEUE_LEASE": "2", "LEASEQUEUE_REAPER_INTERVAL": "0.5", "LEASEQUEUE_POLL_INTERVAL": "0.5"}
TIMED_OUT = "django_leasequeue.exceptions.JobTimedOut"


def figures(ids: list[int]) -> dict[str, int]:
    """From the start/end ledger of ``qa.overlap`` jobs: the most handlers running at once in one
    worker, the most attempts of one job at once, the most handlers of one key at once, and the
    spread of the worker's thread count seen at the handler starts."""
    keys = {j.id: j.kwargs["key"] for j in Job.objects.filter(pk__in=ids)}
    rows = Execution.objects.filter(job_id__in=ids).order_by("id").values_list("job_id", "worker", "tag")
    worker, job, key = Counter(), Counter(), Counter()
    most = {"worker": 0, "job": 0, "key": 0}
    threads = []
    for job_id, by, tag in rows:
        step = 1 if tag.startswith("start") else -1
        if step == 1:
            threads.append(int(tag.split(":")[1]))
        worker[by] += step
        job[job_id] += step
        key[keys[job_id]] += step
        most = {"worker": max(most["worker"], worker[by]), "job": max(most["job"], job[job_id]),
                "key": max(most["key"], key[keys[job_id]])}
    return {"max_handlers_per_worker": most["worker"], "max_attempts_of_one_job": most["job"],
            "max_per_key": most["key"], "threads_min": min(threads), "threads_max": max(threads)}


def test_timed_out_handlers_keep_their_slot_and_lease_until_they_return(spawn):
    """``--concurrency 1``, 2 jobs whose handlers sleep 4 s past ``timeout=1`` (2 attempts each).
    On main the worker gave the slot back at the timeout and started a new thread, and the reaper
    let the retry start beside the running attempt."""
    ids = [enqueue("qa.overlap", kwargs={"key": f"solo-{n}"}).id for n in range(2)]
    spawn("runworker", "--concurrency", "1", env={**FAST, "LEASEQUEUE_STUCK_HANDLERS_MAX": "2"})
    wait_for(lambda: Job.objects.filter(pk__in=ids, status="dead").count() == 2, timeout=120,
             what="both jobs to use up their attempts")
    seen = figures(ids)
    print("figures:", seen)
    assert seen == {"max_handlers_per_worker": 1, "max_attempts_of_one_job": 1, "max_per_key": 1,
                    "threads_min": seen["threads_min"], "threads_max": seen["threads_min"]}
    assert Execution.objects.filter(job_id__in=ids).count() == 8  # 4 attempts, each started and returned
    for job in Job.objects.filter(pk__in=ids):
        assert (job.attempts, job.lease_version) == (2, 2)
        assert [e["type"] for e in job.errors] == [TIMED_OUT, TIMED_OUT]
        assert "returned; its return value was discarded after 4." in job.errors[0]["message"]
        notes = [(h["token"], h["attempt"], h["timeout"]) for h in job.history if h["event"] == "timed_out"]
        assert notes == [(1, 1, 1.0), (2, 2, 1.0)]
        assert job.result is None  # the late return value was discarded


def test_a_key_limit_of_one_holds_while_a_timed_out_handler_still_runs(spawn):
    """``--concurrency 3``, 3 jobs under one key with ``concurrency_limit=1``: the key's next job
    waits until the timed-out handler really returned."""
    ids = [enqueue("qa.overlap", kwargs={"key": "k", "sleep": 3.0}).id for _ in range(3)]
    spawn("runworker", "--concurrency", "3", env=FAST)
    wait_for(lambda: Job.objects.filter(pk__in=ids, status="dead").count() == 3, timeout=120,
             what="the three jobs to use up their attempts")
    seen = figures(ids)
    print("figures:", seen)
    assert (seen["max_per_key"], seen["max_attempts_of_one_job"], seen["max_handlers_per_worker"]) == (1, 1, 1)
    assert seen["threads_max"] == seen["threads_min"]
    assert Execution.objects.filter(job_id__in=ids).count() == 12
    assert {tuple(e["type"] for e in j.errors) for j in Job.objects.filter(pk__in=ids)} == {(TIMED_OUT, TIMED_OUT)}


def test_a_fenced_write_after_the_timeout_is_refused_on_a_real_worker(spawn):
    """A handler sleeps 2 s past its ``timeout=1``, then tries ``fenced_atomic()``: refused with
    JobTimedOut (the token still matches, since the worker kept the lease), nothing committed, and
    the attempt recorded as timed out; the retry does the same (2 attempts, no effect)."""
    job = enqueue("qa.fenced_late", ["late"])
    spawn("runworker", "--concurrency", "2", env=FAST)
    row = wait_for(lambda: job_in(job.id, "dead"), timeout=60, what="both attempts")
    assert (row.attempts, row.lease_version) == (2, 2)
    assert [e["type"] for e in row.errors] == [TIMED_OUT, TIMED_OUT]
    assert "fenced_atomic() refused to commit" in row.errors[0]["message"]
    assert Effect.objects.filter(job_id=job.id).count() == 0
    assert list(Probe.objects.filter(job_id=job.id).order_by("id").values_list("lease_version", "ok")) == [
        (1, False), (2, False)]


def test_a_worker_whose_threads_are_all_stuck_exits_3_and_the_job_is_retried(spawn):
    """``--concurrency 1`` and a handler that never returns: at its timeout every thread is stuck
    (STUCK_HANDLERS_MAX defaults to the concurrency), so the worker stops gracefully with status 3
    and records the attempt as timed out; the retry runs on the next worker."""
    job = enqueue("qa.hang_forever")
    w = spawn("runworker", "--concurrency", "1", env={**FAST, "LEASEQUEUE_SHUTDOWN_GRACE": "1"})
    assert w.wait(60) == 3, w.output()
    assert "1 handler stuck past its timeout (STUCK_HANDLERS_MAX: 1)" in w.output()
    assert f"(job {job.id} fails as JobTimedOut and is retried)" in w.output()
    row = Job.objects.get(pk=job.id)
    assert (row.status, row.attempts, row.lease_version) == ("ready", 1, 1)
    assert [e["type"] for e in row.errors] == [TIMED_OUT]
    assert "still running when worker" in row.errors[0]["message"]
    assert [h["token"] for h in row.history if h["event"] == "timed_out"] == [1]
    spawn("runworker", "--concurrency", "1", env=FAST)
    done = wait_for(lambda: job_in(job.id, "done"), timeout=60, what="the retry")
    assert (done.attempts, done.lease_version) == (2, 2)
    assert Execution.objects.filter(job_id=job.id).count() == 2


def test_stuck_handlers_show_in_queuehealth_and_metrics_then_the_worker_exits_after_the_bound(spawn):
    """``--concurrency 2``, one handler that never returns: one stuck handler (below the count
    bound) is visible from another process; ``STUCK_EXIT_AFTER=4`` s later the worker exits 3."""
    job = enqueue("qa.hang_forever")
    w = spawn("runworker", "--concurrency", "2", env={**FAST, "LEASEQUEUE_STUCK_EXIT_AFTER": "4",
                                                      "LEASEQUEUE_SHUTDOWN_GRACE": "1"})
    snap = wait_for(lambda: (s := health.snapshot()).stuck_handlers == 1 and s, timeout=60, what="a stuck handler")
    (stuck,) = [x for x in snap.workers if x.stuck_handlers]
    assert stuck.id == Job.objects.get(pk=job.id).leased_by and stuck.stuck_seconds < 4
    assert "leasequeue_stuck_handlers 1.0" in metrics.render().decode()
    # In this process: a manage.py started now could take longer than the 4 s left on a loaded
    # machine, and find the worker already gone.
    text = queuehealth(defaults=True).output
    assert f"stuck handlers (past their task's timeout, still running): 1; {stuck.id}: 1" in text
    assert queuehealth("--json", defaults=True).json["snapshot"]["stuck_handlers"] == 1
    assert w.wait(60) == 3, w.output()
    assert "stuck 4 s past its timeout (STUCK_EXIT_AFTER: 4 s)" in w.output()
    assert health.snapshot().stuck_handlers == 0


def test_process_mode_kills_loops_and_gil_holders_at_their_timeout_and_keeps_serving(spawn):
    """``--execution process``: a pure-Python endless loop and a C call that holds the GIL are
    each killed at their 1 s timeout and recorded as timed out; fenced_atomic() in a child is fenced
    on the job's token; the worker keeps serving."""
    spin = enqueue("qa.spin_forever")
    hog = enqueue("qa.gil_hog")
    fenced = enqueue("qa.fenced_in_child", ["child"])
    w = spawn("runworker", "--concurrency", "2", "--execution", "process", env=FAST)
    wait_for(lambda: Job.objects.filter(pk__in=[spin.id, hog.id, fenced.id], status__in=["dead", "done"]).count()
             == 3, timeout=120, what="the three jobs to finish")
    for job in (spin, hog):
        row = Job.objects.get(pk=job.id)
        assert (row.status, row.attempts) == ("dead", 1)
        assert [e["type"] for e in row.errors] == [TIMED_OUT]
        assert "its child process was killed after 1." in row.errors[0]["message"]
    # fenced_atomic() commits "done"; the return value is stored right after, fenced on the token.
    row = wait_for(lambda: Job.objects.filter(pk=fenced.id, result__isnull=False).first(), timeout=30,
                   what="the fenced job's result")
    assert (row.status, row.attempts) == ("done", 1)
    assert row.result["pid"] != w.pid
    assert list(Effect.objects.filter(job_id=fenced.id).values_list("lease_version", flat=True)) == [1]
    after = enqueue("qa.record", ["after the kills"])
    assert wait_for(lambda: job_in(after.id, "done"), timeout=60, what="a job after the kills")
    assert w.running


def other_sessions() -> int:
    """Sessions on this test database besides the test's own."""
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        return cur.fetchone()[0]


def test_process_mode_sigterm_kills_a_child_still_running_after_the_grace_and_releases_its_job(spawn):
    """A child with no timeout still running when the grace period ends is killed before its job
    is released (an interrupted attempt: refunded), so it cannot run on beside the next attempt."""
    job = enqueue("qa.record", ["long"], {"sleep": 600})
    w = spawn("runworker", "--concurrency", "1", "--execution", "process",
              env={**FAST, "LEASEQUEUE_SHUTDOWN_GRACE": "1"})
    wait_for(lambda: Execution.objects.filter(job_id=job.id).count() == 1, timeout=60, what="the child to start")
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.output()
    row = Job.objects.get(pk=job.id)
    assert (row.status, row.attempts, row.interruptions, row.errors) == ("ready", 0, 1, [])
    assert row.history[-1]["event"] == "released" and row.history[-1]["interrupted"] is True
    # The child (which holds a database session since it wrote its Execution row) is gone too.
    assert wait_for(lambda: other_sessions() == 0, timeout=15, what="the child's session to end")


def test_an_interrupted_handler_is_refunded_max_interruptions_times_then_dead_lettered(spawn):
    """A handler that outlives every graceful stop (no timeout), with the default MAX_INTERRUPTIONS
    (5): the first five SIGTERMs refund its attempt, the sixth dead-letters it as Interrupted (on
    main every SIGTERM refunded it, so it re-ran on every deploy)."""
    job = enqueue("qa.record", ["forever"], {"sleep": 600})
    env = {**FAST, "LEASEQUEUE_SHUTDOWN_GRACE": "0.5"}
    seen = []
    for round_ in range(1, 7):
        w = spawn("runworker", "--concurrency", "1", "--no-notify", env=env)
        wait_for(lambda round_=round_: Execution.objects.filter(job_id=job.id).count() == round_, timeout=60,
                 what=f"run {round_}")
        w.signal(signal.SIGTERM)
        assert w.wait(30) == 0, w.output()
        row = Job.objects.get(pk=job.id)
        seen.append((row.status, row.attempts))
    assert seen == [("ready", 0)] * 5 + [("dead", 1)]
    assert row.interruptions == 6
    assert [e["type"] for e in row.errors] == ["Interrupted"]
    assert row.errors[0]["message"].startswith("interrupted 6 times (worker shutdown); MAX_INTERRUPTIONS is 5")
