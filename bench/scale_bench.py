"""The scale curve: drain throughput and claim latency with 1 to 32 worker processes.

Run as the ``scale`` section of ``bench/run.py`` (``python bench/run.py --only scale``). Each point
drains ``--scale-jobs`` no-op jobs with P ``runworker --concurrency 4`` processes against one
PostgreSQL, P in ``--scale-processes`` (default 1, 2, 4, 8, 16, 32), then the same through a
PgBouncer of our own in transaction mode (``--no-notify``: LISTEN needs a session). Per point:

* jobs/s with every worker claiming: the jobs finished after the last worker's first claim, over
  the time from then to the last completion (database times). The workers start against a paused
  queue, resumed once all are registered; with ``--no-notify`` each finds it at its next poll, up to
  ``POLL_INTERVAL`` (1 s) apart, which would otherwise weigh on short drains. The whole drain's
  rate (``count / (max(finished_at) - min(attempted_at))``, as the drain rows of ``bench/run.py``)
  and the share of the jobs inside the steady window are reported too;
* the claim statement's latency p50 / p99, timed in the workers (``bench/lqbench/apps.py``: a
  Django execute wrapper, on when ``LQBENCH_CLAIM_TIMES`` is set), over every claim of the drain;
* the connections each worker process holds: its TCP sockets to the server (PostgreSQL or
  PgBouncer), read from ``/proc`` (``/proc/<pid>/fd`` socket inodes in ``/proc/net/tcp``), the
  most seen during the drain; and the server connections of the database (``pg_stat_activity``),
  the most seen;
* CPU seconds per 1,000 jobs of the PostgreSQL backends serving the database (``utime + stime``
  of ``/proc/<pid>/stat`` of the backends in ``pg_stat_activity``) and of the worker processes.

Before each point the bench checks that it fits in the server's free connections
(``max_connections`` minus reserved ones, minus those in use, minus a margin of
:data:`CONNECTION_MARGIN` for other users of a shared server): direct, the workers times the most
connections a worker held so far (at least threads + 1); through PgBouncer, its pool. A point that
does not fit is not run, and one that fails (a worker exits, the server refuses connections) is
given up; the table says why and the other points still run. Every point is the median of
``--reps`` runs with [min-max]. The curve must not collapse: throughput at the largest process
count at least 80 % of the peak of its curve.
The plot (matplotlib, the ``bench`` extra) goes to ``build/bench/scale.png``, and with
``--write-docs`` to ``docs/img/scale.png``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Any

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
PLOT = os.path.join(REPO, "build", "bench", "scale.png")
DOCS_PLOT = os.path.join(REPO, "docs", "img", "scale.png")
THREADS = 4
# Server connections left free for everything else on the server (other databases, psql, ...).
CONNECTION_MARGIN = 15
# The throughput at the largest process count must stay at least this share of the curve's peak.
NO_COLLAPSE = 0.8
CLK_TCK = os.sysconf("SC_CLK_TCK")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The scale section's options, added to ``bench/run.py``'s parser."""
    ap.add_argument("--scale-processes", help="worker process counts of the scale curve (default "
                    "1,2,4,8,16,32; quick: 1,2,4)")
    ap.add_argument("--scale-jobs", type=int, help="jobs per scale point (default 50000; quick: 2000)")
    ap.add_argument("--scale-no-pgbouncer", action="store_true", help="scale curve: direct connections only")
    ap.add_argument("--scale-pool-size", type=int, default=20,
                    help="scale curve: PgBouncer default_pool_size (server connections; default 20)")


def options(a: argparse.Namespace, quick: bool) -> dict[str, Any]:
    """The scale options of parsed arguments ``a`` as a plain dict (stored in the run's config)."""
    if a.scale_processes:
        processes = [int(x) for x in a.scale_processes.split(",") if x.strip()]
    else:
        processes = [1, 2, 4] if quick else [1, 2, 4, 8, 16, 32]
    if not processes or min(processes) < 1:
        raise SystemExit("--scale-processes: positive integers, comma-separated")
    return {"processes": sorted(set(processes)), "jobs": a.scale_jobs or (2000 if quick else 50_000),
            "pgbouncer": not a.scale_no_pgbouncer, "pool_size": a.scale_pool_size}


