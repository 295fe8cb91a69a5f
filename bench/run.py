"""django-leasequeue benchmark: one command, its own databases, one table.

Usage (from the repository root; ``scripts/bench`` wraps it)::

    python bench/run.py                 # full run: every row, median of 3, then the peer queues
    python bench/run.py --quick         # smoke test: fewer jobs, 1 repetition, small peer run
    python bench/run.py --only drain,latency --skip-peers
    python bench/run.py --write-docs    # also put the table into docs/howto/performance.md
    python bench/run.py --drop-cache    # drop the cached 10M-row database and exit

Rows (each the median of ``--reps`` runs, on a fresh database copied from a migrated template):

* enqueue: ``Task.enqueue()`` one per transaction, per second; ``enqueue_many()`` of 10,000 jobs in
  one statement, per second.
* drain: ``--jobs`` no-op jobs with 1 process x 1, 4, 16 threads and 2 processes x 4 threads
  (and 2 x 4 with ``ASYNC_COMPLETIONS``). Jobs/s from the first claim to the last completion, read
  from the database: ``count / (max(finished_at) - min(attempted_at))``. The workers start against
  a paused queue; the queue is unpaused (with a NOTIFY) once every worker is registered, so start-up
  is excluded and processes start together.
* latency: enqueue-to-start p50/p99 of a trickle of jobs into one idle worker, with LISTEN/NOTIFY and
  with ``runworker --no-notify`` (polling, default 1 s interval; the trickle does not wait for the
  starts, its random 20-220 ms pauses give a uniform phase against the polling cycle).
* on time: how late jobs due later start (claim time ``attempted_at`` - ``run_at``, database
  times), p50/p99/max, into one idle 1 x 4 worker with ``POLL_INTERVAL = 10``: delayed enqueues,
  retries and snoozes with run times spread over the next 0.3-3 s. With ``--ontime-baseline DIR``
  (a checkout of an earlier version, e.g. ``git archive main | tar -x -C DIR``) the same row runs
  with that version's worker too, in the same run ("before").
* HOT: share of heartbeat updates that were HOT (``pg_stat_user_tables``), in a window where only
  heartbeats run: 16 long jobs, lease 1.5 s (a renewal every 0.5 s).
* claim cost: time of one claim statement (10 jobs) with 10k / 1M / 10M finished or future rows
  in the table, plus EXPLAIN showing the partial index ``leasequeue_job_ready``; the retention
  pruner's batch delete on the largest table (rolled back). The 10M table lives in a cached
  database (``<db>_big10000000``) built once with one ``INSERT ... SELECT generate_series`` and
  reused by later runs until the schema changes.
* memory: peak RSS (``VmHWM``) of the 1 x 16 drain worker.

Then the peer queues and django-leasequeue itself run through the same peers harness
(``bench/peer_adapter``), with the same job count, and the ratios ours/peer are printed. The harness
is not part of this repository and none of its code is copied in: it is the folder
``../shared/bench/peers`` next to the repository (from a git worktree, also next to the main
checkout), or wherever ``PEERS_DIR`` points. The peer queues are pip-installed into their own
virtualenv by that folder's ``setup_venv.sh`` (``$PEERS_VENV``, default
``$TMPDIR/leasequeue-peers-venv``, created on the first run). Without the harness the peers are
skipped and the table says so ("peers: skipped (harness not found at ...; set PEERS_DIR)").

Environment: ``PGHOST``/``PGPORT``/``PGUSER``/``PGPASSWORD``; ``LQBENCH_DB`` (database name,
default ``leasequeue_bench``; the runner also uses ``<name>_tpl``; the peers harness uses
``bench_<system>``, dropped after the peers run unless ``--keep``); ``PEERS_VENV``; ``PEERS_DIR``.
Progress goes to stderr, the table to stdout and ``build/bench/results.md``, raw results to
``--out`` (default ``build/bench/results.json``). Peers that drain below ~150 jobs/s (``SLOW_PEERS``)
run 2,000 jobs instead of ``--jobs`` so that the full run takes about 30 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import ast
import glob
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
MANAGE = os.path.join(BENCH, "manage.py")
sys.path[:0] = [BENCH, REPO]

import psycopg  # noqa: E402
import scale_bench  # noqa: E402
import wal_bench  # noqa: E402

PG = {
    "host": os.environ.get("PGHOST", "127.0.0.1"),
    "port": os.environ.get("PGPORT", "5432"),
    "user": os.environ.get("PGUSER", "postgres"),
    "password": os.environ.get("PGPASSWORD", ""),
}


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def connect(db: str, autocommit: bool = True) -> psycopg.Connection:
    return psycopg.connect(dbname=db, autocommit=autocommit, **{k: v for k, v in PG.items() if v})


def load_average() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, q in 0..100."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, -(-len(s) * q // 100) - 1))
    return s[int(k)]


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------


@dataclass
class Config:
    quick: bool
    reps: int
    jobs: int
    single_n: int
    bulk_n: int
    lat_n: int
    hot_seconds: float
    claim_sizes: list[int]
    claim_reps: int
    drains: list[tuple[int, int, bool]]
    sections: set[str]
    db: str
    peers: list[str]
    peers_n: int
    peers_reps: int
    peers_lat_n: int
    peers_dir: str
    out: str
    keep: bool
    profile: bool = False
    write_docs: bool = False
    drop_cache: bool = False
    render: str | None = None
    notes: list[str] = field(default_factory=list)
    ontime_baseline: str | None = None
    scale: dict = field(default_factory=dict)  # the scale section's options (bench/scale_bench.py)
    wal_n: int = 10_000  # jobs per measure of the wal section (bench/wal_bench.py)

    @property
    def template(self) -> str:
        return self.db + "_tpl"


SECTIONS = ["enqueue", "drain", "latency", "ontime", "hot", "claim", "flow", "workflows", "scale", "peers", "wal"]
# What --help says of each section (the epilog), so that --only can be chosen without reading the code.
SECTIONS_HELP = """\
sections (--only; every one by default):
  enqueue    single enqueue() and enqueue_many() of 10,000 jobs, jobs/s
  drain      no-op drains, 1 process x 1, 4, 16 threads and 2 x 4 (and 2 x 4 with
             ASYNC_COMPLETIONS, unless --no-async-row); peak RSS of the 1 x 16 worker
  latency    enqueue-to-start p50/p99 into an idle worker, LISTEN/NOTIFY and polling
  ontime     how late jobs due later (delayed, retried, snoozed) start
  hot        share of HOT heartbeat updates
  claim      one claim's cost with --claim-sizes rows in the table (10M: a cached database)
  flow       drains with rate limits, fair claiming, concurrency limits, sequences vs plain
  workflows  building batches and groups, draining a batch with its callback, the latency
             between a chain's steps
  scale      the scale curve: drains with 1 to 32 worker processes (--scale-*), direct and
             through a PgBouncer of its own (direct only without the pgbouncer program);
             plot in build/bench/scale.png (matplotlib, the bench extra)
  peers      the peer queues through the harness in ../shared/bench/peers (or $PEERS_DIR),
             ratios ours/peer; skipped, and the table says so, without the harness
  wal        WAL bytes per job, enqueue to done, ours and each peer's (--wal-n); needs the
             peers harness (skipped without it) and measures the peers even with --skip-peers

Other benchmarks run on their own (python bench/<name>.py --help): async_bench (async def
handlers), history_bench (time-partitioned history against the pruner), enqueue_breakdown (one
enqueue() taken apart), prune_bench, flow_bench, stats_bench, tracing_bench, health_bench,
admin_dashboard_bench. Figures and how to read them: docs/howto/performance.md.
"""
ALL_PEERS = ["procrastinate", "pgqueuer", "django-tasks-db", "chancy", "django-q2"]


def peers_candidates() -> list[str]:
    """Where the peers harness is looked for: ``$PEERS_DIR`` alone when it is set; otherwise
    ``<repo>/../shared/bench/peers`` and, from a git worktree (``git worktree add``), the same next to
    the main checkout (found through git's common directory)."""
    if os.environ.get("PEERS_DIR"):
        return [os.path.abspath(os.environ["PEERS_DIR"])]
    candidates = [os.path.dirname(REPO)]
    try:
        common = subprocess.run(["git", "rev-parse", "--path-format=absolute", "--git-common-dir"], cwd=REPO,
                                capture_output=True, text=True, check=True).stdout.strip()
        candidates.append(os.path.dirname(os.path.dirname(common)))
    except (OSError, subprocess.CalledProcessError):
        pass
    paths = [os.path.join(c, "shared", "bench", "peers") for c in candidates]
    return list(dict.fromkeys(paths))


def has_harness(peers_dir: str) -> bool:
    return os.path.isfile(os.path.join(peers_dir, "harness", "run_peer.py"))


def find_peers_dir() -> str:
    """The first of :func:`peers_candidates` holding ``harness/run_peer.py``, else the first one."""
    paths = peers_candidates()
    return next((p for p in paths if has_harness(p)), paths[0])


def show_path(path: str) -> str:
    """``path`` as every message and table prints it: as ``$PEERS_DIR`` gave it (absolute) when that
    is set; ``../shared/bench/peers`` for the default place (relative to the repository, or to the
    main checkout from a git worktree); otherwise relative to the repository root."""
    if os.environ.get("PEERS_DIR"):
        return os.path.abspath(path)
    if os.path.abspath(path) in peers_candidates():
        return os.path.join("..", "shared", "bench", "peers")
    return os.path.relpath(path, REPO)


def parse_args(argv: list[str] | None = None) -> Config:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=SECTIONS_HELP,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="few jobs, 1 repetition (development, smoke test)")
    ap.add_argument("--reps", type=int, help="repetitions per row (default 3; quick: 1)")
    ap.add_argument("--jobs", type=int, help="no-op jobs per drain (default 20000; quick: 2000)")
    ap.add_argument("--only", help=f"comma-separated sections among {', '.join(SECTIONS)} (below; default: all)")
    ap.add_argument("--skip-peers", action="store_true", help="do not run the peer queues")
    ap.add_argument("--peers", help=f"systems for the peers harness (default: {' '.join(ALL_PEERS)})")
    ap.add_argument("--peers-n", type=int, help="jobs per peer drain (default: --jobs; quick: 1000)")
    ap.add_argument("--peers-lat-n", type=int, help="latency trickle jobs per peer and repetition (default 40; "
                    "quick: 10). The harness waits 50-1,050 ms after each start, so each costs ~0.6-1.1 s")
    ap.add_argument("--claim-sizes", help="rows in the table for the claim-cost rows (default "
                    "10000,1000000,10000000; quick: 10000,100000). Sizes of 5,000,000 and more are measured in a "
                    "cached database (<db>_big<size>, about 3 GB for 10M) built once and reused by later runs")
    ap.add_argument("--with-10m", action="store_true", help="shorthand: add 10,000,000 to --claim-sizes")
    ap.add_argument("--drop-cache", action="store_true",
                    help="drop the cached large claim-cost databases (rebuilt when needed) and exit")
    ap.add_argument("--write-docs", action="store_true",
                    help="also put the table into docs/howto/performance.md (between its bench-results markers)")
    ap.add_argument("--render", metavar="RESULTS_JSON",
                    help="measure nothing: print the table of an earlier run from its raw results (--out file), "
                    "in this version's format; with --write-docs, also into docs/howto/performance.md")
    ap.add_argument("--ontime-baseline", metavar="DIR",
                    help="also run the on-time row with the worker of the checkout in DIR (the 'before' figures)")
    ap.add_argument("--no-async-row", action="store_true", help="skip the 2 x 4 ASYNC_COMPLETIONS drain row")
    ap.add_argument("--db", default=os.environ.get("LQBENCH_DB", "leasequeue_bench"),
                    help="database name (dropped and recreated; default $LQBENCH_DB or leasequeue_bench)")
    ap.add_argument("--out", default=os.path.join(REPO, "build", "bench", "results.json"),
                    help="raw results (JSON); the table goes next to it as results.md (default build/bench/)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the databases afterwards (ours and the peers harness's bench_<system>)")
    ap.add_argument("--profile", action="store_true",
                    help="one extra 2 x 4 drain under py-spy (GIL samples); prints where the workers' time goes")
    ap.add_argument("--wal-n", type=int, help="jobs per measure of the wal section (default 10000; quick: 1000)")
    scale_bench.add_arguments(ap)
    a = ap.parse_args(argv)
    quick = a.quick
    sections = set(SECTIONS if not a.only else [s.strip() for s in a.only.split(",") if s.strip()])
    unknown = sections - set(SECTIONS)
    if unknown:
        ap.error(f"unknown section(s) {sorted(unknown)}")
    if a.skip_peers:
        sections.discard("peers")
    if a.claim_sizes:
        sizes = [int(x) for x in a.claim_sizes.split(",")]
    else:
        sizes = [10_000, 100_000] if quick else [10_000, 1_000_000, 10_000_000]
    if a.with_10m and 10_000_000 not in sizes:
        sizes.append(10_000_000)
    jobs = a.jobs or (2000 if quick else 20_000)
    drains = [(1, 1, False), (1, 4, False), (1, 16, False), (2, 4, False)]
    if not a.no_async_row:
        drains.append((2, 4, True))
    peers_dir = find_peers_dir()
    return Config(
        quick=quick, reps=a.reps or (1 if quick else 3), jobs=jobs, single_n=500 if quick else 5000,
        bulk_n=10_000, lat_n=30 if quick else 200, hot_seconds=6.0 if quick else 10.0, claim_sizes=sorted(sizes),
        claim_reps=50 if quick else 300, drains=drains, sections=sections, db=a.db,
        peers=(a.peers.split() if a.peers else list(ALL_PEERS)), peers_n=a.peers_n or (1000 if quick else jobs),
        peers_reps=1 if quick else (a.reps or 3), peers_lat_n=a.peers_lat_n or (10 if quick else 40),
        peers_dir=peers_dir,
        out=a.out, keep=a.keep, profile=a.profile, write_docs=a.write_docs, drop_cache=a.drop_cache, render=a.render,
        ontime_baseline=a.ontime_baseline, scale=scale_bench.options(a, quick),
        wal_n=a.wal_n or (1000 if quick else 10_000),
    )


