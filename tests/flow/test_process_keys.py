"""Per-key rate limits and fair claiming with real ``runworker`` processes.

Measured figures are printed (run pytest with ``-s`` to see them).
"""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from django.db import connection
from flowlab.tasks import keyed_rate, tenant_job

from django_leasequeue import enqueue_many, store
from django_leasequeue.enqueueing import build_job
from django_leasequeue.models import Job
from tests.conftest import wait_for

from .conftest import wait_workers, worker_env

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

BIG = 100_000


def enqueue_big_tenant(n: int) -> None:
    """``n`` jobs of tenant "big", in one INSERT (copies of one enqueued job, ids in seq order):
    enqueueing them one by one would take longer than the measurement."""
    template = store.job_insert_one(build_job(tenant_job, ["big", 0]), notify=False, channel="unused")
    assert template is not None
    with connection.cursor() as cur:
        cur.execute("""
            INSERT INTO leasequeue_job (task, queue, priority, status, args, kwargs, run_at, attempts, max_attempts,
                leased_by, lease_version, unique_scope, cancel_requested, snoozes, errors, history, created_at,
                fair_key)
            SELECT t.task, t.queue, t.priority, 'ready', jsonb_build_array('big', g), t.kwargs, t.run_at, 0,
                   t.max_attempts, '', 0, t.unique_scope, false, 0, '[]', '[]', t.created_at, t.fair_key
            FROM leasequeue_job t, generate_series(1, %s) AS g WHERE t.id = %s ORDER BY g
        """, [n - 1, template.pk])
        cur.execute("ANALYZE leasequeue_job")


def small_tenant_started() -> list[tuple[int, float | None]]:
    """(seq, seconds from enqueue to first claim) of the small tenant's jobs, by seq."""
    return [(args[1], None if started is None else (started - created).total_seconds())
            for args, created, started in Job.objects.filter(fair_key="small").order_by("id")
            .values_list("args", "created_at", "started_at")]


def test_a_small_tenant_starts_within_a_second_behind_a_100000_job_backlog_only_when_fair(spawn):
    enqueue_big_tenant(BIG)
    # Plain claiming: a worker busy with the big tenant's backlog reaches the small tenant's 10
    # jobs only after the backlog (minutes): none has started after 1.5 s.
    plain = spawn("runworker", "--queues", "flow", "--concurrency", "4", "--worker-id", "plain",
                  env=worker_env())
    wait_workers(1)
    wait_for(lambda: Job.objects.filter(status="done").exists(), timeout=30, what="the plain worker runs")
    enqueue_many(tenant_job, [["small", i] for i in range(10)])
    time.sleep(1.5)
    plain_started = small_tenant_started()
    plain.kill()
    assert [started for _, started in plain_started] == [None] * 10
    done_plain = Job.objects.filter(status="done", fair_key="big").count()
    # Fair claiming: the same backlog, 10 more small-tenant jobs enqueued while the worker is busy.
    Job.objects.filter(fair_key="small").delete()
    env = worker_env(LEASEQUEUE_QUEUES=json.dumps({"flow": {"fair": True}}))
    spawn("runworker", "--queues", "flow", "--concurrency", "4", "--worker-id", "fair", env=env)
    wait_for(lambda: Job.objects.filter(status="done", leased_by__endswith="fair").exists(), timeout=30,
             what="the fair worker runs")
    enqueue_many(tenant_job, [["small", i] for i in range(10)])
    wait_for(lambda: Job.objects.filter(fair_key="small", status="done").count() == 10, timeout=10,
             interval=0.02, what="the small tenant's 10 jobs done")
    fair_started = small_tenant_started()
    assert [seq for seq, _ in fair_started] == list(range(10))
    worst = max(started for _, started in fair_started if started is not None)
    assert worst < 1.0
    # In key order: the small tenant's jobs were claimed in enqueue order, each once.
    claims = list(Job.objects.filter(fair_key="small").order_by("id").values_list("started_at", "attempts"))
    assert [a for _, a in claims] == [1] * 10
    assert [s for s, _ in claims] == sorted(s for s, _ in claims)
    big_left = Job.objects.filter(fair_key="big", status="ready").count()
    print(f"\nfair claiming: small tenant behind {BIG} big-tenant jobs; plain claim: 0 of 10 started in 1.5 s "
          f"({done_plain} big jobs done meanwhile); fair claim: all 10 started within {worst * 1000:.0f} ms of "
          f"their enqueue ({big_left} big jobs still ready)")
    assert big_left > 0  # the small tenant did not simply wait for the backlog to drain


def test_a_rate_limit_per_key_holds_across_two_worker_processes(spawn):
    """3 customers x 15 jobs, 5 per second per customer, 2 processes x 4 threads: no customer has
    more than 5 claims in any 1-second window, every job runs once, and the customers run side by
    side (each customer's 15 jobs need at least 2 s, all 45 together not much longer)."""
    for i in range(2):
        spawn("runworker", "--queues", "flow", "--concurrency", "4", "--worker-id", f"k{i}", env=worker_env())
    wait_workers(2)
    started = time.monotonic()
    enqueue_many(keyed_rate, [[c, s] for c in ("a", "b", "c") for s in range(15)])
    wait_for(lambda: Job.objects.filter(status="done").count() == 45, timeout=20, interval=0.05,
             what="45 rate-keyed jobs done")
    elapsed = time.monotonic() - started
    rows = list(Job.objects.values_list("rate_key", "args", "attempts", "attempted_at"))
    assert sorted((key, args[1], attempts) for key, args, attempts, _ in rows) == sorted(
        (f"customer-{c}", s, 1) for c in ("a", "b", "c") for s in range(15))
    worst = {}
    for customer in ("a", "b", "c"):
        stamps = sorted(t for key, _, _, t in rows if key == f"customer-{customer}")
        worst[customer] = max(sum(1 for t in stamps[i:] if t <= start + timedelta(seconds=1))
                              for i, start in enumerate(stamps))
        span = (stamps[-1] - stamps[0]).total_seconds()
        assert span >= 2.0 - 0.05, (customer, span)  # 15 claims at 5/s: three windows
    assert worst == {"a": 5, "b": 5, "c": 5}
    print(f"\nrate limit per key 5/s: 3 customers x 15 jobs on 2x4 threads in {elapsed:.2f} s, busiest 1 s "
          f"window per customer {worst}")
    assert elapsed < 12  # side by side (one customer after another would need 3 x 2 s plus polls)
