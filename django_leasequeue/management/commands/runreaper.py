"""``manage.py runreaper``: take back expired leases, prune old jobs and dead-letter the jobs of tasks
no live worker knows (``UNKNOWN_TASK_GRACE``) until SIGTERM."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.management.base import BaseCommand, CommandParser

if TYPE_CHECKING:
    from django_leasequeue import store


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
            settings = get_settings()
            reaped = reaper.reap_once(once=True)
            run = reaper.prune_and_move(settings)
            unknown = reaper.dead_letter_unknown_tasks(settings)
            self.stdout.write(f"reaped {len(reaped)} expired lease(s), pruned {run.pruned} finished job(s), "
                              f"dead-lettered {len(unknown)} job(s) of tasks no live worker knows")
            if settings.history is not None:
                self.stdout.write(history_line(run.history))
            return
        code = run_services([reaper.ReaperService(interval=options["interval"])])
        if code:
            raise SystemExit(code)


def history_line(run: store.HistoryRun | None) -> str:
    """The line ``runreaper --once`` prints with ``HISTORY`` set: the done jobs moved into the
    history and the partitions made and dropped (counted, with the first and last names), or that
    the step failed (its error is logged on ``django_leasequeue.reaper``).

    Args:
        run: what :func:`~django_leasequeue.reaper.move_to_history` did (None: it failed).

    Returns:
        The line, without a newline.
    """
    from django_leasequeue.reaper import partitions_text

    if run is None:
        return ("history: the maintenance failed (logged on django_leasequeue.reaper); "
                "the done jobs stay in the job table until the next one")
    return (f"history: moved {run.moved} done job(s), created partitions: {partitions_text(run.created)}, "
            f"dropped partitions: {partitions_text(run.dropped)}")