# ---------------------------------------------------------------------------------------------
# Databases and the in-process Django (enqueue, claim cost)
# ---------------------------------------------------------------------------------------------


class Databases:
    """A migrated template database, copied into a fresh benchmark database for every run."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.django_ready = False

    def _admin(self, sql: str) -> None:
        with connect(os.environ.get("PG_MAINTENANCE_DB", "postgres")) as c:
            c.execute(sql)

    def prepare(self) -> None:
        log(f"creating template database {self.cfg.template} (migrate)")
        self._admin(f'DROP DATABASE IF EXISTS "{self.cfg.template}" WITH (FORCE)')
        self._admin(f'CREATE DATABASE "{self.cfg.template}"')
        env = {**os.environ, "LQBENCH_DB": self.cfg.template}
        subprocess.run([sys.executable, MANAGE, "migrate", "-v", "0"], env=env, check=True)

    def fresh(self) -> str:
        """Drop and recreate the benchmark database from the template; return its name."""
        if self.django_ready:
            from django.db import connections

            connections.close_all()
        self._admin(f'DROP DATABASE IF EXISTS "{self.cfg.db}" WITH (FORCE)')
        self._admin(f'CREATE DATABASE "{self.cfg.db}" TEMPLATE "{self.cfg.template}"')
        self.setup_django()
        return self.cfg.db

    def use(self, name: str) -> None:
        """Point the in-process Django connection at database ``name`` (reconnects on next use)."""
        from django.db import connections

        connections.close_all()
        connections["default"].settings_dict["NAME"] = name

    def setup_django(self) -> None:
        if self.django_ready:
            return
        os.environ["LQBENCH_DB"] = self.cfg.db
        os.environ["DJANGO_SETTINGS_MODULE"] = "lqbench.settings"
        import django

        django.setup()
        from django_leasequeue import registry

        registry.autodiscover()
        self.django_ready = True

    def drop_all(self) -> None:
        if self.django_ready:
            from django.db import connections

            connections.close_all()
        for name in (self.cfg.db, self.cfg.template):
            self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# ---------------------------------------------------------------------------------------------
# Worker processes
# ---------------------------------------------------------------------------------------------


class Workers:
    """``manage.py runworker`` subprocesses, each in its own process group."""

    def __init__(self, cfg: Config, processes: int, threads: int, *, args: list[str] = (),
                 env: dict[str, str] | None = None, log_path: str, manage: str = MANAGE) -> None:
        self.cfg = cfg
        self.log_path = log_path
        self.log = open(log_path, "ab")
        full_env = {**os.environ, "LQBENCH_DB": cfg.db, "PYTHONUNBUFFERED": "1", **(env or {})}
        cmd = [sys.executable, manage, "runworker", "--concurrency", str(threads), "--queues", "default", *args]
        self.procs = [subprocess.Popen(cmd, env=full_env, stdout=self.log, stderr=subprocess.STDOUT,
                                       start_new_session=True) for _ in range(processes)]

    def wait_registered(self, conn: psycopg.Connection, timeout: float = 60.0) -> None:
        """Wait until every worker has a row in the process registry (it is about to claim)."""
        deadline = time.monotonic() + timeout
        while True:
            n = conn.execute("SELECT count(*) FROM leasequeue_process WHERE kind = 'worker'").fetchone()[0]
            if n >= len(self.procs):
                return
            self.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers did not register within {timeout} s; see {self.log_path}")
            time.sleep(0.05)

    def check_alive(self) -> None:
        for p in self.procs:
            if p.poll() is not None:
                raise RuntimeError(f"worker exited with {p.returncode}; log: {self.tail()}")

    def tail(self) -> str:
        self.log.flush()
        with open(self.log_path, "rb") as f:
            return f.read()[-3000:].decode(errors="replace")

    def peak_rss_mb(self) -> list[float]:
        """VmHWM (peak resident set) of each worker, in MiB."""
        out = []
        for p in self.procs:
            try:
                with open(f"/proc/{p.pid}/status") as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            out.append(int(line.split()[1]) / 1024.0)
            except FileNotFoundError:
                pass
        return out

    def stop(self, timeout: float = 20.0) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(5)
        self.log.close()


# ---------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------


def repeat(cfg: Config, what: str, fn: Callable[[int], dict]) -> list[dict]:
    runs = []
    for rep in range(1, cfg.reps + 1):
        res = fn(rep)
        log(f"{what} rep {rep}/{cfg.reps}: " + ", ".join(
            f"{k}={v:,.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in res.items()
            if not isinstance(v, (list, dict))))
        runs.append(res)
    return runs


def bench_enqueue(cfg: Config, dbs: Databases) -> list[dict]:
    def one(rep: int) -> dict:
        dbs.fresh()
        from django.db import connection
        from lqbench.tasks import noop

        from django_leasequeue import enqueue_many

        noop.enqueue()  # connect, warm caches
        pg = connection.connection

        def singles(threshold: int | None) -> float:
            # threshold 5: prepared statements allowed on the connection (what
            # OPTIONS["prepare_threshold"] sets), so the one-job INSERT is prepared at its first call.
            saved, pg.prepare_threshold = pg.prepare_threshold, threshold
            try:
                noop.enqueue()  # prepares it when allowed
                t0 = time.perf_counter()
                for _ in range(cfg.single_n):
                    noop.enqueue()
                return cfg.single_n / (time.perf_counter() - t0)
            finally:
                pg.prepare_threshold = saved

        # Django's default (nothing prepared) and prepared, in alternating order across repetitions.
        if rep % 2:
            single_prepared, single = singles(5), singles(None)
        else:
            single, single_prepared = singles(None), singles(5)
        args = [[]] * cfg.bulk_n
        t0 = time.perf_counter()
        n = enqueue_many(noop, args)
        bulk = n / (time.perf_counter() - t0)
        assert n == cfg.bulk_n, n
        return {"single_per_s": single, "single_prepared_per_s": single_prepared, "bulk_per_s": bulk}

    return repeat(cfg, "enqueue", one)


def _bulk_enqueue(n: int, task_name: str = "noop", args: list | None = None) -> None:
    from lqbench import tasks

    from django_leasequeue import enqueue_many

    enqueue_many(getattr(tasks, task_name), [args or []] * n)


def _wal_lsn(c: psycopg.Connection) -> str:
    """The server's WAL insert position (server-wide: every database's writes move it)."""
    return c.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]


def _own_wal(db: str, c: psycopg.Connection, start: str):
    """A running :class:`peer_adapter.wal_harness.OwnWal` for database ``db`` from ``start``: its
    own WAL, held by a replication slot and read back with pg_walinspect after the timed drain."""
    from peer_adapter.wal_harness import OwnWal

    own = OwnWal(psycopg.conninfo.make_conninfo(dbname=db, **{k: v for k, v in PG.items() if v}), c, start,
                 hold=True)
    own.start()
    own.ready.wait(30)
    return own


def c_wal_bytes(c: psycopg.Connection, own: int | None, *spans: tuple[str, str]) -> tuple[int, str]:
    """The WAL bytes to report and their scope: ``own`` (bytes of the database's own WAL, or None
    when pg_walinspect could not read them) as ``"own"``, else the position differences of the
    (start, end) spans, summed, as ``"server"`` (every database's writes count)."""
    if own is not None:
        return own, "own"
    return sum(c.execute("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)::bigint", (end, start)).fetchone()[0]
               for start, end in spans), "server"


def bench_drain(cfg: Config, dbs: Databases, processes: int, threads: int, async_completions: bool,
                workdir: str, profile_to: str | None = None) -> list[dict]:
    label = f"drain {processes}x{threads}{' ASYNC_COMPLETIONS' if async_completions else ''}"

    def one(rep: int) -> dict:
        spies: list[subprocess.Popen] = []
        db = dbs.fresh()
        with connect(db) as c:
            from django_leasequeue import store

            store.queue_pause("default", by="bench")
            try:  # pg_walinspect (contrib): this database's own WAL, not the whole server's
                c.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            except psycopg.Error:
                pass
            wal0 = _wal_lsn(c)
            own_wal = _own_wal(db, c, wal0)
            _bulk_enqueue(cfg.jobs)
            wal1 = _wal_lsn(c)
            own_wal.mark(c, wal1)
            c.execute("ANALYZE leasequeue_job")
            wal2 = _wal_lsn(c)  # the ANALYZE's own WAL (wal2 - wal1) is left out
            own_wal.jump(wal2)
            env = {"LQBENCH_ASYNC_COMPLETIONS": "1"} if async_completions else {}
            workers = Workers(cfg, processes, threads, env=env,
                              log_path=os.path.join(workdir, f"drain-{processes}x{threads}-{rep}.log"))
            try:
                workers.wait_registered(c)
                if profile_to:
                    spies = [subprocess.Popen([py_spy(), "record", "--pid", str(p.pid), "--gil", "--rate", "250",
                                               "--format", "raw", "--output", f"{profile_to}.{p.pid}.txt"],
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                             for p in workers.procs]
                time.sleep(0.5 if not spies else 2.0)  # listeners connect right after registering
                store.queue_resume("default")  # NOTIFY at commit wakes the workers
                _wait_settled(c, label, workers, max(120.0, cfg.jobs / 50))
                rss = workers.peak_rss_mb()
            finally:
                workers.stop()
                wal3 = _wal_lsn(c)
                own_bytes = own_wal.mark(c, wal3)
                own_wal.stop()
                for spy in spies:  # py-spy writes its file when the worker exits
                    try:
                        spy.wait(30)
                    except subprocess.TimeoutExpired:
                        spy.kill()
            done, first, last, claims, flushes = c.execute(
                "SELECT count(*) FILTER (WHERE status = 'done'), min(attempted_at), max(finished_at), "
                "count(DISTINCT (leased_by, attempted_at)), count(DISTINCT finished_at) FROM leasequeue_job"
            ).fetchone()
            wal, wal_scope = c_wal_bytes(c, own_bytes, (wal0, wal1), (wal2, wal3))
        elapsed = (last - first).total_seconds()
        if done != cfg.jobs:
            raise RuntimeError(f"{label}: {done} of {cfg.jobs} jobs done")
        return {"jobs_per_s": done / elapsed, "seconds": elapsed, "jobs_per_claim": done / claims,
                "jobs_per_completion_flush": done / flushes, "peak_rss_mb": max(rss) if rss else None,
                "wal_bytes_per_job": wal / done, "wal_scope": wal_scope}

    if profile_to:
        return [one(0)]
    return repeat(cfg, label, one)


# The flow section: real-worker drains (1 process x 4 threads) with one flow-control policy on
# each, compared with a plain drain of the same no-op in the same repetition. Each variant is
# (label, task in lqbench.tasks, extra worker environment). Another per-key policy adds its row here.
FLOW_VARIANTS = [
    ("plain", "flow_plain", {}),
    ("rate limit per key (1,000 keys, 100000/s)", "flow_rate_key", {}),
    ("fair claiming (1,000 keys)", "flow_fair", {"LQBENCH_FAIR": "1"}),
    ("concurrency limit per key (100 keys, limit 5)", "flow_conc", {}),
    ("sequences (1,000 keys)", "flow_seq", {}),
]


def bench_flow(cfg: Config, dbs: Databases, workdir: str) -> dict[str, list[dict]]:
    """Drain ``cfg.jobs`` jobs per variant of :data:`FLOW_VARIANTS`, the variants one after the
    other in each repetition (so load from other processes hits them alike), and return each
    variant's runs with ``jobs_per_s`` and ``vs_plain`` (its rate over the plain drain's, same rep)."""
    dbs.setup_django()
    from lqbench import tasks

    from django_leasequeue import enqueue_many, store

    runs: dict[str, list[dict]] = {label: [] for label, _, _ in FLOW_VARIANTS}
    for rep in range(1, cfg.reps + 1):
        # Rotate the order each repetition, so that no variant always runs first (or last) while the
        # machine warms up or other processes come and go; ratios are to the same repetition's plain.
        shift = (rep - 1) % len(FLOW_VARIANTS)
        rates: dict[str, float] = {}
        for label, task_name, env in FLOW_VARIANTS[shift:] + FLOW_VARIANTS[:shift]:
            db = dbs.fresh()
            with connect(db) as c:
                store.queue_pause("default", by="bench", wait=False)
                enqueue_many(getattr(tasks, task_name), [[i] for i in range(cfg.jobs)])
                c.execute("ANALYZE leasequeue_job")
                workers = Workers(cfg, 1, 4, env=env, log_path=os.path.join(workdir, f"flow-{task_name}-{rep}.log"))
                try:
                    workers.wait_registered(c)
                    time.sleep(0.5)
                    store.queue_resume("default")
                    deadline = time.monotonic() + max(120.0, cfg.jobs / 50)
                    while c.execute("SELECT EXISTS (SELECT 1 FROM leasequeue_job "
                                    "WHERE status IN ('ready', 'leased'))").fetchone()[0]:
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"flow {label}: not drained in time; {workers.tail()}")
                        workers.check_alive()
                        time.sleep(0.05)
                finally:
                    workers.stop()
                done, first, last, attempts = c.execute(
                    "SELECT count(*) FILTER (WHERE status = 'done'), min(attempted_at), max(finished_at), "
                    "sum(attempts) FROM leasequeue_job").fetchone()
            if done != cfg.jobs or attempts != cfg.jobs:
                raise RuntimeError(f"flow {label}: {done} of {cfg.jobs} jobs done in {attempts} attempts")
            rates[label] = done / (last - first).total_seconds()
        plain_rate = rates[FLOW_VARIANTS[0][0]]
        for label, rate in rates.items():
            runs[label].append({"jobs_per_s": rate, "vs_plain": rate / plain_rate})
            log(f"flow {label} rep {rep}/{cfg.reps}: {rate:,.0f} jobs/s ({rate / plain_rate:.2f} x plain)")
    return runs


# The workflows section: building a 10,000-member batch and group, draining a batch with an
# on_success callback against a plain drain of the same task, and a chain's step-to-step latency.
WF_MEMBERS = 10_000
WF_CHAIN_STEPS = 60


def _wait_settled(c: psycopg.Connection, label: str, workers: Workers, timeout: float) -> None:
    """Wait until no job is ready, leased or waiting (the drain, callbacks included, is over)."""
    deadline = time.monotonic() + timeout
    while c.execute("SELECT EXISTS (SELECT 1 FROM leasequeue_job "
                    "WHERE status IN ('ready', 'leased', 'waiting'))").fetchone()[0]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{label}: not drained in time; {workers.tail()}")
        workers.check_alive()
        time.sleep(0.05)


def bench_workflows(cfg: Config, dbs: Databases, workdir: str) -> dict[str, list[dict]]:
    """The three workflow rows, each repetition on a fresh database.

    * build: ``Batch.open`` + ``add_many`` of :data:`WF_MEMBERS` members + ``close``, and
      ``group()`` of as many steps enqueued, in jobs/s (wall clock around the calls);
    * drain: a closed batch of :data:`WF_MEMBERS` members with an ``on_success`` callback and a plain
      ``enqueue_many`` of as many jobs of the same task, 1 x 4 worker, alternating which goes first;
      jobs/s from ``min(attempted_at)`` to ``max(finished_at)`` (the callback included for the
      batch) and the ratio plain / batch; the ledger is checked (every member done in one attempt,
      the callback done exactly once, after the last member);
    * chain: a chain of :data:`WF_CHAIN_STEPS` steps into an idle 1 x 4 worker (NOTIFY on); the
      latency of each step is ``attempted_at`` of the step minus ``finished_at`` of the previous one
      (database times), in ms.

    Returns ``{"build_batch": [...], "build_group": [...], "drain": [...], "chain": [...]}``."""
    dbs.setup_django()
    from lqbench import tasks

    from django_leasequeue import Batch, chain, enqueue_many, group, store

    runs: dict[str, list[dict]] = {"build_batch": [], "build_group": [], "drain": [], "chain": []}
    reps = max(3, cfg.reps)
    n = WF_MEMBERS
    for rep in range(1, reps + 1):
        dbs.fresh()
        tasks.wf_member.enqueue(0)  # connect, warm caches
        t0 = time.perf_counter()
        batch = Batch.open("bench", on_success=tasks.wf_callback.step())
        batch.add_many(tasks.wf_member, [[i] for i in range(n)])
        batch.close()
        rate_batch = n / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        group(*[tasks.wf_member.step(i) for i in range(n)]).enqueue()
        rate_group = n / (time.perf_counter() - t0)
        runs["build_batch"].append({"jobs_per_s": rate_batch})
        runs["build_group"].append({"jobs_per_s": rate_group})
        log(f"workflows build rep {rep}/{reps}: batch {rate_batch:,.0f} jobs/s, group {rate_group:,.0f} jobs/s")

    for rep in range(1, reps + 1):
        rates: dict[str, float] = {}
        for kind in (("plain", "batch") if rep % 2 else ("batch", "plain")):
            db = dbs.fresh()
            with connect(db) as c:
                store.queue_pause("default", by="bench", wait=False)
                if kind == "plain":
                    enqueue_many(tasks.wf_member, [[i] for i in range(n)])
                else:
                    batch = Batch.open("bench", on_success=tasks.wf_callback.step())
                    batch.add_many(tasks.wf_member, [[i] for i in range(n)])
                    batch.close()
                c.execute("ANALYZE leasequeue_job")
                workers = Workers(cfg, 1, 4, log_path=os.path.join(workdir, f"wf-drain-{kind}-{rep}.log"))
                try:
                    workers.wait_registered(c)
                    time.sleep(0.5)
                    store.queue_resume("default")
                    _wait_settled(c, f"workflows drain {kind}", workers, max(120.0, n / 50))
                finally:
                    workers.stop()
                total, done, attempts, first, last = c.execute(
                    "SELECT count(*), count(*) FILTER (WHERE status = 'done'), sum(attempts), min(attempted_at), "
                    "max(finished_at) FROM leasequeue_job").fetchone()
                if kind == "batch":
                    cb = c.execute(
                        "SELECT count(*), count(*) FILTER (WHERE status = 'done'), sum(attempts), "
                        "min(attempted_at) FROM leasequeue_job WHERE task = 'bench.wf_callback'").fetchone()
                    last_member = c.execute("SELECT max(finished_at) FROM leasequeue_job "
                                            "WHERE task = 'bench.wf_member'").fetchone()[0]
                    wf = c.execute("SELECT members, members_done, finished_at IS NOT NULL "
                                   "FROM leasequeue_workflow").fetchall()
                    if cb[:3] != (1, 1, 1) or cb[3] < last_member or wf != [(n, n, True)]:
                        raise RuntimeError(f"workflows drain: ledger wrong: callback {cb}, workflow {wf}")
                    expect = n + 1
                else:
                    expect = n
                if (total, done, attempts) != (expect, expect, expect):
                    raise RuntimeError(f"workflows drain {kind}: {done} of {total} done in {attempts} attempts, "
                                       f"expected {expect}")
            rates[kind] = done / (last - first).total_seconds()
        runs["drain"].append({"plain_per_s": rates["plain"], "batch_per_s": rates["batch"],
                              "plain_over_batch": rates["plain"] / rates["batch"]})
        log(f"workflows drain rep {rep}/{reps}: plain {rates['plain']:,.0f} jobs/s, batch {rates['batch']:,.0f} "
            f"jobs/s ({rates['plain'] / rates['batch']:.2f} x)")

    for rep in range(1, reps + 1):
        db = dbs.fresh()
        with connect(db) as c:
            workers = Workers(cfg, 1, 4, log_path=os.path.join(workdir, f"wf-chain-{rep}.log"))
            try:
                workers.wait_registered(c)
                time.sleep(1.0)  # the listener connects right after registering
                chain(*[tasks.wf_step.step() for _ in range(WF_CHAIN_STEPS)]).enqueue()
                _wait_settled(c, "workflows chain", workers, 60.0)
            finally:
                workers.stop()
            rows = c.execute("SELECT workflow_step::int, status, attempted_at, finished_at, result "
                             "FROM leasequeue_job ORDER BY workflow_step::int").fetchall()
        if [r[:2] for r in rows] != [(i, "done") for i in range(1, WF_CHAIN_STEPS + 1)]:
            raise RuntimeError(f"workflows chain: steps {[r[:2] for r in rows]}")
        lats = [(rows[i][2] - rows[i - 1][3]).total_seconds() * 1000.0 for i in range(1, len(rows))]
        runs["chain"].append({"p50_ms": percentile(lats, 50), "p99_ms": percentile(lats, 99),
                              "max_ms": max(lats), "samples": len(lats), "last_result": rows[-1][4]})
        log(f"workflows chain rep {rep}/{reps}: p50 {percentile(lats, 50):.1f} ms, p99 {percentile(lats, 99):.1f} ms "
            f"over {len(lats)} steps; last result {rows[-1][4]}")
    return runs


def py_spy() -> str:
    """The py-spy executable next to this Python, or on PATH (``pip install py-spy``)."""
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return here if os.path.exists(here) else "py-spy"


def summarize_profile(paths: list[str], top: int = 25) -> str:
    """Where the workers held the GIL: inclusive share per function (py-spy raw stacks, all threads)."""
    inclusive: dict[str, int] = {}
    leaf: dict[str, int] = {}
    total = 0
    for path in paths:
        if not os.path.exists(path):
            continue
        with open(path) as f:
            for line in f:
                stack, _, n = line.rstrip().rpartition(" ")
                if not n.isdigit() or not stack.strip():
                    continue  # no Python stack (the GIL holder was in native code)
                count = int(n)
                total += count
                frames = [fr.split(" (")[0] + " (" + fr.split(" (")[-1].split(":")[0].rsplit("/", 2)[-1] + ")"
                          for fr in stack.split(";")]
                for name in set(frames):
                    inclusive[name] = inclusive.get(name, 0) + count
                leaf[frames[-1]] = leaf.get(frames[-1], 0) + count
    if not total:
        return "(no profile samples: is py-spy installed?)"
    out = [f"{total} samples with the GIL held and a Python stack (all threads of the worker processes)", "",
           "| inclusive % | function |", "|---|---|"]
    skip = ("Thread.run", "Thread._bootstrap", "Thread._bootstrap_inner", "<module>")
    ranked = [(n, k) for k, n in inclusive.items() if not k.startswith(skip)]
    out += [f"| {100 * n / total:.1f} | `{k}` |" for n, k in sorted(ranked, reverse=True)[:top]]
    out += ["", "| self % | function |", "|---|---|"]
    out += [f"| {100 * n / total:.1f} | `{k}` |" for k, n in sorted(leaf.items(), key=lambda x: -x[1])[:top]]
    return "\n".join(out)


def read_stamps(folder: str) -> list[tuple[float, float]]:
    out = []
    for path in glob.glob(os.path.join(folder, "*.txt")):
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2:
                    out.append((float(parts[0]), float(parts[1])))
    return out


def bench_latency(cfg: Config, dbs: Databases, notify: bool, workdir: str) -> list[dict]:
    # Random pauses of 20-220 ms. With NOTIFY each job is enqueued once the previous one started,
    # into an idle worker. Polling: the trickle does not wait for the starts (the enqueue times,
    # independent of the worker's 1 s polling cycle, fall at a uniform phase of it, as the peers
    # harness's 50-1,050 ms pauses after each start do; several jobs may then share a poll), so the
    # row takes cfg.lat_n x 0.12 s instead of cfg.lat_n x 1.05 s.
    lo, hi = 0.02, 0.22
    label = "latency " + ("notify" if notify else "polling")

    def one(rep: int) -> dict:
        dbs.fresh()
        from lqbench.tasks import lat

        stamps = tempfile.mkdtemp(prefix="lqbench-stamps-", dir=workdir)
        with connect(cfg.db) as c:
            workers = Workers(cfg, 1, 4, args=[] if notify else ["--no-notify"], env={"LQBENCH_STAMPS": stamps},
                              log_path=os.path.join(workdir, f"latency-{int(notify)}-{rep}.log"))
            try:
                workers.wait_registered(c)
                time.sleep(1.0)
                rng = random.Random(rep)
                for i in range(cfg.lat_n):
                    time.sleep(rng.uniform(lo, hi))
                    lat.enqueue(time.time())
                    deadline = time.monotonic() + 10
                    while notify and len(read_stamps(stamps)) <= i:
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"{label}: job {i} did not start within 10 s; {workers.tail()}")
                        time.sleep(0.002)
                deadline = time.monotonic() + 10
                while len(read_stamps(stamps)) < cfg.lat_n:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{label}: not every job started within 10 s; {workers.tail()}")
                    time.sleep(0.01)
            finally:
                workers.stop()
        lats = [(start - enq) * 1000.0 for start, enq in read_stamps(stamps)]
        return {"p50_ms": percentile(lats, 50), "p99_ms": percentile(lats, 99), "max_ms": max(lats),
                "samples": len(lats)}

    return repeat(cfg, label, one)


