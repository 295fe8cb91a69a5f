"""Queue health: the read-only queries behind the admin dashboard, ``queuehealth`` and the metrics.

A scheduler's characteristic failure is omission: no job runs, no job fails, every error-rate
dashboard stays green. The figure that catches it is the **age of the oldest due job**, measured
from its ``run_at`` by the database clock: it grows while nothing drains a queue, whatever the
reason (no worker, a paused queue, a crashed scheduler's jobs piling up behind a stuck one, a
worker that serves the wrong queues). This module computes that figure with the others a
dashboard or an alert needs:

* :func:`snapshot` -> :class:`Snapshot`: per queue the due (``ready_due``), scheduled (ready with a
  future ``run_at``, retry backoffs included), leased and dead counts, the oldest due job's age,
  done and dead-lettered counts over a short and a long window (transitions, by ``finished_at``,
  not the size of the dead-letter table), leases past their expiry that no reaper has taken back
  yet, and whether the queue is paused; the registered processes with an ``alive`` flag (heartbeat
  within ``PROCESS_ALIVE_WITHIN``) and the age of the last scheduler tick.
* :func:`evaluate` turns a snapshot and :class:`Checks` (thresholds, see :func:`parse_threshold`)
  into OK / WARNING / CRITICAL results; ``manage.py queuehealth`` is a thin shell around it.
* :func:`lease_report` -> per task runtime percentiles of recent finished jobs, lease losses and
  fence rejections, with a recommended timeout and lease (:func:`recommend`).

Cost: :func:`snapshot` is two statements. The job statement reads only the partial indexes of
``models.Job``: ``leasequeue_job_ready`` for the ready rows (index-only when the visibility map
allows), ``leasequeue_job_leased`` for the leased rows, and ``leasequeue_job_finished`` for the
dead rows and the finished-in-window ranges. Its cost grows with the backlog (ready, leased and dead
rows) and the jobs finished in the long window, never with the millions of retained ``done`` rows
(``bench/health_bench.py`` prints the plans and timings on a 1,000,000-row table).

The statements themselves (plain ``SELECT``: no locks, no writes) are in
:mod:`django_leasequeue.store.read`, like every other statement of the package; this module turns
their rows into figures and verdicts. All times come from the database clock (``leasequeue_now()``)
unless an explicit aware ``now`` is passed (tests).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import IntEnum
from typing import Any

from . import store
from .conf import Settings, get_settings
from .models import QueueState
from .store import read
from .store.read import LEASE_REPORT as LEASE_REPORT  # noqa: F401 - the statements, for benchmarks and plan tests
from .store.read import PROCESSES as PROCESSES  # noqa: F401
from .store.read import QUEUE_STATS as QUEUE_STATS  # noqa: F401
from .store.read import read_cursor as _read_cursor  # noqa: F401

# Number of statements snapshot() runs that read tables (reported by the bench).
SNAPSHOT_QUERIES = 2


@dataclass(frozen=True)
class QueueStats:
    """Health figures of one queue. Counts are jobs; ages and windows are seconds.

    Attributes:
        queue: the queue name.
        ready_due: ready jobs whose ``run_at`` has come (database time): the backlog.
        scheduled: ready jobs whose ``run_at`` is still in the future (delayed jobs, cron
            occurrences emitted early and retries waiting out their backoff).
        leased: jobs held by a worker right now (running).
        dead: dead letters currently kept for this queue (all of them, not a rate).
        oldest_ready_age_seconds: ``now - run_at`` of the oldest due ready job; 0.0 when nothing is
            due. Measured from ``run_at``, so a delayed job or a retry is not "old" before it is due.
        done_recent_short / done_recent_long: jobs that finished ``done`` in the short / long window.
        dead_recent_short / dead_recent_long: jobs dead-lettered in the short / long window
            (transitions by ``finished_at``; replayed jobs no longer count).
        paused: the queue is paused (``QueueState.paused``): workers claim nothing from it.
        leased_expired: leased jobs whose lease has passed but that no reaper has taken back yet
            (a few for one reaper interval is normal; a growing number means no reaper runs).
        workers_serving: alive worker processes that serve this queue (by name or ``*``).
    """

    queue: str
    ready_due: int = 0
    scheduled: int = 0
    leased: int = 0
    dead: int = 0
    oldest_ready_age_seconds: float = 0.0
    done_recent_short: int = 0
    dead_recent_short: int = 0
    done_recent_long: int = 0
    dead_recent_long: int = 0
    paused: bool = False
    leased_expired: int = 0
    workers_serving: int = 0

    @property
    def dead_ratio_short(self) -> float | None:
        """Dead letters / (done + dead) in the short window; None when nothing finished in it."""
        finished = self.done_recent_short + self.dead_recent_short
        return self.dead_recent_short / finished if finished else None

    @property
    def dead_ratio_long(self) -> float | None:
        """Dead letters / (done + dead) in the long window; None when nothing finished in it."""
        finished = self.done_recent_long + self.dead_recent_long
        return self.dead_recent_long / finished if finished else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of the fields and the two ratios."""
        return {**asdict(self), "dead_ratio_short": self.dead_ratio_short, "dead_ratio_long": self.dead_ratio_long}


