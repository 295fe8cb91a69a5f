"""The benchmark's scale and WAL modules: they import, their options parse, and their /proc and
pg_walinspect readings count what they say, on the real server (the figures themselves are the
benchmark's business, not the tests')."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from bench import scale_bench, wal_bench
from bench.peer_adapter import wal_harness

ROOT = Path(__file__).resolve().parent.parent


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (bench/run.py puts bench/ first on sys.path at import)."""
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_run_parses_the_scale_and_wal_options():
    code = ("import json, sys; sys.path.insert(0, 'bench'); import run; "
            "full = run.parse_args(['--only', 'scale,wal']); "
            "quick = run.parse_args(['--quick', '--only', 'scale', '--scale-processes', '8,1,8', "
            "'--scale-no-pgbouncer']); "
            "print(json.dumps([sorted(full.sections), full.scale, full.wal_n, quick.scale, quick.wal_n]))")
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    sections, full, wal_n, quick, quick_wal_n = json.loads(done.stdout)
    assert sections == ["scale", "wal"]
    assert full == {"processes": [1, 2, 4, 8, 16, 32], "jobs": 50_000, "pgbouncer": True, "pool_size": 20}
    assert wal_n == 10_000
    assert quick == {"processes": [1, 8], "jobs": 2000, "pgbouncer": False, "pool_size": 20}
    assert quick_wal_n == 1000


def test_run_refuses_a_bad_process_count():
    done = run_python("import sys; sys.path.insert(0, 'bench'); import run; run.parse_args(['--scale-processes', '0'])")
    assert done.returncode == 1
    assert "--scale-processes: positive integers" in done.stderr


def test_wal_harness_help_names_its_arguments():
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "peer_adapter" / "wal_harness.py"), "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for option in ("harness", "system", "--n", "--reps", "--db-prefix", "--paths"):
        assert option in done.stdout


@pytest.mark.django_db
def test_connections_per_process_counts_this_process_connections_to_the_server():
    params = connection.get_connection_params()
    port = int(params.get("port") or 5432)
    before = scale_bench.connections_per_process([os.getpid()], port)
    conns = [psycopg.connect(**{k: v for k, v in params.items() if k != "cursor_factory"}) for _ in range(2)]
    try:
        assert scale_bench.connections_per_process([os.getpid()], port) == [before[0] + 2]
    finally:
        for c in conns:
            c.close()
    assert scale_bench.connections_per_process([os.getpid()], port) == before


def test_cpu_ticks_of_a_live_and_a_gone_process():
    assert scale_bench.cpu_ticks(os.getpid()) is not None
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert scale_bench.cpu_ticks(gone.pid) is None


def _runs(*rates: float) -> list[dict[str, float]]:
    return [{"jobs_per_s": r} for r in rates]


def test_collapse_verdict_compares_the_largest_count_with_the_peak():
    ok, why = scale_bench.collapse_verdict({"1": _runs(1000), "2": _runs(2000, 2100, 1900), "32": _runs(1600)})
    assert ok is True
    assert why.startswith("32 processes: 1,600 jobs/s = 80% of the peak 2,000 jobs/s (2 processes); holds")
    ok, why = scale_bench.collapse_verdict({"1": _runs(1000), "2": _runs(2000), "32": _runs(1599),
                                            "64": {"skipped": "needs connections"}})
    assert ok is False
    assert "COLLAPSES" in why
    assert scale_bench.collapse_verdict({"1": _runs(1000)}) == (None, "too few points to judge")


def test_scale_report_shows_skipped_points_and_the_verdict():
    point = {"jobs_per_s": 5000.0, "drain_jobs_per_s": 4000.0, "steady_share": 0.9,
             "claim_p50_ms": 1.0, "claim_p99_ms": 4.0, "jobs_per_claim": 10.0,
             "conns_per_worker_max": 5, "server_conns_max": 6, "server_cpu_s_per_1k": 0.1,
             "worker_cpu_s_per_1k": 0.06, "load": "1.00 1.00 1.00"}
    results = {"options": {"jobs": 2000, "pool_size": 20, "processes": [1, 2, 32]},
               "direct": {"1": [point], "2": [point], "32": {"skipped": "needs ~160 connections"}},
               "pgbouncer": {"error": "pgbouncer is not installed"}}
    text = "\n".join(scale_bench.report(results, 1))
    assert "| 1 | 5,000 | 4,000 (0.90) | 1.00 | 4.00 | 10.0 | 5 | 6 | 0.100 | 0.060 | 1.00 1.00 1.00 |" in text
    assert "| 32 | not run: needs ~160 connections | | | | | | | | | |" in text
    assert "Verdict (direct): 2 processes: 5,000 jobs/s = 100% of the peak" in text
    assert "not run: pgbouncer is not installed" in text