ONTIME_POLL = 10.0


def bench_ontime(cfg: Config, dbs: Databases, workdir: str, baseline: str | None = None) -> list[dict]:
    """How late jobs due later start: one idle 1 x 4 worker with ``POLL_INTERVAL = 10`` (``baseline``:
    the ``bench/manage.py`` of another checkout runs it), fed over a few seconds with delayed enqueues,
    retries and snoozes whose run times fall 0.3-3 s ahead. Lateness is ``attempted_at - run_at``
    (database times; a retry's or snooze's run_at is the one it was given). The retries and snoozes
    are written by this process as a holder would (``store.job_fail`` with a retry delay,
    ``store.job_snooze``) on jobs it claimed itself, so they notify as this version's worker does; a
    baseline worker gets the same notifications."""
    label = "on time " + ("before" if baseline else "after")
    manage = os.path.join(baseline, "bench", "manage.py") if baseline else MANAGE
    n_delayed, n_retried, n_snoozed = (20, 4, 4) if cfg.quick else (60, 10, 10)

    def one(rep: int) -> dict:
        dbs.fresh()
        from datetime import timedelta

        from lqbench.tasks import noop

        from django_leasequeue import store

        with connect(cfg.db) as c:
            workers = Workers(cfg, 1, 4, env={"LQBENCH_POLL_INTERVAL": str(ONTIME_POLL)}, manage=manage,
                              log_path=os.path.join(workdir, f"ontime-{int(bool(baseline))}-{rep}.log"))
            try:
                workers.wait_registered(c)
                # Jobs to retry or snooze, claimed by this process: due in a day, claimed "a day later".
                far = store.db_now() + timedelta(days=1)
                for _ in range(n_retried + n_snoozed):
                    noop.using(run_at=far).enqueue()
                held = list(store.job_claim(queues=["default"], limit=n_retried + n_snoozed, worker_id="bench:0:hold",
                                            lease=300, now=far + timedelta(seconds=1), tasks=["bench.noop"]))
                assert len(held) == n_retried + n_snoozed, len(held)
                time.sleep(1.0)  # the worker's claims found nothing: it sleeps its idle wait
                rng = random.Random(rep)
                events = ["delay"] * n_delayed + ["retry"] * n_retried + ["snooze"] * n_snoozed
                rng.shuffle(events)
                for kind in events:
                    time.sleep(rng.uniform(0.02, 0.08))
                    ahead = rng.uniform(0.3, 3.0)
                    if kind == "delay":
                        noop.using(run_at=timedelta(seconds=ahead)).enqueue()
                    elif kind == "retry":
                        job = held.pop()
                        assert store.job_fail(job.id, job.lease_version, {"type": "Bench"}, retry_delay=ahead)
                    else:
                        job = held.pop()
                        assert store.job_snooze(job.id, job.lease_version, ahead, max_snoozes=5) == "ready"
                total = len(events)
                deadline = time.monotonic() + 3 * ONTIME_POLL
                while c.execute("SELECT count(*) FROM leasequeue_job WHERE status = 'done'").fetchone()[0] < total:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{label}: not every job started in time; {workers.tail()}")
                    workers.check_alive()
                    time.sleep(0.05)
                rows = c.execute("SELECT extract(epoch FROM attempted_at - run_at)::float8 * 1000, errors <> '[]', "
                                 "snoozes > 0 FROM leasequeue_job").fetchall()
            finally:
                workers.stop()
        late = [r[0] for r in rows]
        again = [r[0] for r in rows if r[1] or r[2]]
        return {"p50_ms": percentile(late, 50), "p99_ms": percentile(late, 99), "max_ms": max(late),
                "min_ms": min(late), "retry_snooze_max_ms": max(again), "samples": len(late)}

    return repeat(cfg, label, one)


