"""Retention pruning at volume: the cost of each ``job_prune`` batch over thousands of batches in a
row with no vacuum in between, before (the statement walked from the oldest finished row) and after
(keyset: each batch starts after the last row the previous one deleted).

Usage (from the repository root; ``scripts/bench`` sets up the same environment)::

    python bench/prune_bench.py                          # 10,000,000 rows, 2,000 batches of 1,000
    nice python bench/prune_bench.py --rows 2000000      # a smaller table
    python bench/prune_bench.py --only after --keep      # the keyset pruner alone, databases kept
    python bench/prune_bench.py --hold-snapshot          # with a REPEATABLE READ snapshot held open

The history table: ``--rows`` finished jobs whose finish times are spread evenly over the last 350
days, 50 at a time at the same instant (completion batches), in id order (jobs finish roughly in
the order they were enqueued), so that with ``RETENTION`` at its default of 7 days 98 % of them are
past retention: a backlog, the situation in which the pruner runs thousands of batches in a row
(the pruner was stopped, or ``RETENTION`` was lowered). 97.5 % done, 2 % cancelled, 0.5 % dead
(never pruned by retention). Built once into ``<db>_tpl`` (secondary indexes dropped during the
insert, then rebuilt; ``VACUUM (FREEZE, ANALYZE)``), with autovacuum off on the job table, so that
nothing vacuums the rows the batches delete: the worst case, made reproducible.

Each variant runs on its own copy of that database (``CREATE DATABASE ... TEMPLATE``):

* ``before``: the statement of the previous release, kept here verbatim (``OLD_JOB_PRUNE``), on the
  index it was written for, ``(status, finished_at)`` (the copy's index is rebuilt so);
* ``after``: ``store.job_prune()`` on the index of migration 0018, ``(status, finished_at, id)``;
  then one batch of a new full pass (``PRUNE_FULL_PASS_EVERY`` later, from the oldest row, over
  everything the batches deleted) and 5 keyset batches after it.

With ``--hold-snapshot`` another session holds a ``REPEATABLE READ`` snapshot, taken before the
first batch, open until the variant ends (a long report, ``pg_dump``, a standby's
``hot_standby_feedback``): the deleted rows then stay visible to someone, so their index entries
cannot be marked dead either, and a walk over them visits every heap tuple.

``--batches`` batches of ``--batch`` rows, each in its own transaction (autocommit), each timed
alone; reported: ms per batch p50 / p95 / max of the first and of the last 100 batches, and
``EXPLAIN (ANALYZE, BUFFERS)`` of the first batch and of the batch after the last one (rolled
back): the shared buffers the scans of the finished index read, which do not depend on the
machine's load. Plans go to ``build/bench/prune-plan-<variant>-<first|last>.txt``, figures to
``build/bench/prune.json`` and the table to stdout and ``build/bench/prune.md``.

Databases ``<db>_tpl``, ``<db>_before``, ``<db>_after`` (``--db``, default ``lq_prunebench``) are
dropped at the end unless ``--keep``. Disk: about 0.5 GB per million rows per database.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta

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
RETENTION = 7 * 86400.0  # the RETENTION default
INDEX_NAME = "leasequeue_job_finished"
INDEX_CONDITION = "WHERE status IN ('done', 'dead', 'cancelled')"

# The retention pruner's statement before the keyset (django_leasequeue/store/maintenance.py with
# migrations up to 0016): each subquery walks leasequeue_job_finished (status, finished_at) from the
# oldest entry, over the entries of every row deleted since the last vacuum.
_STILL_READ = """NOT EXISTS (SELECT 1 FROM leasequeue_workflow w WHERE w.id = j.workflow_id AND w.finished_at IS NULL)
      AND NOT (j.has_dependents AND EXISTS (
          SELECT 1 FROM leasequeue_dependency d JOIN leasequeue_job dj ON dj.id = d.job_id
          WHERE d.depends_on_id = j.id AND dj.status IN ('waiting', 'cancelled')))"""
OLD_JOB_PRUNE = f"""
WITH clock AS MATERIALIZED (SELECT coalesce(%(now)s::timestamptz, leasequeue_now()) AS now),
done_old AS (
    SELECT j.id FROM leasequeue_job j
    WHERE j.status = 'done' AND j.finished_at < (SELECT now FROM clock) - make_interval(secs => %(age)s)
      AND {_STILL_READ}
    ORDER BY j.finished_at
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
),
cancelled_old AS (
    SELECT j.id FROM leasequeue_job j
    WHERE j.status = 'cancelled' AND j.finished_at < (SELECT now FROM clock) - make_interval(secs => %(age)s)
      AND {_STILL_READ}
    ORDER BY j.finished_at
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
),
deleted AS (
    DELETE FROM leasequeue_job gone
    WHERE gone.id IN (SELECT u.id FROM (SELECT id FROM done_old UNION ALL SELECT id FROM cancelled_old) AS u
                      LIMIT %(limit)s)
    RETURNING gone.id, gone.workflow_id
),
edges_in AS (
    DELETE FROM leasequeue_dependency d WHERE d.job_id IN (SELECT id FROM deleted)
),
edges_out AS (
    DELETE FROM leasequeue_dependency d WHERE d.depends_on_id IN (SELECT id FROM deleted)
)
SELECT count(*), coalesce(array_agg(DISTINCT workflow_id) FILTER (WHERE workflow_id IS NOT NULL), '{{}}')
FROM deleted
"""

SEED = """
INSERT INTO leasequeue_job (
    task, queue, priority, status, args, kwargs, run_at, attempts, max_attempts, leased_by, lease_version,
    unique_scope, cancel_requested, snoozes, errors, history, created_at, started_at, attempted_at,
    finished_at, result)
