"""``manage.py runscheduler``: emit one job per schedule occurrence until SIGTERM (or once)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from django_leasequeue.exceptions import ConfigurationError

if TYPE_CHECKING:
    from django_leasequeue.scheduler import SchedulerService


class Command(BaseCommand):
    help = ("Run the django-leasequeue scheduler: sync LEASEQUEUE_SCHEDULES, then emit one job per due "
            "occurrence. Any number may run at once.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--interval", type=float, default=None,
                            help="maximum seconds between ticks (default 1); the scheduler also wakes at the "
                                 "next occurrence")
        parser.add_argument("--once", action="store_true",
                            help="sync the settings, run one tick, print what it emitted and the next occurrence, "
                                 "then exit (leaving no process row)")
        parser.add_argument("--no-sync", action="store_true",
                            help="do not write LEASEQUEUE_SCHEDULES into the table at start")

    def handle(self, *args: Any, **options: Any) -> None:
        from django_leasequeue.checks import require_migrated
        from django_leasequeue.runtime import run_services
        from django_leasequeue.scheduler import SchedulerService

        require_migrated()
        try:
            service = SchedulerService(interval=options["interval"], sync=not options["no_sync"])
        except ConfigurationError as exc:
            raise CommandError(str(exc))
        if options["once"]:
            self._once(service)
            return
        code = run_services([service])
        if code:
            raise SystemExit(code)

    def _once(self, service: SchedulerService) -> None:
        """Sync, tick once, report what the tick did, and leave no process row behind."""
        from django_leasequeue import store
        from django_leasequeue.models import Schedule
        from django_leasequeue.scheduler import sync_schedules

        try:
            if service.sync:
                sync_schedules(alias=service.alias)
            service.register()  # visible as a running scheduler while it ticks
            result = service.tick()
        finally:
            # A one-shot run is not a process to watch once it has exited: a row left behind would
            # show a scheduler "alive" for PROCESS_ALIVE_WITHIN and then a dead one.
            try:
                store.process_deregister(service.process_id, alias=service.alias)
            except DatabaseError:
                pass  # the tick's own error (if any) is the one to report; the reaper prunes the row
        schedules = Schedule.objects.using(service.alias)
        enabled = schedules.filter(enabled=True).count()
        self.stdout.write(
            f"tick at {result.now.isoformat()}: {enabled} enabled schedule(s), {result.checked} due, emitted "
            f"{len(result.emitted)} job(s), {len(result.duplicates)} already emitted, skipped "
            f"{result.skipped} occurrence(s), {len(result.errors)} error(s)"
        )
        names = dict(schedules.filter(pk__in={sid for sid, _ in result.emitted} | set(result.errors))
                     .values_list("pk", "name"))
        for schedule_id, occurrence in result.emitted[:SHOWN]:
            self.stdout.write(f"  emitted {names.get(schedule_id, schedule_id)!s} @ {occurrence.isoformat()}")
        if len(result.emitted) > SHOWN:
            self.stdout.write(f"  ... and {len(result.emitted) - SHOWN} more")
        if result.paused_skipped or result.coalesced:
            self.stdout.write(f"  paused queue: skipped {len(result.paused_skipped)}, coalesced "
                              f"{len(result.coalesced)} occurrence(s) (see each schedule's when_paused)")
        upcoming = (schedules.filter(enabled=True, next_occurrence_at__isnull=False)
                    .order_by("next_occurrence_at", "name").values_list("name", "next_occurrence_at").first())
        name, at = upcoming if upcoming is not None else ("", None)
        if at is None:
            self.stdout.write("next occurrence: none (no enabled schedule)")
        else:
            wait = (at - result.now).total_seconds()
            self.stdout.write(f"next occurrence: {name} @ {at.isoformat()} "
                              f"({'due now' if wait <= 0 else f'in {_duration(wait)}'})")
        if result.errors:
            failed = {names.get(sid, sid): message for sid, message in result.errors.items()}
            raise CommandError(f"{len(result.errors)} schedule(s) failed: {failed}")


# Emitted occurrences listed one per line by --once; the rest are counted.
SHOWN = 20


def _duration(seconds: float) -> str:
    """``"2d 3h"``, ``"3h 5m"``, ``"5m 7s"`` or ``"7s"``: the two largest units."""
    seconds = int(seconds + 0.5)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")]
    while len(parts) > 1 and parts[0][0] == 0:
        parts.pop(0)
    return " ".join(f"{n}{unit}" for n, unit in parts[:2])
