"""What docs/explanation/claim-sql.md says about the claim's plan and the heartbeat's indexes.

The claim walks the partial index ``leasequeue_job_ready`` under the row lock (never a sequential
scan of the job table), and no index contains ``leased_until``, the column every heartbeat
changes (the precondition of HOT renewals).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from bench.health_bench import SEED, scans
from django_leasequeue import store

# Committed rows and VACUUM ANALYZE, as in tests/monitoring/test_query_plans.py: the planner must
# see a table like a real one, not statistics of an empty or rolled-back table.
pytestmark = pytest.mark.django_db(transaction=True)


def plan_of(sql: str, params: dict[str, Any]) -> dict[str, Any]:
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        plan = cur.fetchone()[0]
    return plan[0]["Plan"] if isinstance(plan, list) else plan


def ancestors_of(plan: dict[str, Any], index: str, above: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Node types above the first scan of ``index`` in a JSON plan (empty if it is not used)."""
    if plan.get("Index Name") == index:
        return above
    for child in plan.get("Plans", []):
        found = ancestors_of(child, index, (*above, str(plan["Node Type"])))
        if found:
            return found
    return ()


def test_claim_walks_the_ready_index_under_the_row_lock():
    with connection.cursor() as cur:
        cur.execute(SEED, {"rows": 20_000})
        cur.execute("VACUUM ANALYZE leasequeue_job")
    params = {"now": None, "limit": 10, "worker": "host:1:docs", "lease": 30.0, "claim": "docs",
              "queues": ["q1", "q2"], "tasks": None, "all_tasks": True}
    plan = plan_of(store.JOB_CLAIM, params)
    nodes = scans(plan, "leasequeue_job")
    assert "Index Scan (leasequeue_job_ready)" in nodes, nodes
    assert not [n for n in nodes if n.startswith("Seq Scan")], nodes
    # The candidates are locked where they are read: a LockRows node is an ancestor of the scan.
    assert "LockRows" in ancestors_of(plan, "leasequeue_job_ready")


@pytest.mark.parametrize("named", [True], ids=["queues"])
def test_claim_of_registered_tasks_keeps_the_plan(named):
    """A worker claims only its registered tasks (rolling deploys): the task test is a filter on the
    rows the same locked scan reads, not a new access path (and never a sequential scan of the job
    table)."""
    with connection.cursor() as cur:
        cur.execute(SEED, {"rows": 20_000})
        cur.execute("VACUUM ANALYZE leasequeue_job")
    every_task = {"now": None, "limit": 10, "worker": "host:1:docs", "lease": 30.0, "claim": "docs",
                  "queues": ["q1", "q2"] if named else None, "tasks": None, "all_tasks": True}
    params = {**every_task, "tasks": [f"bench.task_{i}" for i in range(12)], "all_tasks": False}
    sql = store.JOB_CLAIM if named else store.JOB_CLAIM_ANY_QUEUE
    plan = plan_of(sql, params)
    nodes = scans(plan, "leasequeue_job")
    assert not [n for n in nodes if n.startswith("Seq Scan")], nodes
    if named:
        assert nodes == scans(plan_of(sql, every_task), "leasequeue_job")
    else:
        # Every queue: the due ready rows are read from the ready index and sorted either way; with
        # a task list the planner may read them through a bitmap of the same index.
        assert {"Index Scan (leasequeue_job_ready)", "Bitmap Index Scan (leasequeue_job_ready)"} & set(nodes), nodes
    if named:
        assert "Index Scan (leasequeue_job_ready)" in nodes, nodes
        assert "LockRows" in ancestors_of(plan, "leasequeue_job_ready")


def test_no_index_contains_leased_until():
    with connection.cursor() as cur:
        cur.execute(
            """
            SELECT i.relname, pg_get_indexdef(i.oid) FROM pg_index x
            JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid
            WHERE t.relname = 'leasequeue_job'
            """
        )
        indexes = dict(cur.fetchall())
    assert "leasequeue_job_ready" in indexes and len(indexes) >= 8
    assert not {name: ddl for name, ddl in indexes.items() if "leased_until" in ddl}
