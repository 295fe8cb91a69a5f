"""``manage.py queuehealth``: check the queues like a monitoring plugin (exit 0 OK, 1 WARNING,
2 CRITICAL, 3 UNKNOWN).

Thresholds take ``CRIT``, ``WARN:CRIT``, ``WARN:`` or ``:CRIT`` (see
:func:`django_leasequeue.health.parse_threshold`); durations accept ``s``/``m``/``h``/``d``.
Examples::

    manage.py queuehealth --max-oldest-age 1m:5m --min-workers 1 --max-dead 5:20/10m
    manage.py queuehealth --queue emails --queue billing --max-oldest-age 30 --json
    manage.py queuehealth --max-scheduler-lag 2m
    manage.py queuehealth --max-stuck 0:2          # warn on any stuck handler, critical above 2
    manage.py queuehealth --max-stuck-workflows 0: # warn on any workflow without progress for an hour
    manage.py queuehealth --max-stuck-workflows 0: --workflow-stuck-after 6h
    manage.py queuehealth --lease-report
    manage.py queuehealth --no-default-thresholds   # only the checks given (none: always OK)

Without flags it checks the defaults: no live worker is CRITICAL, a ready job older than 300 s
warns (:data:`DEFAULT_MIN_WORKERS`, :data:`DEFAULT_MAX_OLDEST_AGE`); an explicit
``--min-workers`` or ``--max-oldest-age`` replaces its default. A ``runworker --burst`` exits once
the queue is empty, so right after one the default finds no live worker: its CRITICAL message says
so, and that ``--min-workers 0`` checks a deployment that runs only burst workers (the other
checks stay).

The first line of the text output is the plugin status line (``QUEUEHEALTH CRITICAL - ... |
perfdata``); a table of every queue, the processes and the workflows follows. Bad arguments and an unreachable
database exit 3 (UNKNOWN). System checks are skipped so a probe stays fast and answers even when an
unrelated check fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable
from typing import Any, NoReturn

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from django_leasequeue import health
from django_leasequeue.exceptions import ConfigurationError
from django_leasequeue.health import Level

UNKNOWN = int(Level.UNKNOWN)

#: The checks made when their flag is not given (``--no-default-thresholds`` turns them off): no
#: live worker is critical (``--min-workers 1``), and a ready job waiting more than 300 s warns
#: (``--max-oldest-age 300:``), so that a bare ``queuehealth`` catches a deployment whose workers
#: are all gone or fall behind. An explicit flag replaces its default.
DEFAULT_MIN_WORKERS = health.Threshold(critical=1.0, direction="min")
DEFAULT_MAX_OLDEST_AGE = health.Threshold(warning=300.0, direction="max")

#: Added to the message of the default worker check when no worker is alive: the usual cause on a
#: new project is a ``runworker --burst`` that drained the queue and exited, as it should.
NO_LIVE_WORKER_HINT = ("a runworker --burst exits once the queue is empty, so for a deployment of --burst workers "
                       "only pass --min-workers 0, which keeps the other checks")


def _threshold(direction: str, duration: bool) -> Callable[[str], health.Threshold]:
    def threshold(text: str) -> health.Threshold:
        try:
            return health.parse_threshold(text, direction=direction, duration=duration)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc))

    return threshold


def _duration(text: str) -> float:
    try:
        value = health.parse_number(text, duration=True)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc))
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return value


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if unit == "s":
        return f"{value:.1f}s"
    return f"{value:g}"


class Command(BaseCommand):
    help = ("Check queue health: oldest due job age, dead letters, live workers, scheduler lag, stuck handlers "
            "and stuck workflows. "
            "Exit 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN.")
    requires_system_checks: list[str] = []

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        original_exit = parser.exit

        def exit_unknown(status: int = 0, message: str | None = None) -> NoReturn:
            # argparse exits 2 on a usage error, which a monitoring system would read as
            # CRITICAL; a check that cannot run is UNKNOWN (3).
            original_exit(UNKNOWN if status == 2 else status, message)

        parser.exit = exit_unknown  # type: ignore[method-assign]  # per-instance override, as argparse allows
        return parser

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queue", action="append", default=[], metavar="NAME",
                            help="check this queue on its own (repeatable); default: the whole system")
        parser.add_argument("--max-oldest-age", type=_threshold("max", True), metavar="[WARN:]CRIT",
                            help="age in seconds of the oldest due job, e.g. 300 or 1m:5m")
        parser.add_argument("--max-dead", metavar="[WARN:]CRIT[/WINDOW]",
                            help="dead letters within WINDOW seconds (default 300), e.g. 10/300 or 3:10/5m")
        parser.add_argument("--min-workers", type=_threshold("min", False), metavar="[WARN:]CRIT",
                            help="alive workers (per --queue: alive workers serving it), e.g. 1 or 2:1")
        parser.add_argument("--max-scheduler-lag", type=_threshold("max", True), metavar="[WARN:]CRIT",
                            help="seconds since the last scheduler tick; no tick at all is critical")
        parser.add_argument("--max-stuck", type=_threshold("max", False), metavar="[WARN:]CRIT",
                            help="handlers stuck past their task's timeout and still running, e.g. 0 or 0:2")
        parser.add_argument("--max-stuck-workflows", type=_threshold("max", False), metavar="[WARN:]CRIT",
                            help="unfinished workflows and batches without progress for --workflow-stuck-after, "
                                 "e.g. 0: (warn on any)")
        parser.add_argument("--workflow-stuck-after", type=_duration, default=None, metavar="SECONDS",
                            help="progress age after which a workflow is stuck, e.g. 3600 or 6h "
                                 "(default: WORKFLOW_STUCK_AFTER)")
        parser.add_argument("--ignore-paused", action="store_true",
                            help="leave paused queues out of the oldest-age check")
        parser.add_argument("--alive-within", type=_duration, default=None, metavar="SECONDS",
                            help="heartbeat age that still counts as alive (default: PROCESS_ALIVE_WITHIN)")
        parser.add_argument("--lease-report", action="store_true",
                            help="add per-task runtime percentiles and lease advice; flagged tasks warn")
        parser.add_argument("--lease-window", type=_duration, default=86400.0, metavar="SECONDS",
                            help="history the lease report covers (default 86400 = 1 day)")
        parser.add_argument("--json", action="store_true", help="print one JSON document instead of text")
        parser.add_argument("--no-default-thresholds", action="store_true",
                            help="check only the thresholds given: no default --min-workers 1 (no live worker "
                                 "is critical) nor --max-oldest-age 300: (a ready job waiting over 300 s warns)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            checks, dead_window = self._checks(options)
        except ValueError as exc:
            raise CommandError(str(exc), returncode=UNKNOWN)
        try:
            snap = health.snapshot(window_short=dead_window, window_long=max(3600.0, dead_window),
                                   alive_within=options["alive_within"], queues=options["queue"] or None,
                                   workflow_stuck_after=options["workflow_stuck_after"])
            report = health.lease_report(window=options["lease_window"]) if options["lease_report"] else None
        except (DatabaseError, ConfigurationError) as exc:
            message = f"QUEUEHEALTH UNKNOWN - cannot read the queue: {type(exc).__name__}: {exc}".strip()
            if options["json"]:
                self.stdout.write(json.dumps({"status": "UNKNOWN", "exit_code": UNKNOWN, "summary": message}))
            else:
                self.stdout.write(message)
            raise SystemExit(UNKNOWN)
        try:
            results = health.unknown_queue_checks(snap, options["queue"]) + health.evaluate(snap, checks)
        except DatabaseError as exc:
            message = f"QUEUEHEALTH UNKNOWN - cannot read the queue: {type(exc).__name__}: {exc}".strip()
            self.stdout.write(json.dumps({"status": "UNKNOWN", "exit_code": UNKNOWN, "summary": message})
                              if options["json"] else message)
            raise SystemExit(UNKNOWN)
        results = [_explain_no_live_worker(r, checks) for r in results]
        if report is not None:
            results += health.lease_checks(report)
        level = health.overall(results)
        summary = self._summary(level, results)
        if options["json"]:
            self.stdout.write(json.dumps({
                "status": level.name, "exit_code": int(level), "summary": summary,
                "checks": [r.to_dict() for r in results], "snapshot": snap.to_dict(),
                "lease_report": [t.to_dict() for t in report] if report is not None else None,
            }, indent=2))
        else:
            self._print_text(summary, snap, results, report, options["lease_window"])
        if level != Level.OK:
            raise SystemExit(int(level))

    @staticmethod
    def _checks(options: dict[str, Any]) -> tuple[health.Checks, float]:
        dead, window = None, 300.0
        if options["max_dead"]:
            dead, window = health.parse_rate(options["max_dead"])
        oldest, workers = options["max_oldest_age"], options["min_workers"]
        if not options.get("no_default_thresholds"):
            oldest = DEFAULT_MAX_OLDEST_AGE if oldest is None else oldest
            workers = DEFAULT_MIN_WORKERS if workers is None else workers
        return health.Checks(
            max_oldest_age=oldest, max_dead=dead, min_workers=workers,
            max_scheduler_lag=options["max_scheduler_lag"], max_stuck=options["max_stuck"],
            max_stuck_workflows=options["max_stuck_workflows"], queues=tuple(options["queue"]),
            ignore_paused=options["ignore_paused"],
        ), window

    @staticmethod
    def _summary(level: Level, results: list[health.CheckResult]) -> str:
        bad = [r for r in results if r.level == level and level != Level.OK]
        if not results:
            text = "no thresholds given"
        elif bad:
            text = "; ".join(r.message + (f" ({limits})" if (limits := r.threshold.describe(
                " s" if r.unit == "s" else "")) else "") for r in bad)
        else:
            text = f"{len(results)} check(s) passed"
        perf = " ".join(
            f"'{r.label}'={'' if r.value is None else f'{r.value:g}'}{r.unit};"
            f"{r.threshold.perfdata_range(r.threshold.warning)};{r.threshold.perfdata_range(r.threshold.critical)}"
            for r in results if r.check not in ("lease", "queue")
        )
        return f"QUEUEHEALTH {level.name} - {text}" + (f" | {perf}" if perf else "")

    def _print_text(self, summary: str, snap: health.Snapshot, results: list[health.CheckResult],
                    report: list[health.TaskLeaseStats] | None, lease_window: float) -> None:
        out = self.stdout.write
        out(summary)
        short, long = f"{snap.window_short:g}s", f"{snap.window_long:g}s"
        header = ["queue", "paused", "ready_due", "scheduled", "waiting", "leased", "expired", "dead", "oldest_age",
                  f"done_{short}", f"dead_{short}", f"done_{long}", f"dead_{long}", "workers"]
        rows = [[q.queue, "yes" if q.paused else "no", q.ready_due, q.scheduled, q.waiting, q.leased,
                 q.leased_expired, q.dead, _fmt(q.oldest_ready_age_seconds, "s"), q.done_recent_short,
                 q.dead_recent_short, q.done_recent_long, q.dead_recent_long, q.workers_serving] for q in snap.queues]
        out("")
        out(_table(header, rows))
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(snap.alive_by_kind.items())) or "none"
        tick = ("never" if snap.scheduler_last_tick_age_seconds is None
                else f"{snap.scheduler_last_tick_age_seconds:.1f}s ago")
        out("")
        out(f"processes alive: {kinds} (of {len(snap.workers)} registered; alive = heartbeat within "
            f"{snap.alive_within:g}s); last scheduler tick: {tick}; database time {snap.now.isoformat()}")
        stuck = [w for w in snap.workers if w.stuck_handlers]
        out(f"stuck handlers (past their task's timeout, still running): {snap.stuck_handlers}"
            + "".join(f"; {w.id}: {w.stuck_handlers}, the oldest for {w.stuck_seconds:.0f}s" for w in stuck))
        out(f"workflows: {health.stuck_workflows_message(snap)}")
        if results:
            out("")
            for r in results:
                limits = r.threshold.describe(" s" if r.unit == "s" else "")
                out(f"{r.level.name:<8}  {r.label}: {r.message}" + (f" [{limits}]" if limits else ""))
        if report is not None:
            out("")
            out(f"lease report (jobs finished in the last {lease_window:g}s; seconds; rec_ = recommended):"
                if report else f"lease report: no job finished in the last {lease_window:g}s")
            if report:
                header = ["task", "done", "dead", "p50", "p95", "p99", "max", "timeout", "lease", "expired",
                          "rejected", "healthy_lost", "rec_timeout", "rec_lease", "flags"]
                rows = [[t.task, t.done, t.dead, _fmt(t.p50, "s"), _fmt(t.p95, "s"), _fmt(t.p99, "s"),
                         _fmt(t.max, "s"), _fmt(t.timeout, "s"), _fmt(t.lease, "s"), t.lease_expired,
                         t.fence_rejected, t.lost_while_healthy, _fmt(t.recommended_timeout, "s"),
                         _fmt(t.recommended_lease, "s"), ",".join(t.flags) or "-"] for t in report]
                out(_table(header, rows))


def _explain_no_live_worker(result: health.CheckResult, checks: health.Checks) -> health.CheckResult:
    """``result`` with :data:`NO_LIVE_WORKER_HINT` added to its message when it is the default worker
    check (no ``--min-workers`` given) and found no live worker; any other result unchanged.

    Args:
        result (health.CheckResult): one evaluated check. checks (health.Checks): the checks made.
    """
    if result.check != "workers" or result.value or checks.min_workers is not DEFAULT_MIN_WORKERS \
            or result.level == Level.OK:
        return result
    return dataclasses.replace(result, message=f"{result.message}; {NO_LIVE_WORKER_HINT}")


def _table(header: list[str], rows: list[list[Any]]) -> str:
    cells = [header] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in cells]
    return "\n".join(line.rstrip() for line in lines)
