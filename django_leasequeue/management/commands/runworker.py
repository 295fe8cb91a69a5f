"""``manage.py runworker``: claim and run jobs until SIGTERM (or, with ``--burst``, until idle).

It prints a banner at start (:func:`start_line`, :func:`tasks_line`) and, when it stops, one line
of what the worker did (``WorkerService.summary()``): jobs claimed, done, retried, dead-lettered,
lease lost, released, and the seconds it ran.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_leasequeue.conf import EXECUTION_MODES, check_lease_seconds, get_settings, parse_queue_list
from django_leasequeue.exceptions import ConfigurationError

if TYPE_CHECKING:
    from django_leasequeue.runtime import Service


class Command(BaseCommand):
    help = "Run a django-leasequeue worker: claim due jobs with leases and run them on threads."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queues", default=None,
                            help="comma-separated queues to serve; '*' (default) serves every queue")
        parser.add_argument("--concurrency", type=int, default=4, help="handler threads (default 4)")
        parser.add_argument("--async-slots", type=int, default=None,
                            help="most async def handlers run at once on the worker's event loop, beside the "
                                 "threads; 0 runs them on the threads (default: LEASEQUEUE['ASYNC_SLOTS'], 100)")
        parser.add_argument("--lease", type=float, default=None,
                            help="default lease in seconds for tasks without their own, at most 604800 (7 days) "
                                 "(default: LEASEQUEUE['LEASE'])")
        parser.add_argument("--poll-interval", type=float, default=None,
                            help="seconds between polls when no notification arrives (default: setting)")
        parser.add_argument("--burst", action="store_true", help="exit once no due job is left")
        parser.add_argument("--worker-id", default=None, help="name of this worker (host:pid:NAME)")
        parser.add_argument("--no-notify", action="store_true", help="poll only; do not LISTEN")
        parser.add_argument("--no-reaper", action="store_true", help="do not run the reaper sweep in this worker")
        parser.add_argument("--with-scheduler", action="store_true",
                            help="also run the scheduler in this process")
        parser.add_argument("--execution", choices=EXECUTION_MODES, default=None,
                            help="'thread' runs handlers in the worker's threads; 'process' runs each in a child "
                                 "process killed at its task's timeout (default: LEASEQUEUE['EXECUTION'])")
        parser.add_argument("--metrics-port", type=int, default=None,
                            help="serve this worker's Prometheus counters and histograms on this TCP port "
                                 "(prometheus_client's HTTP server; default: not served)")
        parser.add_argument("--metrics-addr", default="127.0.0.1",
                            help="address the metrics server binds (default 127.0.0.1)")

    def handle(self, *args: Any, **options: Any) -> None:
        from django_leasequeue.runtime import run_services
        from django_leasequeue.worker import WorkerService

        try:
            settings = get_settings()
        except ConfigurationError as exc:
            raise CommandError(str(exc))
        from django_leasequeue.checks import require_migrated

        require_migrated()
        queues_opt = options["queues"]
        try:
            queues = parse_queue_list(queues_opt)
        except ConfigurationError as exc:
            raise CommandError(str(exc))
        if queues is not None and settings.queues is not None:
            unknown = [q for q in queues if q not in settings.queues]
            if unknown:
                raise CommandError(f"unknown queue(s) {unknown}; LEASEQUEUE['QUEUES'] has {sorted(settings.queues)}")
        if options["concurrency"] < 1:
            raise CommandError("--concurrency must be >= 1")
        if options["async_slots"] is not None and options["async_slots"] < 0:
            raise CommandError("--async-slots must be >= 0")
        problem = check_lease_seconds(options["lease"], "--lease") if options["lease"] is not None else None
        if problem:
            raise CommandError(problem)
        port = options["metrics_port"]
        if port is not None and not 1 <= port <= 65535:
            raise CommandError(f"--metrics-port must be a TCP port from 1 to 65535, not {port}")
        worker = WorkerService(queues=queues, concurrency=options["concurrency"], lease=options["lease"],
                               poll_interval=options["poll_interval"], burst=options["burst"],
                               worker_name=options["worker_id"], notify=False if options["no_notify"] else None,
                               reap=not options["no_reaper"], settings=settings, execution=options["execution"],
                               async_slots=options["async_slots"])
        # The worker sets it when it decides to exit (handlers stuck past their timeout), so that
        # a scheduler running in the same process stops too.
        worker.exit_event = threading.Event()
        services: list[Service] = [worker]
        if options["with_scheduler"]:
            from django_leasequeue.scheduler import SchedulerService

            try:
                services.append(SchedulerService())
            except ConfigurationError as exc:  # an invalid LEASEQUEUE_SCHEDULES: refuse to start
                raise CommandError(str(exc))
        metrics_server = None
        if port is not None:
            from django_leasequeue import worker_metrics

            try:  # before any job runs, so that every attempt is counted
                metrics_server = worker_metrics.serve(port, options["metrics_addr"])
            except OSError as exc:
                raise CommandError(f"--metrics-port {port} on {options['metrics_addr']}: cannot serve metrics: {exc}")
            self.stdout.write(f"metrics: http://{options['metrics_addr']}:{port}/metrics")
        names, native, async_names = _registered_tasks()
        # The slots matter only when there are async handlers to run on them (and process mode, or
        # --async-slots 0, runs those on the threads: no slots then).
        slots = worker.async_slots if async_names else 0
        self.stdout.write(start_line(worker.worker_id, queues, worker.concurrency, worker.lease, worker.execution,
                                     worker.burst, async_completions=worker.settings.async_completions,
                                     async_slots=slots))
        self.stdout.write(tasks_line(names, native, async_names=async_names))
        if not logging.getLogger("django_leasequeue.events").hasHandlers():
            self.stdout.write("Events are logged on the 'django_leasequeue' loggers; no handler is configured "
                              "for them, so configure LOGGING to see retries and dead letters.")
        self.stdout.flush()
        try:
            code = run_services(services, stop_when=worker.exit_event) or worker.exit_code
        finally:
            if metrics_server is not None:
                metrics_server.shutdown()
                metrics_server.server_close()
        self.stdout.write(worker.summary())
        self.stdout.flush()
        if code:
            raise SystemExit(code)


def start_line(worker_id: str, queues: list[str] | None, concurrency: int, lease: float, execution: str,
               burst: bool, *, async_completions: bool = False, async_slots: int = 0) -> str:
    """The banner's first line: the worker's id and options, and how to stop it.

    Args:
        worker_id (str): ``host:pid:name``. queues (list[str] | None): the queues served (None: all).
        concurrency (int): handler threads. lease (float): the default lease, seconds.
        execution (str): ``thread`` or ``process``. burst (bool): ``--burst`` was given.
        async_completions (bool): the ``ASYNC_COMPLETIONS`` setting is on: said at start, since a
            crash of PostgreSQL or a failover can then lose the last completions.
        async_slots (int): the event loop's slots for ``async def`` handlers (``ASYNC_SLOTS``,
            ``--async-slots``), shown after the threads when above 0; the caller passes 0 when the
            worker has no async task (the slots would run nothing).

    Returns:
        The line, without a newline.
    """
    slots = f", async slots {async_slots}" if async_slots > 0 else ""
    return (f"worker {worker_id}: queues {','.join(queues) if queues else '*'}, {concurrency} thread(s){slots}, "
            f"lease {lease:g} s, {execution} execution{', burst' if burst else ''}"
            f"{', asynchronous completions (ASYNC_COMPLETIONS)' if async_completions else ''}; "
            "SIGTERM or Ctrl-C stops gracefully.")


def tasks_line(names: list[str], native: int, shown: int = 4, *, async_names: Collection[str] = ()) -> str:
    """The banner's line of the tasks this worker runs, so a newcomer sees at start whether it
    found theirs (a job naming an unregistered task is dead-lettered as UnknownTask, never imported).

    Counts the native ``@task`` tasks and the framework's (``django.tasks`` tasks validated by
    ``LeaseQueueBackend``): both run. One line whatever the number: the first ``shown`` names in
    sorted order, then how many more.

    Args:
        names (list[str]): every registered task name, sorted. native (int): how many of them are
            native ``@task`` tasks (the rest are the framework's).
        shown (int): names listed before the rest are only counted.
        async_names (Collection[str]): the names among ``names`` whose handler is ``async def``
            (they run on the event loop's slots): counted after the kinds, and each listed one
            marked ``(async)``.

    Returns:
        The line, without a newline.
    """
    if not names:
        return ("0 task(s) registered: none (a worker runs the tasks of installed apps' tasks and jobs "
                "modules and of LEASEQUEUE['IMPORTS'])")
    marked = [f"{name} (async)" if name in async_names else name for name in names[:shown]]
    listed = ", ".join(marked) + (f" and {len(names) - shown} more" if len(names) > shown else "")
    counted = f"; {len(async_names)} async" if async_names else ""
    return (f"{len(names)} task(s) registered ({native} native, {len(names) - native} django.tasks{counted}): "
            f"{listed}")


def _registered_tasks() -> tuple[list[str], int, set[str]]:
    """The task names this worker will run (sorted), how many of them are native ``@task`` tasks,
    and the names whose handler is ``async def`` (as the worker's producer splits them)."""
    from django_leasequeue import registry
    from django_leasequeue.exceptions import UnknownTask

    registry.autodiscover()  # the worker would at start; the banner must count what it will run
    names = registry.known_task_names()
    async_names = set()
    for name in names:
        try:
            if registry.get_task(name).is_async:
                async_names.add(name)
        except UnknownTask:  # a resolver that names a task it cannot give: not one the worker runs async
            continue
    return names, len(set(names) & set(registry.registered_tasks())), async_names
