"""WAL bytes per job, enqueue to done, of one system of the peers harness (ours included).

Usage: python bench/peer_adapter/wal_harness.py HARNESS_DIR SYSTEM [--n 10000] [--reps 3]

Drives the harness's own per-system code, imported from the read-only harness folder, never copied:
its ``Adapter`` (``install``, ``enqueue_single``, ``enqueue_bulk``, ``worker_commands``,
``pending_sql``), its ``Workers``, ``LogTail``, ``worker_env`` and ``recreate_database`` (common.py)
and ``wait_for`` (run_peer.py). For ``leasequeue`` it adds this folder to the harness's ``systems``
package, as ``run_harness.py`` does. Run it with the Python that runs the system (the peers'
virtualenv for the peers, the project's for ``leasequeue``).

For each repetition and each path, ``single`` (``enqueue_single``: one job per transaction) and
``bulk`` (``enqueue_bulk``, where the system has one), on a fresh database ``<--db-prefix><system>``:

1. install the schema; read ``pg_current_wal_insert_lsn()`` (L0; the insert position:
   ``pg_current_wal_lsn()`` is the write position, which lags records not yet written out);
2. enqueue N no-op jobs, workers stopped; read L1; ``ANALYZE`` (as the harness does before its
   drain); read L2 (the ANALYZE's own WAL, L2 - L1, is left out);
3. start the system's workers, wait until every job recorded its start and the system's own table
   shows nothing pending; stop the workers (they flush what they buffer); read L3.

WAL per job = ((L1 - L0) + (L3 - L2)) / N, split into its enqueue part and its drain part (worker
start-up and shutdown writes included: they are each system's fixed cost, spread over N jobs).

Where the ``pg_walinspect`` extension is available (a contrib module of PostgreSQL 15+; created in
the measured database), the same spans are also read back record by record, every second while
they are written (:class:`OwnWal`), and only the database's own WAL is counted (``own_*``): records
whose block references name the database, and the records of the same transactions (their
commits). That figure does not count other sessions' writes.

The same measure reads the CPU time of the PostgreSQL backends serving the database (``/proc``,
PostgreSQL on this machine), enqueue to done and for the enqueue alone, in microseconds per job
(``server_cpu_us_per_job``): the server's cost per job, for a capacity estimate. Background
processes (autovacuum, the checkpointer, the WAL writer) are not counted.

The WAL position is server-wide: anything else writing on the server during the measure is
counted too. The script reads the background WAL rate in a 1 s window with no work of its own just
before each measure and reports it (``background_bytes_per_s``) with the share of the figure it
could explain (``background_share``), and it counts checkpoints that fell inside the measure
(``checkpoints``: after one, the first change of each page writes a full-page image, so such a
run writes more). One JSON line per repetition and path goes to stderr; a JSON summary (per path:
the median and the min and max over the repetitions) to stdout.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")


def lsn(c: Any) -> str:
    """The server's current WAL insert position (text form, e.g. ``0/3A000060``)."""
    return str(c.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])


def diff(c: Any, end: str, start: str) -> int:
    """Bytes of WAL between two positions."""
    return int(c.execute("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)::bigint", (end, start)).fetchone()[0])


# WAL records of one database, read back with pg_walinspect: those whose block references name the
# database (``rel <tablespace>/<database>/<relfilenode>``) and the records (commits) of the same
# transactions. Each record counts the WAL space it takes (end - start: header, data, full-page
# images, alignment). One step of OwnWal: those bytes in the span, and where its last record ends.
OWN_WAL_STEP = """
WITH r AS (SELECT xid, start_lsn, end_lsn, block_ref LIKE %(pattern)s AS ours
           FROM pg_get_wal_records_info(%(start)s::pg_lsn, %(end)s::pg_lsn)),
     x AS (SELECT DISTINCT xid FROM r WHERE ours AND xid <> 0)
SELECT coalesce(sum(end_lsn - start_lsn) FILTER (WHERE ours OR xid IN (SELECT xid FROM x)), 0)::bigint,
       max(end_lsn)::text
FROM r
"""


