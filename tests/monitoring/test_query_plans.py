"""The health statements read the partial indexes, not the whole job table.

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
    }
    for name, (sql, params) in statements.items():
        nodes = scans(plan_of(sql, params), "leasequeue_job")
        assert nodes, name
        assert not [n for n in nodes if n.startswith("Seq Scan")], (name, nodes)
