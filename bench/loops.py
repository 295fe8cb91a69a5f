"""The timing loop of the per-call benchmarks (``enqueue_breakdown.py``, ``tracing_bench.py``).

Each of them times loops of ``n`` calls on a scratch database migrated for the bench project
(:func:`scratch_database`), runs its loops in rotation for several rounds so that load from other
processes hits them alike (:func:`rounds`), and prints one table row per loop, the median of the
rounds with their range (:func:`print_table`).

Run as scripts from the repository root, they find this module on ``sys.path`` (their own folder).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import psycopg

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
PG = {k: os.environ.get(f"PG{k.upper()}", d) for k, d in
      (("host", "127.0.0.1"), ("port", "5432"), ("user", "postgres"), ("password", ""))}


def connect(db: str) -> psycopg.Connection:
    """An autocommit connection to ``db`` on the server of the ``PG*`` variables (default 127.0.0.1:5432)."""
    return psycopg.connect(dbname=db, autocommit=True, **{k: v for k, v in PG.items() if v})


@contextmanager
def scratch_database(suffix: str, *, keep: bool = False) -> Iterator[str]:
    """Create ``<LQBENCH_DB>_<suffix>`` (default ``leasequeue_bench_<suffix>``), dropped first if
    it exists, point the bench project at it (``LQBENCH_DB``, ``DJANGO_SETTINGS_MODULE``), migrate
    it, and yield its name; at the end close Django's connections and drop it unless ``keep``."""
    db = os.environ.get("LQBENCH_DB", "leasequeue_bench") + "_" + suffix
    maintenance = os.environ.get("PG_MAINTENANCE_DB", "postgres")
    with connect(maintenance) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{db}"')
    os.environ["LQBENCH_DB"] = db
    os.environ["DJANGO_SETTINGS_MODULE"] = "lqbench.settings"
    try:
        subprocess.run([sys.executable, os.path.join(BENCH, "manage.py"), "migrate", "-v", "0"], check=True)
        yield db
    finally:
        from django.db import connections

        connections.close_all()
        if not keep:
            with connect(maintenance) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


def per_call(body: Callable[[], object], n: int) -> float:
    """Call ``body`` ``n`` times; return the mean time of a call in microseconds."""
    t0 = time.perf_counter()
    for _ in range(n):
        body()
    return (time.perf_counter() - t0) / n * 1e6


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as ``/proc/loadavg`` gives them."""
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def rounds(loops: dict[str, Callable[[], float]], reps: int, *, tag: str, digits: int = 1) -> dict[str, list[float]]:
    """Run every loop once per round, in rotation, for ``reps`` rounds; each loop returns its
    microseconds per call. Reports each result on stderr (``[tag] round 1: name 12.3 us/call``).

    Returns:
        The microseconds per call of each loop, one value per round.
    """
    results: dict[str, list[float]] = {name: [] for name in loops}
    for rnd in range(reps):
        for name, loop in loops.items():
            results[name].append(loop())
            print(f"[{tag}] round {rnd + 1}: {name} {results[name][-1]:,.{digits}f} us/call", file=sys.stderr)
    return results


def print_table(results: dict[str, list[float]], labels: dict[str, str], *, order: Sequence[str] | None = None,
                digits: int = 1) -> None:
    """Print the markdown table: each loop's label, its median microseconds per call with the range
    of the rounds (``[min-max]``, ``digits`` decimals) and the calls per second of the median."""
    print("| loop | us per call | calls/s |")
    print("|---|---|---|")
    for name in order or list(results):
        values = results[name]
        median = statistics.median(values)
        spread = f" [{min(values):,.{digits}f}-{max(values):,.{digits}f}]" if len(values) > 1 else ""
        print(f"| {labels[name]} | {median:,.1f}{spread} | {1e6 / median:,.0f} |")
