"""Pause means pause, with real ``runworker`` processes that prefetch.

A worker with a backlog of short jobs holds more jobs than it has threads (prefetched, leased,
unstarted). The test pauses the queue in the middle of the drain and checks that no handler of
the queue starts once ``queue_pause()`` has returned, that the prefetched jobs went back to
``ready`` with the attempt they had, and that every job is accounted for.

Handlers stamp their start with the wall clock read on entry (``flowlab.pause_probe``), and the
test compares it with the wall clock read right after ``queue_pause()`` returned: one host, one
clock, and no statement between the start and its stamp.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from datetime import UTC, datetime

import pytest
from flowlab.models import Probe
from flowlab.tasks import pause_probe

from django_leasequeue import enqueue_many, store
from django_leasequeue.models import Job
from tests.conftest import WorkerProcess, wait_for

from .conftest import wait_workers, worker_env

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

JOBS = 600
# Expected queueing of a prefetched job: long enough that each worker holds its full
# PREFETCH_MAX of unstarted jobs during the drain (the case that let handlers start after a pause).
PREFETCH = {"LEASEQUEUE_PREFETCH_WAIT": "1.0"}


def released_for_pause(job_history: list[dict[str, object]]) -> int:
    return sum(1 for h in job_history if h.get("event") == "released" and h.get("reason") == "queue paused")


def pause_mid_drain(workers: int, frozen: WorkerProcess | None = None) -> None:
    """Pause mid-drain and check the rule; with ``frozen``, that worker is SIGSTOPped before the
    pause and continued once ``queue_pause()`` has returned."""
    enqueue_many(pause_probe, [([], {"seconds": 0.05}) for _ in range(JOBS)])
    wait_for(lambda: Probe.objects.filter(key="pause").count() >= 100, timeout=30, interval=0.01,
             what="100 handlers started")
    # The workers are busy and hold prefetched jobs now.
    held_unstarted = Job.objects.filter(status="leased").count() - Probe.objects.filter(
        key="pause", job_id__in=Job.objects.filter(status="leased").values("id")).count()
    if frozen is not None:
        frozen.signal(signal.SIGSTOP)
        held_unstarted = Job.objects.filter(status="leased").count() - Probe.objects.filter(
            key="pause", job_id__in=Job.objects.filter(status="leased").values("id")).count()
        assert held_unstarted > 0  # the frozen worker holds jobs it has not started
    called = time.monotonic()
    assert store.queue_pause("flow", by="test")
    returned_at = datetime.fromtimestamp(time.time(), UTC)
    waited = time.monotonic() - called
    if frozen is not None:
        frozen.signal(signal.SIGCONT)  # its threads wake on evidence older than the grace
    # The workers settle: the jobs that had started finish, the unstarted ones go back.
    wait_for(lambda: not Job.objects.filter(status="leased").exists(), timeout=15, interval=0.02,
             what="no job leased after the pause")
    time.sleep(store.PAUSE_GRACE * 2)  # a start on a stale view would show now
    late = list(Probe.objects.filter(key="pause", at__gt=returned_at).values_list("job_id", "at"))
    starts = Probe.objects.filter(key="pause").count()
    done = Job.objects.filter(status="done").count()
    ready = list(Job.objects.filter(status="ready").values_list("id", "attempts", "history"))
    released = sum(released_for_pause(h) for _, _, h in ready)
    if frozen is not None:  # jobs claimed over a second before the freeze went back as too late
        released += sum(1 for _, _, hs in ready for h in hs if h.get("event") == "released"
                        and h.get("reason") == "prefetched job not started in time")
    statuses = set(Job.objects.values_list("status", flat=True))
    reasons = Counter(str(h.get("reason")) for _, _, hs in ready for h in hs if h.get("event") == "released")
    print(f"\npause mid-drain, {workers} worker(s): queue_pause() waited {waited * 1000:.0f} ms; "
          f"{held_unstarted} leased and unstarted when it was called; {starts} handlers started "
          f"({len(late)} after it returned); {done} done, {len(ready)} ready, "
          f"{released} released as 'queue paused' (releases by reason: {dict(reasons)})")
    assert late == []
    assert waited >= store.PAUSE_GRACE + store.PAUSE_MARGIN
    assert statuses <= {"done", "ready"}
    assert done + len(ready) == JOBS  # the ledger adds up: nothing leased, lost or dead
    assert starts == done  # each done job started once
    assert not Probe.objects.filter(key="pause", job_id__in=[i for i, _, _ in ready]).exists()
    assert done >= 100 and len(ready) > 0
    # The prefetched jobs went back without spending an attempt (they never had one).
    assert {attempts for _, attempts, _ in ready} == {0}
    assert released >= 1  # prefetched jobs existed and were given back unstarted
    assert Job.objects.filter(status="done").exclude(attempts=1).count() == 0
    # Resume: every job runs, once, at its first attempt.
    assert store.queue_resume("flow")
    wait_for(lambda: Job.objects.filter(status="done").count() == JOBS, timeout=30, interval=0.05,
             what="all jobs done after the resume")
    assert set(Job.objects.values_list("attempts", flat=True)) == {1}
    assert Probe.objects.filter(key="pause").count() == JOBS


def test_no_handler_starts_after_queue_pause_returns(spawn):
    spawn("runworker", "--queues", "flow", "--concurrency", "4", "--worker-id", "p0",
          env=worker_env(**PREFETCH))
    wait_workers(1)
    pause_mid_drain(1)


def test_no_handler_starts_after_queue_pause_returns_with_two_workers(spawn):
    for i in range(2):
        spawn("runworker", "--queues", "flow", "--concurrency", "4", "--worker-id", f"p{i}",
              env=worker_env(**PREFETCH))
    wait_workers(2)
    pause_mid_drain(2)


def test_no_handler_starts_after_queue_pause_returns_in_a_worker_frozen_during_the_pause(spawn):
    """The worker is SIGSTOPped while it holds prefetched jobs and continued after the pause
    returned: its monotonic clock ran on, so its pause view is too old to start anything."""
    worker = spawn("runworker", "--queues", "flow", "--concurrency", "4", "--worker-id", "p0",
                   env=worker_env(**PREFETCH))
    wait_workers(1)
    pause_mid_drain(1, frozen=worker)


def test_a_process_mode_child_still_setting_up_does_not_start_its_handler_after_the_pause(spawn):
    """Process execution: a child process takes a second or more to set Django up after the
    worker's start check; the worker asks its pause view again once the child is ready."""
    # Each child sets Django up for at least 1.5 s, well past the pause's grace.
    spawn("runworker", "--queues", "flow", "--concurrency", "2", "--execution", "process", "--worker-id", "p0",
          env=worker_env(TESTPROJECT_SLOW_SETUP="1.5"))
    wait_workers(1)
    long = pause_probe.enqueue(seconds=4.0)
    wait_for(lambda: Probe.objects.filter(key="pause", job_id=long.id).exists(), timeout=60, interval=0.01,
             what="the long handler started")
    short = pause_probe.enqueue(seconds=0.01)
    wait_for(lambda: Job.objects.filter(pk=short.pk, status="leased").exists(), timeout=10, interval=0.005,
             what="the second job leased (its child is setting up)")
    assert store.queue_pause("flow", by="test")
    returned_at = datetime.fromtimestamp(time.time(), UTC)
    wait_for(lambda: Job.objects.get(pk=long.pk).status == "done" and Job.objects.get(pk=short.pk).status == "ready",
             timeout=15, interval=0.02, what="the long job done, the second one given back")
    time.sleep(store.PAUSE_GRACE * 2)
    assert not Probe.objects.filter(key="pause", at__gt=returned_at).exists()
    short.refresh_from_db()
    assert (short.status, short.attempts, released_for_pause(short.history)) == ("ready", 0, 1)
    assert store.queue_resume("flow")
    wait_for(lambda: Job.objects.get(pk=short.pk).status == "done", timeout=30, interval=0.05,
             what="the second job done after the resume")
    assert Probe.objects.filter(key="pause", job_id=short.pk).count() == 1
    assert Job.objects.get(pk=short.pk).attempts == 1
