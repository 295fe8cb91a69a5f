"""``manage.py runscheduler``: emit one job per schedule occurrence until SIGTERM (or once).

At start it prints the schedules it serves and each next occurrence; at stop, that it stopped."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from django_leasequeue.exceptions import ConfigurationError

if TYPE_CHECKING:
    from django_leasequeue.models import Schedule
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
        service.on_started = lambda: self._announce(service)
        code = run_services([service])
        self.stdout.write(f"scheduler {service.process_id} stopped{' after a crash' if code else ''}: "
                          f"{service.ticks} tick(s), {service.emitted} job(s) emitted")
        self.stdout.flush()
        if code:
            raise SystemExit(code)

    def _announce(self, service: SchedulerService) -> None:
        """At start: the enabled schedules this scheduler serves, each with its next occurrence in
        its own zone (an aware time with the zone's offset) and how far off it is."""
        from django_leasequeue import store
        from django_leasequeue.models import Schedule

        now = store.db_now(service.alias)
        rows = list(Schedule.objects.using(service.alias).filter(enabled=True).order_by("name"))
        disabled = Schedule.objects.using(service.alias).filter(enabled=False).count()
        self.stdout.write(f"scheduler {service.process_id}: {len(rows)} enabled schedule(s)"
                          f"{f' ({disabled} disabled)' if disabled else ''}; SIGTERM or Ctrl-C stops.")
        if not rows:
            self.stdout.write("  none: declare LEASEQUEUE_SCHEDULES or add one in the admin (Schedules)")
        for row in rows[:SHOWN]:
            self.stdout.write(f"  {row.name}: {row.task}, cron {row.cron!r} in {row.zone_name}, "
                              f"next {_next_text(row, now)}")
        if len(rows) > SHOWN:
            self.stdout.write(f"  ... and {len(rows) - SHOWN} more")
        self.stdout.flush()

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


def _next_text(row: Schedule, now: datetime) -> str:
    """``"2026-12-05T02:00:00+01:00 (in 7h 29m)"``: the stored next occurrence in the schedule's
    zone, or the cron's next one after ``now`` when none is stored yet."""
    from django_leasequeue import cron

    try:
        zone = ZoneInfo(row.zone_name)
        at = row.next_occurrence_at or cron.next_occurrence(row.cron, zone, now)
    except (ValueError, KeyError) as exc:  # a zone or expression the admin check would refuse
        return f"unknown ({exc})"
    wait = (at - now).total_seconds()
    return f"{at.astimezone(zone).isoformat()} ({'due now' if wait <= 0 else f'in {_duration(wait)}'})"


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