# ---------------------------------------------------------------------------------------------
# /proc readings
# ---------------------------------------------------------------------------------------------


def cpu_ticks(pid: int) -> int | None:
    """utime + stime of process ``pid`` (all its threads), in clock ticks; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of proc(5), after "pid (comm)"


def socket_inodes(pid: int) -> set[str]:
    """Inodes of the sockets process ``pid`` has open."""
    out = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                out.add(target[8:-1])
    except OSError:
        pass
    return out


def inodes_to_port(port: int) -> set[str]:
    """Inodes of established TCP sockets (IPv4 and IPv6) whose remote port is ``port``."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[3] == "01" and int(parts[2].rsplit(":", 1)[1], 16) == port:
                        out.add(parts[9])
        except OSError:
            continue
    return out


def connections_per_process(pids: list[int], port: int) -> list[int]:
    """How many TCP connections to ``port`` each process of ``pids`` holds."""
    remote = inodes_to_port(port)
    return [len(socket_inodes(pid) & remote) for pid in pids]


# ---------------------------------------------------------------------------------------------
# PgBouncer
# ---------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PgBouncer:
    """A PgBouncer of the bench's own on a free local port, in transaction mode, forwarding every
    database to ``PGHOST``/``PGPORT`` with ``auth_type = trust`` (as tests/pgbouncer starts its own).
    Started with ``-u nobody`` under root (PgBouncer refuses to run as root)."""

    def __init__(self, pool_size: int, max_clients: int = 1000) -> None:
        exe = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        if not os.access(exe, os.X_OK):
            raise FileNotFoundError("pgbouncer is not installed (scripts/env.sh ensure_pgbouncer installs it)")
        self.dir = tempfile.mkdtemp(prefix="lq-bench-pgbouncer-")
        os.chmod(self.dir, 0o755)
        self.port = _free_port()
        user = os.environ.get("PGUSER", "postgres")
        users = os.path.join(self.dir, "users.txt")
        ini = os.path.join(self.dir, "pgbouncer.ini")
        with open(users, "w") as f:
            f.write(f'"{user}" ""\n')
        with open(ini, "w") as f:
            f.write("[databases]\n"
                    f"* = host={os.environ.get('PGHOST', '127.0.0.1')} port={os.environ.get('PGPORT', '5432')}\n"
                    "[pgbouncer]\n"
                    f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
                    f"auth_type = trust\nauth_file = {users}\npool_mode = transaction\n"
                    f"default_pool_size = {pool_size}\nmax_client_conn = {max_clients}\n")
        for path in (users, ini):
            os.chmod(path, 0o644)
        self.log_path = os.path.join(self.dir, "pgbouncer.log")
        args = [exe, *(["-u", "nobody"] if os.geteuid() == 0 else []), ini]
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"pgbouncer did not start on port {self.port}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# One point of the curve
# ---------------------------------------------------------------------------------------------


@dataclass
class Point:
    """Where and how one drain runs: ``mode`` is "direct" or "pgbouncer"."""

    mode: str
    processes: int
    jobs: int
    port: int
    env: dict[str, str]
    args: list[str]


def free_connections(c: Any) -> int:
    """Connections the server can still accept from ordinary users, minus :data:`CONNECTION_MARGIN`."""
    max_conn, reserved, used = c.execute(
        "SELECT current_setting('max_connections')::int, current_setting('superuser_reserved_connections')::int, "
        "(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')").fetchone()
    return int(max_conn - reserved - used - CONNECTION_MARGIN)