SELECT 'bench.noop', 'default', 0, s.status, '[]', '{}', x.fin - interval '2 seconds', 1, 5, 'w', 1,
       'retained', false, 0, '[]', '[]', x.fin - interval '2 seconds', x.fin - interval '1 second',
       x.fin - interval '1 second', x.fin, CASE WHEN s.status = 'done' THEN '"ok"'::jsonb END
FROM generate_series(%(start)s::bigint, %(stop)s::bigint) AS g,
LATERAL (SELECT CASE WHEN g %% 200 = 3 THEN 'dead' WHEN g %% 50 = 7 THEN 'cancelled' ELSE 'done' END AS status) AS s,
-- 50 rows per instant, evenly over the 350 days before %(end)s, in id order.
LATERAL (SELECT %(end)s::timestamptz - interval '350 days'
                + (g / 50) * (interval '350 days' / greatest(%(rows)s / 50, 1)) AS fin) AS x
"""


def log(msg: str) -> None:
    print(f"[prune-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def connect(db: str) -> psycopg.Connection:
    return psycopg.connect(dbname=db, autocommit=True, **PG)


def admin(sql: str) -> None:
    with connect(os.environ.get("PG_MAINTENANCE_DB", "postgres")) as c:
        c.execute(sql)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, q in 0..100."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, -(-len(s) * q // 100) - 1))
    return s[int(k)]


def build_template(tpl: str, rows: int) -> dict:
    """Create ``tpl``: migrated, the history seeded, indexes rebuilt, frozen and analysed."""
    t0 = time.monotonic()
    admin(f'DROP DATABASE IF EXISTS "{tpl}" WITH (FORCE)')
    admin(f'CREATE DATABASE "{tpl}"')
    subprocess.run([sys.executable, MANAGE, "migrate", "-v", "0"], env={**os.environ, "LQBENCH_DB": tpl}, check=True)
    with connect(tpl) as c:
        c.execute("SET maintenance_work_mem = '256MB'")
        c.execute("ALTER TABLE leasequeue_job SET (autovacuum_enabled = false, toast.autovacuum_enabled = false)")
        defs = c.execute("SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index "
                         "WHERE indrelid = 'leasequeue_job'::regclass AND NOT indisprimary").fetchall()
        for name, _ in defs:
            c.execute(f'DROP INDEX "{name}"')
        end = c.execute("SELECT now()").fetchone()[0]
        for start in range(1, rows + 1, 1_000_000):
            c.execute(SEED, {"start": start, "stop": min(rows, start + 999_999), "rows": rows, "end": end})
            log(f"seeded {min(rows, start + 999_999):,} of {rows:,} rows")
        for _, ddl in defs:
            c.execute(ddl)
        c.execute("VACUUM (FREEZE, ANALYZE) leasequeue_job")
        size = c.execute("SELECT pg_total_relation_size('leasequeue_job')").fetchone()[0]
        due = c.execute("SELECT count(*) FROM leasequeue_job WHERE status IN ('done', 'cancelled') "
                        "AND finished_at < now() - make_interval(secs => %s)", [RETENTION]).fetchone()[0]
    took = time.monotonic() - t0
    log(f"built {tpl}: {rows:,} rows, {size / 2**30:.2f} GiB, {due:,} past retention, in {took:.0f} s")
    return {"rows": rows, "table_gib": size / 2**30, "due": due, "build_s": took}


def copy_of(tpl: str, name: str) -> None:
    admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin(f'CREATE DATABASE "{name}" TEMPLATE "{tpl}"')


def use(name: str) -> None:
    """Point Django's default connection at ``name``."""
    from django.db import connections

    connections.close_all()
    connections["default"].settings_dict["NAME"] = name


def finished_index_buffers(plan: dict) -> int:
    """Shared buffers (hit + read) of the nodes of a JSON plan that scan the finished index."""
    own = plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0) if (
        plan.get("Index Name") == INDEX_NAME) else 0
    return own + sum(finished_index_buffers(p) for p in plan.get("Plans", []))


