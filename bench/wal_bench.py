"""The ``wal`` section of ``bench/run.py``: WAL bytes per job, enqueue to done, for us and each peer.

Every system runs through the same script, :mod:`bench.peer_adapter.wal_harness`, which drives the
peers harness's own per-system code (``../shared/bench/peers/harness``, imported, not copied) and
reads ``pg_current_wal_insert_lsn()`` around the enqueue of N no-op jobs and around their drain
(see its docstring for the method). Ours runs with the project's Python and the harness adapter
``bench/peer_adapter/leasequeue_sys.py``; the peers with their own virtualenv. Paths: ``single``
(one job per transaction, as the harness's single-enqueue row) and ``bulk`` (the system's batch
API, where it has one).

The WAL position is server-wide: nothing else should write on the server during the section. The
table gives the background WAL rate measured just before each measure and the share of the figure
it could account for, and the load average.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

BENCH = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(BENCH, "peer_adapter", "wal_harness.py")
SLOW_PEERS_N = 2000  # chancy and django-q2 drain at ~150 jobs/s here: fewer jobs (bytes are per job)


def db_prefix(cfg: Any) -> str:
    """Our databases of this section are ``<--db>_wal_<system>``: never the harness's ``bench_*``."""
    return f"{cfg.db}_wal_"


def run_wal(run: Any, cfg: Any, workdir: str) -> list[dict[str, Any]]:
    """Measure every system (``leasequeue`` first, then ``cfg.peers``); return their summaries
    (``{"system", "n", "single": {...}, "bulk": {...}}``, or ``{"system", "error": True}``).

    ``run`` is the ``bench/run.py`` module (``log``, ``setup_peers_venv``, ``connect``, ``SLOW_PEERS``)."""
    harness = os.path.join(cfg.peers_dir, "harness")
    venv = os.environ.get("PEERS_VENV") or os.path.join(tempfile.gettempdir(), "leasequeue-peers-venv")
    peers_py = os.path.join(venv, "bin", "python")
    if cfg.peers and not os.path.exists(peers_py):
        run.setup_peers_venv(cfg, venv)
    # As run_peers: without this benchmark's own variables, so a peer never loads lqbench.settings.
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE" and not k.startswith("LQBENCH_")}
    env["PEERS_PROCRASTINATE_CONCURRENCY"] = os.environ.get("PEERS_PROCRASTINATE_CONCURRENCY", "4")
    systems = [("leasequeue", sys.executable)] + [(s, peers_py) for s in cfg.peers]
    results = []
    try:
        for system, python in systems:
            n = min(cfg.wal_n, run.SLOW_PEERS.get(system, cfg.wal_n))
            cmd = [python, SCRIPT, harness, system, "--n", str(n), "--reps", str(cfg.peers_reps),
                   "--db-prefix", db_prefix(cfg)]
            run.log(f"wal: {system} ({n:,} jobs x {cfg.peers_reps} rep(s) per path; load {run.load_average()})")
            with open(os.path.join(workdir, f"wal-{system}.log"), "w") as err:
                proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
            line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("{")), None)
            if proc.returncode != 0 or line is None:
                run.log(f"wal: {system} failed (exit {proc.returncode}); see {err.name}")
                results.append({"system": system, "error": True})
                continue
            summary = json.loads(line)
            summary["load"] = run.load_average()
            for path in ("single", "bulk"):
                if path in summary:
                    own = (summary[path].get("own_wal_bytes_per_job") or {}).get("median")
                    run.log(f"wal: {system} {path}: {own or 0:,.0f} bytes/job own database, "
                            f"{summary[path]['wal_bytes_per_job']['median']:,.0f} server-wide")
            results.append(summary)
    finally:
        if not cfg.keep:
            with run.connect(os.environ.get("PG_MAINTENANCE_DB", "postgres")) as c:
                for system, _ in systems:
                    c.execute(f'DROP DATABASE IF EXISTS "{db_prefix(cfg)}{system.replace("-", "_")}" WITH (FORCE)')
    return results


def _cell(stats: dict[str, Any] | None, nd: int = 0) -> str:
    if not stats:
        return "n/a"
    m, lo, hi = stats["median"], stats["min"], stats["max"]
    return f"{m:,.{nd}f}" if lo == hi else f"{m:,.{nd}f} [{lo:,.{nd}f}-{hi:,.{nd}f}]"


def figure(summary: dict[str, Any], path: str, scope: str = "own") -> float | None:
    """The WAL bytes per job of ``path``: the database's own WAL (pg_walinspect; ``scope="own"``)
    or the server-wide figure (``scope="server"``); None when not measured."""
    s = summary.get(path)
    best = (s or {}).get("own_wal_bytes_per_job" if scope == "own" else "wal_bytes_per_job")
    return None if not best else float(best["median"])


