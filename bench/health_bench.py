"""Time the health queries on a large job table and check that no plan scans the whole table.

Usage (from the repository root; use a database of its own, the job table is truncated)::

    createdb lq_bench
    LEASEQUEUE_DB_NAME=lq_bench python testproject/manage.py migrate -v 0
    LEASEQUEUE_DB_NAME=lq_bench python bench/health_bench.py --rows 1000000 --reseed

The seed mimics a busy installation with a week of retention: 80 % done (finished over 7 days),
2 % dead, 1 % cancelled, 16.9 % ready (60 % of them due within the last hour, the rest scheduled
up to 30 days ahead), 0.1 % leased (5 % of those past their lease), 8 queues, 20 tasks, three
priorities. It is analysed but not vacuumed (a churning table rarely has an all-visible map).

Prints, per statement, the plan's scan nodes on ``leasequeue_job`` and fails (exit 1) if one is a
sequential scan; then the statements and wall time of ``health.snapshot()``, of a metrics scrape
and of ``health.lease_report()``. Timings are informative, not asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "testproject")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

SEED = """
INSERT INTO leasequeue_job (task, queue, priority, status, args, kwargs, run_at, attempts, max_attempts,
    leased_until, leased_by, lease_version, unique_scope, cancel_requested, snoozes, errors, history,
    created_at, started_at, attempted_at, finished_at)
SELECT 'bench.task_' || (g %% 20), 'q' || (g %% 8), (ARRAY[-10, 0, 0, 10])[1 + g %% 4], s.status, '[]', '{}',
       CASE WHEN s.status <> 'ready' THEN x.fin
            WHEN g %% 10 < 6 THEN now() - random() * interval '1 hour'
            ELSE now() + random() * interval '30 days' END,
       1, 5,
       CASE WHEN s.status = 'leased' THEN now() + interval '30 seconds'
            - (g %% 20 = 0)::int * interval '10 minutes' END,
       '', 1, 'retained', false, 0, '[]', '[]',
       now() - interval '8 days', now() - interval '8 days', x.fin - random() * interval '10 seconds',
       CASE WHEN s.status IN ('done', 'dead', 'cancelled') THEN x.fin END
FROM generate_series(1, %(rows)s) AS g,
LATERAL (SELECT CASE WHEN g %% 1000 < 800 THEN 'done' WHEN g %% 1000 < 820 THEN 'dead'
                     WHEN g %% 1000 < 830 THEN 'cancelled' WHEN g %% 1000 < 999 THEN 'ready'
                     ELSE 'leased' END AS status) AS s,
-- "g * 0" makes the subquery depend on g, so random() runs per row, not once.
LATERAL (SELECT now() - random() * interval '7 days' + (g * 0) * interval '1 second' AS fin) AS x
"""


def scans(plan: dict, table: str) -> list[str]:
    """Scan nodes of a JSON plan that read ``table`` or one of its indexes (named ``<table>_...``),
    as "Node Type (Index Name)"."""
    found = []
    if plan.get("Relation Name") == table or plan.get("Index Name", "").startswith(table + "_"):
        found.append(plan["Node Type"] + (f" ({plan['Index Name']})" if "Index Name" in plan else ""))
    for child in plan.get("Plans", []):
        found.extend(scans(child, table))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--reseed", action="store_true", help="truncate the job table and seed --rows rows")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs of each call")
    args = parser.parse_args()

    import django

    django.setup()
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_leasequeue import health, metrics
    from django_leasequeue.models import Job
    from django_leasequeue.store import read

    table = Job._meta.db_table
    with connection.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM {table}")
        count = cur.fetchone()[0]
        if args.reseed:
            print(f"seeding {args.rows:,} rows into {connection.settings_dict['NAME']}.{table} ...", flush=True)
            started = time.perf_counter()
            cur.execute(f"TRUNCATE {table} RESTART IDENTITY CASCADE")
            cur.execute(SEED, {"rows": args.rows})
            cur.execute(f"ANALYZE {table}")
            print(f"  seeded in {time.perf_counter() - started:.1f} s", flush=True)
            count = args.rows
        elif count == 0:
            print("the job table is empty: pass --reseed to seed it", file=sys.stderr)
            return 2
        cur.execute(f"SELECT status, count(*) FROM {table} GROUP BY status ORDER BY status")
        print(f"job table: {count:,} rows: " + ", ".join(f"{s} {n:,}" for s, n in cur.fetchall()))

    statements = {
        "snapshot: queue figures": (read.QUEUE_STATS, {
            "now": None, "queues": None, "always": ["default"], "short": 300.0, "long": 3600.0, "widest": 3600.0}),
        "snapshot: workflows": (read.WORKFLOW_STATS, {"now": None, "stuck_after": 3600.0}),
        "lease report (1 day)": (read.LEASE_REPORT, {"now": None, "window": 86400.0, "tasks": None}),
    }
    failed = False
    print("\nplans (scans of the job table):")
    for name, (sql, params) in statements.items():
        with read.read_cursor(connection.alias) as cur:
            cur.execute("EXPLAIN (FORMAT JSON) " + sql, params)
            plan = cur.fetchone()[0]
        plan = plan[0]["Plan"] if isinstance(plan, list) else plan
        nodes = scans(plan, table)
        seq = [n for n in nodes if n.startswith("Seq Scan")]
        failed |= bool(seq)
        print(f"  {name}: {'SEQ SCAN! ' if seq else ''}{'; '.join(nodes)}")

    def timed(fn, label):
        runs = []
        with CaptureQueriesContext(connection) as ctx:
            fn()
        statements_run = [q["sql"].split()[0] for q in ctx.captured_queries]
        for _ in range(args.repeat):
            started = time.perf_counter()
            fn()
            runs.append((time.perf_counter() - started) * 1000)
        print(f"  {label}: {len(statements_run)} statements ({' '.join(statements_run)}); "
              f"median {statistics.median(runs):.0f} ms, min {min(runs):.0f} ms, max {max(runs):.0f} ms "
              f"over {args.repeat} runs")

    print("\ntimings (first run warms the cache and is not counted):")
    timed(health.snapshot, "health.snapshot()")
    timed(metrics.render, "metrics scrape (render)")
    timed(lambda: health.lease_report(window=3600), "health.lease_report(window=1 h)")
    timed(health.lease_report, "health.lease_report(window=1 day)")
    if failed:
        print("\nFAIL: a plan scans the whole job table", file=sys.stderr)
        return 1
    print("\nOK: no sequential scan of the job table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
