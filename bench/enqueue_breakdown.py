"""Where the time of one ``enqueue()`` goes: the loops behind docs/howto/performance.md's breakdown.

Measures, back to back on one scratch database, the time per call of (each a loop of ``--n``
calls, every call its own transaction and commit)::

    enqueue() durable                  Task.enqueue(), synchronous_commit as the server has it, with
                                       the defaults: its INSERT prepared with SQL PREPARE
                                       (``PREPARED_STATEMENTS``)
    enqueue() unprepared               the same with ``PREPARED_STATEMENTS`` off (parsed and planned
                                       on every call)
    enqueue() synchronous_commit off   the same with ``SET synchronous_commit = off`` for this session
    enqueue() prepared                 the same, durable, with prepared statements allowed on the
                                       connection (psycopg ``prepare_threshold`` set, as
                                       ``OPTIONS["prepare_threshold"]`` does): its INSERT is prepared
    bare psycopg, 4-column row         INSERT one row of a 4-column table and commit (no Django)
    bare psycopg, our INSERT           the exact statement and parameters enqueue() sends (captured
                                       from one call), through psycopg without Django
    bare psycopg, our INSERT, no NOTIFY  the same with the ``notify`` parameter false
    bare psycopg, our INSERT prepared  the same statement as a server-side prepared statement
    build_job() only                   validating one job's arguments and options (Python, no database)

Each row is the median over ``--reps`` rounds; the rounds run the loops in rotation, so load from
other processes hits them alike. Compare the rows with each other, not with another machine or
another moment: on a shared machine the absolute figures vary by tens of percent. The py-spy shares
quoted in docs/howto/performance.md are not reproduced here; take them with
``py-spy record --idle --format raw -- python bench/enqueue_breakdown.py --only enqueue``.

Usage (from the repository root; creates and drops ``<LQBENCH_DB>_enqbd``, default
``leasequeue_bench_enqbd``)::

    .venv/bin/python bench/enqueue_breakdown.py [--n 2000] [--reps 3] [--only enqueue,sync_off,...] [--keep]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [BENCH, os.path.dirname(BENCH)]  # loops and lqbench, then the working tree's package

import psycopg  # noqa: E402
from loops import connect, load_average, per_call, print_table, rounds, scratch_database  # noqa: E402

ROWS = ["enqueue", "enqueue_unprepared", "sync_off", "enqueue_prepared", "plain4", "ours", "ours_no_notify",
        "ours_prepared", "build_job"]
LABELS = {
    "enqueue": "enqueue() durable (defaults: its INSERT prepared with SQL PREPARE)",
    "enqueue_unprepared": "enqueue() durable, PREPARED_STATEMENTS off",
    "sync_off": "enqueue() with synchronous_commit off (session)",
    "enqueue_prepared": "enqueue() durable, psycopg prepared statements allowed (prepare_threshold)",
    "plain4": "bare psycopg: INSERT one 4-column row + commit",
    "ours": "bare psycopg: enqueue()'s INSERT + commit",
    "ours_no_notify": "bare psycopg: enqueue()'s INSERT without NOTIFY + commit",
    "ours_prepared": "bare psycopg: enqueue()'s INSERT, prepared + commit",
    "build_job": "build_job() only (validation, no database)",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="calls per loop (default 2000)")
    ap.add_argument("--reps", type=int, default=3, help="rounds; each row is the median (default 3)")
    ap.add_argument("--only", help=f"comma-separated rows among {','.join(ROWS)}")
    ap.add_argument("--keep", action="store_true", help="keep the scratch database")
    a = ap.parse_args(argv)
    rows = [r.strip() for r in a.only.split(",")] if a.only else ROWS
    if set(rows) - set(ROWS):
        ap.error(f"unknown row(s) {sorted(set(rows) - set(ROWS))}")
    with scratch_database("enqbd", keep=a.keep) as db:
        return run(db, rows, a.n, a.reps)


def run(db: str, rows: list[str], n: int, reps: int) -> int:
    import django

    django.setup()
    from django.db import connection
    from django.test import override_settings
    from lqbench.tasks import noop

    from django_leasequeue import registry
    from django_leasequeue.enqueueing import build_job

    registry.autodiscover()

    # The statement and parameters of one enqueue(), as Django hands them to psycopg.
    captured: list[tuple[str, object]] = []

    def capture(execute, sql, params, many, context):
        if sql.lstrip().upper().startswith("INSERT"):
            captured.append((sql, params))
        return execute(sql, params, many, context)

    # Captured unprepared: the INSERT as its text, not as EXECUTE of a prepared statement.
    with connection.execute_wrapper(capture), override_settings(LEASEQUEUE={"PREPARED_STATEMENTS": False}):
        noop.enqueue()
    sql, params = captured[0]
    quiet = {**params, "notify": False} if isinstance(params, dict) else params

    raw = connect(db)
    raw_cursor = psycopg.ClientCursor(raw)  # client-side binding, as Django's backend uses by default
    raw_prepared = raw.cursor()  # server-side binding; prepare=True below
    raw.execute("CREATE TABLE IF NOT EXISTS enqbd_plain (id bigserial PRIMARY KEY, queue text NOT NULL, "
                "payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now())")

    def loop(body: Callable[[], object]) -> float:
        return per_call(body, n)

    def sync(value: str) -> None:
        with connection.cursor() as cur:
            cur.execute(f"SET synchronous_commit = {value}")

    def sync_off_loop() -> float:
        sync("off")
        try:
            return loop(noop.enqueue)
        finally:
            sync("DEFAULT")

    def prepared_loop() -> float:
        connection.ensure_connection()
        pg = connection.connection
        saved = pg.prepare_threshold
        pg.prepare_threshold = 5  # what OPTIONS["prepare_threshold"] = 5 sets
        try:
            return loop(noop.enqueue)
        finally:
            pg.prepare_threshold = saved

    def unprepared_loop() -> float:
        with override_settings(LEASEQUEUE={"PREPARED_STATEMENTS": False}):
            return loop(noop.enqueue)

    bodies: dict[str, Callable[[], float]] = {
        "enqueue": lambda: loop(noop.enqueue),
        "enqueue_unprepared": unprepared_loop,
        "sync_off": sync_off_loop,
        "enqueue_prepared": prepared_loop,
        "plain4": lambda: loop(lambda: raw.execute("INSERT INTO enqbd_plain (queue, payload) VALUES (%s, %s)",
                                                   ["default", "[]"])),
        "ours": lambda: loop(lambda: raw_cursor.execute(sql, params)),
        "ours_no_notify": lambda: loop(lambda: raw_cursor.execute(sql, quiet)),
        "ours_prepared": lambda: loop(lambda: raw_prepared.execute(sql, params, prepare=True)),
        "build_job": lambda: loop(lambda: build_job(noop)),
    }
    noop.enqueue()  # warm up the connection and caches
    with connect("postgres") as c:
        server_sync = c.execute("SHOW synchronous_commit").fetchone()[0]
    load = load_average()
    print(f"[enqueue_breakdown] {n:,} calls per loop, {reps} round(s); load {load}", file=sys.stderr)
    results = rounds({r: bodies[r] for r in rows}, reps, tag="enqueue_breakdown", digits=0)
    raw.close()
    print(f"Enqueue breakdown: {n:,} calls per loop, median of {reps} round(s) [min-max]; server "
          f"synchronous_commit={server_sync}; load average {load} at start, {load_average()} at end")
    print()
    print_table(results, LABELS, order=rows, digits=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
