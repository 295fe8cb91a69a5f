"""``manage.py syncschedules``: write ``LEASEQUEUE_SCHEDULES`` into the schedule table."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_leasequeue.exceptions import ConfigurationError


class Command(BaseCommand):
    help = ("Write LEASEQUEUE_SCHEDULES into the schedule table (schedulers also do it when they start). "
            "Settings win for the schedules they declare; removed ones are disabled, not deleted.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--check", action="store_true", help="only validate the setting; write nothing")

    def handle(self, *args: Any, **options: Any) -> None:
        from django_leasequeue.scheduler import SETTING, load_settings_schedules, sync_schedules

        try:
            if options["check"]:
                definitions = load_settings_schedules()
                self.stdout.write(f"{SETTING}: {len(definitions)} valid schedule(s)")
                return
            result = sync_schedules()
        except ConfigurationError as exc:
            raise CommandError(str(exc))
        for label, names in (("created", result.created), ("updated", result.updated),
                             ("unchanged", result.unchanged), ("disabled", result.disabled),
                             ("taken over from the admin", result.taken_over)):
            if names:
                self.stdout.write(f"{label}: {', '.join(names)}")
        self.stdout.write(f"{SETTING} synced")
