"""History at volume: the hot job table's heap and index sizes, and the claim, while millions of
jobs pass through, with the time-partitioned history (``LEASEQUEUE["HISTORY"]``) against the
ordinary retention pruner, round by round in the same run (interleaved).

Usage (from the repository root; ``scripts/bench`` sets up the same environment)::

    nice python bench/history_bench.py --jobs 1000000               # 1,000,000 jobs per variant
    python bench/history_bench.py --jobs 10000000 --checkpoints 1000000,5000000,10000000
    python bench/history_bench.py --only history --keep             # one variant, database kept

Each variant has its own database (``<db>_history``, ``<db>_prune``; ``--db``, default
``lqb_history``), migrated from the working tree. The jobs pass through in rounds of ``--round``
jobs; the variants alternate round by round, so that both see the same load on a shared machine.
One round, on the variant's database:

1. **enqueue**: ``enqueue_many()`` of ``--round`` ``bench.noop`` jobs (chunks of 20,000), the
   public bulk path;
2. **claim**: ``--claims`` single-job claims (``store.job_claim(limit=1)``, the worker's statement),
   each timed alone, then completed through ``store.job_complete``; the backlog is the round's
   ready jobs, the same every round, so a claim that slows down is the finished rows' doing;
3. **drain**: every other ready job is finished by one direct ``UPDATE`` (status done, a result,
   a finish time): the fast drain that makes 10,000,000 jobs affordable. A real worker writes each
   row twice (claim, then completion); this writes it once, so the hot table gets about half the
   dead tuples a real drain leaves: the sizes below are a lower bound for the same traffic;
4. **maintenance**, on a simulated clock (``now=``): the jobs of a round finish evenly over
   ``--round`` / ``--per-day`` days of simulated time, after the previous round's. ``history``:
   ``store.history_maintain()`` (partitions of ``--period``, ``HISTORY_MOVE_AFTER`` 300 s,
   ``RETENTION`` ``--retention``); ``prune``: ``store.job_prune()`` batches until none is left
   (the default pruner, same ``RETENTION``). Both in batches of 1,000 (``PRUNE_BATCH``).

5. **vacuum**: a plain ``VACUUM leasequeue_job`` (timed), unless ``--no-vacuum``. It stands in
   for the autovacuum runs the round's simulated time would hold (at 2,000,000 jobs a day a round
   of 100,000 is 72 minutes, in which autovacuum's one-minute naptime wakes it many times; the
   benchmark compresses that into seconds). Without it the heap of either variant only grows,
   as no dead tuple is reclaimed for reuse. Autovacuum stays on besides.

Reported at each checkpoint (jobs passed through per variant): claim ms p50 / p95 of that round
and the shared buffers one claim reads (``EXPLAIN (ANALYZE, BUFFERS)``, rolled back: independent
of the machine's load),
the hot table's heap and index sizes (``pg_relation_size``, ``pg_indexes_size``), its live and
dead tuples, the history's total size and partitions, and the maintenance's ms per 1,000 jobs.
Figures go to ``build/bench/history.json``, the table to stdout and ``build/bench/history.md``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timedelta

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
MANAGE = os.path.join(BENCH, "manage.py")
BUILD = os.path.join(REPO, "build", "bench")
sys.path[:0] = [BENCH, REPO]

import psycopg  # noqa: E402
import report_files  # noqa: E402

PG = {k: v for k, v in {"host": os.environ.get("PGHOST", "127.0.0.1"), "port": os.environ.get("PGPORT", "5432"),
                        "user": os.environ.get("PGUSER", "postgres"),
                        "password": os.environ.get("PGPASSWORD", "")}.items() if v}
MOVE_AFTER = 300.0  # the HISTORY_MOVE_AFTER default
BATCH = 1000  # the PRUNE_BATCH default

# The fast drain: every ready job done at once, their finish times spread evenly over the round's
# simulated interval in id order (jobs finish roughly in the order they were enqueued).
DRAIN = """
UPDATE leasequeue_job SET status = 'done', attempts = 1, lease_version = lease_version + 1,
    started_at = %(t0)s::timestamptz, attempted_at = %(t0)s::timestamptz, leased_by = 'bench',
    finished_at = %(t0)s::timestamptz + (id - %(first)s) * make_interval(secs => %(per_job)s),
    result = 'null'::jsonb
WHERE status = 'ready'
"""

SIZES = """
SELECT pg_relation_size('leasequeue_job'), pg_indexes_size('leasequeue_job'),
       (SELECT count(*) FROM leasequeue_job), coalesce(s.n_dead_tup, 0), coalesce(s.autovacuum_count, 0),
       (SELECT coalesce(sum(pg_total_relation_size(relid)), 0) FROM pg_partition_tree('leasequeue_job_history')),
       (SELECT count(*) FROM pg_partition_tree('leasequeue_job_history') WHERE isleaf),
       (SELECT count(*) FROM leasequeue_job_history)
