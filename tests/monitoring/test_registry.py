"""The process registry as monitoring sees it: alive by heartbeat age, pruning, re-registration."""

from __future__ import annotations

from datetime import timedelta

import pytest

from django_leasequeue import health, reaper, store
from django_leasequeue.conf import get_settings
from django_leasequeue.models import WorkerProcess
from django_leasequeue.worker import WorkerService

from .helpers import ago

pytestmark = pytest.mark.django_db


def register(pid: int, kind: str = "worker", *, at=None, queues=None) -> str:
    process_id = f"h:{pid}:{kind}"
    store.process_register(process_id=process_id, kind=kind, host="h", pid=pid, queues=queues, concurrency=1, now=at)
    return process_id


def test_alive_means_a_heartbeat_within_the_threshold(now):
    register(1, at=now)
    register(2, at=ago(now, 30))
    register(3, at=ago(now, 31))
    snap = health.snapshot(now)
    assert snap.alive_within == 30.0
    assert {w.id: (w.alive, w.heartbeat_age_seconds) for w in snap.workers} == {
        "h:1:worker": (True, 0.0), "h:2:worker": (True, 30.0), "h:3:worker": (False, 31.0)}
    assert snap.workers_alive == 2
    assert health.snapshot(now, alive_within=60).workers_alive == 3
    w = snap.workers[0]
    assert (w.kind, w.host, w.pid, w.queues, w.started_at) == ("worker", "h", 1, ["*"], now)
    assert w.to_dict()["last_heartbeat_at"] == now.isoformat()


def test_stale_rows_are_pruned_after_process_prune_after(now):
    register(1, at=ago(now, 301))
    register(2, at=ago(now, 299))
    settings = get_settings()
    assert settings.process_prune_after == 300.0
    assert reaper.prune_processes(settings, now=now) == 1
    assert list(WorkerProcess.objects.values_list("id", flat=True)) == ["h:2:worker"]


def test_the_workers_embedded_sweep_prunes_stale_process_rows(now):
    register(9, at=ago(now, 3600))  # a SIGKILLed worker never deregisters
    worker = WorkerService(concurrency=1, notify=False, reap=True)
    worker.register()  # the only live reaping process: elected to run the maintenance
    worker.run_once()
    assert not WorkerProcess.objects.filter(id="h:9:worker").exists()
    assert worker.reaper.maintenance_runs == 1


def test_a_reaper_whose_row_was_pruned_registers_again(now):
    service = reaper.ReaperService(interval=5, process_id="h:5:reaper")
    service.on_start()
    WorkerProcess.objects.filter(id="h:5:reaper").delete()
    service.run_once()
    row = WorkerProcess.objects.get(id="h:5:reaper")
    assert row.kind == "reaper"


def test_the_registry_records_which_processes_reap_bug_14(now):
    reaper.ReaperService(interval=5, process_id="h:5:reaper").register()
    WorkerService(concurrency=1, notify=False, reap=True, worker_name="w-reaps").register()
    WorkerService(concurrency=1, notify=False, reap=False, worker_name="w-no-reaper").register()
    rows = {row.id.rsplit(":", 1)[1]: (row.kind, row.reaps) for row in WorkerProcess.objects.all()}
    assert rows == {"reaper": ("reaper", True), "w-reaps": ("worker", True), "w-no-reaper": ("worker", False)}
    snap = health.snapshot()
    assert (snap.reapers_alive, snap.alive_by_kind["reaper"]) == (2, 1)


def test_heartbeat_with_tick_records_the_scheduler_tick(now):
    pid = register(4, "scheduler", at=ago(now, 100))
    assert store.process_heartbeat(pid, tick=True, now=ago(now, 20))
    assert store.process_heartbeat(pid, now=ago(now, 10))  # a plain heartbeat keeps the last tick
    row = WorkerProcess.objects.get(id=pid)
    assert (row.last_heartbeat_at, row.last_tick_at) == (ago(now, 10), ago(now, 20))
    assert health.snapshot(now).scheduler_last_tick_age_seconds == 20.0
    assert health.snapshot(now + timedelta(seconds=5)).scheduler_last_tick_age_seconds == 25.0
