"""Sequences with real ``runworker`` processes: per key one job at a time in enqueue (id) order
across workers, and a dead job that halts its sequence until replayed, or lets it continue.

Each handler records ``start`` and ``end`` probes stamped with the database clock (flowlab.tasks).
"""

from __future__ import annotations

import random
import time

import pytest
from flowlab.models import Probe
from flowlab.tasks import seq_step, seq_step_loose, sleeper

from django_leasequeue import enqueue_many, store
from django_leasequeue.models import Job
from tests.conftest import wait_for

from .conftest import wait_workers, worker_env

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


def runs_by_key() -> dict[str, list[tuple[int, str, object]]]:
    """key -> [(job id, event, at)] in time order."""
    out: dict[str, list[tuple[int, str, object]]] = {}
    for p in Probe.objects.order_by("at", "id"):
        out.setdefault(p.key, []).append((p.job_id, p.event, p.at))
    return out


def test_sequences_run_in_id_order_one_at_a_time_across_3_processes(spawn):
    """60 jobs over 5 accounts, enqueued in a shuffled account order, on 3 workers of 4 threads:
    per account the runs never overlap and go in id order; every job ran exactly once; different
    accounts ran side by side."""
    for i in range(3):
        spawn("runworker", "--queues", "flow", "--concurrency", "4", "--worker-id", f"s{i}", env=worker_env())
    wait_workers(3)
    accounts = [f"a{k}" for k in range(5) for _ in range(12)]
    random.Random(15).shuffle(accounts)
    counters: dict[str, int] = {}
    items = []
    for account in accounts:
        counters[account] = counters.get(account, 0) + 1
        items.append(([], {"account": account, "n": counters[account], "seconds": 0.03}))
    started = time.monotonic()
    assert enqueue_many(seq_step, items) == 60
    wait_for(lambda: Job.objects.filter(status="done").count() == 60, timeout=60, interval=0.05,
             what="60 sequenced jobs done")
    elapsed = time.monotonic() - started
    assert Job.objects.filter(status="done", attempts=1).count() == 60
    ids_by_key: dict[str, list[int]] = {}
    for job in Job.objects.order_by("id"):
        ids_by_key.setdefault(job.sequence_key or "", []).append(job.id)
    runs = runs_by_key()
    assert sum(len(v) for v in runs.values()) == 120  # 60 starts, 60 ends: each job ran once
    overlapped_keys = 0
    all_spans = []
    for key, events in runs.items():
        # start, end, start, end, ... of the key's jobs in id order: never two at once.
        assert [(job_id, event) for job_id, event, _ in events] == \
            [(job_id, event) for job_id in ids_by_key[key] for event in ("start", "end")], key
        spans = [(events[i][2], events[i + 1][2]) for i in range(0, len(events), 2)]
        assert all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1)), key
        all_spans += [(key, s, e) for s, e in spans]
    # Different keys did run at the same time (the rule serialises a key, not the queue).
    for key, start, end in all_spans:
        if any(k != key and s < end and start < e for k, s, e in all_spans):
            overlapped_keys += 1
    assert overlapped_keys > 0
    workers = set(Job.objects.values_list("leased_by", flat=True))
    print(f"\nsequences: 60 jobs x 0.03 s, 5 keys, 3x4 threads: {elapsed:.2f} s "
          f"(one key alone: {12 * 0.03:.2f} s of handler time), workers used: {len(workers)}")


def test_a_dead_job_halts_its_sequence_until_replayed_and_continue_lets_it_go_on(spawn):
    """Account h (policy halt): step 2 dies, step 3 waits, untouched, until step 2 is replayed; then
    2 and 3 run in order. Account c (policy continue): step 2 dies and step 3 runs at once."""
    spawn("runworker", "--queues", "flow", "--concurrency", "4", "--worker-id", "h0", env=worker_env())
    spawn("runworker", "--queues", "flow", "--concurrency", "4", "--worker-id", "h1", env=worker_env())
    wait_workers(2)
    halt = [seq_step.enqueue(account="h", n=n, fail_once=(n == 2)) for n in (1, 2, 3)]
    loose = [seq_step_loose.enqueue(account="c", n=n, fail=(n == 2)) for n in (1, 2, 3)]
    wait_for(lambda: Job.objects.filter(pk=halt[1].pk, status="dead").exists()
             and Job.objects.filter(pk=loose[2].pk, status="done").exists(), timeout=20, what="h2 dead, c3 done")
    # A later keyless job done proves that the workers claimed again after h2 died.
    sentinel = enqueue_many(sleeper, [([], {"customer": "x", "seq": 0, "seconds": 0})])
    assert sentinel == 1
    wait_for(lambda: Job.objects.filter(task="flowlab.sleeper", status="done").exists(), timeout=10,
             what="sentinel done")
    third = Job.objects.get(pk=halt[2].pk)
    assert (third.status, third.attempts) == ("ready", 0)
    assert [h.job_id for h in store.sequence_halted()] == [halt[1].pk]
    assert [(job_id, event) for job_id, event, _ in runs_by_key()["acct-c"]] == [
        (loose[0].pk, "start"), (loose[0].pk, "end"), (loose[1].pk, "start"), (loose[1].pk, "failed"),
        (loose[2].pk, "start"), (loose[2].pk, "end")]
    assert [j.status for j in Job.objects.filter(pk__in=[j.pk for j in loose]).order_by("id")] == \
        ["done", "dead", "done"]

    assert store.job_replay([halt[1].pk], by="test").replayed == [halt[1].pk]
    wait_for(lambda: Job.objects.filter(pk__in=[j.pk for j in halt], status="done").count() == 3, timeout=20,
             what="h2 replayed and h3 done")
    assert [(job_id, event) for job_id, event, _ in runs_by_key()["acct-h"]] == [
        (halt[0].pk, "start"), (halt[0].pk, "end"), (halt[1].pk, "start"), (halt[1].pk, "failed"),
        (halt[1].pk, "start"), (halt[1].pk, "end"), (halt[2].pk, "start"), (halt[2].pk, "end")]
    assert store.sequence_halted() == []
