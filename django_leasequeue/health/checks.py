"""The checks that judge a health report: :class:`Checks` (which thresholds to apply), :func:`evaluate`
(a snapshot against them), :func:`unknown_queue_checks`, :func:`lease_checks` and :func:`overall`,
each producing :class:`CheckResult` values, and :func:`stuck_workflows_message` (the stuck
workflows in one line). ``manage.py queuehealth`` is a thin shell around them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..conf import get_settings
from ..models import QueueState
from .collect import _alias, snapshot
from .leases import FLAG_LOST_WHILE_HEALTHY, FLAG_P99_OVER_TIMEOUT, TaskLeaseStats
from .report import QueueStats, Snapshot
from .thresholds import Level, Threshold, _fmt


@dataclass(frozen=True)
class Checks:
    """What to check in a snapshot. Every threshold is optional.

    Attributes:
        max_oldest_age: seconds; on the oldest due job's age.
        max_dead: dead letters in the snapshot's short window (make ``window_short`` the wanted
            window when taking the snapshot).
        min_workers: alive worker processes (per queue: alive workers serving it).
        max_scheduler_lag: seconds since the last scheduler tick; no tick at all is critical.
        max_stuck: stuck handlers (past their task's timeout, still running) in alive workers,
            the whole system's count (a worker cannot be attributed to one queue).
        max_stuck_workflows: stuck workflows and batches (unfinished, no progress for the
            snapshot's ``workflow_stuck_after`` seconds), the whole system's count (a workflow's
            steps may be in several queues). ``Threshold(warning=0)`` warns on the first one.
        queues: check these queues one by one; empty: check the whole system (oldest age is the
            worst queue's, dead letters the sum, workers every alive worker).
        ignore_paused: leave paused queues out of the oldest-age check (an operator stopped them).
    """

    max_oldest_age: Threshold | None = None
    max_dead: Threshold | None = None
    min_workers: Threshold | None = None
    max_scheduler_lag: Threshold | None = None
    max_stuck: Threshold | None = None
    max_stuck_workflows: Threshold | None = None
    queues: tuple[str, ...] = ()
    ignore_paused: bool = False


@dataclass(frozen=True)
class CheckResult:
    """One evaluated check.

    Attributes:
        check: ``oldest_ready_age``, ``dead_letters``, ``workers``, ``scheduler_lag``,
            ``stuck_handlers``, ``stuck_workflows``, ``queue`` or ``lease``.
        scope: a queue name, a task name (``lease``) or ``*`` for the whole system.
        value: the measured figure (None: no data, e.g. no scheduler tick ever).
        threshold: the limits applied.
        level: the outcome.
        message: one line for humans.
        unit: ``s`` for seconds, else empty.
    """

    check: str
    scope: str
    value: float | None
    threshold: Threshold
    level: Level
    message: str
    unit: str = ""

    @property
    def label(self) -> str:
        """``check[scope]``, e.g. ``oldest_ready_age[emails]``."""
        return f"{self.check}[{self.scope}]"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"check": self.check, "scope": self.scope, "value": self.value, "unit": self.unit,
                "warning": self.threshold.warning, "critical": self.threshold.critical,
                "direction": self.threshold.direction, "level": self.level.name, "message": self.message}


def evaluate(snap: Snapshot, checks: Checks) -> list[CheckResult]:
    """Apply ``checks`` to ``snap``; return one result per (check, scope)."""
    results: list[CheckResult] = []
    scopes: list[str | None] = list(checks.queues) or [None]
    window = _fmt(snap.window_short)
    for scope in scopes:
        name = scope or "*"
        if scope is None:
            stats = snap.total()
            # --ignore-paused concerns the age only: paused queues are left out of the worst age.
            aged = snap.total(q.queue for q in snap.queues if not (checks.ignore_paused and q.paused))
            workers = snap.workers_alive
            where = "any queue"
        else:
            stats = aged = snap.queue(scope)
            workers = snap.workers_serving(scope)
            where = f"queue {scope!r}"
        if checks.max_oldest_age is not None:
            value = aged.oldest_ready_age_seconds
            if scope is not None and checks.ignore_paused and stats.paused:
                results.append(CheckResult("oldest_ready_age", name, value, checks.max_oldest_age, Level.OK,
                                           f"{where} is paused (ignored)", "s"))
            else:
                level = checks.max_oldest_age.level(value)
                results.append(CheckResult(
                    "oldest_ready_age", name, value, checks.max_oldest_age, level,
                    f"oldest due job in {where} waits {_fmt(value)} s ({aged.ready_due} due)", "s"))
        if checks.max_dead is not None:
            value = float(stats.dead_recent_short)
            results.append(CheckResult(
                "dead_letters", name, value, checks.max_dead, checks.max_dead.level(value),
                f"{stats.dead_recent_short} dead letter(s) in {where} in the last {window} s "
                f"({stats.done_recent_short} done)"))
        if checks.min_workers is not None:
            results.append(CheckResult(
                "workers", name, float(workers), checks.min_workers, checks.min_workers.level(workers),
                f"{workers} alive worker(s) serve {where}"))
    if checks.max_scheduler_lag is not None:
        lag = snap.scheduler_last_tick_age_seconds
        message = ("no scheduler tick recorded: no scheduler runs" if lag is None
                   else f"last scheduler tick {_fmt(lag)} s ago")
        results.append(CheckResult("scheduler_lag", "*", lag, checks.max_scheduler_lag,
                                   checks.max_scheduler_lag.level(lag), message, "s"))
    if checks.max_stuck is not None:
        stuck = float(snap.stuck_handlers)
        results.append(CheckResult("stuck_handlers", "*", stuck, checks.max_stuck, checks.max_stuck.level(stuck),
                                   f"{snap.stuck_handlers} handler(s) stuck past their task's timeout"))
    if checks.max_stuck_workflows is not None:
        stuck = float(snap.workflows_stuck)
        results.append(CheckResult("stuck_workflows", "*", stuck, checks.max_stuck_workflows,
                                   checks.max_stuck_workflows.level(stuck), stuck_workflows_message(snap)))
    return results


def stuck_workflows_message(snap: Snapshot) -> str:
    """One line on the snapshot's stuck workflows: how many, of how many unfinished, and the oldest
    by id, kind, name and age with its likely cause (e.g. ``held by dead job 42``).

    Args:
        snap: a :class:`Snapshot`.

    Returns:
        The line, e.g. ``"1 of 3 unfinished workflow(s) stuck (no progress for more than 3600 s);
        the oldest: chain #12 'import', no progress for 7200 s, held by dead job 42 (replay it to
        resume)"``.
    """
    text = (f"{snap.workflows_stuck} of {snap.workflows_unfinished} unfinished workflow(s) stuck "
            f"(no progress for more than {_fmt(snap.workflow_stuck_after)} s)")
    oldest = snap.oldest_stuck_workflow
    if oldest is not None:
        text += f"; the oldest: {oldest.label}, no progress for {oldest.age_seconds:.0f} s, {oldest.cause}"
    return text


def unknown_queue_checks(snap: Snapshot, queues: Iterable[str], *, alias: str | None = None) -> list[CheckResult]:
    """A WARNING for each of ``queues`` that the snapshot cannot vouch for: no job in it
    (none waiting, running, dead, or finished within the snapshot's long window) and nothing names
    it: not ``LEASEQUEUE["QUEUES"]`` nor ``DEFAULT_QUEUE``, no registered task, no schedule, no
    pause/rate state and no worker serving it by name. Most likely a typo: the other checks of such
    a queue would pass on zeros and report OK. A warning, not UNKNOWN: UNKNOWN (3) would outrank and
    hide a CRITICAL of the same run.

    Args:
        snap: a :class:`Snapshot` taken with these queues.
        queues: the queue names asked for (``queuehealth --queue``).
        alias: database alias of the schedule and queue-state tables; default the job table's.

    Returns:
        One :class:`CheckResult` (check ``queue``, level WARNING, value None) per unknown queue,
        naming close known queues.
    """
    from .. import registry
    from ..models import Schedule

    empty = [name for name in dict.fromkeys(queues) if not _has_jobs(snap.queue(name))]
    if not empty:
        return []
    alias = alias or _alias()
    settings = get_settings()
    registry.autodiscover()
    known = {settings.default_queue, *(settings.queues or ())}
    known.update(spec.queue for spec in registry.registered_tasks().values() if spec.queue)
    known.update(QueueState.objects.using(alias).values_list("name", flat=True))
    known.update(q for q in Schedule.objects.using(alias).values_list("queue", flat=True).distinct() if q)
    known.update(q for w in snap.workers for q in w.queues if q != "*")
    known.update(q.queue for q in snap.queues if _has_jobs(q))
    # The queues that hold jobs, for the suggestion (the snapshot may cover only the asked ones):
    # one more snapshot statement, only on this rare path.
    everywhere = snapshot(window_short=snap.window_short, window_long=snap.window_long, alias=alias)
    known.update(q.queue for q in everywhere.queues if _has_jobs(q))
    results = []
    for name in empty:
        if name in known:
            continue
        hint = registry.close_matches(name, known, n=3, cutoff=0.6)
        hint += " " if hint else ""
        results.append(CheckResult(
            "queue", name, None, Threshold(), Level.WARNING,
            f"queue {name!r} is unknown: no job in it (waiting, running, dead or finished in the last "
            f"{_fmt(snap.window_long)} s) and no task, schedule, worker, queue state or LEASEQUEUE['QUEUES'] "
            f"names it; {hint}known queues: {', '.join(sorted(known)) or 'none'}"))
    return results


def _has_jobs(stats: QueueStats) -> bool:
    return bool(stats.ready_due or stats.scheduled or stats.leased or stats.dead or stats.waiting
                or stats.done_recent_long or stats.dead_recent_long or stats.done_recent_short
                or stats.dead_recent_short)


def overall(results: Iterable[CheckResult]) -> Level:
    """The worst level among ``results`` (OK when there are none)."""
    return max((r.level for r in results), default=Level.OK)


def lease_checks(report: Iterable[TaskLeaseStats]) -> list[CheckResult]:
    """One WARNING result per task of a lease report whose p99 runtime exceeds its timeout or that
    lost leases while healthy (for ``queuehealth --lease-report``). ``unregistered`` alone is shown
    in the report but does not warn: the checking process may simply not import every task.
    """
    results = []
    for stats in report:
        reasons = []
        if FLAG_P99_OVER_TIMEOUT in stats.flags:
            reasons.append(f"p99 runtime {_fmt(stats.p99 or 0)} s exceeds its timeout {_fmt(stats.timeout or 0)} s")
        if FLAG_LOST_WHILE_HEALTHY in stats.flags:
            reasons.append(f"lost {stats.lost_while_healthy} lease(s) while healthy")
        if not reasons:
            continue
        results.append(CheckResult("lease", stats.task, stats.p99, Threshold(critical=None, warning=stats.timeout),
                                   Level.WARNING, f"task {stats.task}: " + "; ".join(reasons), "s"))
    return results