def table_tuples(c: Any) -> dict[str, int]:
    """The job table's row versions since the database was created from its (empty) template:
    inserted, updated (and of those, HOT), deleted, dead now; and its size with indexes in bytes
    (the table was empty in the template: the figures are the drain's, enqueue included)."""
    row = c.execute(
        "SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, n_dead_tup, autovacuum_count, "
        "pg_total_relation_size(relid) FROM pg_stat_user_tables WHERE relname = 'leasequeue_job'").fetchone()
    keys = ("inserted", "updated", "hot_updated", "deleted", "dead", "autovacuums", "table_bytes")
    return dict(zip(keys, (int(v or 0) for v in row), strict=True))


def drain_point(run: Any, cfg: Any, dbs: Any, point: Point, workdir: str, rep: int) -> dict[str, Any]:
    """Drain ``point.jobs`` no-op jobs with ``point.processes`` x :data:`THREADS` workers; return the
    figures of one run (see the module docstring). ``run`` is the ``bench/run.py`` module (its
    ``Workers``, ``connect``, ``percentile``), passed in to keep one copy of each."""
    from lqbench import tasks

    from django_leasequeue import enqueue_many, store

    label = f"scale {point.mode} {point.processes}x{THREADS}"
    db = dbs.fresh()
    times_dir = tempfile.mkdtemp(prefix="claims-", dir=workdir)
    with run.connect(db) as c:
        store.queue_pause("default", by="bench", wait=False)
        enqueue_many(tasks.noop, [[]] * point.jobs)
        c.execute("ANALYZE leasequeue_job")
        env = {**point.env, "LQBENCH_CLAIM_TIMES": times_dir}
        workers = run.Workers(cfg, point.processes, THREADS, args=point.args, env=env,
                              log_path=os.path.join(workdir, f"scale-{point.mode}-{point.processes}-{rep}.log"))
        backends: dict[int, tuple[int, int]] = {}  # pid -> (ticks when first seen, ticks last seen)
        max_conns = [0] * point.processes
        max_server = 0

        def sample(first: bool = False) -> None:
            nonlocal max_server
            pids = [r[0] for r in c.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                                            "AND pid <> pg_backend_pid()").fetchall()]
            max_server = max(max_server, len(pids))
            for pid in pids:
                ticks = cpu_ticks(pid)
                if ticks is None:
                    continue
                start = backends[pid][0] if pid in backends else (ticks if first else 0)
                backends[pid] = (start, ticks)
            for i, n in enumerate(connections_per_process([p.pid for p in workers.procs], point.port)):
                max_conns[i] = max(max_conns[i], n)

        try:
            workers.wait_registered(c, timeout=60.0 + 3.0 * point.processes)
            time.sleep(0.5 if point.mode == "direct" else 0.1)  # listeners connect right after registering
            sample(first=True)
            worker_ticks0 = [cpu_ticks(p.pid) or 0 for p in workers.procs]
            store.queue_resume("default")
            deadline = time.monotonic() + max(120.0, point.jobs / 50)
            next_sample = 0.0
            while c.execute("SELECT EXISTS (SELECT 1 FROM leasequeue_job "
                            "WHERE status IN ('ready', 'leased'))").fetchone()[0]:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{label}: not drained in time; {workers.tail()}")
                workers.check_alive()
                if time.monotonic() >= next_sample:
                    sample()
                    next_sample = time.monotonic() + 0.25
                time.sleep(0.05)
            sample()
            worker_ticks = sum((cpu_ticks(p.pid) or 0) - t0 for p, t0 in zip(workers.procs, worker_ticks0, strict=True))
        finally:
            workers.stop()
        done, first, last, attempts = c.execute(
            "SELECT count(*) FILTER (WHERE status = 'done'), min(attempted_at), max(finished_at), sum(attempts) "
            "FROM leasequeue_job").fetchone()
        # Steady state: from the moment the last worker made its first claim (with --no-notify the
        # workers find the resumed queue at their next poll, up to POLL_INTERVAL apart) to the last
        # completion, the jobs finished in between.
        active_from, claimers, steady_done = c.execute(
            "WITH w AS (SELECT leased_by, min(attempted_at) AS first FROM leasequeue_job GROUP BY leased_by) "
            "SELECT (SELECT max(first) FROM w), (SELECT count(*) FROM w), "
            "count(*) FILTER (WHERE finished_at > (SELECT max(first) FROM w)) FROM leasequeue_job").fetchone()
        # A backend publishes its table statistics at exit, or within 10 s when idle: PgBouncer keeps
        # its server connections open, so end them (ours only) and read the counters after.
        c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                  "AND pid <> pg_backend_pid()")
        time.sleep(1.0)
        tuples = table_tuples(c)
    if done != point.jobs or attempts != point.jobs:
        raise RuntimeError(f"{label}: {done} of {point.jobs} jobs done in {attempts} attempts")
    claims = []
    for name in os.listdir(times_dir):
        with open(os.path.join(times_dir, name)) as f:
            claims += [float(line) * 1000.0 for line in f if line.strip()]
    server_ticks = sum(end - start for start, end in backends.values())
    per_k = 1000.0 / point.jobs / CLK_TCK
    steady_s = (last - active_from).total_seconds()
    whole = done / (last - first).total_seconds()
    return {"jobs_per_s": steady_done / steady_s if steady_s > 0 and steady_done > 0 else whole,
            "drain_jobs_per_s": whole, "seconds": (last - first).total_seconds(),
            "steady_share": steady_done / done, "workers_claimed": claimers,
            "claims": len(claims), "jobs_per_claim": done / len(claims) if claims else None,
            "claim_p50_ms": run.percentile(claims, 50) if claims else None,
            "claim_p99_ms": run.percentile(claims, 99) if claims else None,
            "conns_per_worker_max": max(max_conns), "conns_per_worker_min": min(max_conns),
            "server_conns_max": max_server, "server_cpu_s_per_1k": server_ticks * per_k,
            "worker_cpu_s_per_1k": worker_ticks * per_k, "load": run.load_average(),
            **{f"{k}_per_job": v / point.jobs for k, v in tuples.items()}}


