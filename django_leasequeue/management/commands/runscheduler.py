"""``manage.py runscheduler``: emit one job per schedule occurrence until SIGTERM (or once)."""

from __future__ import annotations

import socket
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_leasequeue.exceptions import ConfigurationError


class Command(BaseCommand):
    help = ("Run the django-leasequeue scheduler: sync LEASEQUEUE_SCHEDULES, then emit one job per due "
            "occurrence. Any number may run at once.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--interval", type=float, default=None,
                            help="maximum seconds between ticks (default 1); the scheduler also wakes at the "
                                 "next occurrence")
        parser.add_argument("--once", action="store_true", help="sync the settings, run one tick, then exit")
        parser.add_argument("--no-sync", action="store_true",
                            help="do not write LEASEQUEUE_SCHEDULES into the table at start")

    def handle(self, *args: Any, **options: Any) -> None:
        from django_leasequeue import store
        from django_leasequeue.checks import require_migrated
        from django_leasequeue.runtime import run_services
        from django_leasequeue.scheduler import SchedulerService, sync_schedules

        require_migrated()
        once = options["once"]
        try:
            # A one-shot tick (e.g. from system cron) records itself under one row per host, kept after
            # exit so monitoring sees the last tick; the reaper prunes the row once it is stale.
            process_id = f"{socket.gethostname()}:once:scheduler" if once else None
            service = SchedulerService(interval=options["interval"], sync=not options["no_sync"],
                                       process_id=process_id)
        except ConfigurationError as exc:
            raise CommandError(str(exc))
        if once:
            if service.sync:
                sync_schedules(alias=service.alias)
            service.register()
            result = service.tick()
            store.process_heartbeat(service.process_id, tick=True, alias=service.alias)
            self.stdout.write(
                f"tick at {result.now.isoformat()}: {result.checked} due schedule(s), emitted "
                f"{len(result.emitted)} job(s), {len(result.duplicates)} already emitted, skipped "
                f"{result.skipped} occurrence(s), {len(result.errors)} error(s)"
            )
            if result.errors:
                raise CommandError(f"{len(result.errors)} schedule(s) failed: {result.errors}")
            return
        code = run_services([service])
        if code:
            raise SystemExit(code)
