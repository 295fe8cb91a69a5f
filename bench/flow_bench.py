"""Claim throughput with flow control: plain claim vs keyed limits, rate limits, fair claiming.

Drains N no-op jobs per scenario through ``store.job_claim`` + ``store.job_complete`` in batches,
in one process with one connection (no handler threads, no worker loop), so the figure is the cost
of the claim and completion statements themselves. Limits are set so that they never bind (the
drain completes each batch before claiming the next): the ratio to the plain claim is the price of
the checks, not of waiting. Each scenario has its own queue in one table and the scenarios are
drained batch by batch in rotation, each timing only its own statements, so load from other
processes on the machine hits them alike; "vs plain" is the median of the per-rep ratios.

Scenarios:
  plain, no flow predicate  the claim statement without the concurrency predicate (reference)
  plain claim               keyless jobs through the real claim (the predicate stops at IS NULL)
  keyed, 100 keys limit 5   every job has a key; 50 distinct keys per batch (50 probes per claim)
  keyed, 1 key limit=batch  every job has the same key (1 probe, then cache hits)
  rated 1000000/s           a rate-limited queue (lock row + sliding log), 1 s window
  rated 1000000000/h        the same with a 1 h window (log at its ~101-entry bound)
  sequences, 1,000 keys     every job has one of 1,000 sequence keys, enqueued round-robin (each
                            claimed job is its key's head: 2 sequence probes per candidate)
  sequences, key by key     the same keys, each key's jobs enqueued together (a batch of 50 heads
                            reads past the queued jobs of 50 keys: the look-ahead worst case)
  rate per key, 1000 keys   every job has a rate key (rate_key/rate_limit 100000/s, not binding):
                            one leasequeue_rate_admit() call (lock, log read, log write) per job
  fair, 1000 keys           a fair queue (QUEUES[...]["fair"]): round-robin over 1000 fair keys
                            (one skip-scan probe and one per-key probe per job)

Usage (from the project root; uses a scratch database it creates and migrates, named after
LEASEQUEUE_DB_NAME with a ``_flowbench`` suffix, and deletes every job in it)::

    LEASEQUEUE_DB_NAME=lq_flow /work/main/.venv/bin/python bench/flow_bench.py [--jobs 20000] [--batch 50] [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "testproject")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")


def ensure_database(name: str) -> None:
    import psycopg

    params = {"host": os.environ.get("PGHOST", "127.0.0.1"), "port": os.environ.get("PGPORT", "5432"),
              "user": os.environ.get("PGUSER", "postgres"), "password": os.environ.get("PGPASSWORD") or None}
    with psycopg.connect(dbname="postgres", autocommit=True, **params) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()

    db = os.environ.get("LEASEQUEUE_DB_NAME", "leasequeue") + "_flowbench"
    ensure_database(db)
    os.environ["LEASEQUEUE_DB_NAME"] = db
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from django_leasequeue import store
    from django_leasequeue.conf import RateLimit
    from django_leasequeue.enqueueing import build_job, task
    from django_leasequeue.store import claim as claim_sql

    call_command("migrate", verbosity=0)

    @task(name="bench.noop", queue="bench")
    def noop(i: int) -> None:
        """No-op."""

    @task(name="bench.keyed100", queue="bench", concurrency_key=lambda i: f"k{i % 100}", concurrency_limit=5)
    def keyed100(i: int) -> None:
        """No-op with one of 100 keys."""

    @task(name="bench.keyed1", queue="bench", concurrency_key="the-key", concurrency_limit=args.batch)
    def keyed1(i: int) -> None:
        """No-op with a single key."""

    @task(name="bench.seq1000", queue="bench", sequence_key=lambda i: f"s{i % 1000}")
    def seq1000(i: int) -> None:
        """No-op in one of 1,000 sequences, keys round-robin over the job numbers."""

    per_key = max(args.jobs // 1000, 1)

    # Keys of their own: a sequence spans queues, so sharing the keys of bench.seq1000 would make
    # these jobs (enqueued later) wait for that scenario's.
    @task(name="bench.seq_blocks", queue="bench", sequence_key=lambda i: f"b{i // per_key}")
    def seq_blocks(i: int) -> None:
        """No-op in one of 1,000 sequences, each key's jobs consecutive."""

    @task(name="bench.rate_key1000", queue="bench", rate_key=lambda i: f"r{i % 1000}", rate_limit="100000/s")
    def rate_key1000(i: int) -> None:
        """No-op with one of 1000 rate keys."""

    @task(name="bench.fair1000", queue="bench", fair_key=lambda i: f"t{i % 1000:04d}")
    def fair1000(i: int) -> None:
        """No-op with one of 1000 fair keys."""

    # The reference statement: the claim without its flow rules (sequence, concurrency and rate
    # admission, one CASE so that they run in that order).
    flow_rules = re.search(r"\n *AND CASE WHEN \(j\.sequence_key IS NULL.*?ELSE false END", claim_sql.JOB_CLAIM, re.S)
    assert flow_rules is not None
    no_predicate_sql = claim_sql.JOB_CLAIM.replace(flow_rules.group(0), "")

    def claim_with(rates, fair=()):
        def claim(queue: str, limit: int) -> list[tuple]:
            jobs = store.job_claim(queues=[queue], limit=limit, worker_id="bench", lease=30, rate_limits=rates,
                                   fair_queues=fair)
            return [(j.id, j.lease_version) for j in jobs]
        return claim

    def claim_without_predicate(queue: str, limit: int) -> list[tuple]:
        # The same Python path (store.job_claim), only the statement lacks the concurrency predicate.
        plain_sql = claim_sql.JOB_CLAIM
        claim_sql.JOB_CLAIM = no_predicate_sql
        try:
            return claim_with({})(queue, limit)
        finally:
            claim_sql.JOB_CLAIM = plain_sql

    # (label, queue, task, claim function). Each scenario has its own queue in the same table.
    scenarios = [
        ("plain, no flow predicate (reference)", "b_ref", noop, claim_without_predicate),
        ("plain claim", "b_plain", noop, claim_with({})),
        ("keyed: 100 keys, limit 5", "b_k100", keyed100, claim_with({})),
        (f"keyed: 1 key, limit {args.batch}", "b_k1", keyed1, claim_with({})),
        ("rate limit 1000000/s (not binding)", "b_rs", noop, claim_with({"b_rs": RateLimit(1_000_000, 1.0)})),
        ("rate limit 1000000000/h (not binding)", "b_rh", noop,
         claim_with({"b_rh": RateLimit(1_000_000_000, 3600.0)})),
        ("sequences: 1,000 keys, round-robin", "b_seq", seq1000, claim_with({})),
        ("sequences: 1,000 keys, key by key", "b_seqb", seq_blocks, claim_with({})),
        ("rate per key: 1000 keys, 100000/s each", "b_rk", rate_key1000, claim_with({})),
        ("fair: 1000 keys", "b_fair", fair1000, claim_with({}, fair=("b_fair",))),
        # Further per-key policies add their row here: (label, queue, task, claim_with(...)).
    ]

    def fill() -> None:
        with connection.cursor() as cur:
            cur.execute("TRUNCATE leasequeue_job, leasequeue_queue, leasequeue_rate_key")
        for _, queue, spec, _ in scenarios:
            for start in range(0, args.jobs, 5000):
                store.job_insert([build_job(spec, [i], queue=queue)
                                  for i in range(start, min(args.jobs, start + 5000))],
                                 notify=False, channel="unused")
        with connection.cursor() as cur:
            cur.execute("VACUUM ANALYZE leasequeue_job")

    def drain_interleaved() -> dict[str, float]:
        """Drain every scenario's queue one batch at a time, round-robin (rotating the order), and
        time each scenario's own claim + complete statements; return jobs/s per scenario."""
        spent = {label: 0.0 for label, *_ in scenarios}
        drained = {label: 0 for label, *_ in scenarios}
        active = list(scenarios)
        turn = 0
        while active:
            turn += 1
            order = active[turn % len(active):] + active[:turn % len(active)]
            for scenario in order:
                label, queue, _, claim = scenario
                started = time.perf_counter()
                got = claim(queue, args.batch)
                if got:
                    store.job_complete([(i, v, None) for i, v in got])
                spent[label] += time.perf_counter() - started
                drained[label] += len(got)
                if not got:
                    active.remove(scenario)
        for label, n in drained.items():
            assert n == args.jobs, f"{label}: drained {n} of {args.jobs}"
        return {label: args.jobs / spent[label] for label in spent}

    rates: dict[str, list[float]] = {label: [] for label, *_ in scenarios}
    ratios: dict[str, list[float]] = {label: [] for label, *_ in scenarios}
    for rep in range(args.reps):
        fill()
        result = drain_interleaved()
        for label, value in result.items():
            rates[label].append(value)
            ratios[label].append(value / result["plain claim"])
        print(f"  rep {rep + 1}: " + ", ".join(f"{label.split(' (')[0]} {v:,.0f}" for label, v in result.items()),
              file=sys.stderr)
    with connection.cursor() as cur:
        cur.execute("TRUNCATE leasequeue_job, leasequeue_queue, leasequeue_rate_key")

    print(f"\nflow_bench: {args.jobs} no-op jobs per scenario, batches of {args.batch}, claim + complete on one "
          f"connection, scenarios interleaved batch by batch, {args.reps} reps (PostgreSQL "
          f"{connection.pg_version // 10000})")
    print(f"{'scenario':<42} {'jobs/s':>9} {'best':>9} {'vs plain':>9} {'ratio range':>13}")
    for label, *_ in scenarios:
        r = ratios[label]
        print(f"{label:<42} {statistics.median(rates[label]):>9,.0f} {max(rates[label]):>9,.0f} "
              f"{statistics.median(r):>9.2f} {min(r):>6.2f}-{max(r):<6.2f}")

if __name__ == "__main__":
    main()