def _table_stats(c: psycopg.Connection) -> tuple[int, int]:
    c.execute("SELECT pg_stat_clear_snapshot()")
    return c.execute("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                     "WHERE relname = 'leasequeue_job'").fetchone()


def bench_hot(cfg: Config, dbs: Databases, workdir: str) -> list[dict]:
    jobs, lease, seconds = 16, 1.5, cfg.hot_seconds

    def one(rep: int) -> dict:
        dbs.fresh()
        with connect(cfg.db) as c:
            _bulk_enqueue(2000)  # some finished neighbours, so the long jobs do not sit alone in the table
            c.execute("UPDATE leasequeue_job SET status = 'done', finished_at = now()")
            _bulk_enqueue(jobs, "sleep", [seconds])
            c.execute("VACUUM ANALYZE leasequeue_job")
            time.sleep(1.0)
            before = _table_stats(c)
            workers = Workers(cfg, 1, jobs, env={"LQBENCH_LEASE": str(lease)},
                              log_path=os.path.join(workdir, f"hot-{rep}.log"))
            try:
                deadline = time.monotonic() + 60
                while c.execute("SELECT count(*) FROM leasequeue_job WHERE status = 'leased'").fetchone()[0] < jobs:
                    workers.check_alive()
                    if time.monotonic() > deadline:
                        raise RuntimeError("hot: jobs not claimed")
                    time.sleep(0.02)
                t_claimed = time.monotonic()
                time.sleep(2.0)  # claims' statistics reach pg_stat (flushed at most once a second)
                a = _table_stats(c)
                time.sleep(max(0.5, seconds - 1.5 - (time.monotonic() - t_claimed)))
                b = _table_stats(c)
                while c.execute("SELECT EXISTS (SELECT 1 FROM leasequeue_job WHERE status IN ('ready', 'leased'))"
                                ).fetchone()[0]:
                    workers.check_alive()
                    time.sleep(0.1)
            finally:
                workers.stop()
            time.sleep(1.5)  # the worker's backends flush their statistics at exit
            after = _table_stats(c)
        upd, hot = b[0] - a[0], b[1] - a[1]
        total_upd, total_hot = after[0] - before[0], after[1] - before[1]
        heartbeats_total = total_upd - 2 * jobs  # every other update is a claim or a completion
        return {"hot_ratio": hot / upd if upd else None, "window_updates": upd,
                "run_hot_ratio_heartbeats": total_hot / heartbeats_total if heartbeats_total > 0 else None,
                "run_updates": total_upd}

    return repeat(cfg, "hot", one)


SEED = """
INSERT INTO leasequeue_job (
    task, queue, priority, status, args, kwargs, run_at, attempts, max_attempts, leased_by, lease_version,
    unique_scope, cancel_requested, snoozes, errors, history, created_at, started_at, attempted_at,
    finished_at, result)
SELECT 'bench.noop', 'default', 0,
       CASE WHEN g %% 10 = 0 THEN 'ready' ELSE 'done' END, '[]', '{}',
       CASE WHEN g %% 10 = 0 THEN now() + interval '1 day' + g * interval '1 ms'
            ELSE now() - interval '2 hours' END,
       CASE WHEN g %% 10 = 0 THEN 0 ELSE 1 END, 5, '', CASE WHEN g %% 10 = 0 THEN 0 ELSE 1 END,
       'retained', false, 0, '[]', '[]', now() - interval '2 hours',
       CASE WHEN g %% 10 = 0 THEN NULL ELSE now() - interval '2 hours' END,
       CASE WHEN g %% 10 = 0 THEN NULL ELSE now() - interval '2 hours' END,
       CASE WHEN g %% 10 = 0 THEN NULL ELSE now() - interval '1 hour' - (g %% 1000) * interval '1 minute' END,
       NULL
FROM generate_series(%(start)s::bigint, %(stop)s::bigint) AS g
"""


def _plan(sql: str, params: dict) -> tuple[str, float]:
    """EXPLAIN ANALYZE ``sql`` inside a rolled-back transaction; return (plan text, execution ms)."""
    from django.db import connection, transaction

    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql, params)
            text = "\n".join(r[0] for r in cur.fetchall())
        transaction.set_rollback(True)
    ms = next((float(line.split(":")[1].split()[0]) for line in text.splitlines()
               if line.strip().startswith("Execution Time")), float("nan"))
    return text, ms