def bench_scale(run: Any, cfg: Any, dbs: Any, workdir: str) -> dict[str, Any]:
    """The whole curve, direct and (unless disabled) through PgBouncer.

    Returns ``{"direct": {P: [runs] or {"skipped": reason}}, "pgbouncer": {...}, "options": ...}``
    (P as a string key, for JSON)."""
    opts = cfg.scale
    dbs.setup_django()
    out: dict[str, Any] = {"options": opts, "direct": {}, "pgbouncer": {}}
    modes = ["direct"] + (["pgbouncer"] if opts["pgbouncer"] else [])
    per_worker = 0
    for mode in modes:
        bouncer = None
        try:
            if mode == "pgbouncer":
                try:
                    bouncer = PgBouncer(opts["pool_size"])
                except (FileNotFoundError, RuntimeError) as e:
                    out["pgbouncer"] = {"error": str(e)}
                    run.log(f"scale: pgbouncer skipped: {e}")
                    continue
                port = bouncer.port
                env = {"PGHOST": "127.0.0.1", "PGPORT": str(port), "LQBENCH_TRANSACTION_POOLING": "1",
                       "LQBENCH_NOTIFY": "0"}
                args = ["--no-notify"]
            else:
                port, env, args = int(run.PG["port"]), {}, []
            for processes in opts["processes"]:
                runs: list[dict[str, Any]] = []
                for rep in range(1, cfg.reps + 1):
                    try:
                        with run.connect("postgres") as c:
                            free = free_connections(c)
                    except Exception as e:  # the server is full right now
                        free = -1
                        run.log(f"scale: cannot read the free connections: {e}")
                    if mode == "direct":
                        need = processes * max(per_worker, THREADS + 1)
                        what = f"{processes} x {max(per_worker, THREADS + 1)}"
                    else:  # the bouncer's pool, and ours
                        need, what = opts["pool_size"] + 2, f"pool of {opts['pool_size']} + 2"
                    if need > free:
                        reason = (f"needs ~{need} connections ({what}), the server has {free} free "
                                  f"(max_connections, less those in use and a margin of {CONNECTION_MARGIN})")
                        run.log(f"scale {mode} {processes}x{THREADS}: not run: {reason}")
                        out[mode][str(processes)] = {"skipped": reason}
                        break
                    try:
                        res = drain_point(run, cfg, dbs, Point(mode, processes, opts["jobs"], port, env, args),
                                          workdir, rep)
                    except Exception as e:  # a worker died, the drain stalled, the server was full: go on
                        run.log(f"scale {mode} {processes}x{THREADS} rep {rep}: failed: {e}")
                        out[mode][str(processes)] = {"skipped": f"failed: {str(e).splitlines()[0][:200]}"}
                        break
                    per_worker = max(per_worker, res["conns_per_worker_max"]) if mode == "direct" else per_worker
                    run.log(f"scale {mode} {processes}x{THREADS} rep {rep}/{cfg.reps}: "
                            f"{res['jobs_per_s']:,.0f} jobs/s, "
                            f"claim p50 {res['claim_p50_ms'] or 0:.2f} ms p99 {res['claim_p99_ms'] or 0:.2f} ms, "
                            f"{res['conns_per_worker_max']} conns/worker, {res['server_conns_max']} server conns, "
                            f"server CPU {res['server_cpu_s_per_1k']:.3f} s/1k jobs; load {res['load']}")
                    runs.append(res)
                else:
                    out[mode][str(processes)] = runs
        finally:
            if bouncer is not None:
                bouncer.stop()
    return out


