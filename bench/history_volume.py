"""A time-partitioned history of 100,000,000 jobs: what its size costs the queue.

``bench/history_bench.py`` passes jobs through the hot table and shows that it stays small; this
one asks the other question: once the history itself holds a hundred million jobs (a long
``RETENTION`` at a high rate), what do the queue's own statements cost? It fills the history
directly (one ``INSERT ... SELECT generate_series`` per simulated day, copies of one real job
row), because passing 100,000,000 jobs through a worker takes days here, and at each checkpoint
measures on the database:

* the history's rows, partitions and size on disk (``pg_partition_tree``);
* **reading a moved job**: ``store.job_get`` of random moved ids (the hot table's miss, then the
  history's index on id, one probe per partition), ms p50 / p95, and the shared buffers one
  lookup reads (``EXPLAIN (ANALYZE, BUFFERS)``);
* **the claim** of the hot table, behind a backlog of 100,000 ready jobs: the buffers one
  single-job claim reads, and the ms of ``--claims`` timed claims;
* **the move**: ``store.history_maintain()`` of 100,000 done jobs from the hot table into the
  history, ms per 1,000 jobs;
* at the end, **retention**: the drop of the oldest partition (one simulated day), in ms.

Usage (from the repository root; about 3 GB of disk per 10,000,000 rows; the database is dropped
at the end unless ``--keep``)::

    nice .venv/bin/python bench/history_volume.py --rows 10000000              # a quick look
    nice .venv/bin/python bench/history_volume.py --rows 100000000 --checkpoints 10000000,50000000,100000000

Figures go to ``build/bench/history_volume.json``, the table to stdout and
``build/bench/history_volume.md``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from datetime import datetime, timedelta

import report_files
from history_bench import BATCH, DRAIN, MANAGE, MOVE_AFTER, admin, claim_buffers, loadavg, log, mib, percentile

BACKLOG = 100_000  # ready jobs in the hot table while the claim is measured, and jobs moved

# The columns a filled history row takes from its generated number g; every other column is the
# template job's (a real row made by enqueue_many, so every constraint of the job table holds).
FILLED = {
    "id": "%(first_id)s + g",
    "status": "'done'",
    "attempts": "1",
    "lease_version": "1",
    "leased_by": "'bench'",
    "result": "'null'::jsonb",
    "finished_at": "%(t0)s::timestamptz + g * make_interval(secs => %(per_job)s)",
    "created_at": "%(t0)s::timestamptz + g * make_interval(secs => %(per_job)s) - interval '2 seconds'",
    "run_at": "%(t0)s::timestamptz + g * make_interval(secs => %(per_job)s) - interval '2 seconds'",
    "started_at": "%(t0)s::timestamptz + g * make_interval(secs => %(per_job)s) - interval '1 second'",
    "attempted_at": "%(t0)s::timestamptz + g * make_interval(secs => %(per_job)s) - interval '1 second'",
}


def fill_sql(columns: list[str]) -> str:
    """The statement that inserts rows ``g`` in ``%(g0)s .. %(g1)s`` into the history."""
    exprs = [FILLED.get(c, f"t.{c}") for c in columns]
    return (f"INSERT INTO leasequeue_job_history ({', '.join(columns)}) "
            f"SELECT {', '.join(exprs)} FROM leasequeue_job t, generate_series(%(g0)s::bigint, %(g1)s::bigint) g "
            f"WHERE t.id = %(template)s")


def lookup_buffers(job_id: int) -> int:
    """Shared buffers (hit + read) of the history's lookup of ``job_id`` (``EXPLAIN (ANALYZE, BUFFERS)``)."""
    from django.db import connection

    from django_leasequeue.store.history import HISTORY_GET

    with connection.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + HISTORY_GET, {"id": job_id})
        plan = cur.fetchone()[0][0]["Plan"]
    return int(plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0))