# Claim-cost sizes from this many rows up are measured in a cached database, built once.
BIG = 5_000_000
CACHE_VERSION = "1"


def schema_signature(c: psycopg.Connection) -> str:
    """What a cached large database must share with the template: the job table's columns and
    indexes, the applied migrations and the seed (a change to any of them rebuilds the cache)."""
    cols = c.execute("SELECT string_agg(attname || ':' || format_type(atttypid, atttypmod), ',' ORDER BY attnum) "
                     "FROM pg_attribute WHERE attrelid = 'leasequeue_job'::regclass AND attnum > 0 "
                     "AND NOT attisdropped").fetchone()[0]
    idx = c.execute("SELECT string_agg(pg_get_indexdef(indexrelid), ';' ORDER BY indexrelid::regclass::text) "
                    "FROM pg_index WHERE indrelid = 'leasequeue_job'::regclass").fetchone()[0]
    migs = c.execute("SELECT string_agg(app || '.' || name, ',' ORDER BY app, name) FROM django_migrations"
                     ).fetchone()[0]
    return "|".join([CACHE_VERSION, cols, idx, migs, SEED])


def _seed(c: psycopg.Connection, start: int, stop: int) -> None:
    c.execute(SEED, {"start": start, "stop": stop})


def ensure_big(cfg: Config, dbs: Databases, size: int) -> str:
    """The cached database ``<db>_big<size>``: the template plus ``size`` finished/future rows,
    ready for :func:`measure_claims` (rows added by an earlier run are deleted first). Built when
    missing or when the schema changed: the secondary indexes are dropped, the rows inserted with
    one ``INSERT ... SELECT generate_series``, the indexes rebuilt, then ``VACUUM (FREEZE, ANALYZE)``."""
    name = f"{cfg.db}_big{size}"
    with connect(cfg.template) as c:
        want = schema_signature(c)
    exists = False
    with connect("postgres") as c:
        exists = bool(c.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone())
    if exists:
        with connect(name) as c:
            row = c.execute("SELECT to_regclass('lqbench_cache') IS NOT NULL").fetchone()[0] and c.execute(
                "SELECT signature, filler_max FROM lqbench_cache").fetchone()
            if row and row[0] == want:
                stray = c.execute("DELETE FROM leasequeue_job WHERE id > %s", [row[1]]).rowcount
                if stray:
                    c.execute("VACUUM ANALYZE leasequeue_job")
                log(f"claim cost: reusing the cached {size:,}-row database {name}"
                    f"{f' ({stray:,} rows of an earlier run deleted)' if stray else ''}")
                return name
        log(f"claim cost: the cached database {name} is out of date; rebuilding it")
    t0 = time.monotonic()
    dbs._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    dbs._admin(f'CREATE DATABASE "{name}" TEMPLATE "{cfg.template}"')
    with connect(name) as c:
        c.execute("SET maintenance_work_mem = '256MB'")
        c.execute("ALTER TABLE leasequeue_job SET (autovacuum_enabled = false)")  # no vacuum mid-measurement
        defs = c.execute("SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index "
                         "WHERE indrelid = 'leasequeue_job'::regclass AND NOT indisprimary").fetchall()
        for idx, _ in defs:
            c.execute(f'DROP INDEX "{idx}"')
        _seed(c, 1, size)
        t_ins = time.monotonic() - t0
        for _, ddl in defs:
            c.execute(ddl)
        t_idx = time.monotonic() - t0 - t_ins
        c.execute("VACUUM (FREEZE, ANALYZE) leasequeue_job")
        filler_max = c.execute("SELECT max(id) FROM leasequeue_job").fetchone()[0]
        c.execute("CREATE TABLE lqbench_cache (signature text NOT NULL, filler_max bigint NOT NULL)")
        c.execute("INSERT INTO lqbench_cache VALUES (%s, %s)", [want, filler_max])
    log(f"claim cost: built {name} in {time.monotonic() - t0:.0f} s (insert {t_ins:.0f} s, "
        f"indexes {t_idx:.0f} s, vacuum {time.monotonic() - t0 - t_ins - t_idx:.0f} s); later runs reuse it")
    return name


def drop_big(cfg: Config, dbs: Databases) -> None:
    with connect("postgres") as c:
        names = [r[0] for r in c.execute("SELECT datname FROM pg_database WHERE datname LIKE %s",
                                         [cfg.db.replace("_", r"\_") + r"\_big%"]).fetchall()]
    for name in names:
        log(f"dropping {name}")
        dbs._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def measure_claims(cfg: Config, c: psycopg.Connection, size: int, workdir: str) -> dict:
    """Time ``cfg.claim_reps`` claims of 10 due jobs (each completed, committed) in the current
    Django database, which holds ``size`` filler rows; EXPLAIN ANALYZE the claim statement."""
    from django.db import transaction

    from django_leasequeue import store

    _bulk_enqueue(cfg.claim_reps * 10 + 500)
    c.execute("ANALYZE leasequeue_job")
    size_mb = c.execute("SELECT pg_total_relation_size('leasequeue_job') / 1048576.0").fetchone()[0]
    times = []
    for i in range(cfg.claim_reps + 10):  # 10 warm-up rounds
        # Timed inside a transaction: the statement, not the commit's WAL flush (which does not
        # depend on the table size and, on a busy disk, would drown it).
        with transaction.atomic():
            t0 = time.perf_counter()
            jobs = store.job_claim(queues=["default"], limit=10, worker_id="bench", lease=30)
            if i >= 10:
                times.append((time.perf_counter() - t0) * 1000.0)
            assert len(jobs) == 10, len(jobs)
            store.job_complete([(j.id, j.lease_version, None) for j in jobs])
    plans = [_plan(store.JOB_CLAIM, {"now": None, "limit": 10, "worker": "bench", "lease": 30.0,
                                     "queues": ["default"], "claim": "bench", "tasks": None,
                                     "all_tasks": True}) for _ in range(5)]
    plan, exec_ms = plans[-1][0], statistics.median(p[1] for p in plans)
    with open(os.path.join(workdir, f"claim-plan-{size}.txt"), "w") as f:
        f.write(plan)
    row = {"rows": size, "claim_ms_p50": percentile(times, 50), "claim_ms_p95": percentile(times, 95),
           "explain_exec_ms": exec_ms, "uses_ready_index": "leasequeue_job_ready" in plan,
           "table_mib": float(size_mb), "plan": plan}
    log(f"claim cost @ {size:,} ({size_mb:,.0f} MiB): p50 {row['claim_ms_p50']:.2f} ms, "
        f"p95 {row['claim_ms_p95']:.2f} ms, EXPLAIN {exec_ms:.2f} ms, ready index used: {row['uses_ready_index']}")
    return row