class OwnWal(threading.Thread):
    """This database's own WAL (see :data:`OWN_WAL_STEP`), read back as it is written: a busy server
    recycles its WAL segments after each checkpoint, which can come within seconds, so a thread
    with a connection of its own reads what was flushed every second while :attr:`active`. Each
    step starts where the previous step's last record ended (a record that straddles a step's end
    is read whole by the next step). :meth:`mark` ends a phase at an exact position; :meth:`jump`
    skips a span (the ANALYZE between enqueue and drain). :attr:`error` says why the figure is
    missing (no pg_walinspect, WAL already recycled)."""

    def __init__(self, db_dsn: str, c: Any, start: str, *, hold: bool = False) -> None:
        super().__init__(daemon=True)
        self.dsn = db_dsn
        # hold: read nothing while the WAL is written (a reader beside a timed drain takes CPU
        # from it: on 2 cores the drain rows ran 25-35 % slower with it), and keep the segments
        # with a temporary physical replication slot of the thread's connection instead, until
        # :meth:`mark` reads them; the slot goes with the connection.
        self.hold = hold
        self.ready = threading.Event()
        oid = c.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()[0]
        self.pattern = f"%/{oid}/%"
        self.pos = start
        self.total = 0
        self.error: str | None = None
        self.active = True
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    def _step(self, c: Any, limit: str | None) -> None:
        if self.error is not None:
            return
        try:
            flush = c.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0]
            end = flush if limit is None or diff(c, flush, limit) < 0 else limit
            if diff(c, end, self.pos) <= 0:
                return
            own, last = c.execute(OWN_WAL_STEP, {"pattern": self.pattern, "start": self.pos, "end": end}).fetchone()
        except Exception as e:  # no extension, WAL removed: the server-wide figure stands alone
            self.error = f"{type(e).__name__}: {str(e).strip()}"
            print(f"own WAL not read back: {self.error}", file=sys.stderr, flush=True)
            return
        self.total += int(own)
        if last is not None:
            self.pos = last

    def mark(self, c: Any, end: str) -> int | None:
        """Stop the thread's reading, read up to ``end`` (once the server has flushed it) with
        connection ``c``; return the bytes counted so far, or None after an error."""
        with self.lock:
            self.active = False
            deadline = time.monotonic() + 10
            while diff(c, c.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0], end) < 0:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            self._step(c, end)
            return None if self.error else self.total

    def jump(self, position: str) -> None:
        """Go on counting from ``position`` (the span before it is left out) and resume the thread."""
        with self.lock:
            self.pos = position
            self.active = True

    def run(self) -> None:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as c:
            if self.hold:
                try:
                    c.execute("SELECT pg_create_physical_replication_slot(%s, true, true)",
                              (f"lqbench_wal_{os.getpid()}_{id(self)}",))
                except Exception as e:  # no free slot: read back at the end all the same
                    print(f"WAL not held by a slot: {type(e).__name__}: {str(e).strip()}", file=sys.stderr, flush=True)
                self.ready.set()
                self.stopping.wait()
                return
            self.ready.set()
            while not self.stopping.wait(1.0):
                with self.lock:
                    if self.active:
                        self._step(c, None)

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)


class BackendCpu(threading.Thread):
    """CPU time (``utime + stime`` of ``/proc/<pid>/stat``) of the PostgreSQL backends serving one
    database, but ``exclude`` (the measuring connections), sampled every 0.1 s from a thread with a
    connection of its own. A backend first seen after the first sample counts from zero (it was
    born during the measure); one that exits counts up to its last sample. Needs PostgreSQL on this
    machine: elsewhere :meth:`ticks` is None."""

    def __init__(self, db_dsn: str, exclude: set[int]) -> None:
        super().__init__(daemon=True)
        self.dsn = db_dsn
        self.exclude = set(exclude)
        self.seen: dict[int, tuple[int, int]] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.readable = True
        self.first = True

    def sample(self, c: Any) -> None:
        """Read the backends' CPU now (with connection ``c``, whose backend is excluded too)."""
        rows = c.execute("SELECT pid, pg_backend_pid() FROM pg_stat_activity "
                         "WHERE datname = current_database()").fetchall()
        with self.lock:
            for pid, me in rows:
                if pid in self.exclude or pid == me:
                    continue
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                except FileNotFoundError:
                    continue
                except PermissionError:
                    self.readable = False
                    continue
                ticks = int(fields[11]) + int(fields[12])
                start = self.seen[pid][0] if pid in self.seen else (ticks if self.first else 0)
                self.seen[pid] = (start, ticks)
            self.first = False

    def run(self) -> None:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as c:
            while not self.stopping.is_set():
                self.sample(c)
                self.stopping.wait(0.1)

    def ticks(self) -> int | None:
        """Clock ticks used so far by the backends seen."""
        with self.lock:
            return sum(end - start for start, end in self.seen.values()) if self.readable else None

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)


def checkpoints(c: Any) -> int:
    """Checkpoints the server has completed since its statistics were reset (timed and requested)."""
    return int(c.execute("SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter").fetchone()[0])