@dataclass(frozen=True)
class WorkerInfo:
    """A registered process (``WorkerProcess`` row) as monitoring sees it.

    Attributes:
        id: ``host:pid:name``.
        kind: ``worker``, ``scheduler`` or ``reaper``.
        host, pid: where it runs.
        queues: queue names it serves; ``["*"]`` for every queue.
        started_at, last_heartbeat_at: aware datetimes, database time.
        alive: the last heartbeat is at most ``alive_within`` seconds old.
        concurrency: handler threads (workers).
        last_tick_at: the last scheduler tick recorded on this row, or None.
        heartbeat_age_seconds: ``now - last_heartbeat_at``.
        stuck_handlers: its handlers past their task's timeout and still running (thread mode:
            they hold a thread and their job's lease until they return).
        stuck_seconds: seconds since the oldest of them passed its timeout (0.0: none stuck).
    """

    id: str
    kind: str
    host: str
    pid: int
    queues: list[str]
    started_at: datetime
    last_heartbeat_at: datetime
    alive: bool
    concurrency: int = 0
    last_tick_at: datetime | None = None
    heartbeat_age_seconds: float = 0.0
    stuck_handlers: int = 0
    stuck_seconds: float = 0.0

    def serves(self, queue: str) -> bool:
        """True when this process claims jobs from ``queue``."""
        return "*" in self.queues or queue in self.queues

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (datetimes as ISO 8601)."""
        data = asdict(self)
        for key in ("started_at", "last_heartbeat_at", "last_tick_at"):
            data[key] = data[key].isoformat() if data[key] is not None else None
        return data


@dataclass(frozen=True)
class Snapshot:
    """The health of the whole queue system at one instant of database time.

    Attributes:
        now: the database clock reading every figure refers to (aware datetime).
        queues: one :class:`QueueStats` per known queue, by name.
        workers: every registered process (workers, schedulers, reapers), alive or not.
        workers_alive: alive processes of kind ``worker`` (those that run jobs).
        scheduler_last_tick_age_seconds: ``now`` minus the newest ``last_tick_at`` of any
            registered process; None when no tick is recorded (no scheduler ever ran, or its row
            was pruned after it stopped: both mean no scheduler is running).
        window_short, window_long, alive_within: the parameters used, in seconds.
        query_seconds: wall time of the snapshot's statements.
    """

    now: datetime
    queues: list[QueueStats] = field(default_factory=list)
    workers: list[WorkerInfo] = field(default_factory=list)
    workers_alive: int = 0
    scheduler_last_tick_age_seconds: float | None = None
    window_short: float = 300.0
    window_long: float = 3600.0
    alive_within: float = 30.0
    query_seconds: float = 0.0

    def queue(self, name: str) -> QueueStats:
        """The stats of queue ``name`` (all zero when the queue has no jobs at all)."""
        for stats in self.queues:
            if stats.queue == name:
                return stats
        return QueueStats(queue=name, workers_serving=self.workers_serving(name))

    def workers_serving(self, queue: str) -> int:
        """Alive worker processes that serve ``queue``."""
        return sum(1 for w in self.workers if w.alive and w.kind == "worker" and w.serves(queue))

    @property
    def alive_by_kind(self) -> dict[str, int]:
        """Alive processes per kind (``worker``, ``scheduler``, ``reaper``...)."""
        counts: dict[str, int] = {}
        for w in self.workers:
            counts.setdefault(w.kind, 0)
            if w.alive:
                counts[w.kind] += 1
        return counts

    def total(self, queues: Iterable[str] | None = None) -> QueueStats:
        """Sum the figures over ``queues`` (default all) into one :class:`QueueStats` named ``*``.

        Counts add up; ``oldest_ready_age_seconds`` is the maximum; ``paused`` is True only when
        every summed queue is paused; ``workers_serving`` is :attr:`workers_alive`.
        """
        wanted = None if queues is None else set(queues)
        rows = [q for q in self.queues if wanted is None or q.queue in wanted]
        return QueueStats(
            queue="*",
            ready_due=sum(q.ready_due for q in rows),
            scheduled=sum(q.scheduled for q in rows),
            leased=sum(q.leased for q in rows),
            dead=sum(q.dead for q in rows),
            oldest_ready_age_seconds=max((q.oldest_ready_age_seconds for q in rows), default=0.0),
            done_recent_short=sum(q.done_recent_short for q in rows),
            dead_recent_short=sum(q.dead_recent_short for q in rows),
            done_recent_long=sum(q.done_recent_long for q in rows),
            dead_recent_long=sum(q.dead_recent_long for q in rows),
            paused=bool(rows) and all(q.paused for q in rows),
            leased_expired=sum(q.leased_expired for q in rows),
            workers_serving=self.workers_alive,
        )

    @property
    def stuck_handlers(self) -> int:
        """Handlers past their task's timeout and still running, over every registered worker."""
        return sum(w.stuck_handlers for w in self.workers)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of the whole snapshot."""
        return {
            "now": self.now.isoformat(),
            "window_short": self.window_short,
            "window_long": self.window_long,
            "alive_within": self.alive_within,
            "queues": [q.to_dict() for q in self.queues],
            "workers": [w.to_dict() for w in self.workers],
            "workers_alive": self.workers_alive,
            "stuck_handlers": self.stuck_handlers,
            "alive_by_kind": self.alive_by_kind,
            "scheduler_last_tick_age_seconds": self.scheduler_last_tick_age_seconds,
            "query_seconds": self.query_seconds,
        }


def _alias() -> str:
    return store.db_alias()


def snapshot(now: datetime | None = None, *, window_short: float = 300, window_long: float = 3600,
             alive_within: float | None = None, queues: Sequence[str] | None = None,
             alias: str | None = None) -> Snapshot:
    """Read the health of every queue and process (two read-only statements).

    Args:
        now: aware datetime to evaluate at; None (the normal case) reads the database clock.
        window_short, window_long: seconds of the two "recently done / dead-lettered" windows.
        alive_within: seconds; a process whose heartbeat is older is not alive. None: the
            ``PROCESS_ALIVE_WITHIN`` setting.
        queues: restrict the queue figures to these names (each is reported, even with no jobs);
            None reports every queue that has jobs, a ``QueueState`` row, or is configured in
            ``LEASEQUEUE["QUEUES"]`` (or is the ``DEFAULT_QUEUE``).
        alias: database alias; default the job table's (through the routers).

    Returns:
        A :class:`Snapshot`.

    Raises:
        ValueError: a naive ``now`` or a window that is not > 0.
        django.db.DatabaseError: the database cannot be read.
    """
    if now is not None and (now.tzinfo is None or now.utcoffset() is None):
        raise ValueError("snapshot(now=...) needs an aware datetime")
    if window_short <= 0 or window_long <= 0:
        raise ValueError("windows must be > 0 seconds")
    settings = get_settings()
    alive_within = float(settings.process_alive_within if alive_within is None else alive_within)
    if queues is not None:
        queue_filter: list[str] | None = list(dict.fromkeys(queues))
        always = queue_filter
    else:
        queue_filter = None
        always = list(settings.queues) if settings.queues is not None else [settings.default_queue]
    params = {"now": now, "queues": queue_filter, "always": always, "short": float(window_short),
              "long": float(window_long), "widest": float(max(window_short, window_long))}
    rows, process_rows, elapsed = read.snapshot_rows(params, alias=alias or _alias())
    db_now = rows[0][0]
    workers = []
    for pid_, kind, host, pid, wq, concurrency, started_at, beat, tick, stuck, stuck_since in process_rows:
        age = (db_now - beat).total_seconds()
        if isinstance(wq, (str, bytes)):  # Django's psycopg backend hands jsonb over undecoded
            wq = json.loads(wq)
        workers.append(WorkerInfo(
            id=pid_, kind=kind, host=host, pid=pid, queues=[str(q) for q in wq or []], started_at=started_at,
            last_heartbeat_at=beat, alive=age <= alive_within, concurrency=concurrency,
            last_tick_at=tick, heartbeat_age_seconds=max(age, 0.0), stuck_handlers=stuck,
            stuck_seconds=max((db_now - stuck_since).total_seconds(), 0.0) if stuck_since is not None else 0.0,
        ))
    ticks = [w.last_tick_at for w in workers if w.last_tick_at is not None]
    tick_age = max((db_now - max(ticks)).total_seconds(), 0.0) if ticks else None
    snap = Snapshot(now=db_now, workers=workers, scheduler_last_tick_age_seconds=tick_age,
                    workers_alive=sum(1 for w in workers if w.alive and w.kind == "worker"),
                    window_short=float(window_short), window_long=float(window_long),
                    alive_within=alive_within, query_seconds=elapsed)
    for row in rows:
        if row[1] is None:  # no queue at all: the clock row only
            continue
        snap.queues.append(QueueStats(
            queue=row[1], ready_due=row[2], scheduled=row[3], leased=row[4], dead=row[5],
            oldest_ready_age_seconds=float(row[6]), done_recent_short=row[7], dead_recent_short=row[8],
            done_recent_long=row[9], dead_recent_long=row[10], paused=row[11], leased_expired=row[12],
            workers_serving=snap.workers_serving(row[1]),
        ))
    return snap


# ---------------------------------------------------------------------------------------------
# Thresholds and checks (queuehealth, probes, the dashboard's traffic lights)
# ---------------------------------------------------------------------------------------------


class Level(IntEnum):
    """Check outcome; the values are the monitoring-plugin exit codes."""

    OK = 0
    WARNING = 1
    CRITICAL = 2
    UNKNOWN = 3


_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_NUMBER = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhd]?)\s*$")


def parse_number(text: str, *, duration: bool) -> float:
    """Parse ``"12"``, ``"1.5"``, or with ``duration`` a unit: ``"90s"``, ``"5m"``, ``"2h"``, ``"1d"``.

    Returns:
        The value (seconds for durations).

    Raises:
        ValueError: not a non-negative number (with a unit only where a duration is expected).
    """
    match = _NUMBER.match(text)
    if not match or (match.group(2) and not duration):
        kind = "a duration such as 30, 90s, 5m or 1h" if duration else "a non-negative number"
        raise ValueError(f"{text!r} is not {kind}")
    return float(match.group(1)) * _UNITS[match.group(2)]


@dataclass(frozen=True)
class Threshold:
    """A warning and a critical limit for one figure; either may be None (not checked).

    ``direction`` is ``"max"`` (alert when the value goes above a limit) or ``"min"`` (alert when
    it goes below, e.g. live workers). Limits themselves are allowed: ``--max-oldest-age 300``
    alerts at 300.1 s, not at 300 s; ``--min-workers 2`` alerts at 1 worker, not at 2.
    """

    warning: float | None = None
    critical: float | None = None
    direction: str = "max"

    def level(self, value: float | None) -> Level:
        """The level of ``value``; None counts as infinitely bad (no data means nothing runs)."""
        if value is None:
            value = math.inf if self.direction == "max" else -math.inf
        for limit, level in ((self.critical, Level.CRITICAL), (self.warning, Level.WARNING)):
            if limit is None:
                continue
            if (value > limit) if self.direction == "max" else (value < limit):
                return level
        return Level.OK

    def describe(self, unit: str = "") -> str:
        """Human form, e.g. ``"warn > 60 s, crit > 300 s"``."""
        op = ">" if self.direction == "max" else "<"
        parts = []
        if self.warning is not None:
            parts.append(f"warn {op} {_fmt(self.warning)}{unit}")
        if self.critical is not None:
            parts.append(f"crit {op} {_fmt(self.critical)}{unit}")
        return ", ".join(parts)

    def perfdata_range(self, limit: float | None) -> str:
        """A monitoring-plugin perfdata range for one limit (``"5"`` for max, ``"2:"`` for min)."""
        if limit is None:
            return ""
        return _fmt(limit) if self.direction == "max" else f"{_fmt(limit)}:"


def _fmt(value: float) -> str:
    return f"{value:g}" if value == int(value) else f"{value:.1f}"


def parse_threshold(text: str, *, direction: str = "max", duration: bool = False) -> Threshold:
    """Parse a threshold: ``CRIT``, ``WARN:CRIT``, ``WARN:`` (warning only) or ``:CRIT``.

    Examples (``direction="max"``): ``"300"`` is critical above 300; ``"60:300"`` warns above 60
    and is critical above 300; ``"60:"`` only warns. For ``direction="min"``, ``"2:1"`` warns
    below 2 and is critical below 1, so the warning limit must not be below the critical one.
    With ``duration``, values take an optional unit ``s``/``m``/``h``/``d`` (``"1m:5m"``).

    Raises:
        ValueError: malformed, empty, or the warning limit is beyond the critical one.
    """
    text = text.strip()
    if ":" in text:
        warn_text, crit_text = text.split(":", 1)
    else:
        warn_text, crit_text = "", text
    warn = parse_number(warn_text, duration=duration) if warn_text.strip() else None
    crit = parse_number(crit_text, duration=duration) if crit_text.strip() else None
    if warn is None and crit is None:
        raise ValueError(f"{text!r} sets no limit; use CRIT, WARN:CRIT, WARN: or :CRIT")
    if warn is not None and crit is not None:
        if direction == "max" and warn > crit:
            raise ValueError(f"{text!r}: the warning limit must not be above the critical one")
        if direction == "min" and warn < crit:
            raise ValueError(f"{text!r}: for a minimum the warning limit must not be below the critical one")
    return Threshold(warning=warn, critical=crit, direction=direction)


def parse_rate(text: str, *, default_window: float = 300.0) -> tuple[Threshold, float]:
    """Parse a count-per-window threshold: ``THRESHOLD[/WINDOW]``.

    ``"10/300"``: critical above 10 in 300 s; ``"3:10/5m"``: warn above 3, critical above 10 in
    5 minutes; ``"10"``: critical above 10 in ``default_window`` seconds.

    Returns:
        ``(threshold, window seconds)``.

    Raises:
        ValueError: malformed threshold or a window that is not > 0.
    """
    limits, _, window_text = text.partition("/")
    window = parse_number(window_text, duration=True) if window_text.strip() else float(default_window)
    if window <= 0:
        raise ValueError(f"{text!r}: the window must be > 0 seconds")
    return parse_threshold(limits), window


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
        queues: check these queues one by one; empty: check the whole system (oldest age is the
            worst queue's, dead letters the sum, workers every alive worker).
        ignore_paused: leave paused queues out of the oldest-age check (an operator stopped them).
    """

    max_oldest_age: Threshold | None = None
    max_dead: Threshold | None = None
    min_workers: Threshold | None = None
    max_scheduler_lag: Threshold | None = None
    max_stuck: Threshold | None = None
    queues: tuple[str, ...] = ()
    ignore_paused: bool = False


