"""The scheduler: turns each schedule's cron occurrences into jobs, exactly one job per occurrence.

One tick (:meth:`SchedulerService.tick`) reads the database clock once, then, in short
transactions, locks the enabled schedules that are due (``FOR UPDATE SKIP LOCKED``), plans each one
with :func:`django_leasequeue.cron.due` (DST policy and catch-up policy live there), inserts one job
per occurrence to emit and advances the schedule, all in the same transaction.

Why any number of schedulers may run at once: every emitted job carries the
unique key :func:`occurrence_key` = (schedule id, occurrence instant in UTC), inserted with ``ON
CONFLICT DO NOTHING`` under the ``retained`` scope, so a second insert of the same occurrence is a
no-op whatever the timing: no leader election, no lock is needed for correctness. The row lock only
saves redundant work (a scheduler skips a schedule another one is handling), and the advance is
monotonic, so a scheduler that read a stale row cannot move a schedule backwards. Losing such a race
is normal and logged at DEBUG at most (case C14). The occurrence is the computed cron instant, never
the time the scheduler noticed it, and the job's ``run_at`` is that instant.

Schedules come from the admin (or any ``Schedule.save()``) and from the ``LEASEQUEUE_SCHEDULES``
setting, which :func:`sync_schedules` writes into the table when a scheduler starts (and
``manage.py syncschedules``). Settings win for the schedules they declare; see docs/howto/schedules.md.

When an occurrence's target queue is paused, the schedule's ``when_paused`` policy decides what
it becomes: ``"latest"`` (the default) keeps at most one pending job, the latest occurrence's, and
cancels the older pending ones as coalesced (:func:`store.job_coalesce`); ``"skip"`` emits nothing;
``"all"`` emits every occurrence as if the queue ran. Each skipped or coalesced occurrence is
counted on the schedule and logged in its bounded ``paused_log`` (:func:`store.schedule_record_paused`).
The pause is read once per batch: a queue paused or resumed during a tick takes effect at the next.

Each scheduler process registers a ``WorkerProcess`` row of kind ``"scheduler"`` and stamps its
``last_tick_at`` on every tick, so monitoring can tell a stopped scheduler.

The shape (a cron table in the database, a unique (schedule, time) key on the emitted jobs, any
number of schedulers) follows Solid Queue's recurring tasks and Oban's cron plugin; the code is ours.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from . import cron, registry, store
from .conf import Settings, get_settings, unknown_keys_hint
from .enqueueing import build_job, insert_jobs
from .exceptions import ConfigurationError, UnknownTask
from .models import PAUSED_LOG_SIZE, Job, Schedule
from .processes import RegisteredService, make_process_id

logger = logging.getLogger("django_leasequeue.scheduler")

DEFAULT_INTERVAL = 1.0
"""Default maximum seconds between ticks. The scheduler also wakes at the earliest stored next
occurrence, so a schedule fires on time whatever the interval; the interval bounds how long a new or
edited schedule waits to be noticed, and how often ``last_tick_at`` is stamped."""

LOCK_BATCH = 500
"""Schedules locked (and their jobs inserted in one statement) per transaction."""

INSERT_BATCH = 5000
"""Jobs per INSERT statement."""

MIN_WAIT = 0.05
"""Shortest wait between ticks (seconds): a due schedule locked by another scheduler is left to it."""

SETTING = "LEASEQUEUE_SCHEDULES"
SETTINGS_KEYS = ("task", "cron", "timezone", "args", "kwargs", "queue", "priority", "enabled", "catch_up",
                 "catch_up_limit", "when_paused")


def occurrence_key(schedule_id: int, occurrence: datetime) -> str:
    """The unique key of the job emitted for one occurrence.

    Args:
        schedule_id: the schedule's primary key (stable across renames and settings re-syncs).
        occurrence: aware datetime of the occurrence (normalised to UTC, whole seconds).

    Returns:
        ``"leasequeue:schedule:<id>:<YYYY-MM-DDTHH:MM:SSZ>"``.

    Raises:
        ValueError: ``occurrence`` is naive.
    """
    if occurrence.tzinfo is None or occurrence.utcoffset() is None:
        raise ValueError(f"occurrence {occurrence!r} is naive; pass an aware datetime")
    utc = occurrence.astimezone(UTC)
    return f"leasequeue:schedule:{schedule_id}:{utc:%Y-%m-%dT%H:%M:%S}Z"


# ---------------------------------------------------------------------------------------------
# Settings sync
# ---------------------------------------------------------------------------------------------


def load_settings_schedules(raw: Mapping[str, Any] | None = None, *,
                            now: datetime | None = None) -> list[store.ScheduleDefinition]:
    """Validate ``LEASEQUEUE_SCHEDULES`` (or ``raw``) and return the definitions to sync.

    The setting maps a schedule name to a dict with ``task`` (registered task name, or a
    :class:`~django_leasequeue.registry.TaskSpec`) and ``cron`` (required), and optionally
    ``timezone`` (IANA name; default ``""``: the project's ``TIME_ZONE``), ``args`` (list),
    ``kwargs`` (dict), ``queue`` (default ``""``: the task's queue), ``priority`` (default: the
    task's), ``enabled`` (default True), ``catch_up`` (``"latest"``, ``"all"``, ``"none"``; default
    ``"latest"``), ``catch_up_limit`` (default 10) and ``when_paused`` (``"latest"``, ``"skip"``,
    ``"all"``; default ``"latest"``: what an occurrence due while the target queue is paused becomes).

    Args:
        raw: the setting's value; None reads ``settings.LEASEQUEUE_SCHEDULES`` (missing: ``{}``).
        now: aware datetime from which each definition's first occurrence is computed; None: none
            is computed (``next_at`` stays None; :func:`sync_schedules` passes the database clock).

    Returns:
        One :class:`store.ScheduleDefinition` per schedule, in the setting's order.

    Raises:
        ConfigurationError: listing every invalid entry by name with the offending value (unknown
            key with a did-you-mean, missing task or cron, invalid cron, unknown zone, unregistered
            task, non-JSON arguments, bad queue, priority, catch-up policy or limit, or
            ``when_paused`` policy).
    """
    if raw is None:
        from django.conf import settings

        raw = getattr(settings, SETTING, None) or {}
    if not isinstance(raw, Mapping):
        raise ConfigurationError(f"{SETTING} must be a dict of schedule name -> options, got {raw!r}")
    registry.autodiscover()
    problems: list[str] = []
    definitions: list[store.ScheduleDefinition] = []
    for name, options in raw.items():
        where = f"{SETTING}[{name!r}]"
        try:
            definitions.append(_definition(name, options, where, now))
        except ConfigurationError as exc:
            problems.append(str(exc))
    if problems:
        raise ConfigurationError(f"invalid {SETTING}:\n  " + "\n  ".join(problems))
    return definitions


def _definition(name: Any, options: Any, where: str, now: datetime | None) -> store.ScheduleDefinition:
    if not isinstance(name, str) or not name.strip():
        raise ConfigurationError(f"{where}: a schedule name must be a non-empty str")
    if not isinstance(options, Mapping):
        raise ConfigurationError(f"{where} must be a dict of options, got {options!r}")
    unknown = sorted(set(options) - set(SETTINGS_KEYS))
    if unknown:
        raise ConfigurationError(f"{where}: unknown option(s) {unknown_keys_hint(unknown, SETTINGS_KEYS)}; "
                                 f"allowed: {', '.join(SETTINGS_KEYS)}")
    missing = [key for key in ("task", "cron") if key not in options]
    if missing:
        raise ConfigurationError(f"{where}: missing required option(s) {', '.join(map(repr, missing))}")
    task = options["task"]
    if isinstance(task, registry.TaskSpec):
        task = task.name
    args = options.get("args", [])
    if isinstance(args, tuple):
        args = list(args)
    types = {"task": (task, str), "cron": (options["cron"], str), "timezone": (options.get("timezone", ""), str),
             "queue": (options.get("queue", ""), str), "enabled": (options.get("enabled", True), bool),
             "catch_up_limit": (options.get("catch_up_limit", cron.DEFAULT_CATCH_UP_LIMIT), int),
             "when_paused": (options.get("when_paused", Schedule.WhenPaused.LATEST), str)}
    if "priority" in options:
        types["priority"] = (options["priority"], int)
    for key, (value, kind) in types.items():
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ConfigurationError(f"{where}: {key} must be a {kind.__name__}, got {value!r}")
    when_paused = options.get("when_paused", Schedule.WhenPaused.LATEST)
    if when_paused not in Schedule.WhenPaused.values:
        raise ConfigurationError(f"{where}: when_paused must be one of "
                                 f"{', '.join(map(repr, Schedule.WhenPaused.values))}, got {when_paused!r}")
    priority = options.get("priority")
    if priority is None:  # default: the task's own priority, as for enqueue()
        try:
            task_spec = registry.get_task(task)
            priority = task_spec.priority if isinstance(task_spec, registry.TaskSpec) else 0
        except UnknownTask:
            priority = 0  # reported by full_clean below
    row = Schedule(name=name, task=task, cron=options["cron"], timezone=options.get("timezone", ""),
                   args=args, kwargs=options.get("kwargs", {}), queue=options.get("queue", ""),
                   priority=priority, enabled=options.get("enabled", True),
                   catch_up=options.get("catch_up", cron.DEFAULT_CATCH_UP),
                   catch_up_limit=options.get("catch_up_limit", cron.DEFAULT_CATCH_UP_LIMIT), source="settings",
                   when_paused=when_paused)
    try:
        row.full_clean(validate_unique=False, validate_constraints=False)
    except ValidationError as exc:
        details = "; ".join(f"{key}: {' '.join(msgs)}" for key, msgs in exc.message_dict.items())
        raise ConfigurationError(f"{where}: {details}") from None
    next_at = None
    if now is not None and row.enabled:
        next_at = cron.next_occurrence(row.cron, row.zone_name, now)
    return store.ScheduleDefinition(
        name=row.name, task=row.task, args_json=json.dumps(row.args), kwargs_json=json.dumps(row.kwargs),
        cron=row.cron, timezone=row.timezone, queue=row.queue, priority=row.priority, enabled=row.enabled,
        catch_up=row.catch_up, catch_up_limit=row.catch_up_limit, next_at=next_at, when_paused=row.when_paused,
    )


def sync_schedules(raw: Mapping[str, Any] | None = None, *, now: datetime | None = None,
                   alias: str | None = None) -> store.ScheduleSync:
    """Write ``LEASEQUEUE_SCHEDULES`` (or ``raw``) into the schedule table, in one transaction.

    Settings win for the schedules they declare: they are created or updated with
    ``source="settings"`` (an admin-created schedule of the same name is taken over, with a
    warning), keeping their last occurrence so nothing is emitted twice. A changed cron expression
    or zone takes effect from the next occurrence after ``now``. Settings-owned schedules no longer
    declared are disabled, not deleted. Admin-created schedules are never touched otherwise.
    Safe to run from several processes at once (an upsert by name).

    Args:
        raw: the setting's value; None reads ``settings.LEASEQUEUE_SCHEDULES``.
        now: aware datetime for the first occurrence of new or changed schedules; None: the
            database clock.
        alias: database alias; default the job table's.

    Returns:
        A :class:`store.ScheduleSync`.

    Raises:
        ConfigurationError: an invalid entry (see :func:`load_settings_schedules`); nothing is written.
    """
    alias = alias or store.db_alias()
    now = now or store.db_now(alias)
    definitions = load_settings_schedules(raw, now=now)
    with transaction.atomic(using=alias):
        result = store.schedule_sync_settings(definitions, now=now, alias=alias)
    for name in result.taken_over:
        logger.warning("schedule %r was created in the admin and is now owned by %s (settings win)", name, SETTING)
    if result.created or result.updated or result.disabled:
        logger.info("synced %s: created %s, updated %s, disabled %s", SETTING, result.created, result.updated,
                    result.disabled)
    return result


# ---------------------------------------------------------------------------------------------
# The tick
# ---------------------------------------------------------------------------------------------


@dataclass
class TickResult:
    """What one tick did.

    Attributes:
        now: the tick's time (aware; the database clock unless given).
        checked: schedules locked and planned by this scheduler.
        emitted: ``(schedule id, occurrence)`` of each job this tick inserted.
        duplicates: ``(schedule id, occurrence)`` whose job already existed (another scheduler won).
        skipped: due occurrences not emitted under the schedules' catch-up policies.
        paused_skipped: ``(schedule id, occurrence)`` not emitted because the target queue was
            paused (``when_paused="skip"``).
        coalesced: ``(schedule id, occurrence)`` superseded by a later occurrence while the target
            queue was paused (``when_paused="latest"``): never inserted, or its pending job cancelled.
        errors: schedule id -> error message, for schedules that could not be handled (left due).
        next_due: the earliest stored next occurrence of an enabled schedule after the tick (None:
            no enabled schedule), ignoring the failed ones.
    """

    now: datetime
    checked: int = 0
    emitted: list[tuple[int, datetime]] = field(default_factory=list)
    duplicates: list[tuple[int, datetime]] = field(default_factory=list)
    skipped: int = 0
    paused_skipped: list[tuple[int, datetime]] = field(default_factory=list)
    coalesced: list[tuple[int, datetime]] = field(default_factory=list)
    errors: dict[int, str] = field(default_factory=dict)
    next_due: datetime | None = None


def _unregistered(*args: Any, **kwargs: Any) -> None:  # pragma: no cover - never called
    raise UnknownTask("placeholder for a task this scheduler process does not know")


class SchedulerService(RegisteredService):
    """``manage.py runscheduler`` (and ``runworker --with-scheduler``): emit due occurrences.

    Args:
        interval: maximum seconds between ticks (default :data:`DEFAULT_INTERVAL`); the service
            also wakes at the earliest stored next occurrence.
        sync: write ``LEASEQUEUE_SCHEDULES`` into the table when the service starts.
        process_id: name of the ``WorkerProcess`` row (default ``host:pid:scheduler``).
        settings: validated ``LEASEQUEUE`` settings (default: the project's).

    Attributes:
        on_started (Callable[[], None] | None): called in the service thread once the settings are
            synced and the process is registered, before the first tick (``runscheduler`` prints
            the schedules it serves from it).

    Raises:
        ConfigurationError: ``interval`` is not > 0, or (with ``sync``) ``LEASEQUEUE_SCHEDULES`` is
            invalid: checked here, so a bad setting stops the process before it starts.
    """

    stops_first = True
    name = "scheduler"
    kind = "scheduler"

    def __init__(self, *, interval: float | None = None, sync: bool = True, process_id: str | None = None,
                 settings: Settings | None = None) -> None:
        super().__init__()
        self.interval = float(DEFAULT_INTERVAL if interval is None else interval)
        if not self.interval > 0:
            raise ConfigurationError(f"scheduler interval must be > 0 seconds, got {interval!r}")
        self.settings = settings or get_settings()
        self.sync = sync
        self.alias = store.db_alias()
        self.process_id = process_id or make_process_id("scheduler")
        self.ticks = 0
        self.emitted = 0
        self._reported: dict[tuple[int, str], str] = {}  # (schedule id, topic) -> message logged
        self.on_started: Callable[[], None] | None = None
        if sync:
            load_settings_schedules()  # validate now, without the database

    # -- service ----------------------------------------------------------------------------------
    def on_start(self) -> None:
        registry.autodiscover()
        if self.sync:
            sync_schedules(alias=self.alias)
        self.register()
        if self.on_started is not None:
            self.on_started()

    def run_once(self) -> float:
        started = time.monotonic()
        result = self.tick()
        self.beat(tick=True)
        self.ticks += 1
        return self._wait_after(result, time.monotonic() - started)

    def _wait_after(self, result: TickResult, elapsed: float) -> float:
        wait = self.interval
        if result.next_due is not None:
            # Wake just after the earliest next occurrence (measured on the tick's database clock).
            until = (result.next_due - result.now).total_seconds() - elapsed + 0.002
            wait = min(wait, until)
        return max(MIN_WAIT, wait)

    def on_stop(self) -> None:
        self.deregister()

    # -- one tick ---------------------------------------------------------------------------------
    def tick(self, now: datetime | None = None) -> TickResult:
        """Emit the due occurrences of every enabled schedule, once.

        Args:
            now: aware datetime to treat as the current time (tests drive DST and outages with
                it); None: the database clock, read once for the whole tick.

        Returns:
            A :class:`TickResult`. A schedule that cannot be planned (its task's queue is no longer
            allowed, a definition written past validation) is logged at ERROR once per distinct
            problem, left due and retried on the next tick; the others proceed.

        Raises:
            ValueError: ``now`` is naive. Database errors propagate (the service loop retries).
        """
        if now is not None and (now.tzinfo is None or now.utcoffset() is None):
            raise ValueError(f"now {now!r} is naive; pass an aware datetime")
        registry.autodiscover()
        now = now or store.db_now(self.alias)
        result = TickResult(now=now)
        handled: list[int] = []
        while True:
            # One short transaction per batch: lock, insert every job of the batch in one
            # statement, advance every schedule of the batch in one statement, commit.
            with transaction.atomic(using=self.alias):
                rows = store.schedule_lock_due(limit=LOCK_BATCH, exclude=handled, now=now, alias=self.alias)
                handled += [row.id for row in rows]
                self.fire(rows, now, result)
            if len(rows) < LOCK_BATCH:
                break
        pending, earliest = store.schedule_next_due(exclude=list(result.errors), alias=self.alias)
        result.next_due = now if pending else earliest
        return result

    def fire(self, rows: Sequence[store.ScheduleRow], now: datetime, result: TickResult | None = None) -> TickResult:
        """Plan schedules at ``now``, insert a job per occurrence to emit, advance the schedules.

        Run inside a transaction, normally holding the schedules' row locks
        (:func:`store.schedule_lock_due`); correctness does not depend on the locks: two calls with
        the same rows insert each occurrence once (unique key) and advance monotonically.

        Args:
            rows: the schedules as read (possibly stale).
            now: aware datetime, the tick's time.
            result: a :class:`TickResult` to add to (default: a new one).

        A schedule whose target queue is paused follows its ``when_paused`` policy (see the module
        docstring); the pause is read once, here.

        Returns:
            ``result``. A schedule whose plan fails is recorded in ``result.errors`` and skipped.
        """
        result = result if result is not None else TickResult(now=now)
        result.checked += len(rows)
        plans: list[tuple[store.ScheduleRow, cron.DuePlan]] = []
        jobs: list[store.NewJob] = []
        # Occurrences to insert per schedule (all of plan.emit unless its queue is paused), and
        # (policy, queue, occurrences held back) of the schedules whose queue is paused.
        kept: dict[int, list[datetime]] = {}
        held: dict[int, tuple[str, str, list[datetime]]] = {}
        paused: set[str] | None = None
        for row in rows:
            try:
                plan = cron.due(row.cron, row.timezone or _project_zone(), last=row.last_occurrence_at,
                                next_at=row.next_occurrence_at, now=now, catch_up=row.catch_up,
                                limit=row.catch_up_limit)
                new = [self._new_job(row, occurrence) for occurrence in plan.emit]
            except Exception as exc:  # noqa: BLE001 - one broken schedule must not stop the others
                message = f"{type(exc).__name__}: {exc}"
                result.errors[row.id] = message
                self._report(row.id, "error", logging.ERROR, "schedule %r (id %s) failed and stays due: %s",
                             row.name, row.id, message)
                continue
            self._reported.pop((row.id, "error"), None)
            plans.append((row, plan))
            kept[row.id] = list(plan.emit)
            if new and row.when_paused != Schedule.WhenPaused.ALL:
                if paused is None:
                    paused = set(store.queue_paused_names(alias=self.alias))
                queue = new[0].queue
                if queue in paused:
                    # skip: nothing; latest: only the newest occurrence of the plan.
                    cut = len(new) if row.when_paused == Schedule.WhenPaused.SKIP else len(new) - 1
                    held[row.id] = (row.when_paused, queue, list(plan.emit[:cut]))
                    kept[row.id], new = list(plan.emit[cut:]), new[cut:]
            jobs += new
        inserted: dict[tuple[int | None, datetime | None], Job] = {}
        job: Job | None
        # The enqueued event names the schedule and the occurrence as planned (in the plan's zone).
        names = {row.id: row.name for row, _ in plans}
        planned = {(new.schedule_id, new.occurrence_at): new.occurrence_at for new in jobs}

        def event_fields(job: Job) -> dict[str, Any]:
            occurrence = planned.get((job.schedule_id, job.occurrence_at)) or job.occurrence_at
            return {"schedule": names.get(job.schedule_id or 0),
                    "occurrence_at": occurrence.isoformat() if occurrence else None}

        for start in range(0, len(jobs), INSERT_BATCH):
            for job in insert_jobs(jobs[start:start + INSERT_BATCH], now=now, alias=self.alias,
                                   event_fields=event_fields, settings=self.settings):
                inserted[(job.schedule_id, job.occurrence_at)] = job
        advances = []
        for row, plan in plans:
            for occurrence in kept[row.id]:
                job = inserted.get((row.id, occurrence))
                if job is None:
                    # Another scheduler emitted it first (or this one, from a stale read): normal.
                    result.duplicates.append((row.id, occurrence))
                    logger.debug("schedule %r: occurrence %s was already emitted", row.name, occurrence.isoformat())
                    continue
                result.emitted.append((row.id, occurrence))
                self.emitted += 1
                logger.info("schedule %r: emitted occurrence %s as job %s", row.name, occurrence.isoformat(), job.id)
            if plan.skipped:
                result.skipped += plan.skipped
                logger.info("schedule %r: skipped %s%s missed occurrence(s) (catch_up=%r%s)", row.name,
                            plan.skipped, "+" if plan.skipped_is_lower_bound else "", row.catch_up,
                            f", limit {row.catch_up_limit}" if row.catch_up == "all" else "")
            advances.append(store.ScheduleAdvance(schedule_id=row.id, last=kept[row.id][-1] if kept[row.id] else None,
                                                  next_at=plan.next_at, skipped=plan.skipped, cron=row.cron,
                                                  timezone=row.timezone))
        advanced = store.schedule_advance(advances, alias=self.alias)
        if held:
            self._record_paused(plans, held, kept, inserted, now, result)
        for row, _ in plans:
            if row.id not in advanced:
                logger.debug("schedule %r was edited or disabled during the tick; its new definition applies",
                             row.name)
        return result

    def _record_paused(self, plans: Sequence[tuple[store.ScheduleRow, cron.DuePlan]],
                       held: Mapping[int, tuple[str, str, list[datetime]]], kept: Mapping[int, list[datetime]],
                       inserted: Mapping[tuple[int | None, datetime | None], Job], now: datetime,
                       result: TickResult) -> None:
        """Coalesce the pending jobs of the ``latest`` schedules whose queue is paused, and record
        every skipped or coalesced occurrence on its schedule (counters and ``paused_log``)."""
        names = {row.id: row.name for row, _ in plans}
        entries: dict[int, list[dict[str, Any]]] = {sid: [] for sid in held}
        counts: dict[int, list[int]] = {sid: [0, 0] for sid in held}  # [skipped, coalesced]
        at = now.astimezone(UTC).isoformat()

        def note(sid: int, occurrence: datetime, action: str, queue: str, job: int | None,
                 kept_at: datetime | None) -> None:
            entries[sid].append({"occurrence": occurrence.astimezone(UTC).isoformat(), "action": action,
                                 "queue": queue, "job": job,
                                 "kept": kept_at.astimezone(UTC).isoformat() if kept_at else None, "at": at})
            counts[sid][0 if action == "skipped" else 1] += 1
            (result.paused_skipped if action == "skipped" else result.coalesced).append((sid, occurrence))

        latest: list[tuple[int, str]] = []
        for sid, (policy, queue, occurrences) in held.items():
            if policy == Schedule.WhenPaused.SKIP:
                for occurrence in occurrences:
                    note(sid, occurrence, "skipped", queue, None, None)
                continue
            latest.append((sid, queue))
            newest = kept[sid][-1]
            # The plan's older occurrences were never inserted; they count only when this
            # scheduler inserted the newest one (else another scheduler did this work and counted).
            if (sid, newest) in inserted:
                for occurrence in occurrences:
                    note(sid, occurrence, "coalesced", queue, None, newest)
        for job in store.job_coalesce(latest, now=now, alias=self.alias):
            note(job.schedule_id, job.occurrence_at, "coalesced", job.queue, job.job_id, job.kept_at)
        records = [store.PausedRecord(schedule_id=sid, skipped=counts[sid][0], coalesced=counts[sid][1],
                                      entries=sorted(entries[sid], key=lambda e: e["occurrence"]))
                   for sid in held if entries[sid]]
        store.schedule_record_paused(records, keep=PAUSED_LOG_SIZE, alias=self.alias)
        for record in records:
            logger.info("schedule %r: queue %r is paused: skipped %s, coalesced %s occurrence(s) (when_paused=%r)",
                        names.get(record.schedule_id), held[record.schedule_id][1], record.skipped,
                        record.coalesced, held[record.schedule_id][0])

    def _new_job(self, row: store.ScheduleRow, occurrence: datetime) -> store.NewJob:
        try:
            task_spec = registry.get_task(row.task)
        except UnknownTask:
            task_spec = None
        if not isinstance(task_spec, registry.TaskSpec):
            if task_spec is None:
                # Emit anyway: the row is the contract between processes (a rolling deploy may give
                # the workers a task this scheduler does not know yet). A worker that does not know
                # it either dead-letters the job with the reason (an unknown task never runs): visible,
                # replayable.
                self._report(row.id, "task", logging.WARNING,
                             "schedule %r: task %r is not registered in this scheduler process; emitting its "
                             "jobs anyway (a worker that does not know it dead-letters them)", row.name, row.task)
            task_spec = registry.TaskSpec(func=_unregistered, name=row.task)
        return build_job(task_spec, row.args, row.kwargs, run_at=occurrence, queue=row.queue or None,
                         priority=row.priority, unique_key=occurrence_key(row.id, occurrence),
                         unique_scope="retained", check_signature=False, schedule_id=row.id,
                         occurrence_at=occurrence)

    def _report(self, schedule_id: int, topic: str, level: int, msg: str, *args: Any) -> None:
        """Log a schedule's problem at ``level`` once per distinct message, then at DEBUG."""
        text = msg % args
        if self._reported.get((schedule_id, topic)) == text:
            logger.debug(msg, *args)
            return
        self._reported[(schedule_id, topic)] = text
        logger.log(level, msg, *args)


def _project_zone() -> str:
    from django.conf import settings

    return settings.TIME_ZONE or "UTC"