def measure(system: str, path: str, n: int, rep: int, prefix: str = "bench_") -> dict[str, Any]:
    """One measure of ``path`` ("single" or "bulk") for ``system``; see the module docstring."""
    import psycopg
    from common import LogTail, Workers, dsn, recreate_database, worker_env
    from run_peer import module_for, wait_for

    db = prefix + system.replace("-", "_")
    recreate_database(db)
    adapter = importlib.import_module(module_for(system)).Adapter(db)
    log_dir = tempfile.mkdtemp(prefix=f"wal-{system}-")
    workers = None
    try:
        adapter.install()
        with psycopg.connect(dsn(db), autocommit=True) as c:
            try:
                c.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            except psycopg.Error:
                pass  # not available: OwnWal reports the error and the figure is None
            b0 = lsn(c)
            time.sleep(1.0)
            background = diff(c, lsn(c), b0)
            ck0 = checkpoints(c)
            cpu = BackendCpu(dsn(db), {c.info.backend_pid})
            cpu.sample(c)
            cpu.start()
            l0 = lsn(c)
            own_wal = OwnWal(dsn(db), c, l0)
            own_wal.start()
            t0 = time.monotonic()
            if path == "single":
                adapter.enqueue_single(n)
            else:
                adapter.enqueue_bulk(n)
            l1 = lsn(c)
            cpu.sample(c)
            cpu_enqueue = cpu.ticks()
            own_enqueue = own_wal.mark(c, l1)
            c.execute("ANALYZE")
            l2 = lsn(c)
            own_wal.jump(l2)
            tail = LogTail(log_dir)
            workers = Workers(adapter.worker_commands(), worker_env(log_dir), os.path.join(log_dir, "workers.out"))
            if not wait_for(tail, "d", n, workers, stall_s=60, poll_s=0.02):
                raise RuntimeError(f"{system}: drain stalled at {tail.count('d')} of {n} jobs")
            deadline = time.monotonic() + 60
            while (c.execute(adapter.pending_sql).fetchone() or (0,))[0] != 0:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{system}: jobs still pending 60 s after the last start")
                time.sleep(0.01)
            cpu.sample(c)
            workers.stop()
            workers = None
            cpu.stop()
            l3 = lsn(c)
            cpu_total = cpu.ticks()
            own_all = own_wal.mark(c, l3)
            own_wal.stop()
            seconds = time.monotonic() - t0
            enqueue, drain = diff(c, l1, l0), diff(c, l3, l2)
            own = own_all
            own_drain = None if own_all is None or own_enqueue is None else own_all - own_enqueue
            return {"system": system, "path": path, "rep": rep, "n": n,
                    "wal_bytes_per_job": (enqueue + drain) / n, "enqueue_bytes_per_job": enqueue / n,
                    "drain_bytes_per_job": drain / n, "analyze_bytes": diff(c, l2, l1),
                    "own_wal_bytes_per_job": None if own is None else own / n,
                    "own_enqueue_bytes_per_job": None if own_enqueue is None else own_enqueue / n,
                    "own_drain_bytes_per_job": None if own_drain is None else own_drain / n,
                    "server_cpu_us_per_job": None if cpu_total is None else cpu_total / CLK_TCK / n * 1e6,
                    "server_cpu_enqueue_us_per_job": None if cpu_enqueue is None else cpu_enqueue / CLK_TCK / n * 1e6,
                    "seconds": seconds, "background_bytes_per_s": background,
                    "background_share": background * seconds / max(1, enqueue + drain),
                    "checkpoints": checkpoints(c) - ck0}
    finally:
        if workers is not None:
            workers.stop()
        adapter.close()
        shutil.rmtree(log_dir, ignore_errors=True)


def stats(values: list[float | None]) -> dict[str, float] | None:
    """Median, min and max of the values that are not None; None when there are none."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="WAL bytes per job, enqueue to done, of one harness system")
    ap.add_argument("harness", help="the harness folder (../shared/bench/peers/harness)")
    ap.add_argument("system", help="a harness system, or leasequeue")
    ap.add_argument("--n", type=int, default=10_000, help="jobs per measure (default 10000)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per path (default 3)")
    ap.add_argument("--db-prefix", default="bench_",
                    help="the database is PREFIX<system> (dropped and recreated; default bench_)")
    ap.add_argument("--paths", default="single,bulk", help="enqueue paths to measure (default single,bulk)")
    a = ap.parse_args(argv)
    harness = os.path.abspath(a.harness)
    sys.path.insert(0, harness)
    import systems

    systems.__path__.append(os.path.dirname(os.path.abspath(__file__)))
    from run_peer import module_for

    adapter_cls = importlib.import_module(module_for(a.system)).Adapter
    paths = [p for p in a.paths.split(",") if p and (p != "bulk" or getattr(adapter_cls, "enqueue_bulk", None))]
    summary: dict[str, Any] = {"system": a.system, "n": a.n, "reps": a.reps}
    for path in paths:
        runs = []
        for rep in range(1, a.reps + 1):
            r = measure(a.system, path, a.n, rep, a.db_prefix)
            print(json.dumps(r), file=sys.stderr, flush=True)
            runs.append(r)
        summary[path] = {k: stats([r[k] for r in runs])
                         for k in ("wal_bytes_per_job", "enqueue_bytes_per_job", "drain_bytes_per_job",
                                   "own_wal_bytes_per_job", "own_enqueue_bytes_per_job", "own_drain_bytes_per_job",
                                   "server_cpu_us_per_job", "server_cpu_enqueue_us_per_job",
                                   "background_bytes_per_s", "background_share")}
        summary[path]["checkpoints"] = sum(r["checkpoints"] for r in runs)
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
