"""Tables of django-leasequeue: jobs, schedules, queue state and the process registry.

Models here are data only. Every statement that claims, leases or moves a job between states lives
in :mod:`django_leasequeue.store`; the admin and monitoring read through these models and call the
store for writes. Indexes are few and partial: ``leased_until`` is in no
index, so heartbeat renewals can be HOT updates.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.core.exceptions import ValidationError
from django.db import models, router, transaction
from django.db.models import Q


def _parse_int(text: str) -> int | Decimal:
    try:
        return int(text)
    except ValueError:
        return Decimal(text)


class JobJSONDecoder(json.JSONDecoder):
    """Decodes the job table's JSON columns like :class:`json.JSONDecoder`, except that an integer
    of more than ``sys.get_int_max_str_digits()`` (4300) digits becomes a :class:`~decimal.Decimal`
    of the same value instead of raising ValueError.

    Enqueue refuses such integers, but a row written by hand or by an older version may hold one;
    without this, reading that row through the ORM (the admin's job page, ``refresh_from_db()``)
    raised. The worker does not run such a job: its claim dead-letters it as ``CorruptRow``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("parse_int", _parse_int)
        super().__init__(*args, **kwargs)


class JobStatus(models.TextChoices):
    """The five states of a job. "Scheduled" is not a state: it is ``ready`` with a future ``run_at``."""

    READY = "ready", "ready"
    LEASED = "leased", "leased"
    DONE = "done", "done"
    DEAD = "dead", "dead"
    CANCELLED = "cancelled", "cancelled"


class UniqueScope(models.TextChoices):
    """How long a job's ``unique_key`` stays taken.

    ``retained``: while the row exists (an idempotent enqueue; a resubmission is a no-op even after
    the job finished). ``active``: while the job is ``ready`` or ``leased``.
    """

    RETAINED = "retained", "retained"
    ACTIVE = "active", "active"


FINISHED_STATUSES = (JobStatus.DONE, JobStatus.DEAD, JobStatus.CANCELLED)


class Job(models.Model):
    """One unit of durable work: a registered task name, JSON arguments and a due time."""

    id = models.BigAutoField(primary_key=True)
    task = models.CharField(max_length=255)
    queue = models.CharField(max_length=100, default="default")
    priority = models.SmallIntegerField(default=0, help_text="-100..100, higher runs first")
    status = models.CharField(max_length=10, choices=JobStatus.choices, default=JobStatus.READY)
    args = models.JSONField(decoder=JobJSONDecoder, default=list, blank=True)
    kwargs = models.JSONField(decoder=JobJSONDecoder, default=dict, blank=True)
    run_at = models.DateTimeField(help_text="due when run_at <= the database clock")
    attempts = models.PositiveIntegerField(default=0, help_text="claims so far (a claim is an attempt)")
    max_attempts = models.PositiveIntegerField(default=5)
    lease_seconds = models.FloatField(null=True, blank=True, help_text="lease length; null: worker default")
    leased_until = models.DateTimeField(null=True, blank=True)
    leased_by = models.CharField(max_length=255, blank=True, default="")
    lease_version = models.BigIntegerField(default=0, help_text="fencing token, +1 on every claim")
    unique_key = models.CharField(max_length=255, null=True, blank=True)
    unique_scope = models.CharField(
        max_length=10, choices=UniqueScope.choices, default=UniqueScope.RETAINED
    )
    concurrency_key = models.CharField(max_length=255, null=True, blank=True)
    concurrency_limit = models.PositiveIntegerField(null=True, blank=True)
    cancel_requested = models.BooleanField(default=False)
    snoozes = models.PositiveIntegerField(default=0)
    # Graceful stops that cut this job's handler short and refunded its attempt (bounded by
    # MAX_INTERRUPTIONS). A database default: the enqueue statements do not list the column.
    interruptions = models.PositiveIntegerField(
        default=0, db_default=0, help_text="attempts refunded because a graceful stop interrupted the handler")
    schedule = models.ForeignKey(
        "Schedule", null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs", db_index=False
    )
    occurrence_at = models.DateTimeField(null=True, blank=True)
    errors = models.JSONField(decoder=JobJSONDecoder, default=list, blank=True)
    history = models.JSONField(decoder=JobJSONDecoder, default=list, blank=True,
                               help_text="operator events: replay, edit, cancel")
    result = models.JSONField(decoder=JobJSONDecoder, null=True, blank=True)
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True, help_text="first claim")
    attempted_at = models.DateTimeField(null=True, blank=True, help_text="latest claim")
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "leasequeue_job"
        ordering = ["-id"]
        permissions = [("replay_job", "Can replay dead or cancelled jobs")]
        indexes = [
            # The claim path: due ready work per queue in claim order.
            models.Index(
                "queue", models.F("priority").desc(), "run_at", "id",
                name="leasequeue_job_ready", condition=Q(status="ready"),
            ),
            # The reaper and heartbeat monitoring: the few leased rows. Not on leased_until (HOT).
            models.Index(fields=["id"], name="leasequeue_job_leased", condition=Q(status="leased")),
            # Retention pruning, dead-letter lists and "done/dead in the last N minutes".
            models.Index(
                fields=["status", "finished_at"], name="leasequeue_job_finished",
                condition=Q(status__in=["done", "dead", "cancelled"]),
            ),
            models.Index(
                fields=["schedule", "occurrence_at"], name="leasequeue_job_schedule",
                condition=Q(schedule__isnull=False),
            ),
            models.Index(
                fields=["concurrency_key"], name="leasequeue_job_conc_leased",
                condition=Q(status="leased", concurrency_key__isnull=False),
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["unique_key"], name="leasequeue_job_unique_retained",
                condition=Q(unique_key__isnull=False, unique_scope="retained"),
            ),
            models.UniqueConstraint(
                fields=["unique_key"], name="leasequeue_job_unique_active",
                condition=Q(unique_key__isnull=False, unique_scope="active", status__in=["ready", "leased"]),
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=-100, priority__lte=100), name="leasequeue_job_priority_range"
            ),
            models.CheckConstraint(
                condition=Q(status__in=[s.value for s in JobStatus]), name="leasequeue_job_status_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.id} {self.task} [{self.status}]"

    @property
    def last_error(self) -> dict[str, Any] | None:
        """The newest entry of :attr:`errors`, or None."""
        return self.errors[-1] if self.errors else None


class DeadLetter(Job):
    """Proxy of :class:`Job` restricted to dead jobs, for the admin's "Dead letters" page."""

    class Meta:
        proxy = True
        verbose_name = "dead letter"
        verbose_name_plural = "dead letters"


# The scheduler's bookkeeping of a schedule: written by the scheduler's own statements (and by
# Schedule.save() only when recomputing it under the row lock), never from a copy of the row.
SCHEDULE_BOOKKEEPING = ("last_occurrence_at", "next_occurrence_at", "skipped_occurrences")


class Schedule(models.Model):
    """A recurring job: one job per cron occurrence, evaluated in ``timezone``.

    Validation (``full_clean()``, hence the admin form and the settings sync, and every ``save()``)
    refuses an invalid cron expression, an unknown time zone, an unregistered task (for an enabled
    schedule), arguments that do not round-trip through JSON, a priority outside -100..100, a queue
    that ``LEASEQUEUE["QUEUES"]`` does not allow and a ``catch_up_limit`` below 1; each message
    names the offending value. The checks live in :meth:`clean_fields`, Django's per-field hook, so
    a ModelForm that leaves a field out does not get errors for it.

    ``save()`` keeps ``next_occurrence_at`` right for the scheduler (see docs/schedules.md): a new
    schedule starts with the first occurrence after its creation; a changed cron expression or time
    zone, or a re-enabled schedule, gets the first occurrence after the save under the new
    definition (no back-fill, no burst, never an occurrence already emitted); a disabled one has
    none. Saving an existing schedule writes only its definition fields, under the row lock: the
    scheduler's bookkeeping (last occurrence, next occurrence, skipped count) is never written back
    from a copy, so a form loaded before, or saved during, a scheduler tick cannot rewind it. Times
    are database time (``store.db_now()``).
    """

    class CatchUp(models.TextChoices):
        LATEST = "latest", "latest missed occurrence only"
        ALL = "all", "every missed occurrence (capped)"
        NONE = "none", "skip missed occurrences"

    name = models.CharField(max_length=200, unique=True)
    task = models.CharField(max_length=255)
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    cron = models.CharField(max_length=200)
    timezone = models.CharField(max_length=64, blank=True, default="")
    queue = models.CharField(max_length=100, blank=True, default="")
    priority = models.SmallIntegerField(default=0)
    enabled = models.BooleanField(default=True)
    catch_up = models.CharField(max_length=10, choices=CatchUp.choices, default=CatchUp.LATEST)
    catch_up_limit = models.PositiveIntegerField(default=10)
    last_occurrence_at = models.DateTimeField(null=True, blank=True)
    next_occurrence_at = models.DateTimeField(null=True, blank=True)
    skipped_occurrences = models.PositiveBigIntegerField(default=0)
    source = models.CharField(max_length=10, default="admin", help_text="'settings' or 'admin'")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "leasequeue_schedule"
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.cron})"

    def save(self, **kwargs: Any) -> None:
        """Validate (``full_clean``), keep ``next_occurrence_at`` right, then save.

        A new schedule is inserted with the first occurrence after its creation. An existing one
        is updated in one transaction that first locks its row (:func:`store.schedule_lock_for_save`): only the
        definition fields are written (``update_fields``, minus the scheduler's bookkeeping
        ``last_occurrence_at``, ``next_occurrence_at`` and ``skipped_occurrences``), so a copy read
        before a scheduler tick (an admin form) cannot put that bookkeeping back. When the save
        changes the cron expression or time zone, or re-enables the schedule, ``next_occurrence_at``
        is recomputed under the lock from database time, never at or before the last occurrence
        already emitted; disabling clears it. The instance's bookkeeping attributes are refreshed
        from the locked row.

        Args:
            **kwargs: as :meth:`django.db.models.Model.save` (``using``, ``update_fields``...).

        Raises:
            ValidationError: the schedule is invalid (nothing is written).
        """
        self.full_clean(validate_unique=False, validate_constraints=False)
        using = kwargs.get("using") or router.db_for_write(type(self), instance=self)
        if self._state.adding or self.pk is None or kwargs.get("force_insert"):
            self._plan_new_occurrence(using)
            super().save(**kwargs)
            return
        from . import store

        with transaction.atomic(using=using):
            old = store.schedule_lock_for_save(self.pk, alias=using)
            if old is None:  # deleted meanwhile: Django's save() inserts it again, as a new row
                self._plan_new_occurrence(using)
                super().save(**kwargs)
                return
            replan = self._replan_next_occurrence(old, using)
            update_fields = kwargs.get("update_fields")
            owned = ({f.name for f in self._meta.concrete_fields if not f.primary_key} if update_fields is None
                     else set(update_fields)) - set(SCHEDULE_BOOKKEEPING)
            if replan:
                owned.add("next_occurrence_at")
            else:
                self.next_occurrence_at = old["next_occurrence_at"]
            self.last_occurrence_at = old["last_occurrence_at"]
            self.skipped_occurrences = old["skipped_occurrences"]
            super().save(**{**kwargs, "update_fields": owned})

    @property
    def zone_name(self) -> str:
        """The IANA zone the cron expression is read in: ``timezone``, or ``settings.TIME_ZONE`` if blank."""
        return _zone_name(self.timezone)

    def clean_fields(self, exclude: Iterable[str] | None = None) -> None:
        """Django's field validation plus the schedule's own checks (see the class docstring).

        Raises:
            ValidationError: keyed by field, each message naming the offending value.
        """
        errors: dict[str, Any] = {}
        exclude = set(exclude or ())
        # Arguments first: our message names the offending value, Django's says "Value must be valid JSON".
        others = {f.name for f in self._meta.fields} - {"args", "kwargs"}
        for field, message in self._definition_errors(exclude | others):
            errors.setdefault(field, []).append(ValidationError(message, code="invalid_schedule"))
        try:
            super().clean_fields(exclude=exclude | set(errors))
        except ValidationError as exc:
            errors = exc.update_error_dict(errors)
        for field, message in self._definition_errors(exclude | set(errors) | {"args", "kwargs"}):
            errors.setdefault(field, []).append(ValidationError(message, code="invalid_schedule"))
        if errors:
            raise ValidationError(errors)

    def _definition_errors(self, skip: set[str]) -> Iterator[tuple[str, str]]:
        from . import arguments, cron, registry
        from .conf import get_settings
        from .exceptions import PayloadNotSerializable, UnknownTask

        if "cron" not in skip:
            try:
                cron.validate_cron(self.cron)
            except cron.InvalidCron as exc:
                yield "cron", str(exc)
        if "timezone" not in skip:
            try:
                cron.validate_timezone(self.zone_name)
            except cron.InvalidTimezone as exc:
                where = "" if self.timezone else " (blank timezone: the project's TIME_ZONE)"
                yield "timezone", f"{exc}{where}"
        if "task" not in skip and self.enabled:
            registry.autodiscover()
            try:
                registry.get_task(self.task)
            except UnknownTask:
                hint = registry.did_you_mean(self.task)
                hint = f"; {hint}" if hint else ""
                yield "task", (f"task {self.task!r} is not registered (no @task of that name in an app's "
                               f"tasks.py / jobs.py or in LEASEQUEUE['IMPORTS']){hint}")
        if "args" not in skip:
            if not isinstance(self.args, list):
                yield "args", f"args must be a JSON list of positional arguments, got {self.args!r}"
            else:
                try:
                    arguments.check_json(self.args, "args")
                except PayloadNotSerializable as exc:
                    yield "args", str(exc)
        if "kwargs" not in skip:
            if not isinstance(self.kwargs, dict):
                yield "kwargs", f"kwargs must be a JSON object of keyword arguments, got {self.kwargs!r}"
            else:
                try:
                    arguments.check_json(self.kwargs, "kwargs")
                except PayloadNotSerializable as exc:
                    yield "kwargs", str(exc)
        if "queue" not in skip and self.queue:
            settings = get_settings()
            if not settings.queue_allowed(self.queue):
                allowed = sorted(settings.queues or [])
                yield "queue", f"unknown queue {self.queue!r}; LEASEQUEUE['QUEUES'] allows {allowed}"
        if "priority" not in skip and isinstance(self.priority, int) and not -100 <= self.priority <= 100:
            yield "priority", f"priority must be from -100 to 100, got {self.priority!r}"
        if "catch_up_limit" not in skip and isinstance(self.catch_up_limit, int) and self.catch_up_limit < 1:
            yield "catch_up_limit", f"catch_up_limit must be >= 1, got {self.catch_up_limit!r}"

    def _plan_new_occurrence(self, using: str) -> None:
        """Set ``next_occurrence_at`` of a schedule about to be inserted (none if disabled; the first
        occurrence after now unless the caller gave the bookkeeping)."""
        from . import cron, store

        if not self.enabled:
            self.next_occurrence_at = None
        elif self.last_occurrence_at is None and self.next_occurrence_at is None:
            self.next_occurrence_at = cron.next_occurrence(self.cron, self.zone_name, store.db_now(using))

    def _replan_next_occurrence(self, old: dict[str, Any], using: str) -> bool:
        """Recompute ``next_occurrence_at`` if this save changes what it depends on.

        Args:
            old: the locked row's ``cron``, ``timezone``, ``enabled`` and bookkeeping fields.

        Returns:
            True when ``next_occurrence_at`` was recomputed (a new cron expression or time zone, or
            re-enabled: the first occurrence after database time and after the last one emitted)
            or cleared (disabled); False when the stored value stands.
        """
        from . import cron, store

        if not self.enabled:
            self.next_occurrence_at = None
            return old["next_occurrence_at"] is not None
        if old["cron"] == self.cron and _zone_name(old["timezone"]) == self.zone_name and old["enabled"]:
            return False
        # From the later of now and the last occurrence emitted: no back-fill, and never an
        # occurrence the scheduler already emitted (its job may have been pruned since).
        after = _latest(store.db_now(using), old["last_occurrence_at"])
        assert after is not None
        self.next_occurrence_at = cron.next_occurrence(self.cron, self.zone_name, after)
        return True


