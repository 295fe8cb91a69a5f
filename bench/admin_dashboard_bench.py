"""Time the admin's pages on a job table of 1,000,000 rows (``--rows``): queries per page and wall time,
and the chart reads on the counters table of a busy installation.

Usage (from the repository root; use a database of its own: the job table is truncated)::

    createdb lq_admin_bench
    LEASEQUEUE_DB_NAME=lq_admin_bench python testproject/manage.py migrate -v 0
    LEASEQUEUE_DB_NAME=lq_admin_bench python bench/admin_dashboard_bench.py --reseed

The seed (``generate_series``, one statement) mimics a busy installation with a week of
retention: 80 % done, 2 % dead (each with an error entry of one of four types), 1 % cancelled,
16.9 % ready (60 % due within the last hour, the rest scheduled up to 30 days ahead, a tenth of
them waiting on a retry backoff with an error), 0.1 % leased; 8 queues, 20 tasks, kwargs of
about 300 bytes. It is analysed, not vacuumed (``--vacuum`` to vacuum too).

For each page (queue dashboard, job list, job list filtered to dead, dead letters, a job's page)
it prints the number of SQL statements, the median and max wall time of the whole request through
Django's test client (rendering included), and the slowest statement. Nothing is asserted.
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
SELECT 'bench.task_' || (g %% 20), 'q' || (g %% 8), (ARRAY[-10, 0, 0, 10])[1 + g %% 4], s.status,
       '[]',
       jsonb_build_object('account', g, 'period', '2026-11', 'note', repeat('x', 240)),
       CASE WHEN s.status <> 'ready' THEN x.fin
            WHEN g %% 10 < 6 THEN now() - random() * interval '1 hour'
            ELSE now() + random() * interval '30 days' END,
       CASE WHEN s.status = 'dead' THEN 5 WHEN s.status = 'ready' AND g %% 10 = 9 THEN 2 ELSE 1 END, 5,
       CASE WHEN s.status = 'leased' THEN now() + interval '30 seconds' END,
       '', 1, 'retained', false, 0,
       CASE WHEN s.status = 'dead' OR (s.status = 'ready' AND g %% 10 = 9) THEN jsonb_build_array(jsonb_build_object(
           'attempt', 1, 'type', (ARRAY['builtins.ValueError', 'builtins.ConnectionError', 'LeaseExpired',
                                        'builtins.KeyError'])[1 + g %% 4],
           'message', 'failed on account ' || g, 'traceback', repeat('  File "x.py", line 1, in f\\n', 12),
           'worker', 'bench:1:w', 'at', x.fin))
       ELSE '[]'::jsonb END,
       '[]',
       now() - interval '8 days', now() - interval '8 days', x.fin - random() * interval '10 seconds',
       CASE WHEN s.status IN ('done', 'dead', 'cancelled') THEN x.fin END
FROM generate_series(1, %(rows)s) AS g,
LATERAL (SELECT CASE WHEN g %% 1000 < 800 THEN 'done' WHEN g %% 1000 < 820 THEN 'dead'
                     WHEN g %% 1000 < 830 THEN 'cancelled' WHEN g %% 1000 < 999 THEN 'ready'
                     ELSE 'leased' END AS status) AS s,
-- "g * 0" makes the subquery depend on g, so random() runs per row, not once.
LATERAL (SELECT now() - random() * interval '7 days' + (g * 0) * interval '1 second' AS fin) AS x
"""


