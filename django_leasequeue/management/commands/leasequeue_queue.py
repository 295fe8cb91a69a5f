"""``manage.py leasequeue_queue pause|resume|list [NAME]``: pause, resume and list queues.

Once ``pause`` has answered, no job of the queue starts in any worker (``store.queue_pause``):
handlers that had started run to the end, and jobs held unstarted go back to ready without
spending an attempt.
Resuming wakes idle workers with a NOTIFY. ``list`` shows every queue that holds jobs (in any
state), is configured or has a state row: its state, rate limit, throttled claims, depth (jobs not
finished: ready, waiting and leased) and dead letters.
"""

from __future__ import annotations

import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_leasequeue import store
from django_leasequeue.conf import get_settings, queue_name_problem
from django_leasequeue.exceptions import ConfigurationError


class Command(BaseCommand):
    help = "Pause, resume or list django-leasequeue queues."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["pause", "resume", "list"])
        parser.add_argument("names", nargs="*", metavar="NAME", help="queue name(s) (pause/resume)")
        parser.add_argument("--by", default=None, help="who pauses (default: the OS user name)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            settings = get_settings()
        except ConfigurationError as exc:
            raise CommandError(str(exc))
        action, names = options["action"], options["names"]
        if action == "list":
            self._list()
            return
        if not names:
            raise CommandError(f"{action} needs at least one queue name")
        for name in names:
            # Resume stays possible for a queue paused under a name written before the grammar.
            problem = queue_name_problem(name, "queue") if action == "pause" else None
            if problem:
                raise CommandError(problem)
        if settings.queues is not None:
            unknown = [n for n in names if n not in settings.queues]
            if unknown:
                raise CommandError(f"unknown queue(s) {unknown}; LEASEQUEUE['QUEUES'] has {sorted(settings.queues)}")
        for i, name in enumerate(names):
            if action == "pause":
                by = options["by"] or _user()
                # One wait, after the last commit, covers the pauses committed before it too.
                changed = store.queue_pause(name, by=by, wait=i == len(names) - 1)
                self.stdout.write(f"{name}: {'paused' if changed else 'already paused'}")
            else:
                changed = store.queue_resume(name)
                self.stdout.write(f"{name}: {'resumed' if changed else 'was not paused'}")

    def _list(self) -> None:
        rows = store.queue_list()
        if not rows:
            self.stdout.write("no queues: no job was ever enqueued, none is configured (LEASEQUEUE['QUEUES']) "
                              "and none was paused")
            return
        self.stdout.write(f"{'queue':<24} {'state':<8} {'rate':<10} {'throttled':>9} {'depth':>8} {'ready':>8} "
                          f"{'waiting':>8} {'leased':>7} {'dead':>7}  paused")
        for q in rows:
            paused = f"{q.paused_at:%Y-%m-%d %H:%M:%S} by {q.paused_by or '?'}" if q.paused and q.paused_at else ""
            self.stdout.write(f"{q.name:<24} {'paused' if q.paused else 'running':<8} {q.rate_limit or '-':<10} "
                              f"{q.throttled_total:>9} {q.depth:>8} {q.ready:>8} {q.waiting:>8} {q.leased:>7} "
                              f"{q.dead:>7}  {paused}".rstrip())


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return ""
