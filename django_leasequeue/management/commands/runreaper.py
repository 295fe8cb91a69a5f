"""``manage.py runreaper``: take back expired leases, prune old jobs and dead-letter the jobs of tasks
no live worker knows (``UNKNOWN_TASK_GRACE``) until SIGTERM."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = "Run the django-leasequeue reaper: expired leases back to ready (or dead), prune finished jobs."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--interval", type=float, default=None, help="seconds between sweeps (default: setting)")
        parser.add_argument("--once", action="store_true", help="one sweep, then exit")

    def handle(self, *args: Any, **options: Any) -> None:
        from django_leasequeue import reaper
        from django_leasequeue.checks import require_migrated
        from django_leasequeue.conf import get_settings
        from django_leasequeue.runtime import run_services

        require_migrated()
        if options["once"]:
            reaped = reaper.reap_once(once=True)
            pruned = reaper.prune_once(get_settings())
            unknown = reaper.dead_letter_unknown_tasks(get_settings())
            self.stdout.write(f"reaped {len(reaped)} expired lease(s), pruned {pruned} finished job(s), "
                              f"dead-lettered {len(unknown)} job(s) of tasks no live worker knows")
            return
        code = run_services([reaper.ReaperService(interval=options["interval"])])
        if code:
            raise SystemExit(code)