def measure_prune(c: psycopg.Connection, size: int, workdir: str) -> dict:
    """The retention pruner on a table of ``size`` seeded rows, in a rolled-back transaction (the
    cached database stays as it is): 5 batches of 1,000."""
    from django.db import transaction

    from django_leasequeue import store

    # The seeded finished rows finished 1 to ~17.6 hours ago, evenly: a retention of 17 hours makes
    # ~3.5 % of them due for deletion, the pruner's usual situation (most finished rows are younger).
    retention = 17 * 3600.0
    plan, exec_ms = _plan(store.JOB_PRUNE, {"now": None, "age": retention, "limit": 1000,
                                            "every": store.PRUNE_FULL_PASS_EVERY})
    prune_times, deleted = [], 0
    with transaction.atomic():
        for _ in range(5):
            t0 = time.perf_counter()
            n = store.job_prune(older_than=retention, limit=1000)
            prune_times.append((time.perf_counter() - t0) * 1000.0)
            deleted += n
        transaction.set_rollback(True)
    with open(os.path.join(workdir, "prune-plan.txt"), "w") as f:
        f.write(plan)
    log(f"prune @ {size:,}: {percentile(prune_times, 50):.1f} ms per batch ({deleted} rows in 5 batches), "
        f"finished index used: {'leasequeue_job_finished' in plan}")
    return {"prune_rows": size, "prune_batch_ms_p50": percentile(prune_times, 50), "prune_deleted": deleted,
            "prune_explain_ms": exec_ms, "prune_uses_finished_index": "leasequeue_job_finished" in plan,
            "plan": plan}


def bench_claim_cost(cfg: Config, dbs: Databases, workdir: str) -> list[dict]:
    """Claim cost against tables of finished (90 %) and future (10 %) rows: the small sizes grow
    one fresh database; each size from ``BIG`` up is its own cached database (:func:`ensure_big`)."""
    rows: list[dict] = []
    small = [s for s in cfg.claim_sizes if s < BIG]
    big = [s for s in cfg.claim_sizes if s >= BIG]
    if small:
        db = dbs.fresh()
        with connect(db) as c:
            c.execute("ALTER TABLE leasequeue_job SET (autovacuum_enabled = false)")
            have = 0
            for size in small:
                t0 = time.monotonic()
                for start in range(have + 1, size + 1, 1_000_000):
                    _seed(c, start, min(size, start + 999_999))
                have = size
                c.execute("VACUUM ANALYZE leasequeue_job")
                log(f"claim cost: {size:,} filler rows seeded and vacuumed in {time.monotonic() - t0:.1f} s")
                rows.append(measure_claims(cfg, c, size, workdir))
            if not big:
                rows.append(measure_prune(c, size, workdir))
    for size in big:
        dbs.setup_django()
        name = ensure_big(cfg, dbs, size)
        dbs.use(name)
        try:
            with connect(name) as c:
                rows.append(measure_claims(cfg, c, size, workdir))
                if size == big[-1]:
                    rows.append(measure_prune(c, size, workdir))
                filler_max = c.execute("SELECT filler_max FROM lqbench_cache").fetchone()[0]
                c.execute("DELETE FROM leasequeue_job WHERE id > %s", [filler_max])  # leave the cache as built
                c.execute("VACUUM ANALYZE leasequeue_job")
        finally:
            dbs.use(cfg.db)
    return rows


# ---------------------------------------------------------------------------------------------
# Peers
# ---------------------------------------------------------------------------------------------


# Peers that drain below ~150 jobs/s on this machine (end to end, as the harness measures it) run
# with fewer jobs: 20,000 would take 2.5 to 9 minutes per repetition. Their rates are per second,
# so they stay comparable; the table shows every system's job count.
SLOW_PEERS = {"chancy": 2000, "django-q2": 2000}


def peers_skip_reason(cfg: Config) -> str | None:
    """Why the peers cannot run (the harness is missing), or None."""
    if has_harness(cfg.peers_dir):
        return None
    where = " or ".join(dict.fromkeys(show_path(p) for p in peers_candidates()))
    return f"harness not found at {where}; set PEERS_DIR"


# pip warns once per configured index or find-links location that does not exist on this machine
# (a global pip.conf): noise for the benchmark, filtered from the peers' virtualenv setup.
PIP_NOISE = re.compile(r"^WARNING: Location .* is ignored")


def setup_peers_venv(cfg: Config, venv: str) -> None:
    """Create the peers' virtualenv with the harness's ``setup_venv.sh``; its output goes to stderr
    without pip's "Location ... is ignored" warnings."""
    log(f"creating the peers' virtualenv in {venv} (first run only; pip-installs the peer queues)")
    proc = subprocess.Popen([os.path.join(cfg.peers_dir, "setup_venv.sh")], env={**os.environ, "PEERS_VENV": venv},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if not PIP_NOISE.match(line):
            sys.stderr.write(line)
    if proc.wait() != 0:
        raise subprocess.CalledProcessError(proc.returncode, proc.args)


def drop_peer_databases(systems: list[str]) -> None:
    """Drop the ``bench_<system>`` databases the harness created for ``systems`` (it leaves them
    behind). Without FORCE: a database someone else is connected to is kept, with a message."""
    with connect(os.environ.get("PG_MAINTENANCE_DB", "postgres")) as c:
        for system in systems:
            name = "bench_" + system.replace("-", "_")
            try:
                c.execute(f'DROP DATABASE IF EXISTS "{name}"')
            except psycopg.Error as e:
                log(f"peers: could not drop database {name}: {str(e).strip()}")


def run_peers(cfg: Config, workdir: str) -> list[dict]:
    harness = os.path.join(cfg.peers_dir, "harness")
    venv = os.environ.get("PEERS_VENV") or os.path.join(tempfile.gettempdir(), "leasequeue-peers-venv")
    peers_py = os.path.join(venv, "bin", "python")
    if cfg.peers and not os.path.exists(peers_py):
        setup_peers_venv(cfg, venv)
    raw = os.path.join(os.path.dirname(cfg.out), "peers_raw.jsonl")
    os.makedirs(os.path.dirname(raw), exist_ok=True)

    def common(system: str) -> list[str]:
        n = min(cfg.peers_n, SLOW_PEERS.get(system, cfg.peers_n))
        return ["--n", str(n), "--reps", str(cfg.peers_reps), "--lat-n", str(cfg.peers_lat_n), "--out", raw]

    # Same concurrency as our 2 x 4 row where the peer has the knob (Procrastinate's default is 1).
    # Without this benchmark's own variables (set when its in-process Django started): a peer that
    # looks for DJANGO_SETTINGS_MODULE (Chancy's job processes do) would load lqbench.settings.
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE" and not k.startswith("LQBENCH_")}
    env["PEERS_PROCRASTINATE_CONCURRENCY"] = os.environ.get("PEERS_PROCRASTINATE_CONCURRENCY", "4")
    results = []
    runs = [("leasequeue", [sys.executable, os.path.join(BENCH, "peer_adapter", "run_harness.py"), harness,
                            "leasequeue", *common("leasequeue")])]
    runs += [(s, [peers_py, os.path.join(harness, "run_peer.py"), s, *common(s)]) for s in cfg.peers]
    log(f"peers harness: {show_path(cfg.peers_dir)}; virtualenv {venv}")
    try:
        for system, cmd in runs:
            log(f"peers harness: {system} ({' '.join(cmd[-8:-2])})")
            proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
            line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("{")), None)
            if proc.returncode != 0 or line is None:
                log(f"peers harness: {system} failed (exit {proc.returncode})")
                results.append({"system": system, "error": True})
                continue
            results.append(json.loads(line))
    finally:
        if not cfg.keep:
            drop_peer_databases([system for system, _ in runs])
    return results


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def fmt(v: float | None, nd: int = 0) -> str:
    return "n/a" if v is None else f"{v:,.{nd}f}"


def spread(runs: list[dict], key: str, nd: int = 0) -> str:
    vals = [r[key] for r in runs if r.get(key) is not None]
    if not vals:
        return "n/a"
    m = statistics.median(vals)
    if len(vals) == 1:
        return fmt(m, nd)
    return f"{fmt(m, nd)} [{fmt(min(vals), nd)}-{fmt(max(vals), nd)}]"


TARGETS = {
    "enqueue single": ">= 3,000 /s and >= 1.25x pgqueuer",
    "enqueue bulk": ">= 100,000 /s",
    "drain 2x4": ">= 3.5x best peer in the harness, >= 4x with this row's rate",
    "latency notify": "p50 <= 3 ms, p99 <= 10 ms",
    "on time": "p99 <= 50 ms",
    "hot": ">= 90 %",
    "claim": "p50 within 2x of the 10k row",
}
MAIN_SECTIONS = [s for s in SECTIONS if s not in ("peers", "flow", "scale", "wal")]


def verdict(ok: bool | None, detail: str = "") -> str:
    """The verdict cell of a row with a target: met / **missed** (or n/a), with ``detail``."""
    word = "n/a" if ok is None else "met" if ok else "**missed**"
    return f"{word} ({detail})" if detail else word


def best_peer(results: dict) -> dict | None:
    """The peer (not django-leasequeue) with the highest drain rate in the peers run, or None."""
    peers = [r for r in results.get("peers") or [] if r["system"] != "leasequeue" and not r.get("error")
             and r.get("drain_per_s")]
    return max(peers, key=lambda r: r["drain_per_s"]) if peers else None


def drain_verdict(cfg: Config, results: dict, rate: float | None) -> str:
    """Verdict of a 2 x 4 drain row against the best peer's drain through the peers harness: ours
    through the harness too (same method) >= 3.5x, and this row's ``rate`` (jobs/s) >= 4x."""
    if rate is None:
        return verdict(None)
    best = best_peer(results)
    if best is None:
        why = ("peers skipped" if results.get("peers_skipped") else "peers failed" if results.get("peers")
               else "peers not run")
        return verdict(None, f"peer ratio not measured ({why})")
    ours = next((r for r in results["peers"] if r["system"] == "leasequeue" and r.get("drain_per_s")), None)
    row_ratio = rate / best["drain_per_s"]
    detail = f"{row_ratio:.2f}x {best['system']} with this row's rate"
    ok = row_ratio >= 4
    if ours:
        harness_ratio = ours["drain_per_s"] / best["drain_per_s"]
        detail = f"{harness_ratio:.2f}x {best['system']} in the harness, {detail}"
        ok = ok and harness_ratio >= 3.5
    note = "; quick run: not comparable" if cfg.quick else ""
    return verdict(ok, f"{detail}{note}")


def single_enqueue_verdict(results: dict, rate: float | None) -> str:
    """Verdict of a single-enqueue row: ``rate`` (jobs/s) >= 3,000 and >= 1.25x PgQueuer's single
    enqueue through the peers harness (judged on the rate alone when PgQueuer did not run)."""
    if rate is None:
        return verdict(None)
    peer = next((r for r in results.get("peers") or [] if r["system"] == "pgqueuer" and not r.get("error")
                 and r.get("enqueue_single_per_s")), None)
    if peer is None:
        return verdict(rate >= 3000, "pgqueuer not measured")
    ratio = rate / peer["enqueue_single_per_s"]
    return verdict(rate >= 3000 and ratio >= 1.25, f"{ratio:.2f}x pgqueuer")