def explain(sql: str, params: dict, path: str) -> dict:
    """EXPLAIN ANALYZE one batch, rolled back; write the text plan to ``path``."""
    from django.db import connection, transaction

    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
        plan = cur.fetchone()[0][0]
        transaction.set_rollback(True)
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql, params)
        text = "\n".join(r[0] for r in cur.fetchall())
        transaction.set_rollback(True)
    with open(path, "w") as f:
        f.write(text + "\n")
    top = plan["Plan"]
    return {"execution_ms": plan["Execution Time"], "finished_index_buffers": finished_index_buffers(top),
            "total_buffers": top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)}


def summary(times: list[float]) -> dict:
    return {"p50": percentile(times, 50), "p95": percentile(times, 95), "max": max(times)}


def run_variant(variant: str, db: str, batches: int, batch: int, hold_snapshot: bool) -> dict:
    """Run ``batches`` batches on database ``db`` with the ``before`` or ``after`` pruner."""
    if variant == "before":  # the old statement on the index it was written for
        with connect(db) as c:
            t0 = time.monotonic()
            c.execute(f"DROP INDEX {INDEX_NAME}")
            c.execute(f"CREATE INDEX {INDEX_NAME} ON leasequeue_job (status, finished_at) {INDEX_CONDITION}")
            c.execute("ANALYZE leasequeue_job")
            log(f"{variant}: index rebuilt as (status, finished_at) in {time.monotonic() - t0:.0f} s")
    if not hold_snapshot:
        return _run_variant(variant, db, batches, batch)
    with connect(db) as analyst:
        analyst.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        analyst.execute("SELECT count(*) FROM leasequeue_job").fetchone()  # the snapshot is taken here
        try:
            return _run_variant(variant, db, batches, batch)
        finally:
            analyst.execute("ROLLBACK")


def _run_variant(variant: str, db: str, batches: int, batch: int) -> dict:
    from django.db import connection

    from django_leasequeue import store

    use(db)
    with connection.cursor() as cur:
        cur.execute("SELECT pg_size_pretty(pg_relation_size(%s))", [INDEX_NAME])
        index_size = cur.fetchone()[0]
    params = {"now": None, "age": RETENTION, "limit": batch, "every": store.PRUNE_FULL_PASS_EVERY}
    sql = OLD_JOB_PRUNE if variant == "before" else store.JOB_PRUNE

    def one_batch() -> int:
        if variant == "after":
            return store.job_prune(older_than=RETENTION, limit=batch)
        with connection.cursor() as cur:
            cur.execute(OLD_JOB_PRUNE, params)
            deleted, workflows = cur.fetchone()
            assert not workflows  # the seed has no workflows (JOB_PRUNE_WORKFLOWS would run)
        return int(deleted)

    result: dict = {"index_size": index_size,
                    "explain_first": explain(sql, params, os.path.join(BUILD, f"prune-plan-{variant}-first.txt"))}
    times: list[float] = []
    t_all = time.monotonic()
    for i in range(batches):
        t0 = time.perf_counter()
        n = one_batch()
        times.append((time.perf_counter() - t0) * 1000.0)
        if n != batch:
            raise SystemExit(f"{variant}: batch {i + 1} deleted {n} rows, not {batch}: the table is too small "
                             f"for {batches} batches of {batch} (use fewer --batches or more --rows)")
        if (i + 1) % 250 == 0:
            log(f"{variant}: {i + 1} batches, last 250 p50 {statistics.median(times[-250:]):.1f} ms")
    result["total_s"] = time.monotonic() - t_all
    result["explain_last"] = explain(sql, params, os.path.join(BUILD, f"prune-plan-{variant}-last.txt"))
    result["first100"], result["last100"] = summary(times[:100]), summary(times[-100:])
    result["times"] = times
    if variant == "after":
        # A new full pass (as PRUNE_FULL_PASS_EVERY later): its first batch walks, from the oldest
        # row, the entries of everything the batches above deleted; the keyset batches after it do not.
        now = store.db_now() + timedelta(seconds=store.PRUNE_FULL_PASS_EVERY)
        t0 = time.perf_counter()
        store.job_prune(older_than=RETENTION, limit=batch, now=now)
        result["full_pass_first_ms"] = (time.perf_counter() - t0) * 1000.0
        after = []
        for _ in range(5):
            t0 = time.perf_counter()
            store.job_prune(older_than=RETENTION, limit=batch, now=now)
            after.append((time.perf_counter() - t0) * 1000.0)
        result["after_full_pass_ms"] = after
    return result


