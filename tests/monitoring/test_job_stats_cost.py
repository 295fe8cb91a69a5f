"""The chart counters' trigger stays linear on a large statement, whatever the session ran before:
plpgsql keeps a generic plan once it has run the statement a few times, planned for the one-row
transition tables of renewals and completions; reused on a bulk cancel it joined every old row to
every new one (10,000 rows: 28 to 35 s; 20,000: 133 s). Renewals move nothing and insert nothing."""

from __future__ import annotations

import json
import re

import pytest
from django.db import connection
from flowlab.tasks import rated_noop

from django_leasequeue import store
from django_leasequeue.enqueueing import build_job
from django_leasequeue.models import Job, JobStat

pytestmark = pytest.mark.django_db(transaction=True)

N = 10_000


def trigger_ms(sql: str, params: list | None = None) -> float:
    with connection.cursor() as cur:
        cur.execute(f"EXPLAIN (ANALYZE, COSTS OFF) {sql}", params)
        plan = "\n".join(r[0] for r in cur.fetchall())
    return float(re.search(r"Trigger leasequeue_job_stat_count: time=([0-9.]+) calls=1", plan).group(1))


def test_a_bulk_cancel_after_many_small_statements_is_linear_and_renewals_insert_nothing():
    store.job_insert_many(build_job(rated_noop, [0], queue="bulk"), json.dumps([[i] for i in range(N + 20)]), None,
                          notify=False, channel="unused")
    connection.close()  # a fresh session: no cached plan yet
    # Small statements, as a worker or the admin runs all day: one-row claims, renewals, cancels.
    claimed = [c for _ in range(10) for c in store.job_claim(queues=["bulk"], limit=1, worker_id="w", lease=60,
                                                              rate_limits={})]
    for c in claimed:
        store.job_renew([(c.id, c.lease_version, 60)])
    rows = JobStat.objects.count()
    store.job_renew([(c.id, c.lease_version, 60) for c in claimed])
    assert JobStat.objects.count() == rows  # a renewal moves nothing: no counter row
    for c in claimed:
        store.job_complete([(c.id, c.lease_version, None)])
    ready = list(Job.objects.filter(status="ready").order_by("id").values_list("id", flat=True)[:10])
    for job_id in ready:
        store.job_request_cancel([job_id])

    # Well under a second here; the nested loop of the generic plan took 28 s.
    assert trigger_ms("UPDATE leasequeue_job SET status = 'cancelled', finished_at = leasequeue_now() "
                      "WHERE status = 'ready'") < 3000
    [t] = store.stat_totals(since=store.db_now().replace(year=2000))
    assert (t.started, t.done, t.cancelled) == (10, 10, N + 10)


def test_the_trigger_function_plans_hash_joins_and_never_compiles():
    with connection.cursor() as cur:
        cur.execute("SELECT proconfig FROM pg_proc WHERE proname = 'leasequeue_job_stat_count'")
        assert sorted(cur.fetchone()[0]) == ["enable_nestloop=off", "jit=off"]