def run_label(cfg: Config, results: dict) -> str:
    """``full``/``quick``, plus which sections ran when not all of them, and the job counts."""
    ran = [s for s in SECTIONS if s in cfg.sections]
    parts = ["quick" if cfg.quick else "full"]
    if ran != SECTIONS:
        parts[0] = f"{'quick, ' if cfg.quick else ''}partial: {', '.join(ran) if ran else 'nothing'}"
    if set(ran) & set(MAIN_SECTIONS):
        parts.append(f"median of {cfg.reps} [min-max]")
    if "drain" in cfg.sections:
        parts.append(f"{cfg.jobs:,} jobs per drain")
    if "peers" in cfg.sections and not results.get("peers_skipped"):
        parts.append(f"peers {cfg.peers_n:,} jobs per system")
    return "; ".join(parts)


def report(cfg: Config, results: dict) -> str:
    out = []
    w = out.append
    w(f"# django-leasequeue benchmark ({run_label(cfg, results)})")
    w("")
    w(f"Host: {os.cpu_count()} CPUs; load average at start {results['load_start']}, at end {results.get('load_end')}; "
      f"PostgreSQL {results.get('server_version', '?')}, synchronous_commit={results.get('sync_commit', '?')}; "
      f"run took {results.get('duration_s', 0) / 60:.1f} min ({results.get('started', '?')}).")
    if results.get("prepared_statements") is False:
        w("")
        w("`PREPARED_STATEMENTS` off (`LQBENCH_PREPARED_STATEMENTS=0`): claims and single enqueues parsed and "
          "planned on every call.")
    if cfg.quick:
        w("")
        per_peer = f", {cfg.peers_n:,} per peer" if "peers" in cfg.sections else ""
        w(f"**Quick run** (smoke test): {cfg.jobs:,} jobs per drain{per_peer}, {cfg.reps} repetition(s). "
          "The targets and the peer ratios are set for the full run (20,000 jobs, median of 3) and are not "
          "comparable here: with fewer jobs, start-up and warm-up weigh more (the drain ratio to the best peer "
          "comes out lower), so the verdicts are indicative only; see docs/howto/performance.md.")
    if any(s in results for s in MAIN_SECTIONS):
        w("")
        w("| row | result | target | verdict |")
        w("|---|---|---|---|")
    if "enqueue" in results:
        r = results["enqueue"]
        single = median([x["single_per_s"] for x in r])
        bulk = median([x["bulk_per_s"] for x in r])
        w(f"| enqueue single (one `enqueue()` per transaction; SQL-prepared unless `PREPARED_STATEMENTS` is off), "
          f"jobs/s | {spread(r, 'single_per_s')} "
          f"| {TARGETS['enqueue single']} | {single_enqueue_verdict(results, single)} |")
        if any(x.get("single_prepared_per_s") is not None for x in r):
            prepared = median([x["single_prepared_per_s"] for x in r if x.get("single_prepared_per_s") is not None])
            w(f"| enqueue single, its INSERT prepared by psycopg (`prepare_threshold` set), jobs/s | "
              f"{spread(r, 'single_prepared_per_s')} | {TARGETS['enqueue single']} "
              f"| {single_enqueue_verdict(results, prepared)} |")
        w(f"| enqueue_many (10,000 in one statement), jobs/s | {spread(r, 'bulk_per_s')} | {TARGETS['enqueue bulk']} "
          f"| {verdict(None if bulk is None else bulk >= 100_000)} |")
    for key, runs in results.get("drain", {}).items():
        p, t, a = key
        target = TARGETS["drain 2x4"] if (p, t) == (2, 4) else ""
        check = drain_verdict(cfg, results, median([x["jobs_per_s"] for x in runs])) if target else ""
        w(f"| drain {cfg.jobs:,} no-op jobs, {p} process{'es' if p > 1 else ''} x {t} thread{'s' if t > 1 else ''}"
          f"{' (ASYNC_COMPLETIONS)' if a else ''}, jobs/s | {spread(runs, 'jobs_per_s')} "
          f"(jobs/claim {spread(runs, 'jobs_per_claim', 1)}, jobs/completion flush "
          f"{spread(runs, 'jobs_per_completion_flush', 1)}, WAL bytes/job enqueue_many to done "
          f"{spread(runs, 'wal_bytes_per_job')}"
          f"{'' if all(x.get('wal_scope') == 'own' for x in runs) else ' server-wide'}) | {target} | {check} |")
    for notify in (True, False):
        runs = results.get("latency", {}).get(notify)
        if runs:
            name = "LISTEN/NOTIFY" if notify else "polling (`--no-notify`, 1 s poll)"
            check = ""
            if notify:
                p50, p99 = median([x["p50_ms"] for x in runs]), median([x["p99_ms"] for x in runs])
                check = verdict(None if p50 is None or p99 is None else p50 <= 3 and p99 <= 10)
            w(f"| enqueue-to-start latency, {name}, p50 / p99 ms ({cfg.lat_n} jobs) | {spread(runs, 'p50_ms', 1)} / "
              f"{spread(runs, 'p99_ms', 1)} | {TARGETS['latency notify'] if notify else ''} | {check} |")
    for when in ("before", "after"):
        runs = results.get("ontime", {}).get(when)
        if runs:
            p99 = median([x["p99_ms"] for x in runs])
            name = "this version" if when == "after" else "the `--ontime-baseline` worker"
            w(f"| on time: start of jobs due later (delays, retries, snoozes) after their run_at, "
              f"`POLL_INTERVAL = 10`, {name}, p50 / p99 / max ms ({runs[0]['samples']} jobs) | "
              f"{spread(runs, 'p50_ms', 1)} / {spread(runs, 'p99_ms', 1)} / {spread(runs, 'max_ms', 1)} "
              f"(earliest {spread(runs, 'min_ms', 1)}) | {TARGETS['on time'] if when == 'after' else ''} | "
              f"{verdict(None if p99 is None else p99 <= 50) if when == 'after' else ''} |")
    if "hot" in results:
        runs = results["hot"]
        pct = [{"v": r["hot_ratio"] * 100 if r["hot_ratio"] is not None else None,
                "run": r["run_hot_ratio_heartbeats"] * 100 if r["run_hot_ratio_heartbeats"] is not None else None}
               for r in runs]
        hot = median([x["v"] for x in pct])
        w(f"| HOT heartbeat updates (16 long jobs, lease 1.5 s), % | {spread(pct, 'v', 1)} "
          f"(whole run, claims and completions excluded: {spread(pct, 'run', 1)}) | {TARGETS['hot']} "
          f"| {verdict(None if hot is None else hot >= 90)} |")
    claims = [row for row in results.get("claim", []) if "rows" in row]
    small = next((row for row in claims if row["rows"] == 10_000), None)
    big = max((row for row in claims if row["rows"] >= 10_000_000), key=lambda row: row["rows"], default=None)
    for row in results.get("claim", []):
        if "rows" in row:
            target = check = ""
            if row is big and small is not None:  # the target only where there is a 10M row to check
                target = TARGETS["claim"]
                check = verdict(row["claim_ms_p50"] <= 2 * small["claim_ms_p50"],
                                f"{row['claim_ms_p50'] / small['claim_ms_p50']:.2f}x")
            w(f"| claim 10 jobs with {row['rows']:,} finished/future rows in the table, ms per statement | "
              f"p50 {row['claim_ms_p50']:.2f}, p95 {row['claim_ms_p95']:.2f} (server execution "
              f"{row['explain_exec_ms']:.2f}; "
              f"`leasequeue_job_ready` used: {'yes' if row['uses_ready_index'] else 'NO'}) | {target} | {check} |")
        else:
            w(f"| retention prune (`job_prune`, batches of 1,000) with {row['prune_rows']:,} rows, ms per batch | "
              f"{row['prune_batch_ms_p50']:.1f} ({row['prune_deleted']:,} rows deleted in 5 batches; "
              f"`leasequeue_job_finished` used: {'yes' if row['prune_uses_finished_index'] else 'NO'}) | | |")
    for key, runs in results.get("drain", {}).items():
        if key == (1, 16, False):
            w(f"| peak RSS of a worker process with 16 threads (VmHWM), MiB | {spread(runs, 'peak_rss_mb', 1)} | | |")
    if results.get("profile"):
        w("")
        w(f"## Profile of the 2 x 4 drain (py-spy, one extra run at "
          f"{results['profile_run'][0]['jobs_per_s']:,.0f} jobs/s under the profiler)")
        w("")
        w(results["profile"])
    if results.get("peers_skipped"):
        w("")
        w(f"peers: skipped ({results['peers_skipped']})")
    peers = results.get("peers")
    if peers:
        w("")
        w(f"## Peer queues, same harness (median of {cfg.peers_reps} rep(s), {cfg.peers_lat_n} trickle jobs "
          f"per rep; `{show_path(cfg.peers_dir)}`)")
        w("")
        w("| system | jobs | enqueue single /s | enqueue bulk /s | drain /s | latency p50 ms | latency p99 ms "
          "| workers |")
        w("|---|---|---|---|---|---|---|---|")
        for r in peers:
            if r.get("error"):
                w(f"| {r['system']} | error | | | | | | |")
                continue
            w(f"| {r['system']} | {fmt(r.get('n'))} | {fmt(r.get('enqueue_single_per_s'))} | "
              f"{fmt(r.get('enqueue_bulk_per_s'))} | "
              f"{fmt(r.get('drain_per_s'))} | {fmt(r.get('latency_p50_ms'), 1)} | {fmt(r.get('latency_p99_ms'), 1)} | "
              f"{r.get('worker_desc', '')} |")
        ours = next((r for r in peers if r["system"] == "leasequeue" and not r.get("error")), None)
        own_drain = results.get("drain", {}).get((2, 4, False))
        own = median([x["jobs_per_s"] for x in own_drain]) if own_drain else None
        if ours:
            w("")
            w("Ratios ours/peer (enqueue, drain: higher is better; latency: lower is better). "
              "`drain (bench 2x4)` uses this benchmark's own 2 x 4 drain figure"
              f"{'' if own else ' (n/a: the drain section did not run)'}."
              + (" Quick run: fewer jobs, so these ratios are not comparable with the full run's." if cfg.quick
                 else ""))
            w("")
            w("| peer | enqueue single | enqueue bulk | drain (harness) | drain (bench 2x4) "
              "| latency p50 | latency p99 |")
            w("|---|---|---|---|---|---|---|")

            def ratio(a: float | None, b: float | None) -> str:
                return "n/a" if not a or not b else f"{a / b:,.2f}"

            for r in peers:
                if r is ours or r.get("error"):
                    continue
                w(f"| {r['system']} | {ratio(ours.get('enqueue_single_per_s'), r.get('enqueue_single_per_s'))} | "
                  f"{ratio(ours.get('enqueue_bulk_per_s'), r.get('enqueue_bulk_per_s'))} | "
                  f"{ratio(ours.get('drain_per_s'), r.get('drain_per_s'))} | {ratio(own, r.get('drain_per_s'))} | "
                  f"{ratio(ours.get('latency_p50_ms'), r.get('latency_p50_ms'))} | "
                  f"{ratio(ours.get('latency_p99_ms'), r.get('latency_p99_ms'))} |")
    if "flow" in results:
        w("")
        w(f"Flow control: drains of {cfg.jobs:,} no-op jobs, 1 x 4 threads, each compared with the plain drain "
          "of the same repetition (limits never bind; target: within 2x of plain).")
        w("")
        w("| drain | jobs/s | vs plain [min-max] | verdict |")
        w("|---|---|---|---|")
        for label, runs in results["flow"].items():
            ratios = [x["vs_plain"] for x in runs]
            ok = median(ratios) is not None and median(ratios) >= 0.5
            w(f"| {label} | {fmt(median([x['jobs_per_s'] for x in runs]))} | {median(ratios):.2f} "
              f"[{min(ratios):.2f}-{max(ratios):.2f}] | {'within 2x' if ok else 'SLOWER than 2x'} |")
    if "workflows" in results:
        wf = results["workflows"]
        w("")
        w(f"Workflows: {WF_MEMBERS:,}-member batch and group, drains 1 x 4 threads, a {WF_CHAIN_STEPS}-step chain "
          f"into an idle worker (NOTIFY on); median [min-max] of {len(wf['drain'])} repetitions.")
        w("")
        w("| row | figure [min-max] | target | verdict |")
        w("|---|---|---|---|")
        for key, what in (("build_batch", "build a batch (open + add_many + close), jobs/s"),
                          ("build_group", "build a group() and enqueue it, jobs/s")):
            m = median([x["jobs_per_s"] for x in wf[key]])
            w(f"| {what} | {spread(wf[key], 'jobs_per_s')} | >= 50,000 | {verdict(m is not None and m >= 50_000)} |")
        d = wf["drain"]
        w(f"| drain plain, jobs/s | {spread(d, 'plain_per_s')} | | |")
        w(f"| drain batch + on_success, jobs/s (ledger checked) | {spread(d, 'batch_per_s')} | | |")
        m = median([x["plain_over_batch"] for x in d])
        w(f"| plain / batch | {spread(d, 'plain_over_batch', 2)} | <= 1.5 | {verdict(m is not None and m <= 1.5)} |")
        ch = wf["chain"]
        m = median([x["p50_ms"] for x in ch])
        w(f"| chain step-to-step p50, ms | {spread(ch, 'p50_ms', 1)} | <= 10 | {verdict(m is not None and m <= 10)} |")
        w(f"| chain step-to-step p99, ms | {spread(ch, 'p99_ms', 1)} | | |")
    if results.get("scale"):
        w("")
        out.extend(scale_bench.report(results["scale"], cfg.reps))
        if results.get("scale_plot"):
            w(f"![scale curve]({'../img/scale.png' if cfg.write_docs else results['scale_plot']})")
    if results.get("wal_skipped"):
        w("")
        w(f"wal: skipped ({results['wal_skipped']})")
    if results.get("wal"):
        w("")
        out.extend(wal_bench.report(results["wal"], cfg.peers_reps))
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