@dataclass(frozen=True)
class CheckResult:
    """One evaluated check.

    Attributes:
        check: ``oldest_ready_age``, ``dead_letters``, ``workers``, ``scheduler_lag`` or ``lease``.
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
    return results


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
    from . import registry
    from .models import Schedule

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
    return bool(stats.ready_due or stats.scheduled or stats.leased or stats.dead or stats.done_recent_long
                or stats.dead_recent_long or stats.done_recent_short or stats.dead_recent_short)


def overall(results: Iterable[CheckResult]) -> Level:
    """The worst level among ``results`` (OK when there are none)."""
    return max((r.level for r in results), default=Level.OK)


# ---------------------------------------------------------------------------------------------
# Lease advice
# ---------------------------------------------------------------------------------------------

FLAG_P99_OVER_TIMEOUT = "p99>timeout"
FLAG_LOST_WHILE_HEALTHY = "lost-lease-while-healthy"
FLAG_UNREGISTERED = "unregistered"


@dataclass(frozen=True)
class TaskLeaseStats:
    """Lease advice for one task. Durations are seconds.

    Attributes:
        task: the task name.
        done, dead: jobs of the task that finished done / dead in the window (leased ones running
            now count in neither).
        p50, p95, p99, max: runtime of the done jobs' successful attempt (claim to completion),
            ``percentile_cont`` (linear interpolation); None without done jobs.
        lease_expired: leases of the task the reaper took back in the window (``LeaseExpired``).
        fence_rejected: attempts whose worker, still running, had a write refused because its
            fencing token was stale (the worker outlived its lease).
        lost_while_healthy: the part of ``fence_rejected`` whose attempt had not timed out (no
            ``timed_out`` history entry for its token): the lease expired although the handler
            was within its budget and its worker alive.
        registered: the task name is known to this process's registry.
        timeout: the registered timeout, or None.
        lease: the lease its jobs get (the task's ``lease`` or ``LEASEQUEUE["LEASE"]``).
        manual_heartbeat: the task renews only when its handler calls ``ctx.heartbeat()``.
        recommended_timeout, recommended_lease: see :func:`recommend`; None without data.
        flags: :data:`FLAG_P99_OVER_TIMEOUT`, :data:`FLAG_LOST_WHILE_HEALTHY`, :data:`FLAG_UNREGISTERED`.
    """

    task: str
    done: int
    dead: int
    p50: float | None
    p95: float | None
    p99: float | None
    max: float | None
    lease_expired: int
    fence_rejected: int
    lost_while_healthy: int
    registered: bool
    timeout: float | None
    lease: float
    manual_heartbeat: bool
    recommended_timeout: float | None
    recommended_lease: float | None
    flags: tuple[str, ...] = ()

    @property
    def recommended_renewal_interval(self) -> float | None:
        """Heartbeat interval that goes with :attr:`recommended_lease`: a third of it (the worker's rule)."""
        return None if self.recommended_lease is None else self.recommended_lease / 3

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {**asdict(self), "flags": list(self.flags),
                "recommended_renewal_interval": self.recommended_renewal_interval}


def recommend(*, p99: float | None, max_runtime: float | None, lease: float, manual_heartbeat: bool,
              lost_while_healthy: int) -> tuple[float | None, float]:
    """The lease-advice rule: a timeout and a lease for one task, from its runtime distribution.

    * **timeout** = ``ceil(max(2 * p99, 1.25 * max, 1))`` seconds. Past its timeout an attempt
      fails as ``JobTimedOut``, so the timeout must sit above the normal tail with room to spare:
      twice the p99 absorbs a tail that doubles under load, and 1.25 times the slowest successful
      run keeps every run seen in the window alive. None without runtimes.
    * **lease**: with automatic renewal (every lease / 3) the lease does not have to cover the
      runtime; it bounds how long a crashed worker's job waits before it runs again, so keep it.
      Exceptions:

      - the task lost leases while healthy (``lost_while_healthy`` > 0): renewals every lease / 3
        did not survive the worker's stalls (GC pauses, CPU starvation, slow database), so
        double it: ``2 * lease``;
      - manual heartbeats: nothing renews between the handler's own calls, so the lease must cover
        a whole run in the worst case: ``max(lease, ceil(1.5 * p99))``.

    Args:
        p99, max_runtime: seconds, or None without data.
        lease: the task's current lease in seconds.
        manual_heartbeat: the task renews only when its handler asks.
        lost_while_healthy: count of healthy lease losses in the window.

    Returns:
        ``(recommended timeout or None, recommended lease)`` in seconds.
    """
    timeout = None
    if p99 is not None and max_runtime is not None:
        timeout = float(math.ceil(max(2 * p99, 1.25 * max_runtime, 1.0) - 1e-9))
    recommended_lease = float(lease)
    if lost_while_healthy > 0:
        recommended_lease = 2 * float(lease)
    if manual_heartbeat and p99 is not None:
        recommended_lease = max(recommended_lease, float(math.ceil(1.5 * p99 - 1e-9)))
    return timeout, recommended_lease


def lease_report(now: datetime | None = None, *, window: float = 86400, tasks: Sequence[str] | None = None,
                 settings: Settings | None = None, alias: str | None = None) -> list[TaskLeaseStats]:
    """Runtime distribution, lease losses and advice per task over the last ``window`` seconds.

    Flags a task whose p99 runtime exceeds its registered timeout (its normal runs are being cut
    off and retried) and a task that lost leases while healthy (see :func:`recommend` for the
    recommended timeout and lease, and :class:`TaskLeaseStats` for each figure).

    Args:
        now: aware datetime; None reads the database clock.
        window: seconds of history (by ``finished_at``; leases and rejections by their own time).
        tasks: restrict to these task names.
        settings: for the default lease; default the validated ``LEASEQUEUE`` setting.
        alias: database alias; default the job table's.

    Returns:
        One :class:`TaskLeaseStats` per task with jobs finished in the window, by name.

    Raises:
        ValueError: ``window`` not > 0 or a naive ``now``.
        django.db.DatabaseError: the database cannot be read.
    """
    from . import registry

    if window <= 0:
        raise ValueError("window must be > 0 seconds")
    if now is not None and (now.tzinfo is None or now.utcoffset() is None):
        raise ValueError("lease_report(now=...) needs an aware datetime")
    settings = settings or get_settings()
    registry.autodiscover()
    params = {"now": now, "window": float(window), "tasks": list(tasks) if tasks is not None else None}
    rows = read.lease_report_rows(params, alias=alias or _alias())
    report = []
    for task_name, done, dead, pcts, max_secs, expired, rejected, healthy in rows:
        try:
            spec = registry.get_task(task_name)
            registered = True
        except Exception:  # UnknownTask, or a resolver that cannot import it
            spec, registered = None, False
        timeout = getattr(spec, "timeout", None)
        lease = float(getattr(spec, "lease", None) or settings.lease)
        manual = bool(getattr(spec, "manual_heartbeat", False))
        p50, p95, p99 = (float(x) for x in pcts) if pcts else (None, None, None)
        max_runtime = float(max_secs) if max_secs is not None else None
        rec_timeout, rec_lease = recommend(p99=p99, max_runtime=max_runtime, lease=lease,
                                           manual_heartbeat=manual, lost_while_healthy=healthy)
        flags = []
        if timeout is not None and p99 is not None and p99 > timeout:
            flags.append(FLAG_P99_OVER_TIMEOUT)
        if healthy:
            flags.append(FLAG_LOST_WHILE_HEALTHY)
        if not registered:
            flags.append(FLAG_UNREGISTERED)
        report.append(TaskLeaseStats(
            task=task_name, done=done, dead=dead, p50=p50, p95=p95, p99=p99, max=max_runtime,
            lease_expired=expired, fence_rejected=rejected, lost_while_healthy=healthy, registered=registered,
            timeout=float(timeout) if timeout is not None else None, lease=lease, manual_heartbeat=manual,
            recommended_timeout=rec_timeout, recommended_lease=rec_lease if p99 is not None or healthy else None,
            flags=tuple(flags),
        ))
    return report


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