# ---------------------------------------------------------------------------------------------
# Report and plot
# ---------------------------------------------------------------------------------------------


def _spread(runs: list[dict[str, Any]], key: str, nd: int = 0) -> str:
    vals = [r[key] for r in runs if r.get(key) is not None]
    if not vals:
        return "n/a"
    m = statistics.median(vals)
    if len(vals) == 1:
        return f"{m:,.{nd}f}"
    return f"{m:,.{nd}f} [{min(vals):,.{nd}f}-{max(vals):,.{nd}f}]"


def curve(points: dict[str, Any]) -> list[tuple[int, float]]:
    """(processes, median jobs/s) of the points that ran, by process count."""
    out = []
    for p, runs in points.items():
        if isinstance(runs, list) and runs:
            out.append((int(p), statistics.median(r["jobs_per_s"] for r in runs)))
    return sorted(out)


def collapse_verdict(points: dict[str, Any]) -> tuple[bool | None, str]:
    """Whether the curve holds: the largest process count that ran reaches :data:`NO_COLLAPSE` of
    the peak. Returns (ok or None when fewer than two points ran, a sentence saying why)."""
    pts = curve(points)
    if len(pts) < 2:
        return None, "too few points to judge"
    peak_p, peak = max(pts, key=lambda x: x[1])
    last_p, last = pts[-1]
    ok = last >= NO_COLLAPSE * peak
    return ok, (f"{last_p} processes: {last:,.0f} jobs/s = {last / peak:.0%} of the peak {peak:,.0f} jobs/s "
                f"({peak_p} processes); {'holds' if ok else 'COLLAPSES'} (target >= {NO_COLLAPSE:.0%})")


