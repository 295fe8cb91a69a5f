"""Chaos: handlers that hang for good.

``qa.hang_forever`` has ``timeout=1`` and blocks its first attempt on an event nobody sets. A
thread cannot be stopped: at the timeout the worker records the attempt as timed out but keeps
the job leased (and the thread's slot taken), so no retry can run beside it. A worker whose handler
is stuck ``STUCK_EXIT_AFTER`` seconds past its timeout stops gracefully with status 3, the attempt
fails as ``JobTimedOut`` and another worker retries the job. SIGTERM stops a worker with a stuck
thread within the shutdown grace period; its stuck attempt fails as ``JobTimedOut`` too.
"""


import pytest
from qa.models import Execution

from django_leasequeue import enqueue
from django_leasequeue.models import Job
from tests.support import job_in, wait_for
from tests.support.chaos.harness import (
    CHAOS_ENV,
    Fleet,
    assert_balanced,
    assert_no_overlaps,
    assert_no_reruns,
    db_now,
    enqueue_chaos,
    enqueue_plain,
    ledger,
    record,
    scaled,
    seconds,
    wait_drained,
)

pytestmark = [pytest.mark.chaos, pytest.mark.process]

JOBS = scaled(300)
GRACE = float(CHAOS_ENV["LEASEQUEUE_SHUTDOWN_GRACE"])
TIMEOUT = 1.0  # qa.hang_forever's timeout
TIMED_OUT = "django_leasequeue.exceptions.JobTimedOut"


def name_of(leased_by: str) -> str:
    return leased_by.rsplit(":", 1)[1]


def test_hung_handlers_are_given_up_retried_elsewhere_and_do_not_block_shutdown(spawn):
    fleet = Fleet(spawn, concurrency=2)
    # 1. A burst worker without a reaper runs the first hung job. Nobody can take the job back
    #    while it lives (no reaper anywhere yet), so the retry cannot happen in its process.
    first = enqueue("qa.hang_forever", priority=50)
    hung = fleet.start(name="hung", args=("--burst", "--no-reaper"), env={"LEASEQUEUE_STUCK_EXIT_AFTER": "2"})
    claimed = wait_for(lambda: job_in(first.id, "leased"), timeout=60, what="the hung job to be claimed")
    # At the timeout the attempt is marked timed out and the lease kept; 2 s later (STUCK_EXIT_AFTER)
    # the worker stops gracefully, records the attempt as JobTimedOut and exits 3.
    assert hung.proc.wait(60) == 3, hung.proc.output()
    exited = db_now()
    job = Job.objects.get(pk=first.id)
    assert (job.status, job.attempts, job.lease_version) == ("ready", 1, 1)
    assert [e["type"] for e in job.errors] == [TIMED_OUT]
    assert [h["token"] for h in job.history if h["event"] == "timed_out"] == [1]
    burst_exit = seconds(claimed.attempted_at, exited) - TIMEOUT

    # 2. Two more workers and a reaper: the first job's retry runs on one of them. A second hung
    #    job holds a thread of one of them and a fenced workload keeps them busy; at the end a
    #    SIGTERM stops both within the grace period although one has a thread stuck in the second
    #    hung job, whose attempt then fails as JobTimedOut; a last burst worker runs its retry.
    fleet.start_reaper()
    second = enqueue("qa.hang_forever", priority=50)
    ids = enqueue_chaos(JOBS, seed=6)
    plain = enqueue_plain(JOBS // 2, seed=61)  # the second workload: plain handlers returning a value
    others = [fleet.start(name=name) for name in ("w1", "w2")]
    drained = wait_drained(120) + wait_drained(120, task="qa.chaos_plain")
    wait_for(lambda: job_in(first.id, "done"), timeout=60, what="the first hung job's retry")
    assert Job.objects.get(pk=second.id).status == "leased"  # still stuck, still held
    stops = fleet.stop(timeout=GRACE + 30)
    assert set(stops) == {m.name for m in others}
    assert all(code == 0 for code, _ in stops.values()), stops
    slowest = max(took for _, took in stops.values())
    assert slowest < GRACE + 5, stops
    # The stuck attempt's retry waits at least one lease (its thread ran until its process was
    # gone), and a --burst worker stops at once when no job is due: start it once the retry is.
    retry_at = Job.objects.get(pk=second.id).run_at
    wait_for(lambda: db_now() >= retry_at, timeout=30, what="the second hung job's retry to be due")
    last = fleet.start(name="w3", args=("--burst",))
    wait_for(lambda: job_in(second.id, "done"), timeout=60, what="the second hung job's retry")
    assert last.proc.wait(60) == 0, last.proc.output()

    books = ledger(ids + plain, deaths=fleet.deaths)
    assert_balanced(books, done=JOBS + len(plain))
    assert_no_reruns(books)
    assert_no_overlaps(books)
    for hung_job in (first, second):
        job = Job.objects.get(pk=hung_job.id)
        assert (job.status, job.attempts) == ("done", 2), job.errors
        assert [e["type"] for e in job.errors] == [TIMED_OUT]
        runs = list(Execution.objects.filter(job_id=job.id).order_by("attempt").values_list("attempt", "worker"))
        assert [attempt for attempt, _ in runs] == [1, 2]  # no third, concurrent run
    # From the timeout (first claim + 1 s) to the retry's claim: STUCK_EXIT_AFTER, the grace
    # period of the stuck worker's stop, then a claim.
    job = Job.objects.get(pk=first.id)
    recoveries = [seconds(job.started_at, job.attempted_at) - TIMEOUT]
    (_, first_by), (_, retry_by) = Execution.objects.filter(job_id=first.id).order_by("attempt").values_list(
        "attempt", "worker")
    assert name_of(first_by) == "hung" and name_of(retry_by) in ("w1", "w2")
    assert max(recoveries) < 15
    record("hang", fault="handler hangs for good past its timeout=1 s (twice)", jobs=JOBS + len(plain) + 2, faults=2,
           books=books,
           also=[first.id, second.id],
           recovery=max(recoveries),
           recovery_meaning="worst time from the task timeout until the retry was claimed by a worker",
           notes=f"a worker with a handler stuck past its timeout kept the lease and exited (status 3, "
                 f"STUCK_EXIT_AFTER 2 s) {burst_exit:.1f} s after the timeout; SIGTERM with a stuck thread: slowest "
                 f"worker exit {slowest:.1f} s (grace {GRACE:.0f} s)",
           seconds=round(drained, 1))