FROM pg_stat_user_tables s WHERE s.relname = 'leasequeue_job'
"""


def log(msg: str) -> None:
    print(f"[history-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def admin(sql: str) -> None:
    with psycopg.connect(dbname=os.environ.get("PG_MAINTENANCE_DB", "postgres"), autocommit=True, **PG) as c:
        c.execute(sql)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, q in 0..100."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, -(-len(s) * q // 100) - 1))
    return s[int(k)]


def loadavg() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


def use(name: str) -> None:
    """Point Django's default connection at ``name``."""
    from django.db import connections

    connections.close_all()
    connections["default"].settings_dict["NAME"] = name


class Variant:
    """One database and its simulated clock."""

    def __init__(self, name: str, db: str, start: datetime) -> None:
        self.name, self.db, self.clock = name, db, start
        self.passed = 0
        self.maint_ms: list[float] = []
        self.maint_jobs = 0

    def round(self, cfg: argparse.Namespace) -> dict:
        from django.db import connection

        from django_leasequeue import store
        from django_leasequeue.enqueueing import enqueue_many

        use(self.db)
        span = timedelta(days=cfg.round / cfg.per_day)
        for start in range(0, cfg.round, 20_000):
            enqueue_many("bench.noop", [[] for _ in range(min(20_000, cfg.round - start))])
        claims: list[float] = []
        for _ in range(cfg.claims):
            t0 = time.perf_counter()
            claimed = store.job_claim(queues=["default"], limit=1, worker_id="bench", lease=30.0)
            claims.append((time.perf_counter() - t0) * 1000.0)
            store.job_complete([(c.id, c.lease_version, "null") for c in claimed], now=self.clock)
        buffers = claim_buffers()
        with connection.cursor() as cur:
            cur.execute("SELECT min(id) FROM leasequeue_job WHERE status = 'ready'")
            first = cur.fetchone()[0] or 0
            cur.execute(DRAIN, {"t0": self.clock, "first": first,
                                "per_job": span.total_seconds() / max(1, cfg.round - cfg.claims)})
        self.clock += span
        self.passed += cfg.round
        t0 = time.perf_counter()
        if self.name == "history":
            run = store.history_maintain(cfg.period, move_after=MOVE_AFTER, retention=cfg.retention, batch=BATCH,
                                         now=self.clock)
            jobs = run.moved
        else:
            jobs = 0
            while True:
                n = store.job_prune(older_than=cfg.retention, limit=BATCH, now=self.clock)
                jobs += n
                if n < BATCH:
                    break
        took = (time.perf_counter() - t0) * 1000.0
        self.maint_ms.append(took)
        self.maint_jobs += jobs
        vacuum_ms = None
        with connection.cursor() as cur:
            if cfg.vacuum:
                t0 = time.perf_counter()
                cur.execute("VACUUM leasequeue_job")
                vacuum_ms = (time.perf_counter() - t0) * 1000.0
            cur.execute(SIZES)
            heap, index, live, dead, autovacuums, history, parts, history_rows = cur.fetchone()
        return {"variant": self.name, "passed": self.passed, "clock": self.clock.isoformat(),
                "claim_p50": statistics.median(claims), "claim_p95": percentile(claims, 95),
                "claim_buffers": buffers,
                "heap": heap, "index": index, "live": live, "dead": dead, "autovacuums": autovacuums,
                "history": history, "partitions": parts, "history_rows": history_rows, "maint_jobs": jobs,
                "vacuum_ms": vacuum_ms,
                "maint_ms_per_1000": took / jobs * 1000.0 if jobs else None, "load": loadavg()}


def claim_buffers() -> int:
    """Shared buffers (hit + read) of one single-job claim, ``EXPLAIN (ANALYZE, BUFFERS)`` of the
    worker's statement (``store.JOB_CLAIM``), rolled back: what the claim reads, whatever the load."""
    import uuid

    from django.db import connection, transaction

    from django_leasequeue import store

    params = {"now": None, "limit": 1, "worker": "bench", "lease": 30.0, "claim": uuid.uuid4().hex[:16],
              "tasks": None, "all_tasks": True, "queues": ["default"]}
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + store.JOB_CLAIM, params)
        plan = cur.fetchone()[0][0]["Plan"]
        transaction.set_rollback(True)
    return int(plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0))


def mib(n: int) -> str:
    return f"{n / 2**20:,.1f}"