def report(results: dict[str, Any], reps: int) -> list[str]:
    """The scale section of the table, as markdown lines."""
    opts = results["options"]
    w = [f"Scale curve: drains of {opts['jobs']:,} no-op jobs with P x `runworker --concurrency {THREADS}`, "
         f"median of {reps} [min-max]. Claim: the claim statement's round trip timed in the workers. Connections: "
         "TCP connections each worker process holds (most seen), and server connections of the database. CPU: "
         "seconds per 1,000 jobs of the PostgreSQL backends and of the workers (all on the same machine).", ""]
    for mode, title in (("direct", "direct to PostgreSQL (LISTEN/NOTIFY on)"),
                        ("pgbouncer", f"through PgBouncer, transaction mode, pool size {opts['pool_size']}, "
                                      "`--no-notify`")):
        points = results.get(mode) or {}
        if not points:
            continue
        w.append(f"**{title}**")
        w.append("")
        if "error" in points:
            w += [f"not run: {points['error']}", ""]
            continue
        w.append("| processes | jobs/s, all workers claiming | whole drain jobs/s (share of jobs in the steady "
                 "window) | claim p50 ms | claim p99 ms | jobs/claim | conns per worker | server conns | "
                 "server CPU s/1k jobs | worker CPU s/1k jobs | load |")
        w.append("|---|---|---|---|---|---|---|---|---|---|---|")
        for p, runs in sorted(points.items(), key=lambda x: int(x[0])):
            if isinstance(runs, dict):
                w.append(f"| {p} | not run: {runs['skipped']} | | | | | | | | | |")
                continue
            w.append(f"| {p} | {_spread(runs, 'jobs_per_s')} | {_spread(runs, 'drain_jobs_per_s')} "
                     f"({_spread(runs, 'steady_share', 2)}) | {_spread(runs, 'claim_p50_ms', 2)} | "
                     f"{_spread(runs, 'claim_p99_ms', 2)} | {_spread(runs, 'jobs_per_claim', 1)} | "
                     f"{_spread(runs, 'conns_per_worker_max')} | "
                     f"{_spread(runs, 'server_conns_max')} | {_spread(runs, 'server_cpu_s_per_1k', 3)} | "
                     f"{_spread(runs, 'worker_cpu_s_per_1k', 3)} | {runs[-1]['load']} |")
        ok, why = collapse_verdict(points)
        w += ["", f"Verdict ({mode}): {why}", ""]
        first = next((runs for _, runs in sorted(points.items(), key=lambda x: int(x[0]))
                      if isinstance(runs, list) and runs and "updated_per_job" in runs[0]), None)
        if first:
            w += [f"Vacuum load ({mode}, {len(first)} run(s) of the smallest point), per job: "
                  f"row versions inserted {_spread(first, 'inserted_per_job', 2)}, updated "
                  f"{_spread(first, 'updated_per_job', 2)} (HOT {_spread(first, 'hot_updated_per_job', 2)}), dead at "
                  f"the end {_spread(first, 'dead_per_job', 2)}; job table with its indexes "
                  f"{_spread(first, 'table_bytes_per_job')} bytes per job; autovacuum runs during the point "
                  f"{_spread(first, 'autovacuums_per_job', 5)} per job.", ""]
    return w


def plot(results: dict[str, Any], path: str = PLOT) -> str | None:
    """Draw throughput and claim p99 against processes (log2 axis), median with min-max bars, into
    ``path``. Returns the path, or None when matplotlib is not installed (the ``bench`` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ticks: set[int] = set()
    for mode, label in (("direct", "direct"), ("pgbouncer", "PgBouncer (transaction, --no-notify)")):
        points = {p: r for p, r in (results.get(mode) or {}).items() if isinstance(r, list) and r}
        if not points:
            continue
        ps = sorted(points, key=int)
        xs = [int(p) for p in ps]
        ticks.update(xs)
        for ax, key in ((ax1, "jobs_per_s"), (ax2, "claim_p99_ms")):
            vals = [[r[key] for r in points[p] if r.get(key) is not None] or [0.0] for p in ps]
            med = [statistics.median(v) for v in vals]
            low = [m - min(v) for m, v in zip(med, vals, strict=True)]
            high = [max(v) - m for m, v in zip(med, vals, strict=True)]
            ax.errorbar(xs, med, yerr=[low, high], marker="o", capsize=3, label=label)
    for ax, title in ((ax1, "drain throughput, jobs/s"), (ax2, "claim statement p99, ms")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(ticks), [str(t) for t in sorted(ticks)])
        ax.set_xlabel(f"worker processes (x {THREADS} threads)")
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
