"""Async handlers benchmark: many ``async def`` jobs that wait, on one worker process.

Usage (from the repository root)::

    python bench/async_bench.py                       # 10,000 jobs x 0.5 s, 1,000 slots, 3 reps, + Procrastinate
    python bench/async_bench.py --jobs 2000 --reps 1 --skip-peers

Each repetition enqueues ``--jobs`` jobs of ``bench.asleep`` (``await asyncio.sleep(--sleep)``)
with ``enqueue_many()`` on a scratch database (``<LQBENCH_DB>_async``), then starts one
``runworker --burst --async-slots <--slots> --concurrency 1 --no-reaper`` and waits for it to exit.

* drain: seconds from the first claim to the last completion, read from the database
  (``max(finished_at) - min(attempted_at)``): the worker's start-up is excluded. The floor is
  ``jobs / slots x sleep`` (5 s for the defaults).
* peak RSS: the worker's ``ru_maxrss`` (``os.wait4``; the kernel's ``VmHWM`` of the process).

Then the same for Procrastinate's async worker, in the same run, when the peers virtualenv is
there (``$PEERS_VENV``, default ``$TMPDIR/leasequeue-peers-venv``, made by
``../shared/bench/peers/setup_venv.sh``): a task ``async def asleep(seconds)`` of our own, deferred
with ``batch_defer_async`` (1,000 per call), and one ``procrastinate worker --concurrency <--slots>
--one-shot``, drain read from its ``procrastinate_events`` (first ``started`` to last
``succeeded``), its database ``<LQBENCH_DB>_async_procrastinate``. Repetitions alternate the two.

Prints one Markdown table (median [min-max] of the repetitions) with the load average before and
after, and writes the raw figures to ``build/bench/async.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
MANAGE = os.path.join(BENCH, "manage.py")
sys.path[:0] = [BENCH, REPO]

from loops import PG, connect, load_average, scratch_database  # noqa: E402

PEERS_VENV = os.environ.get("PEERS_VENV", os.path.join(os.environ.get("TMPDIR", "/tmp"), "leasequeue-peers-venv"))

# The Procrastinate side: an app module and a driver run with the peers venv's Python.
PROCRASTINATE_APP = textwrap.dedent('''
    import asyncio
    import os

    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ["BENCH_DSN"]))


    @app.task(name="asleep")
    async def asleep(seconds: float) -> None:
        await asyncio.sleep(seconds)
''')
PROCRASTINATE_DRIVER = textwrap.dedent('''
    import asyncio
    import sys

    from lqasync_app import app, asleep


    async def main(action: str, n: int, seconds: float) -> None:
        async with app.open_async():
            if action == "schema":
                await app.schema_manager.apply_schema_async()
                return
            for i in range(0, n, 1000):
                await asleep.batch_defer_async(*([{"seconds": seconds}] * min(1000, n - i)))


    asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
''')


def dsn(db: str) -> str:
    """A libpq connection string to ``db`` on the server of the ``PG*`` variables."""
    parts = [f"dbname={db}"] + [f"{k}={v}" for k, v in PG.items() if v]
    return " ".join(parts)


def run_child(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[int, float, float]:
    """Run ``cmd`` to its end; return its exit status, wall seconds and peak RSS in MiB (``ru_maxrss``)."""
    t0 = time.monotonic()
    # stderr to a file, not a pipe: a worker that logs more than a pipe holds would block on it.
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log)
    deadline = t0 + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            proc.kill()
            pid, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)
    log.seek(0)
    err = log.read().decode(errors="replace")
    log.close()
    if proc.returncode or "Traceback" in err:
        print(f"{' '.join(cmd[1:5])}... exited {proc.returncode}:\n{err[-3000:]}", file=sys.stderr)
    return proc.returncode, time.monotonic() - t0, usage.ru_maxrss / 1024


def ours(db: str, jobs: int, sleep: float, slots: int, threads: int = 1) -> dict[str, float]:
    """One repetition of django-leasequeue: enqueue, drain with one runworker, read the figures
    (``slots`` 0: the async handlers run on ``threads`` handler threads, one loop per attempt)."""
    from django.db import connection, transaction

    from django_leasequeue import enqueue_many

    with connection.cursor() as cur:
        cur.execute("TRUNCATE leasequeue_job")
    with transaction.atomic():
        for i in range(0, jobs, 10_000):
            enqueue_many("bench.asleep", [[sleep]] * min(10_000, jobs - i))
    env = {**os.environ, "LQBENCH_DB": db, "DJANGO_SETTINGS_MODULE": "lqbench.settings"}
    code, wall, rss = run_child([sys.executable, MANAGE, "runworker", "--burst", "--async-slots", str(slots),
                                 "--concurrency", str(threads), "--no-reaper"], env, timeout=600)
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FILTER (WHERE status = 'done'), "
                    "extract(epoch FROM max(finished_at) - min(attempted_at)) FROM leasequeue_job")
        done, drain = cur.fetchone()
    return {"done": done, "drain_s": float(drain or 0), "wall_s": wall, "rss_mib": rss, "exit": code}


def procrastinate(workdir: str, db: str, jobs: int, sleep: float, slots: int) -> dict[str, float]:
    """One repetition of Procrastinate's async worker (fresh database)."""
    python = os.path.join(PEERS_VENV, "bin", "python")
    with connect(os.environ.get("PG_MAINTENANCE_DB", "postgres")) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{db}"')
    env = {**os.environ, "BENCH_DSN": dsn(db), "PYTHONPATH": workdir}
    driver = os.path.join(workdir, "lqasync_driver.py")
    subprocess.run([python, driver, "schema", "0", "0"], env=env, check=True)
    subprocess.run([python, driver, "defer", str(jobs), str(sleep)], env=env, check=True)
    code, wall, rss = run_child([python, "-m", "procrastinate", "--app=lqasync_app.app", "--log-level=warning",
                                 "worker", f"--concurrency={slots}", "--one-shot"], env, timeout=600)
    with connect(db) as c:
        done, drain = c.execute(
            "SELECT (SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'), "
            "extract(epoch FROM (SELECT max(at) FROM procrastinate_events WHERE type = 'succeeded') "
            "- (SELECT min(at) FROM procrastinate_events WHERE type = 'started'))").fetchone()
    with connect(os.environ.get("PG_MAINTENANCE_DB", "postgres")) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    return {"done": done, "drain_s": float(drain or 0), "wall_s": wall, "rss_mib": rss, "exit": code}