def report(cfg: argparse.Namespace, rows: list[dict], results: dict) -> str:
    lines = [f"### History at volume ({cfg.jobs:,} jobs per variant in rounds of {cfg.round:,}; "
             f"{cfg.per_day:,} jobs per simulated day; RETENTION {cfg.retention:g} s; history partitions "
             f"of one {cfg.period}, HISTORY_MOVE_AFTER {MOVE_AFTER:g} s)", "",
             f"Host: {os.cpu_count()} CPUs; load at start {results['load_start']}, at end {results['load_end']}; "
             f"PostgreSQL {results['server_version']}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. "
             "Fast drain by direct UPDATE (one write per job instead of a worker's two); autovacuum on"
             f"{', and a VACUUM of the job table after each round' if cfg.vacuum else ''}.", "",
             "| variant | jobs passed | claim ms p50 / p95 | claim buffers | hot heap MiB | hot indexes MiB "
             "| hot rows / dead tuples "
             "| history rows, MiB (partitions) | maintenance ms per 1,000 jobs | VACUUM ms | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        per = f"{r['maint_ms_per_1000']:.0f}" if r["maint_ms_per_1000"] is not None else "–"
        lines.append(f"| {r['variant']} | {r['passed']:,} | {r['claim_p50']:.2f} / {r['claim_p95']:.2f} "
                     f"| {r['claim_buffers']:,} "
                     f"| {mib(r['heap'])} | {mib(r['index'])} | {r['live']:,} / {r['dead']:,} "
                     f"| {r['history_rows']:,}, {mib(r['history'])} ({r['partitions']}) | {per} "
                     f"| {r['vacuum_ms'] if r['vacuum_ms'] is None else round(r['vacuum_ms'])} | {r['load']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1_000_000, help="jobs per variant (default 1,000,000)")
    ap.add_argument("--round", type=int, default=100_000, help="jobs per round (default 100,000)")
    ap.add_argument("--claims", type=int, default=200, help="timed single-job claims per round (default 200)")
    ap.add_argument("--checkpoints", default="", help="jobs passed at which to report, comma-separated "
                    "(default: the first round, every 1,000,000 and the last)")
    ap.add_argument("--per-day", type=int, default=2_000_000, help="jobs per simulated day (default 2,000,000)")
    ap.add_argument("--retention", type=float, default=6 * 3600.0, help="RETENTION, seconds (default 6 h)")
    ap.add_argument("--period", choices=["hour", "day"], default="hour", help="history partitions (default hour)")
    ap.add_argument("--no-vacuum", dest="vacuum", action="store_false",
                    help="no VACUUM of the job table after each round (autovacuum alone)")
    ap.add_argument("--only", choices=["history", "prune"], help="run one variant")
    ap.add_argument("--db", default="lqb_history", help="database name prefix (default lqb_history)")
    ap.add_argument("--keep", action="store_true", help="keep the databases")
    cfg = ap.parse_args(argv)
    if cfg.round <= cfg.claims or cfg.jobs % cfg.round:
        raise SystemExit("--round must be above --claims and divide --jobs")
    marks = ({int(x) for x in cfg.checkpoints.split(",") if x} if cfg.checkpoints else
             {cfg.round, cfg.jobs} | set(range(1_000_000, cfg.jobs + 1, 1_000_000)))
    os.makedirs(BUILD, exist_ok=True)
    names = [cfg.only] if cfg.only else ["history", "prune"]
    os.environ["LQBENCH_DB"] = f"{cfg.db}_{names[0]}"
    os.environ["DJANGO_SETTINGS_MODULE"] = "lqbench.settings"
    import django

    django.setup()
    import lqbench.tasks  # noqa: F401  (registers bench.noop)
    from django.db import connections

    results: dict = {"load_start": loadavg()}
    with psycopg.connect(dbname="postgres", **PG) as c:
        results["server_version"] = c.execute("SHOW server_version").fetchone()[0]
        start = c.execute("SELECT now()").fetchone()[0]
    variants = []
    for name in names:
        db = f"{cfg.db}_{name}"
        admin(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        admin(f'CREATE DATABASE "{db}"')
        subprocess.run([sys.executable, MANAGE, "migrate", "-v", "0"], env={**os.environ, "LQBENCH_DB": db},
                       check=True)
        variants.append(Variant(name, db, start))
    rows: list[dict] = []
    t_all = time.monotonic()
    try:
        for _ in range(cfg.jobs // cfg.round):
            for v in variants:
                r = v.round(cfg)
                if r["passed"] in marks:
                    rows.append(r)
                    log(f"{v.name}: {r['passed']:,} jobs, claim p50 {r['claim_p50']:.2f} ms p95 "
                        f"{r['claim_p95']:.2f} ms, {r['claim_buffers']} buffers, heap {mib(r['heap'])} MiB, "
                        f"indexes {mib(r['index'])} MiB, "
                        f"dead {r['dead']:,}, history {mib(r['history'])} MiB in {r['partitions']} partitions, "
                        f"load {r['load']}")
    finally:
        connections.close_all()
        if not cfg.keep:
            for v in variants:
                admin(f'DROP DATABASE IF EXISTS "{v.db}" WITH (FORCE)')
    results["load_end"] = loadavg()
    results["total_s"] = time.monotonic() - t_all
    path = report_files.save("history", report(cfg, rows, results),
                             {"config": vars(cfg), "results": results, "rows": rows})
    log(f"table: {path}; {results['total_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