def _zone_name(timezone: str) -> str:
    from django.conf import settings

    return timezone or settings.TIME_ZONE or "UTC"


def _latest(a: datetime | None, b: datetime | None) -> datetime | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


class QueueState(models.Model):
    """Operator state of a queue: paused or not, and rate-limit bookkeeping.

    Rows are created on first use (pause, or the first claim from a rate-limited queue). The
    rate-limit log (``rate_log``) is written only by ``store.job_claim`` while
    it holds this row's lock; see docs/flow-control.md.
    """

    name = models.CharField(max_length=100, primary_key=True)
    paused = models.BooleanField(default=False)
    paused_at = models.DateTimeField(null=True, blank=True)
    paused_by = models.CharField(max_length=150, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)
    rate_log = models.JSONField(
        default=list, blank=True,
        help_text="[[claim time as epoch seconds (database clock), jobs claimed], ...] inside the rate window",
    )
    throttled_total = models.BigIntegerField(default=0, help_text="claims cut short by the queue's rate limit")

    class Meta:
        db_table = "leasequeue_queue"

    def __str__(self) -> str:
        return f"{self.name}{' (paused)' if self.paused else ''}"


class WorkerProcess(models.Model):
    """A registered worker, scheduler or reaper process, with its last heartbeat (database time)."""

    id = models.CharField(max_length=255, primary_key=True)
    kind = models.CharField(max_length=20, default="worker")
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    queues = models.JSONField(default=list, blank=True)
    concurrency = models.PositiveIntegerField(default=1)
    # The task names a worker can run, as it registered them (sorted). NULL: not recorded (a
    # scheduler or reaper, or a worker of a version before this column), read as "knows every
    # task", so such a worker never lets a job be dead-lettered as UnknownTask.
    tasks = models.JSONField(null=True, blank=True)
    started_at = models.DateTimeField()
    last_heartbeat_at = models.DateTimeField()
    last_tick_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "leasequeue_process"
        ordering = ["kind", "id"]

    def __str__(self) -> str:
        return f"{self.kind} {self.id}"


class Dashboard(QueueState):
    """Proxy of :class:`QueueState` that gives the admin's queue dashboard its index entry and URL
    (``admin/django_leasequeue/dashboard/``) and its own view permission. No table of its own."""

    class Meta:
        proxy = True
        verbose_name = "queue dashboard"
        verbose_name_plural = "queue dashboard"


class ReaperSweep(models.Model):
    """One row (id 1): when a reaper last swept, and when the database last came back after a
    silence, by the database's real clock (``clock_timestamp()``, not the adjustable
    ``leasequeue_now()``). Written only by the reaper's statement (``store.JOB_REAP``): a silence
    longer than twice the reaper interval means no process could reach the database (an outage or
    restart hits every worker at once), so for one lease period after it the reaper leaves expired
    leases to their holders, who renew or complete them (docs/explanation/leases.md)."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    last_sweep_at = models.DateTimeField()
    resumed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "leasequeue_reaper_sweep"

    def __str__(self) -> str:
        return f"last sweep {self.last_sweep_at}, resumed {self.resumed_at}"