# The chart counters of a busy installation after the reaper's folds, for the same 8 queues and
# 20 tasks (all 160 pairs, the worst case for the reads): per minute for the last two hours (the
# last two minutes still in 4 writers' shards each), per hour for the last 49 hours, per day for
# 90 days (STATS_RETENTION). Every row's wait and run histograms have 6 buckets filled.
STAT_SEED = """
INSERT INTO leasequeue_job_stat (bucket, span, queue, task, shard, started, done, failed, dead, cancelled,
                                 wait_sum, wait_hist, run_sum, run_hist)
SELECT b.bucket, b.span, 'q' || q, 'bench.task_' || t, b.shard,
       b.n + 5, b.n, b.n / 50, b.n / 100, b.n / 200, b.n * 0.4,
       ARRAY[0, 0, b.n / 2, b.n / 4, b.n / 8, b.n / 16, 0, b.n / 32, 0, 0, 0, 0, 0, 1, 0]::bigint[],
       b.n * 0.12, ARRAY[0, b.n / 2, b.n / 4, b.n / 8, 0, b.n / 16, b.n / 32, 0, 0, 1, 0, 0, 0, 0, 0]::bigint[]
FROM generate_series(0, 7) AS q, generate_series(0, 19) AS t,
LATERAL (
    SELECT date_trunc('minute', now()) - m * interval '1 minute' AS bucket, 60 AS span, 0 AS shard, 40 AS n
    FROM generate_series(2, 119) AS m
    UNION ALL
    SELECT date_trunc('minute', now()) - m * interval '1 minute', 60, 1000 + w, 10
    FROM generate_series(0, 1) AS m, generate_series(1, 4) AS w
    UNION ALL
    SELECT date_trunc('hour', now()) - h * interval '1 hour', 3600, 0, 2400 FROM generate_series(2, 50) AS h
    UNION ALL
    SELECT date_trunc('day', now()) - d * interval '1 day', 86400, 0, 57600 FROM generate_series(2, 91) AS d
) AS b
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--reseed", action="store_true", help="truncate the job table and seed --rows rows")
    parser.add_argument("--vacuum", action="store_true", help="VACUUM ANALYZE after seeding (default: ANALYZE)")
    parser.add_argument("--repeat", type=int, default=5, help="timed requests per page")
    args = parser.parse_args()

    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.urls import reverse

    from django_leasequeue.models import Job

    table = Job._meta.db_table
    with connection.cursor() as cur:
        if args.reseed:
            print(f"seeding {args.rows:,} rows into {connection.settings_dict['NAME']}.{table} ...", flush=True)
            started = time.perf_counter()
            cur.execute(f"TRUNCATE {table} RESTART IDENTITY CASCADE")
            cur.execute(SEED, {"rows": args.rows})
            cur.execute("TRUNCATE leasequeue_job_stat RESTART IDENTITY")
            cur.execute(STAT_SEED)
            print(f"  seeded in {time.perf_counter() - started:.1f} s", flush=True)
        if args.reseed or args.vacuum:
            connection.ensure_connection()
            old_autocommit = connection.get_autocommit()
            connection.set_autocommit(True)
            cur.execute(f"{'VACUUM ANALYZE' if args.vacuum else 'ANALYZE'} {table}")
            cur.execute(f"{'VACUUM ANALYZE' if args.vacuum else 'ANALYZE'} leasequeue_job_stat")
            connection.set_autocommit(old_autocommit)
        cur.execute(f"SELECT status, count(*) FROM {table} GROUP BY status ORDER BY status")
        counts = cur.fetchall()
    total = sum(n for _, n in counts)
    if not total:
        print("the job table is empty: pass --reseed to seed it", file=sys.stderr)
        return 2
    print(f"job table: {total:,} rows: " + ", ".join(f"{s} {n:,}" for s, n in counts))
    with connection.cursor() as cur:
        cur.execute("SELECT span, count(*) FROM leasequeue_job_stat GROUP BY span ORDER BY span")
        print("chart counters: " + ", ".join(f"{n:,} rows of {span} s" for span, n in cur.fetchall()))

    user, _ = User.objects.get_or_create(username="bench-admin", defaults={"is_staff": True, "is_superuser": True})
    client = Client()
    client.force_login(user)
    some_dead = Job.objects.filter(status="dead").order_by("-id").values_list("id", flat=True).first()
    pages = {
        "queue dashboard (charts: last hour)": reverse("admin:django_leasequeue_dashboard_changelist"),
        "queue dashboard, range=day latency=day": reverse("admin:django_leasequeue_dashboard_changelist")
        + "?range=day&latency=day",
        "queue dashboard, range=month": reverse("admin:django_leasequeue_dashboard_changelist") + "?range=month",
        "queue page q3": reverse("admin:django_leasequeue_queue", args=["q3"]),
        "queue page q3, range=month": reverse("admin:django_leasequeue_queue", args=["q3"]) + "?range=month",
        "job list": reverse("admin:django_leasequeue_job_changelist"),
        "job list, status=dead": reverse("admin:django_leasequeue_job_changelist") + "?status=dead",
        "job list, queue=q3 task=bench.task_3": reverse("admin:django_leasequeue_job_changelist")
        + "?queue=q3&task=bench.task_3",
        "job list, page 50": reverse("admin:django_leasequeue_job_changelist") + "?p=50",
        "dead letters (with grouped counts)": reverse("admin:django_leasequeue_deadletter_changelist"),
        "a dead job's page": reverse("admin:django_leasequeue_job_change", args=[some_dead]),
    }
    print(f"\n{'page':40} {'queries':>7} {'median':>9} {'max':>9}  slowest statement")
    for name, url in pages.items():
        with CaptureQueriesContext(connection) as ctx:
            response = client.get(url)
        if response.status_code != 200:
            print(f"{name}: HTTP {response.status_code}", file=sys.stderr)
            return 1
        queries = list(ctx.captured_queries)  # a lazy view of a log the next request clears
        slowest = max(queries, key=lambda q: float(q["time"]))
        runs = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            client.get(url)
            runs.append((time.perf_counter() - started) * 1000)
        sql = " ".join(slowest["sql"].split())
        print(f"{name:40} {len(queries):>7} {statistics.median(runs):>7.0f} ms {max(runs):>6.0f} ms"
              f"  {float(slowest['time']) * 1000:.0f} ms: {sql[:90]}")
    print(f"\n{'chart read (health.charts)':40} {'queries':>7} {'median':>9} {'max':>9}")
    from django_leasequeue import health

    reads = {f"throughput({period!r})": (lambda p=period: health.throughput(p)) for period in ("hour", "day", "month")}
    reads |= {f"throughput({period!r}, queue='q3')": (lambda p=period: health.throughput(p, queue="q3"))
              for period in ("hour", "month")}
    reads |= {f"latency({period!r})": (lambda p=period: health.latency(p)) for period in ("hour", "day")}
    for name, read in reads.items():
        with CaptureQueriesContext(connection) as ctx:
            read()
        runs = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            read()
            runs.append((time.perf_counter() - started) * 1000)
        print(f"{name:40} {len(ctx.captured_queries):>7} {statistics.median(runs):>7.1f} ms {max(runs):>6.1f} ms")
    print("\n(times are whole requests through Django's test client, rendering included; the first "
          "request of each page warms the cache and is not counted)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