def test_wal_report_compares_own_database_figures_only():
    def stats(v: float) -> dict[str, float]:
        return {"median": v, "min": v, "max": v}

    def summary(system: str, own: float | None, server: float) -> dict[str, object]:
        path = {"wal_bytes_per_job": stats(server), "enqueue_bytes_per_job": stats(server / 2),
                "drain_bytes_per_job": stats(server / 2), "own_wal_bytes_per_job": own and stats(own),
                "own_enqueue_bytes_per_job": own and stats(own / 2), "own_drain_bytes_per_job": own and stats(own / 2),
                "server_cpu_us_per_job": stats(150.0), "server_cpu_enqueue_us_per_job": stats(50.0),
                "background_bytes_per_s": stats(0), "background_share": stats(0.0), "checkpoints": 0}
        return {"system": system, "n": 1000, "single": path, "load": "1.00 1.00 1.00"}

    results = [summary("leasequeue", 1400.0, 90_000.0), summary("peer-a", 2800.0, 3000.0),
               summary("peer-b", None, 7000.0), {"system": "peer-c", "error": True}]
    text = "\n".join(wal_bench.report(results, 3))
    assert ("| leasequeue | single | 1,000 | 1,400 | 700 / 700 | 90,000 | 150 (50) | 0 (0%) | 0 | 1.00 1.00 1.00 |"
            in text)
    assert "| peer-a | 0.50 | n/a |" in text
    assert "| peer-b | n/a | n/a |" in text  # no own figure: not compared with a server-wide one
    assert "| peer-c | error | | | | | | | | |" in text
    # A server without pg_walinspect: nobody has an own figure, the server-wide ones are compared.
    blind = "\n".join(wal_bench.report([summary("leasequeue", None, 1500.0), summary("peer-b", None, 3000.0)], 3))
    assert "| peer-b | 0.50 (server-wide) | n/a |" in blind


@pytest.mark.django_db(transaction=True)
def test_own_wal_counts_this_database_phase_by_phase_and_nothing_else():
    params = {k: v for k, v in connection.get_connection_params().items() if k != "cursor_factory"}
    with psycopg.connect(**params, autocommit=True) as c:
        try:
            c.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        except psycopg.Error as e:
            pytest.skip(f"pg_walinspect is not available: {e}")
        c.execute("CREATE TABLE IF NOT EXISTS wal_probe (a int)")
        dsn = psycopg.conninfo.make_conninfo(**{k: str(params[k]) for k in ("dbname", "user", "password", "host",
                                                                            "port") if params.get(k)})
        own = wal_harness.OwnWal(dsn, c, wal_harness.lsn(c))
        own.start()
        try:
            c.execute("INSERT INTO wal_probe SELECT generate_series(1, 1000)")
            first = own.mark(c, wal_harness.lsn(c))
            assert first is not None and 50_000 <= first <= 200_000
            c.execute("INSERT INTO wal_probe SELECT generate_series(1, 5000)")  # skipped by the jump
            own.jump(wal_harness.lsn(c))
            c.execute("INSERT INTO wal_probe SELECT generate_series(1, 1000)")
            second = own.mark(c, wal_harness.lsn(c))
            # WAL that names none of the database's relations is not counted: 100 kB of a logical
            # message (the shape of other databases' records; tests touch no other database).
            own.jump(wal_harness.lsn(c))
            start = wal_harness.lsn(c)
            c.execute("SELECT pg_logical_emit_message(false, 'lq-test', repeat('x', 100000))")
            end = wal_harness.lsn(c)
            third = own.mark(c, end)
        finally:
            own.stop()
        assert own.error is None
        assert second is not None and 50_000 <= second - first <= 200_000
        assert wal_harness.diff(c, end, start) >= 100_000
        # Not the message; at most a page or two of the database's own upkeep (autovacuum may visit
        # the table just written) in the same span.
        assert third is not None and 0 <= third - second < 20_000
        c.execute("DROP TABLE wal_probe")
