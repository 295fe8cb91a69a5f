"""``manage.py qa_produce``: the failover test's producer. Enqueues ``--count`` jobs of the failover
workload (``qa.failover_plain`` and ``qa.failover_fenced`` in turn), one transaction each, with the
unique key ``<prefix>-<n>``, and appends ``<key> <job id> <POSIX time>`` to ``--out`` (fsynced) once
the enqueue has committed and returned: that file is the list of acknowledged jobs, and the time
each synchronous commit was acknowledged.

A failed enqueue (the server gone, a read-only standby, a commit whose outcome is unknown) closes
the connection and is retried under the same key after a short backoff, so a commit that did land
is found, not doubled; the next connection goes wherever libpq's host list leads.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, InterfaceError, connection

from django_leasequeue import enqueue

TASKS = ("qa.failover_plain", "qa.failover_fenced")


class Command(BaseCommand):
    help = "Enqueue failover workload jobs one by one, logging each acknowledged key and id to a file."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--count", type=int, required=True, help="jobs to enqueue")
        parser.add_argument("--out", required=True, help="file the acknowledged '<key> <id> <time>' lines go to")
        parser.add_argument("--prefix", default="fo", help="unique key prefix")
        parser.add_argument("--interval", type=float, default=0.02, help="seconds between enqueues")
        parser.add_argument("--seed", type=int, default=0, help="seed of the handlers' work times")

    def handle(self, *args: Any, count: int, out: str, prefix: str, interval: float, seed: int,
               **options: Any) -> None:
        if count < 0 or interval < 0:
            raise CommandError("--count and --interval must not be negative")
        rng = random.Random(seed)
        failures = 0
        started = time.monotonic()
        fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            for n in range(count):
                key = f"{prefix}-{n}"
                # A fifth of the handlers work long enough to be caught mid-run by the failover.
                work = round(rng.uniform(0.2, 0.6), 3) if rng.random() < 0.2 else round(rng.uniform(0.0, 0.03), 3)
                delay = 0.05
                while True:
                    try:
                        job = enqueue(TASKS[n % 2], kwargs={"key": key, "work": work}, unique_key=key)
                        break
                    except (DatabaseError, InterfaceError) as exc:
                        failures += 1
                        self.stderr.write(f"enqueue of {key} failed ({type(exc).__name__}: {exc}); retrying")
                        try:
                            connection.close()
                        except (DatabaseError, InterfaceError):
                            pass
                        time.sleep(delay)
                        delay = min(delay * 2, 0.5)
                os.write(fd, f"{key} {job.pk} {time.time():.6f}\n".encode())
                os.fsync(fd)
                if interval:
                    time.sleep(interval)
        finally:
            os.close(fd)
        self.stdout.write(f"acknowledged {count} jobs in {time.monotonic() - started:.1f} s; "
                          f"{failures} failed enqueue attempts retried")
