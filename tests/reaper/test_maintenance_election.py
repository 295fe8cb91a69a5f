"""The election of the one process that runs the periodic maintenance: the store's
statement, and workers' reapers pruning finished jobs only when elected, the next one elected
continuing where the last one stopped."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from invoices.tasks import flaky_sync

from django_leasequeue import enqueue_many, store
from django_leasequeue.conf import build
from django_leasequeue.models import Job, ReaperSweep, WorkerProcess
from django_leasequeue.reaper import ReaperService

pytestmark = pytest.mark.django_db


def register(process_id: str, kind: str = "worker", *, at: datetime, reaps: bool = True) -> str:
    store.process_register(process_id=process_id, kind=kind, host="h", pid=1, queues=None, concurrency=1,
                           reaps=reaps, now=at)
    return process_id


def test_the_oldest_live_reaping_process_is_elected_and_a_runreaper_first():
    now = store.db_now()
    assert store.process_maintainer(alive_within=30, now=now) is None  # nobody registered
    register("h:2:b", at=now - timedelta(seconds=20))
    register("h:1:a", at=now - timedelta(seconds=10))
    register("h:0:no-reaper", at=now - timedelta(seconds=25), reaps=False)  # runworker --no-reaper
    # Both beat now; the one registered first wins (its heartbeat is renewed, started_at is kept).
    store.process_heartbeat("h:2:b", now=now)
    store.process_heartbeat("h:1:a", now=now)
    assert store.process_maintainer(alive_within=30, now=now) == "h:2:b"
    # Its heartbeat ages past PROCESS_ALIVE_WITHIN (SIGKILL): the next oldest takes over.
    assert store.process_maintainer(alive_within=30, now=now + timedelta(seconds=30)) == "h:2:b"
    store.process_heartbeat("h:1:a", now=now + timedelta(seconds=25))
    assert store.process_maintainer(alive_within=30, now=now + timedelta(seconds=31)) == "h:1:a"
    # A live runreaper is elected before any worker, however young.
    register("h:9:reaper", kind="reaper", at=now + timedelta(seconds=31))
    assert store.process_maintainer(alive_within=30, now=now + timedelta(seconds=31)) == "h:9:reaper"
    # Same start time: the smaller id breaks the tie, so every process reads the same winner.
    store.process_deregister("h:9:reaper")
    store.process_deregister("h:1:a")  # a clean stop hands the election over at once
    assert store.process_maintainer(alive_within=30, now=now + timedelta(seconds=31)) is None
    register("h:0:a", at=now + timedelta(seconds=25))
    register("h:0:0", at=now + timedelta(seconds=25))
    assert store.process_maintainer(alive_within=30, now=now + timedelta(seconds=31)) == "h:0:0"
    assert store.process_maintainer(alive_within=30, now=now + timedelta(seconds=56)) is None


def old_finished_jobs(count: int, *, hours: float) -> list[int]:
    enqueue_many(flaky_sync, [[f"k{i}"] for i in range(count)])
    ids = list(Job.objects.filter(status="ready").order_by("id").values_list("id", flat=True))
    Job.objects.filter(pk__in=ids).update(status="done", finished_at=store.db_now() - timedelta(hours=hours))
    return ids


def test_only_the_elected_worker_prunes_and_another_takes_over_when_its_row_ages_out():
    settings = build({"RETENTION": 3600})
    now = store.db_now()
    first = ReaperService(settings=settings, process_id=register("h:1:first", at=now - timedelta(seconds=5)))
    second = ReaperService(settings=settings, process_id=register("h:2:second", at=now))
    old_finished_jobs(3, hours=2)
    recent = old_finished_jobs(2, hours=0.5)  # within RETENTION: kept
    assert (second.maintain_if_elected(0.0), first.maintain_if_elected(0.0)) == (False, True)
    assert (first.maintenance_runs, first.pruned, second.maintenance_runs, second.pruned) == (1, 3, 0, 0)
    assert sorted(Job.objects.values_list("id", flat=True)) == recent
    # Not due again before MAINTENANCE_INTERVAL (60 s) (monotonic clock passed in).
    old_finished_jobs(4, hours=2)
    assert first.maintain_if_elected(59.9) is False
    assert first.maintenance_runs == 1
    # The first worker is SIGKILLed: its heartbeat stops and ages past PROCESS_ALIVE_WITHIN (30 s).
    WorkerProcess.objects.filter(pk="h:1:first").update(last_heartbeat_at=store.db_now() - timedelta(seconds=31))
    assert second.maintain_if_elected(60.0) is True
    assert (first.maintenance_runs, first.pruned, second.maintenance_runs, second.pruned) == (1, 3, 1, 4)
    assert sorted(Job.objects.values_list("id", flat=True)) == recent


def test_worker_maintenance_false_leaves_it_to_runreaper():
    settings = build({"RETENTION": 3600, "WORKER_MAINTENANCE": False})
    only = ReaperService(settings=settings, process_id=register("h:1:only", at=store.db_now()))
    ids = old_finished_jobs(2, hours=2)
    assert only.maintain_if_elected(0.0) is False
    assert (only.maintenance_runs, sorted(Job.objects.values_list("id", flat=True))) == (0, ids)


def test_worker_maintenance_must_be_a_bool():
    from django_leasequeue.exceptions import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"WORKER_MAINTENANCE'\] must be True or False, got 'no'"):
        build({"WORKER_MAINTENANCE": "no"})


def test_a_newly_elected_pruner_continues_from_the_place_the_killed_one_left(db_clock):
    settings = build({"RETENTION": 3600, "PRUNE_BATCH": 2})
    now = store.db_now()
    first = ReaperService(settings=settings, process_id=register("h:1:first", at=now - timedelta(seconds=5)))
    second = ReaperService(settings=settings, process_id=register("h:2:second", at=now))
    pruned_by_first = old_finished_jobs(5, hours=3)
    assert first.maintain_if_elected(0.0) is True
    assert (first.pruned, Job.objects.filter(pk__in=pruned_by_first).exists()) == (5, False)
    # The place, in the sweep record: the first row of the last batch (of 2, 2 and 1 rows).
    assert ReaperSweep.objects.get().prune_from_id == pruned_by_first[4]
    # A row finished behind that place (a clock set back wrote it), and rows finished after it.
    behind = old_finished_jobs(1, hours=4)
    after = old_finished_jobs(3, hours=2)
    # The first worker is SIGKILLed; the second is elected and continues after the first one's
    # place: it deletes the rows after it, not the one behind it (a walk from the oldest row would).
    WorkerProcess.objects.filter(pk="h:1:first").update(last_heartbeat_at=store.db_now() - timedelta(seconds=31))
    assert second.maintain_if_elected(60.0) is True
    assert second.pruned == 3 and not Job.objects.filter(pk__in=after).exists()
    assert list(Job.objects.values_list("id", flat=True)) == behind
    assert ReaperSweep.objects.get().prune_from_id == after[2]  # batches of 2 and 1
    # The next full pass (PRUNE_FULL_PASS_EVERY after the first pass began) starts from the oldest
    # row and deletes it.
    db_clock.advance(store.PRUNE_FULL_PASS_EVERY)
    store.process_heartbeat("h:2:second")
    assert second.maintain_if_elected(120.0) is True
    assert second.pruned == 4 and not Job.objects.exists()
