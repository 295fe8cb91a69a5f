"""The health statements read the partial indexes, not the whole job or workflow table.

A regression guard at a small scale (20,000 rows, analysed); ``bench/health_bench.py`` checks the
same on 1,000,000 rows and prints the timings.
"""

from __future__ import annotations

import pytest
from django.db import connection

from bench.health_bench import SEED, scans
from django_leasequeue.store import read

# Committed rows and VACUUM ANALYZE: after other tests' deletes the table holds dead pages, and
# statistics taken inside a rolled-back transaction would not describe the table the planner sees.
pytestmark = pytest.mark.django_db(transaction=True)


def plan_of(sql: str, params: dict) -> dict:
    # At this small scale the planner may rightly prefer a sequential scan of 20,000 rows, so the
    # test asks whether every scan of the job table CAN be served by an index (seqscan off): a scan
    # that still comes out sequential has no usable index. bench/health_bench.py checks the real
    # plan choice on 1,000,000 rows.
    with read.read_cursor(connection.alias) as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        cur.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        plan = cur.fetchone()[0]
    return plan[0]["Plan"] if isinstance(plan, list) else plan


def test_no_sequential_scan_of_the_job_table():
    with connection.cursor() as cur:
        cur.execute(SEED, {"rows": 20_000})
        cur.execute("VACUUM ANALYZE leasequeue_job")
    statements = {
        "snapshot": (read.QUEUE_STATS, {"now": None, "queues": None, "always": ["default"], "short": 300.0,
                                        "long": 3600.0, "widest": 3600.0}),
        "snapshot, some queues": (read.QUEUE_STATS, {"now": None, "queues": ["q1", "q2"], "always": ["q1", "q2"],
                                                     "short": 300.0, "long": 3600.0, "widest": 3600.0}),
        "lease report": (read.LEASE_REPORT, {"now": None, "window": 86400.0, "tasks": None}),
        "workflows": (read.WORKFLOW_STATS, {"now": None, "stuck_after": 3600.0}),
    }
    for name, (sql, params) in statements.items():
        nodes = scans(plan_of(sql, params), "leasequeue_job")
        assert nodes, name
        assert not [n for n in nodes if n.startswith("Seq Scan")], (name, nodes)
        if name.startswith("snapshot"):
            # The waiting jobs are counted from their own partial index.
            assert [n for n in nodes if n.endswith("(leasequeue_job_waiting)")], (name, nodes)


# 5,000 workflows, 1 in 50 unfinished (a third of those idle for two hours: stuck), each with two
# member jobs, the second depending on the first.
WORKFLOW_SEED = """
INSERT INTO leasequeue_workflow (kind, name, on_dependency_dead, created_at, closed_at, progressed_at, finished_at,
                                 members, members_pending, members_done, members_dead, members_cancelled)
SELECT 'chain', 'w' || g, 'hold', now() - interval '3 hours', now() - interval '3 hours',
       now() - (g % 3) * interval '1 hour', CASE WHEN g % 50 <> 0 THEN now() - interval '1 minute' END,
       2, 0, 2, 0, 0
FROM generate_series(1, 5000) AS g;
INSERT INTO leasequeue_job (task, queue, priority, status, args, kwargs, run_at, attempts, max_attempts, leased_by,
    lease_version, unique_scope, cancel_requested, snoozes, errors, history, created_at, workflow_id,
    workflow_step, workflow_role, waiting_on, has_dependents)
SELECT 'bench.step', 'q1', 0, CASE WHEN w.finished_at IS NULL AND s = 2 THEN 'waiting' ELSE 'done' END, '[]', '{}',
       now(), 1, 5, '', 1, 'retained', false, 0, '[]', '[]', now(), w.id, s::text, 'member',
       CASE WHEN w.finished_at IS NULL AND s = 2 THEN 1 ELSE 0 END, s = 1
FROM leasequeue_workflow w, generate_series(1, 2) AS s;
ANALYZE leasequeue_job;
INSERT INTO leasequeue_dependency (job_id, depends_on_id, name, resolved)
SELECT b.id, a.id, '1', a.status = 'done'
FROM leasequeue_job a JOIN leasequeue_job b ON b.workflow_id = a.workflow_id AND b.workflow_step = '2'
WHERE a.workflow_step = '1';
"""


def test_the_workflow_statement_reads_only_the_unfinished_workflows_and_one_workflow_s_jobs():
    with connection.cursor() as cur:
        cur.execute(WORKFLOW_SEED)
        cur.execute("VACUUM ANALYZE leasequeue_workflow")
        cur.execute("VACUUM ANALYZE leasequeue_job")
        cur.execute("VACUUM ANALYZE leasequeue_dependency")
    plan = plan_of(read.WORKFLOW_STATS, {"now": None, "stuck_after": 3600.0})
    workflow_scans = scans(plan, "leasequeue_workflow")
    # Both CTEs (the counts and the oldest stuck row) read the partial index of unfinished rows
    # (a bitmap heap scan follows its bitmap index scan and names no index of its own).
    assert workflow_scans and not [n for n in workflow_scans if n.startswith("Seq Scan")], workflow_scans
    assert {n.split(" (")[1] for n in workflow_scans if " (" in n} == {"leasequeue_workflow_active)"}, workflow_scans
    job_scans = scans(plan, "leasequeue_job")
    assert job_scans and not [n for n in job_scans if n.startswith("Seq Scan")], job_scans
    assert "Index Scan (leasequeue_job_workflow)" in job_scans or "Bitmap Index Scan (leasequeue_job_workflow)" \
        in job_scans, job_scans
    dependency_scans = scans(plan, "leasequeue_dependency")
    assert dependency_scans and not [n for n in dependency_scans if n.startswith("Seq Scan")], dependency_scans
