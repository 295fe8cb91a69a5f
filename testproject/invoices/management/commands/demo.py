"""``manage.py demo``: the main job end to end, on real jobs and real worker processes.

1. Resets the demo tables, creates accounts and enqueues one ``send_invoice`` job per account for
   the period, each with the unique key ``invoice:<account>:<period>``; a share of them is
   enqueued a second time (an at-least-once producer retrying), which the unique key deduplicates.
   Adds flaky jobs (fail twice, then succeed) and poison jobs (always fail -> dead letters).
2. Starts worker processes (``manage.py runworker``) with a short lease, SIGKILLs one in the middle
   of the run, and waits until no job is ready or leased: the killed worker's jobs come back by
   themselves when their leases expire.
3. Prints a summary table. "duplicate invoices" must be 0 and "lost" must be 0.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand
from django.db import connection, transaction
from django.db.models import Count, Max, Min, Q

from django_leasequeue import enqueue_many
from django_leasequeue.models import Job
from invoices.models import Account, FlakyAttempt, Invoice
from invoices.tasks import flaky_sync, poison, send_invoice

MANAGE = Path(__file__).resolve().parents[3] / "manage.py"


class Command(BaseCommand):
    help = "Run the invoice demo: enqueue real jobs, run 2 workers, SIGKILL one mid-run, print a summary."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--accounts", type=int, default=2000, help="invoice jobs (one per account)")
        parser.add_argument("--duplicates", type=float, default=0.1, help="share enqueued twice (dedup)")
        parser.add_argument("--flaky", type=int, default=50, help="flaky jobs (fail twice, then succeed)")
        parser.add_argument("--poison", type=int, default=10, help="poison jobs (always fail)")
        parser.add_argument("--workers", type=int, default=2, help="worker processes")
        parser.add_argument("--concurrency", type=int, default=4, help="threads per worker")
        parser.add_argument("--work-ms", type=float, default=8.0, help="simulated work per invoice, in ms")
        parser.add_argument("--lease", type=float, default=3.0, help="lease seconds given to the workers")
        parser.add_argument("--kill-at", type=float, default=0.35,
                            help="SIGKILL the first worker once this share of invoices is sent")
        parser.add_argument("--timeout", type=float, default=180.0, help="give up after this many seconds")

    def handle(self, *args: Any, **opts: Any) -> None:
        period = "2026-11"
        self._reset()
        n = opts["accounts"]
        Account.objects.bulk_create(Account(name=f"account {i}", email=f"billing{i}@example.com") for i in range(n))
        account_ids = list(Account.objects.order_by("id").values_list("id", flat=True))

        t0 = time.monotonic()
        attempted = 0
        with transaction.atomic():
            for account_id in account_ids:
                send_invoice.using(unique_key=f"invoice:{account_id}:{period}").enqueue(
                    account_id, period, work_seconds=opts["work_ms"] / 1000)
                attempted += 1
        # An at-least-once producer sends some of them again: the unique key makes it a no-op.
        redo = account_ids[: int(len(account_ids) * opts["duplicates"])]
        with transaction.atomic():
            for account_id in redo:
                send_invoice.using(unique_key=f"invoice:{account_id}:{period}").enqueue(
                    account_id, period, work_seconds=opts["work_ms"] / 1000)
                attempted += 1
        with transaction.atomic():
            attempted += enqueue_many(flaky_sync, [[f"partner-{i}", 2] for i in range(opts["flaky"])])
            attempted += enqueue_many(poison, [[{"row": i}] for i in range(opts["poison"])])
        enqueue_seconds = time.monotonic() - t0
        jobs_in = Job.objects.count()
        self.stdout.write(f"enqueued {jobs_in} jobs ({attempted} enqueue calls) in {enqueue_seconds:.2f} s; "
                          f"starting {opts['workers']} workers x {opts['concurrency']} threads")

        env = {**os.environ, "LEASEQUEUE_DB_NAME": connection.settings_dict["NAME"],
               "LEASEQUEUE_LEASE": str(opts["lease"]), "LEASEQUEUE_REAPER_INTERVAL": "0.5",
               "LEASEQUEUE_BACKOFF_BASE": "0.2", "PYTHONUNBUFFERED": "1",
               "LEASEQUEUE_LOG_LEVEL": os.environ.get("LEASEQUEUE_LOG_LEVEL", "ERROR")}
        workers = [
            subprocess.Popen([sys.executable, str(MANAGE), "runworker", "--concurrency", str(opts["concurrency"]),
                              "--worker-id", f"demo-{i}"], env=env)
            for i in range(opts["workers"])
        ]
        start = time.monotonic()
        killed_at = None
        killed_holding = 0
        try:
            while True:
                time.sleep(0.05)
                sent = Invoice.objects.count()
                if killed_at is None and sent >= n * opts["kill_at"]:
                    victim = workers[0]
                    victim.send_signal(signal.SIGKILL)
                    victim.wait()
                    # Counted after the kill: a dead process finishes nothing more.
                    killed_holding = Job.objects.filter(status="leased", leased_by__endswith=":demo-0").count()
                    killed_at = time.monotonic() - start
                    self.stdout.write(f"t={killed_at:.1f}s: SIGKILLed worker demo-0 (pid {victim.pid}) holding "
                                      f"{killed_holding} leased job(s), after {sent} invoices")
                open_jobs = Job.objects.filter(status__in=["ready", "leased"]).count()
                if killed_at is not None and open_jobs == 0:
                    break
                if time.monotonic() - start > opts["timeout"]:
                    self.stderr.write("timed out waiting for the queue to drain")
                    break
        finally:
            for w in workers:
                if w.poll() is None:
                    w.send_signal(signal.SIGTERM)
            for w in workers:
                try:
                    w.wait(30)
                except subprocess.TimeoutExpired:
                    w.kill()
        wall = time.monotonic() - start
        self._summary(jobs_in=jobs_in, attempted=attempted, wall=wall, killed_holding=killed_holding, period=period)

    def _reset(self) -> None:
        Job.objects.all().delete()
        Invoice.objects.all().delete()
        Account.objects.all().delete()
        FlakyAttempt.objects.all().delete()

    def _summary(self, *, jobs_in: int, attempted: int, wall: float, killed_holding: int, period: str) -> None:
        by_status = dict(Job.objects.values_list("status").annotate(n=Count("id")))
        done, dead = by_status.get("done", 0), by_status.get("dead", 0)
        cancelled = by_status.get("cancelled", 0)
        still_open = by_status.get("ready", 0) + by_status.get("leased", 0)
        retried = Job.objects.filter(attempts__gt=1).count()
        expired = Job.objects.filter(errors__contains=[{"type": "LeaseExpired"}]).count()
        invoices = Invoice.objects.filter(period=period).count()
        distinct = Invoice.objects.filter(period=period).values("account_id").distinct().count()
        invoice_jobs_done = Job.objects.filter(task=send_invoice.name, status="done").count()
        span = Job.objects.aggregate(first=Min("started_at"), last=Max("finished_at"))
        first, last = span["first"], span["last"]
        busy = (last - first).total_seconds() if first and last else wall
        rows = [
            ("enqueue calls", attempted),
            ("jobs enqueued (rows)", jobs_in),
            ("  invoices / flaky (fail twice, by design) / poison (always fail)",
             f"{Job.objects.filter(task=send_invoice.name).count()}/{Job.objects.filter(task=flaky_sync.name).count()}"
             f"/{Job.objects.filter(task=poison.name).count()}"),
            ("deduplicated by unique key", attempted - jobs_in),
            ("done", done),
            ("jobs run more than once (attempts > 1; stop lines count retried attempts)", retried),
            ("  of which recovered from the killed worker (lease expired)", expired),
            ("dead-lettered", dead),
            ("cancelled", cancelled),
            ("still ready/leased", still_open),
            ("lost (enqueued - done - dead - cancelled - open)", jobs_in - done - dead - cancelled - still_open),
            ("invoices sent", invoices),
            ("invoice jobs done", invoice_jobs_done),
            ("duplicate invoices", invoices - distinct),
            ("jobs held by the killed worker", killed_holding),
            ("wall time, workers start to drained (s)", f"{wall:.2f}"),
            ("busy time, first claim to last completion (s)", f"{busy:.2f}"),
            ("jobs/s (busy time)", f"{jobs_in / busy:.0f}" if busy else "-"),
        ]
        width = max(len(k) for k, _ in rows)
        self.stdout.write("")
        self.stdout.write(f"| {'demo summary'.ljust(width)} | {'value':>11} |")
        self.stdout.write(f"|{'-' * (width + 2)}|{'-' * 13}|")
        for key, value in rows:
            self.stdout.write(f"| {key.ljust(width)} | {str(value):>11} |")
        ok = invoices - distinct == 0 and jobs_in - done - dead - cancelled - still_open == 0 and still_open == 0
        dead_ok = Job.objects.filter(Q(task=poison.name) & ~Q(status="dead")).count() == 0
        self.stdout.write("")
        self.stdout.write(self.style.SUCCESS("OK: every job accounted for, no duplicate invoice")
                          if ok and dead_ok else self.style.ERROR("FAILED: see the table above"))
        if not (ok and dead_ok):
            raise SystemExit(1)