def measure(cfg: argparse.Namespace, rows: int, t0: datetime, per_job: float, clock: datetime) -> dict:
    """The checkpoint's figures with ``rows`` rows in the history (their finish times from ``t0``,
    ``per_job`` seconds apart); ``clock`` is the simulated now, after the last of them."""
    from django.db import connection

    from django_leasequeue import store
    from django_leasequeue.enqueueing import enqueue_many

    with connection.cursor() as cur:
        cur.execute("SELECT coalesce(sum(pg_total_relation_size(relid)), 0), count(*) FILTER (WHERE isleaf) "
                    "FROM pg_partition_tree('leasequeue_job_history')")
        size, parts = cur.fetchone()
    # Reading moved jobs: random ids of the history (the hot table has none of them).
    ids = [cfg.first_id + random.randint(0, rows - 1) for _ in range(cfg.lookups)]
    reads: list[float] = []
    for job_id in ids:
        started = time.perf_counter()
        job = store.job_get(job_id)
        reads.append((time.perf_counter() - started) * 1000.0)
        if job is None or job.status != "done":
            raise RuntimeError(f"moved job {job_id} not found in the history")
    buffers_read = lookup_buffers(ids[0])
    # The claim behind a backlog, then the move of that backlog once done.
    for start in range(0, BACKLOG, 20_000):
        enqueue_many("bench.noop", [[] for _ in range(min(20_000, BACKLOG - start))])
    claims: list[float] = []
    for _ in range(cfg.claims):
        started = time.perf_counter()
        claimed = store.job_claim(queues=["default"], limit=1, worker_id="bench", lease=30.0)
        claims.append((time.perf_counter() - started) * 1000.0)
        store.job_complete([(c.id, c.lease_version, "null") for c in claimed], now=clock)
    buffers_claim = claim_buffers()
    with connection.cursor() as cur:
        cur.execute("SELECT min(id) FROM leasequeue_job WHERE status = 'ready'")
        first = cur.fetchone()[0] or 0
        cur.execute(DRAIN, {"t0": clock, "first": first, "per_job": 60.0 / BACKLOG})
    started = time.perf_counter()
    run = store.history_maintain("day", move_after=MOVE_AFTER, retention=cfg.retention, batch=BATCH,
                                 now=clock + timedelta(seconds=MOVE_AFTER + 120))
    move_ms = (time.perf_counter() - started) * 1000.0
    with connection.cursor() as cur:
        cur.execute("VACUUM leasequeue_job")  # the moved rows' dead tuples, as autovacuum would
    return {"rows": rows, "history_bytes": size, "partitions": parts,
            "read_p50": statistics.median(reads), "read_p95": percentile(reads, 95), "read_buffers": buffers_read,
            "claim_p50": statistics.median(claims), "claim_p95": percentile(claims, 95),
            "claim_buffers": buffers_claim, "moved": run.moved,
            "move_ms_per_1000": move_ms / run.moved * 1000.0 if run.moved else None, "load": loadavg()}


