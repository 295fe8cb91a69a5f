"""Peers-harness adapter for django-leasequeue (``harness/run_peer.py leasequeue``).

Loaded by :mod:`bench.peer_adapter.run_harness`, which adds this folder to the harness's
``systems`` package at run time (the harness folder is read-only; nothing of it is copied). Uses
only the public API: ``Task.enqueue``, ``enqueue_many`` and ``manage.py runworker``.

Workers: 2 x ``runworker --concurrency 4 --queues default`` (LISTEN/NOTIFY on, 1 s polling
fallback), the same concurrency as the benchmark's "2 processes x 4 threads" drain row.
"""

import os
import sys
import time

BENCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(BENCH_DIR)
MANAGE = os.path.join(BENCH_DIR, "manage.py")
CHUNK = 1000
PROCESSES = int(os.environ.get("LQBENCH_HARNESS_PROCESSES", "2"))
THREADS = int(os.environ.get("LQBENCH_HARNESS_THREADS", "4"))


class Adapter:
    name = "leasequeue"
    bulk_label = "enqueue_many(), 1,000/call (one INSERT ... SELECT unnest statement each)"
    worker_desc = (f"{PROCESSES} x `manage.py runworker --concurrency {THREADS} --queues default` "
                   "(LISTEN/NOTIFY on, polling fallback 1 s)")

    def __init__(self, db: str):
        os.environ["LQBENCH_DB"] = db
        os.environ["DJANGO_SETTINGS_MODULE"] = "lqbench.settings"
        for path in (BENCH_DIR, REPO):
            if path not in sys.path:
                sys.path.insert(0, path)
        import django

        django.setup()
        from lqbench import tasks

        from django_leasequeue import enqueue_many

        self.tasks = tasks
        self.enqueue_many = enqueue_many

    def install(self) -> None:
        from django.core.management import call_command

        call_command("migrate", verbosity=0)

    def enqueue_single(self, n: int) -> float:
        noop = self.tasks.harness_noop
        t0 = time.perf_counter()
        for _ in range(n):
            noop.enqueue()
        return time.perf_counter() - t0

    def enqueue_bulk(self, n: int) -> float:
        t0 = time.perf_counter()
        for i in range(0, n, CHUNK):
            self.enqueue_many(self.tasks.harness_noop, [[]] * min(CHUNK, n - i))
        return time.perf_counter() - t0

    def enqueue_latency(self, t_enq: float) -> None:
        self.tasks.harness_lat.enqueue(t_enq)

    def worker_commands(self) -> list[list[str]]:
        cmd = [sys.executable, MANAGE, "runworker", "--concurrency", str(THREADS), "--queues", "default"]
        return [cmd] * PROCESSES

    pending_sql = "select count(*) from leasequeue_job where status in ('ready', 'leased')"

    def close(self) -> None:
        from django.db import connections

        connections.close_all()