def ratio(ours: dict[str, Any], peer: dict[str, Any], path: str) -> str:
    """Ours over the peer's WAL bytes per job, like with like: own database figures when both have
    one; server-wide ones only when neither has (no pg_walinspect on the server); else n/a."""
    a, b = figure(ours, path), figure(peer, path)
    if a and b:
        return f"{a / b:.2f}"
    if ours.get(path) and peer.get(path) and a is None and b is None:
        a, b = figure(ours, path, "server"), figure(peer, path, "server")
        return f"{a / b:.2f} (server-wide)" if a and b else "n/a"
    return "n/a"


def capacity(ours: dict[str, Any]) -> list[str]:
    """The capacity model's figures from our measures (docs/howto/performance.md, "Capacity model"):
    per path, jobs per day that one fully busy PostgreSQL core serves (86,400 s over the backends'
    CPU seconds per job, enqueue to done) and the WAL per million jobs."""
    w = ["Capacity, from the figures above (django-leasequeue; arithmetic on the medians, one PostgreSQL core "
         "fully busy, no other work on it):", ""]
    for path, what in (("single", "one `enqueue()` per transaction"), ("bulk", "`enqueue_many()`")):
        s = ours.get(path)
        if not s:
            continue
        cpu = (s.get("server_cpu_us_per_job") or {}).get("median")
        wal = figure(ours, path) or figure(ours, path, "server")
        per_day = f"{86_400 / (cpu / 1e6) / 1e6:,.0f} million jobs per day per core ({cpu:,.0f} µs of backend CPU " \
                  "per job)" if cpu else "n/a (backend CPU not readable)"
        w.append(f"- {what}, then drained: {per_day}; WAL {wal * 1e6 / 1e9:,.2f} GB per million jobs." if wal
                 else f"- {what}: {per_day}.")
    return w


def report(results: list[dict[str, Any]], reps: int) -> list[str]:
    """The WAL table as markdown lines: per system and path, bytes per job (median of the
    repetitions [min-max]) of the system's own database (pg_walinspect) and server-wide, the enqueue
    and drain parts, and the background WAL."""
    w = [f"WAL bytes per job, enqueue to done: N no-op jobs enqueued, then drained and the workers stopped "
         f"(median of {reps} [min-max]). *Own database*: the WAL records of the system's database and their "
         "transactions, read back with pg_walinspect (other sessions' writes excluded); *server-wide*: "
         "`pg_current_wal_insert_lsn()` difference, which also counts whatever else wrote on the server: the "
         "background "
         "column is that rate just before each measure, and the share of the server-wide figure it could explain. "
         "Checkpoints inside a measure add full-page images. *PostgreSQL CPU*: CPU time of the backends serving "
         "the system's database, enqueue to done (of which the enqueue), µs per job (`/proc`; background "
         "processes not counted). Lower is better.", "",
         "| system | path | jobs | WAL bytes/job, own database | enqueue / drain part | server-wide | "
         "PostgreSQL CPU µs/job (enqueue) | background B/s (share) | checkpoints | load |",
         "|---|---|---|---|---|---|---|---|---|---|"]
    ours = next((r for r in results if r["system"] == "leasequeue" and not r.get("error")), None)
    for r in results:
        if r.get("error"):
            w.append(f"| {r['system']} | error | | | | | | | | |")
            continue
        for path in ("single", "bulk"):
            s = r.get(path)
            if not s:
                continue
            bg = s["background_share"]["median"]
            w.append(f"| {r['system']} | {path} | {r['n']:,} | {_cell(s.get('own_wal_bytes_per_job'))} | "
                     f"{_cell(s.get('own_enqueue_bytes_per_job'))} / {_cell(s.get('own_drain_bytes_per_job'))} | "
                     f"{_cell(s['wal_bytes_per_job'])} | {_cell(s.get('server_cpu_us_per_job'))} "
                     f"({_cell(s.get('server_cpu_enqueue_us_per_job'))}) | "
                     f"{_cell(s['background_bytes_per_s'])} ({bg:.0%}) | {s['checkpoints']} | {r['load']} |")
    if ours:
        w += ["", *capacity(ours)]
    if ours:
        w += ["", "Ratio ours/peer, WAL bytes per job (own database; lower is better: below 1.00 we write less; "
              "n/a where a figure is missing: on a busy server the WAL can be recycled before it is read back, "
              "see the log):", "", "| peer | single | bulk |", "|---|---|---|"]
        for r in results:
            if r is ours or r.get("error"):
                continue
            w.append(f"| {r['system']} | {ratio(ours, r, 'single')} | {ratio(ours, r, 'bulk')} |")
    return w