def report(cfg: argparse.Namespace, built: dict, results: dict) -> str:
    lines = [f"### Retention prune at volume ({built['rows']:,} rows, {built['table_gib']:.2f} GiB; "
             f"{cfg.batches:,} batches of {cfg.batch:,} in a row; autovacuum off on the job table"
             f"{'; a REPEATABLE READ snapshot held open' if cfg.hold_snapshot else ''})", "",
             f"Host: {os.cpu_count()} CPUs; load at start {results['load_start']}, at end {results['load_end']}; "
             f"PostgreSQL {results['server_version']}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", "",
             "| pruner | first 100 batches, ms p50 / p95 / max | last 100 batches, ms p50 / p95 / max "
             "| finished-index buffers, first batch / batch after the last | index size |",
             "|---|---|---|---|---|"]
    names = {"before": "before: walk from the oldest row, index (status, finished_at)",
             "after": "after: keyset, index (status, finished_at, id)"}
    for variant in ("before", "after"):
        r = results.get(variant)
        if not r:
            continue
        f, la = r["first100"], r["last100"]
        bufs = r["explain_first"]["finished_index_buffers"], r["explain_last"]["finished_index_buffers"]
        lines.append(f"| {names[variant]} | {f['p50']:.1f} / {f['p95']:.1f} / {f['max']:.1f} "
                     f"| {la['p50']:.1f} / {la['p95']:.1f} / {la['max']:.1f} "
                     f"| {bufs[0]:,} / {bufs[1]:,} | {r['index_size']} |")
    if "after" in results:
        r = results["after"]
        lines += ["", f"After the {cfg.batches:,} batches, the first batch of a new full pass (from the oldest row, "
                  f"over the {cfg.batches * cfg.batch:,} deleted rows not yet vacuumed) took "
                  f"{r['full_pass_first_ms']:.0f} ms; the 5 keyset batches after it "
                  + ", ".join(f"{t:.1f}" for t in r["after_full_pass_ms"]) + " ms."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000, help="history rows (default 10,000,000)")
    ap.add_argument("--batches", type=int, default=2000, help="batches in a row (default 2,000)")
    ap.add_argument("--batch", type=int, default=1000, help="rows per batch (default 1,000, PRUNE_BATCH)")
    ap.add_argument("--only", choices=["before", "after"], help="run one variant")
    ap.add_argument("--db", default="lq_prunebench", help="database name prefix (default lq_prunebench)")
    ap.add_argument("--hold-snapshot", action="store_true",
                    help="hold a REPEATABLE READ snapshot open in another session during each variant")
    ap.add_argument("--keep", action="store_true", help="keep the databases")
    cfg = ap.parse_args(argv)
    os.makedirs(BUILD, exist_ok=True)
    os.environ["LQBENCH_DB"] = f"{cfg.db}_tpl"
    os.environ["DJANGO_SETTINGS_MODULE"] = "lqbench.settings"
    import django

    django.setup()
    from django.db import connections

    tpl = f"{cfg.db}_tpl"
    variants = [cfg.only] if cfg.only else ["before", "after"]
    results: dict = {"load_start": " ".join(open("/proc/loadavg").read().split()[:3])}
    with connect("postgres") as c:
        results["server_version"] = c.execute("SHOW server_version").fetchone()[0]
    try:
        built = build_template(tpl, cfg.rows)
        if built["due"] < cfg.batches * cfg.batch:
            raise SystemExit(f"{built['due']:,} rows past retention: fewer than {cfg.batches:,} batches of "
                             f"{cfg.batch:,}; use fewer --batches or more --rows")
        for variant in variants:
            connections.close_all()
            name = f"{cfg.db}_{variant}"
            copy_of(tpl, name)
            log(f"{variant}: {cfg.batches:,} batches of {cfg.batch:,} on {name}")
            results[variant] = run_variant(variant, name, cfg.batches, cfg.batch, cfg.hold_snapshot)
            r = results[variant]
            bufs = r["explain_first"]["finished_index_buffers"], r["explain_last"]["finished_index_buffers"]
            log(f"{variant}: first 100 p50 {r['first100']['p50']:.1f} ms, last 100 p50 {r['last100']['p50']:.1f} ms, "
                f"max {r['last100']['max']:.1f} ms; finished-index buffers {bufs[0]} -> {bufs[1]}, "
                f"{r['total_s']:.0f} s")
            connections.close_all()
            if not cfg.keep:
                admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        connections.close_all()
        if not cfg.keep:
            admin(f'DROP DATABASE IF EXISTS "{tpl}" WITH (FORCE)')
            for variant in variants:
                admin(f'DROP DATABASE IF EXISTS "{cfg.db}_{variant}" WITH (FORCE)')
    results["load_end"] = " ".join(open("/proc/loadavg").read().split()[:3])
    path = report_files.save("prune", report(cfg, built, results),
                             {"config": vars(cfg), "built": built, "results": results})
    log(f"table: {path}; plans and figures: {BUILD}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