DOCS = os.path.join(REPO, "docs", "howto", "performance.md")
DOCS_START, DOCS_END = "<!-- bench-results:start -->", "<!-- bench-results:end -->"


def write_docs(text: str) -> None:
    """Replace the measured table in docs/howto/performance.md (between its bench-results markers), its
    headings demoted to fit under the page's own."""
    with open(DOCS) as f:
        page = f.read()
    if DOCS_START not in page or DOCS_END not in page:
        raise SystemExit(f"{DOCS} has no {DOCS_START} ... {DOCS_END} markers")
    body = "\n".join("###" + line[1:] if line.startswith("# ") else "####" + line[2:] if line.startswith("## ")
                     else line for line in text.splitlines())
    head, rest = page.split(DOCS_START, 1)
    tail = rest.split(DOCS_END, 1)[1]
    with open(DOCS, "w") as f:
        f.write(f"{head}{DOCS_START}\n{body}\n{DOCS_END}{tail}")
    log(f"table written into {DOCS}")


def load_results(path: str) -> tuple[Config, dict]:
    """The configuration and results of an earlier run, from its raw results file (``--out``)."""
    with open(path) as f:
        data = json.load(f)
    conf = {k: v for k, v in data["config"].items() if k in Config.__dataclass_fields__}
    sections = conf["sections"]  # a list; older files have the str() of a set
    conf["sections"] = set(ast.literal_eval(sections) if isinstance(sections, str) else sections)
    cfg = Config(**{**conf, "drains": []})
    results = dict(data["results"])
    if "drain" in results:
        drains = {}
        for key, runs in results["drain"].items():  # "2x4", "2x4-async"
            p, _, rest = key.partition("x")
            drains[(int(p), int(rest.split("-")[0]), rest.endswith("-async"))] = runs
        results["drain"] = drains
    if "latency" in results:
        results["latency"] = {k == "notify": v for k, v in results["latency"].items()}
    return cfg, results


def _terminate(signum, frame):  # run the finally blocks (stop workers) on SIGTERM/SIGHUP
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    cfg = parse_args(argv)
    t_start = time.monotonic()
    if cfg.drop_cache:
        drop_big(cfg, Databases(cfg))
        return 0
    if cfg.render:
        old_cfg, old_results = load_results(cfg.render)
        # Written into the docs, the table links the plot copied there (not the run's build path).
        old_cfg.write_docs = cfg.write_docs
        text = report(old_cfg, old_results)
        print(text, flush=True)
        if cfg.write_docs:
            write_docs(text)
            plot = old_results.get("scale_plot")
            if plot and os.path.exists(plot):
                shutil.copyfile(plot, scale_bench.DOCS_PLOT)
                log(f"scale plot copied to {scale_bench.DOCS_PLOT}")
        return 0
    os.makedirs(os.path.dirname(os.path.abspath(cfg.out)), exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="leasequeue-bench-")
    results: dict = {"load_start": load_average(), "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                     "prepared_statements": os.environ.get("LQBENCH_PREPARED_STATEMENTS") != "0"}
    with connect("postgres") as c:
        results["server_version"] = c.execute("SHOW server_version").fetchone()[0]
        results["sync_commit"] = c.execute("SHOW synchronous_commit").fetchone()[0]
    log(f"sections {sorted(cfg.sections)}; logs in {workdir}; load {results['load_start']}")
    if "peers" in cfg.sections:
        results["peers_skipped"] = peers_skip_reason(cfg)
        if results["peers_skipped"]:
            log(f"peers: skipped ({results['peers_skipped']})")
    dbs = Databases(cfg)
    needs_db = cfg.sections - {"peers", "wal"}
    try:
        if needs_db:
            dbs.prepare()
        if "enqueue" in cfg.sections:
            results["enqueue"] = bench_enqueue(cfg, dbs)
        if "drain" in cfg.sections:
            results["drain"] = {}
            for p, t, a in cfg.drains:
                results["drain"][(p, t, a)] = bench_drain(cfg, dbs, p, t, a, workdir)
            if cfg.profile:
                base = os.path.join(workdir, "profile-2x4")
                log(f"profiling one more 2 x 4 drain with py-spy ({py_spy()})")
                results["profile_run"] = bench_drain(cfg, dbs, 2, 4, False, workdir, profile_to=base)
                results["profile"] = summarize_profile(glob.glob(base + ".*.txt"))
        if "latency" in cfg.sections:
            results["latency"] = {n: bench_latency(cfg, dbs, n, workdir) for n in (True, False)}
        if "ontime" in cfg.sections:
            results["ontime"] = {"after": bench_ontime(cfg, dbs, workdir)}
            if cfg.ontime_baseline:
                results["ontime"]["before"] = bench_ontime(cfg, dbs, workdir, baseline=cfg.ontime_baseline)
        if "hot" in cfg.sections:
            results["hot"] = bench_hot(cfg, dbs, workdir)
        if "claim" in cfg.sections:
            results["claim"] = bench_claim_cost(cfg, dbs, workdir)
        if "flow" in cfg.sections:
            results["flow"] = bench_flow(cfg, dbs, workdir)
        if "workflows" in cfg.sections:
            results["workflows"] = bench_workflows(cfg, dbs, workdir)
        if "scale" in cfg.sections:
            results["scale"] = scale_bench.bench_scale(sys.modules[__name__], cfg, dbs, workdir)
    finally:
        if needs_db and not cfg.keep:
            dbs.drop_all()
    if "peers" in cfg.sections and not results["peers_skipped"]:
        results["peers"] = run_peers(cfg, workdir)
    if "wal" in cfg.sections:
        results["wal_skipped"] = peers_skip_reason(cfg)
        if results["wal_skipped"]:
            log(f"wal: skipped ({results['wal_skipped']})")
        else:
            results["wal"] = wal_bench.run_wal(sys.modules[__name__], cfg, workdir)
    if results.get("scale"):
        results["scale_plot"] = scale_bench.plot(results["scale"])
        log(f"scale plot: {results['scale_plot'] or 'not drawn (matplotlib missing: install the bench extra)'}")
    results["load_end"] = load_average()
    results["duration_s"] = time.monotonic() - t_start
    text = report(cfg, results)
    print(text, flush=True)
    table_path = os.path.splitext(cfg.out)[0] + ".md"
    with open(table_path, "w") as f:
        f.write(text + "\n")
    log(f"table written to {table_path}")
    if cfg.write_docs:
        write_docs(text)
        if results.get("scale_plot"):
            shutil.copyfile(results["scale_plot"], scale_bench.DOCS_PLOT)
            log(f"scale plot copied to {scale_bench.DOCS_PLOT}")
    serialisable = {**results}
    if "drain" in serialisable:
        serialisable["drain"] = {f"{p}x{t}{'-async' if a else ''}": v for (p, t, a), v in results["drain"].items()}
    if "latency" in serialisable:
        serialisable["latency"] = {("notify" if k else "polling"): v for k, v in results["latency"].items()}
    with open(cfg.out, "w") as f:
        config = {k: sorted(v) if isinstance(v, set) else v for k, v in vars(cfg).items() if k != "drains"}
        json.dump({"config": config, "results": serialisable,
                   "table": text}, f, indent=1, default=str)
    log(f"raw results: {cfg.out}; worker logs and plans: {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