def report(cfg: argparse.Namespace, points: list[dict], results: dict) -> str:
    lines = [
        f"History of {cfg.rows:,} jobs ({cfg.per_day:,} a simulated day, partitions of a day), PostgreSQL "
        f"{results['server_version']}, load {results['load_start']} -> {results['load_end']}, "
        f"filled at {results['fill_rows_per_s']:,.0f} rows/s, {results['total_s']:.0f} s in all",
        "",
        "| rows in the history | size on disk MiB (partitions) | read a moved job ms p50 / p95 | buffers per read "
        "| claim ms p50 / p95 | claim buffers | move ms per 1,000 jobs |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in points:
        move = f"{p['move_ms_per_1000']:.0f}" if p["move_ms_per_1000"] is not None else "–"
        lines.append(f"| {p['rows']:,} | {mib(p['history_bytes'])} ({p['partitions']}) | {p['read_p50']:.2f} / "
                     f"{p['read_p95']:.2f} | {p['read_buffers']} | {p['claim_p50']:.2f} / {p['claim_p95']:.2f} | "
                     f"{p['claim_buffers']} | {move} |")
    if "drop_ms" in results:
        lines += ["", f"Dropping the oldest partition ({results['drop_rows']:,} rows): {results['drop_ms']:.0f} ms."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=100_000_000, help="rows in the history at the end "
                    "(default 100,000,000)")
    ap.add_argument("--checkpoints", default="", help="rows at which to measure, comma-separated (default: --rows)")
    ap.add_argument("--per-day", type=int, default=2_000_000, help="jobs per simulated day (default 2,000,000)")
    ap.add_argument("--lookups", type=int, default=200, help="timed reads of moved jobs per checkpoint (default 200)")
    ap.add_argument("--claims", type=int, default=200, help="timed single-job claims per checkpoint (default 200)")
    ap.add_argument("--db", default="lqb_history_volume", help="database name (dropped and made; "
                    "default lqb_history_volume)")
    ap.add_argument("--keep", action="store_true", help="keep the database")
    cfg = ap.parse_args(argv)
    marks = sorted({int(x) for x in cfg.checkpoints.split(",") if x} | {cfg.rows})
    days = -(-cfg.rows // cfg.per_day)
    cfg.retention = (days + 2) * 86400.0  # every filled day stays until the final drop
    cfg.first_id = 1_000_000_000  # history ids above anything the hot table's sequence hands out here
    os.environ["LQBENCH_DB"] = cfg.db
    os.environ["DJANGO_SETTINGS_MODULE"] = "lqbench.settings"
    import django

    django.setup()
    import lqbench.tasks  # noqa: F401  (registers bench.noop)
    from django.db import connection, connections

    from django_leasequeue import enqueue, store

    results: dict = {"load_start": loadavg()}
    admin(f'DROP DATABASE IF EXISTS "{cfg.db}" WITH (FORCE)')
    admin(f'CREATE DATABASE "{cfg.db}"')
    subprocess.run([sys.executable, MANAGE, "migrate", "-v", "0"], env=os.environ, check=True)
    points: list[dict] = []
    t_all = time.monotonic()
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT date_trunc('day', now()), current_setting('server_version')")
            today, results["server_version"] = cur.fetchone()
            t0 = today - timedelta(days=days)
            per_job = 86400.0 / cfg.per_day
            clock = t0 + timedelta(days=days)
            store.history_ensure_partitions("day", back=cfg.retention, now=clock)
            template = enqueue("bench.noop")
            cur.execute("SELECT attname FROM pg_attribute WHERE attrelid = 'leasequeue_job_history'::regclass "
                        "AND attnum > 0 AND NOT attisdropped ORDER BY attnum")
            insert = fill_sql([r[0] for r in cur.fetchall()])
        filled, fill_s = 0, 0.0
        for mark in marks:
            while filled < mark:
                step = min(cfg.per_day, mark - filled)
                started = time.perf_counter()
                with connection.cursor() as cur:
                    cur.execute(insert, {"first_id": cfg.first_id, "t0": t0, "per_job": per_job, "g0": filled,
                                         "g1": filled + step - 1, "template": template.id})
                fill_s += time.perf_counter() - started
                filled += step
                log(f"filled {filled:,} rows ({filled / fill_s:,.0f} rows/s), load {loadavg()}")
            with connection.cursor() as cur:
                cur.execute("VACUUM ANALYZE leasequeue_job_history")  # as autovacuum would have, long before
                cur.execute("DELETE FROM leasequeue_job WHERE id = %s", [template.id])
            point = measure(cfg, filled, t0, per_job, clock)
            points.append(point)
            log(f"{filled:,} rows: {mib(point['history_bytes'])} MiB in {point['partitions']} partitions, read "
                f"p50 {point['read_p50']:.2f} ms ({point['read_buffers']} buffers), claim p50 "
                f"{point['claim_p50']:.2f} ms ({point['claim_buffers']} buffers), move "
                f"{point['move_ms_per_1000'] or 0:.0f} ms per 1,000, load {point['load']}")
            template = enqueue("bench.noop")  # the next fill's template
            clock += timedelta(seconds=600)  # past the moved backlog, for the next checkpoint's
        results["fill_rows_per_s"] = filled / fill_s
        # Retention: the first filled day's partition (and the empty ones made before it) dropped.
        with connection.cursor() as cur:
            cur.execute("SELECT count(*) FROM leasequeue_job_history WHERE finished_at < %s",
                        [t0 + timedelta(days=1)])
            results["drop_rows"] = cur.fetchone()[0]
        started = time.perf_counter()
        dropped = store.history_drop_partitions(older_than=(days - 1) * 86400.0, now=clock)
        results["drop_ms"] = (time.perf_counter() - started) * 1000.0
        results["dropped"] = dropped
    finally:
        connections.close_all()
        if not cfg.keep:
            admin(f'DROP DATABASE IF EXISTS "{cfg.db}" WITH (FORCE)')
    results["load_end"] = loadavg()
    results["total_s"] = time.monotonic() - t_all
    path = report_files.save("history_volume", report(cfg, points, results),
                             {"config": vars(cfg), "results": results, "points": points})
    log(f"table: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