def cell(values: list[float], fmt: str = "{:.2f}") -> str:
    """``median [min-max]`` of ``values``."""
    if not values:
        return "-"
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0] + " Its databases, <LQBENCH_DB>_async and "
        "<LQBENCH_DB>_async_procrastinate (LQBENCH_DB default leasequeue_bench), are dropped and made anew.")
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs per repetition (default 10000)")
    parser.add_argument("--sleep", type=float, default=0.5, help="seconds each job awaits (default 0.5)")
    parser.add_argument("--slots", type=int, default=1000,
                        help="runworker --async-slots (Procrastinate: --concurrency); default 1000")
    parser.add_argument("--reps", type=int, default=3, help="repetitions, alternating the systems (default 3)")
    parser.add_argument("--skip-peers", action="store_true",
                        help="do not run Procrastinate's async worker (skipped anyway without the peers virtualenv)")
    parser.add_argument("--thread-baseline", type=int, default=0, metavar="THREADS",
                        help="also run the jobs on THREADS handler threads (--async-slots 0: one event loop per "
                             "attempt, as before the event loop existed), interleaved")
    parser.add_argument("--out", default=os.path.join(REPO, "build", "bench", "async.json"),
                        help="raw figures, JSON (default build/bench/async.json)")
    args = parser.parse_args()
    peers = not args.skip_peers and os.path.exists(os.path.join(PEERS_VENV, "bin", "python"))
    if not args.skip_peers and not peers:
        print(f"procrastinate: skipped (no peers virtualenv at {PEERS_VENV}; run ../shared/bench/peers/setup_venv.sh "
              "or set PEERS_VENV)", file=sys.stderr)
    load_before = load_average()
    baseline = f"django-leasequeue, {args.thread_baseline} threads"
    results: dict[str, list[dict[str, float]]] = {"django-leasequeue": [], baseline: [], "procrastinate": []}
    with scratch_database("async") as db, tempfile.TemporaryDirectory() as workdir:
        import django

        django.setup()
        with open(os.path.join(workdir, "lqasync_app.py"), "w") as f:
            f.write(PROCRASTINATE_APP)
        with open(os.path.join(workdir, "lqasync_driver.py"), "w") as f:
            f.write(PROCRASTINATE_DRIVER)
        for rep in range(args.reps):
            row = ours(db, args.jobs, args.sleep, args.slots)
            results["django-leasequeue"].append(row)
            print(f"rep {rep + 1} django-leasequeue: {row}", file=sys.stderr)
            if args.thread_baseline:
                row = ours(db, args.jobs, args.sleep, 0, args.thread_baseline)
                results[baseline].append(row)
                print(f"rep {rep + 1} {baseline}: {row}", file=sys.stderr)
            if peers:
                row = procrastinate(workdir, db + "_procrastinate", args.jobs, args.sleep, args.slots)
                results["procrastinate"].append(row)
                print(f"rep {rep + 1} procrastinate: {row}", file=sys.stderr)
    load_after = load_average()
    floor = args.jobs / args.slots * args.sleep
    print(f"\nAsync handlers: {args.jobs:,} jobs x `await asyncio.sleep({args.sleep:g})`, one worker process, "
          f"{args.slots:,} concurrent slots; median [min-max] of {args.reps}; floor {floor:g} s; "
          f"load average {load_before} before, {load_after} after.\n")
    print("| system | worker | drain, s | jobs/s | peak RSS (VmHWM), MiB | jobs done |")
    print("|---|---|---|---|---|---|")
    workers = {"django-leasequeue": f"`runworker --async-slots {args.slots} --concurrency 1 --burst`",
               baseline: f"`runworker --async-slots 0 --concurrency {args.thread_baseline} --burst`",
               "procrastinate": f"`procrastinate worker --concurrency={args.slots} --one-shot`"}
    for system, rows in results.items():
        if not rows:
            continue
        drains = [r["drain_s"] for r in rows]
        rates = cell([args.jobs / d for d in drains if d], "{:,.0f}")
        rss = cell([r["rss_mib"] for r in rows], "{:.0f}")
        print(f"| {system} | {workers[system]} | {cell(drains)} | {rates} | {rss} "
              f"| {', '.join(str(r['done']) for r in rows)} |")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "load_before": load_before, "load_after": load_after, "results": results},
                  f, indent=1)


if __name__ == "__main__":
    main()
