"""Tables of django-leasequeue: jobs, schedules, queue state and the process registry.

Models here are data only. Every statement that claims, leases or moves a job between states lives
in :mod:`django_leasequeue.store`; the admin and monitoring read through these models and call the
store for writes. Indexes are few and partial: ``leased_until`` is in no
index, so heartbeat renewals can be HOT updates.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from decimal import Decimal
from typing import Any, Protocol

from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.db import models
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
    without this decoder, reading that row through the ORM (the admin's job page,
    ``refresh_from_db()``) would raise. The worker does not run such a job: its claim dead-letters it as ``CorruptRow``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("parse_int", _parse_int)
        super().__init__(*args, **kwargs)


class JobStatus(models.TextChoices):
    """The six states of a job. "Scheduled" is not a state: it is ``ready`` with a future ``run_at``."""

    READY = "ready", "ready"
    # A workflow step or dependent job whose dependencies are not all settled: never claimable, not
    # in the claim indexes, not "ready" to monitoring. Completing its last dependency releases it
    # (the database trigger leasequeue_job_settled, in the same transaction as that completion).
    WAITING = "waiting", "waiting"
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

# The chart counters live in their own module; they are re-exported here, where Django (and the
# rest of the package) finds the models.
from .stat_models import STAT_BOUNDS as STAT_BOUNDS  # noqa: E402
from .stat_models import STAT_SPANS as STAT_SPANS  # noqa: E402
from .stat_models import HistogramField as HistogramField  # noqa: E402
from .stat_models import JobStat as JobStat  # noqa: E402
from .stat_models import zero_histogram as zero_histogram  # noqa: E402

# The chart counters live in their own module (re-exported here, where Django finds the models).


class DependencyPolicy(models.TextChoices):
    """What a waiting job does when one of its dependencies ends ``dead`` (or ``cancelled``)."""

    HOLD = "hold", "hold: wait until the dependency is replayed"
    CANCEL = "cancel", "cancel this job (and its dependents that cancel too)"
    RUN = "run", "run anyway, with the failure passed in"


class WorkflowRole(models.TextChoices):
    """A job's part in its workflow: a member step, or one of the workflow's callbacks."""

    MEMBER = "member", "member"
    ON_SUCCESS = "on_success", "on_success callback"
    ON_COMPLETE = "on_complete", "on_complete callback"


class Job(models.Model):
    """One unit of durable work: a registered task name, JSON arguments and a due time."""

    id = models.BigAutoField(primary_key=True)
    task = models.CharField(max_length=255)
    queue = models.CharField(max_length=100, default="default")
    priority = models.SmallIntegerField(default=0, help_text="-100..100, higher runs first")
    # The database defaults (db_default) of status, attempts, leased_by, lease_version, unique_scope,
    # cancel_requested, snoozes, errors and history are the values of a new job: the one-job enqueue
    # INSERT lists only the columns that job sets (store/enqueue.py), a shorter statement to parse.
    status = models.CharField(max_length=10, choices=JobStatus.choices, default=JobStatus.READY,
                              db_default=JobStatus.READY)
    args = models.JSONField(decoder=JobJSONDecoder, default=list, blank=True)
    kwargs = models.JSONField(decoder=JobJSONDecoder, default=dict, blank=True)
    run_at = models.DateTimeField(help_text="due when run_at <= the database clock")
    attempts = models.PositiveIntegerField(default=0, db_default=0, help_text="claims so far (a claim is an attempt)")
    max_attempts = models.PositiveIntegerField(default=5)
    lease_seconds = models.FloatField(null=True, blank=True, help_text="lease length; null: worker default")
    leased_until = models.DateTimeField(null=True, blank=True)
    leased_by = models.CharField(max_length=255, blank=True, default="", db_default="")
    lease_version = models.BigIntegerField(default=0, db_default=0, help_text="fencing token, +1 on every claim")
    unique_key = models.CharField(max_length=255, null=True, blank=True)
    unique_scope = models.CharField(
        max_length=10, choices=UniqueScope.choices, default=UniqueScope.RETAINED, db_default=UniqueScope.RETAINED
    )
    concurrency_key = models.CharField(max_length=255, null=True, blank=True)
    concurrency_limit = models.PositiveIntegerField(null=True, blank=True)
    cancel_requested = models.BooleanField(default=False, db_default=False)
    snoozes = models.PositiveIntegerField(default=0, db_default=0)
    # Graceful stops that cut this job's handler short and refunded its attempt (bounded by
    # MAX_INTERRUPTIONS). A database default: the enqueue statements do not list the column.
    interruptions = models.PositiveIntegerField(
        default=0, db_default=0, help_text="attempts refunded because a graceful stop interrupted the handler")
    schedule = models.ForeignKey(
        "Schedule", null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs", db_index=False
    )
    occurrence_at = models.DateTimeField(null=True, blank=True)
    errors = models.JSONField(decoder=JobJSONDecoder, default=list, db_default=[], blank=True)
    history = models.JSONField(decoder=JobJSONDecoder, default=list, db_default=[], blank=True,
                               help_text="operator events: replay, edit, cancel")
    result = models.JSONField(decoder=JobJSONDecoder, null=True, blank=True)
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True, help_text="first claim")
    attempted_at = models.DateTimeField(null=True, blank=True, help_text="latest claim")
    finished_at = models.DateTimeField(null=True, blank=True)
    # Sequences: jobs of one sequence_key run one at a time in id (enqueue) order. sequence_halts is
    # the task's sequence_on_dead policy ("halt": True) copied into the row, so the claim can read
    # it; a dead job with it set holds its sequence until an operator replays or skips it.
    sequence_key = models.CharField(max_length=255, null=True, blank=True,
                                    help_text="jobs with the same key run one at a time, in enqueue order")
    sequence_halts = models.BooleanField(default=False, db_default=False,
                                         help_text="when dead, hold the sequence until replayed or skipped")
    # Per-key rate limit (task option rate_key/rate_limit): at most rate_limit_n claims of jobs
    # with this key in any window of rate_limit_secs seconds. Null for jobs without a key.
    rate_key = models.CharField(max_length=255, null=True, blank=True)
    rate_limit_n = models.PositiveIntegerField(null=True, blank=True)
    rate_limit_secs = models.FloatField(null=True, blank=True)
    # Fair claiming (queue option "fair"): the claim serves these keys round-robin.
    fair_key = models.CharField(max_length=255, null=True, blank=True)
    # Workflows (docs/howto/workflows.md). A job in a workflow or batch names it, its step name and
    # its role; waiting_on counts its dependency edges (Dependency rows) not yet settled, and the
    # job stays "waiting" until it is 0. has_dependents marks a job some other job depends on, so
    # that the settle trigger runs only for jobs that matter to a workflow. No database foreign
    # keys: pruning deletes finished rows with plain statements.
    workflow = models.ForeignKey(
        "Workflow", null=True, blank=True, on_delete=models.DO_NOTHING, related_name="jobs",
        db_constraint=False, db_index=False)
    workflow_step = models.CharField(max_length=255, null=True, blank=True, help_text="step name in its workflow")
    workflow_role = models.CharField(max_length=12, null=True, blank=True, choices=WorkflowRole.choices)
    waiting_on = models.PositiveIntegerField(
        default=0, db_default=0, help_text="dependencies not settled yet (waiting until 0)")
    has_dependents = models.BooleanField(default=False, db_default=False)
    pass_result = models.BooleanField(
        default=False, db_default=False,
        help_text="on release, the dependencies' results are prepended to args")
    on_dependency_dead = models.CharField(
        max_length=6, choices=DependencyPolicy.choices, default=DependencyPolicy.HOLD,
        db_default=DependencyPolicy.HOLD, help_text="when a dependency is dead: hold, cancel or run")
    # The W3C trace context (``traceparent``, ``tracestate``) of the enqueue's "send" span, written
    # in the INSERT when OpenTelemetry is configured (django_leasequeue.tracing); NULL otherwise.
    # Every attempt's "process" span links to it, so a retry keeps pointing at the same producer.
    trace_context = models.JSONField(
        null=True, blank=True, editable=False, help_text="W3C trace context of the enqueue (OpenTelemetry)")

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
            # Retention pruning, dead-letter lists and "done/dead in the last N minutes". The id
            # makes every entry's position unique, so that the pruner can start each batch right
            # after the row where the previous one stopped, even inside a run of rows finished at
            # the same instant (store.JOB_PRUNE; migration 0017).
            models.Index(
                fields=["status", "finished_at", "id"], name="leasequeue_job_finished",
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
            # The sequence check of the claim: "is an earlier job of this sequence still pending or
            # halting?" is a range probe on (sequence_key, id) below the candidate's id.
            models.Index(
                fields=["sequence_key", "id"], name="leasequeue_job_seq_order",
                condition=Q(sequence_key__isnull=False, status__in=["ready", "leased", "dead"]),
            ),
            # The fair claim's skip scan over the distinct fair keys of a queue's ready jobs, and
            # its probe for each key's first jobs (keyless jobs are the NULL group of the index).
            models.Index(
                "queue", "fair_key", models.F("priority").desc(), "run_at", "id",
                name="leasequeue_job_fair", condition=Q(status="ready"),
            ),
            # A workflow's members in order (its page, its results, its counts).
            models.Index(fields=["workflow", "id"], name="leasequeue_job_workflow",
                         condition=Q(workflow__isnull=False)),
            # Monitoring: the waiting jobs per queue (dependencies not finished). Only those rows,
            # so the health snapshot counts them without reading the retained finished rows.
            models.Index(fields=["queue"], name="leasequeue_job_waiting", condition=Q(status="waiting")),
            # The dead letters per queue (the dashboard's and a queue page's dead count, the queue
            # filter of Dead letters): an index-only count, where the finished index (status,
            # finished_at) had to visit every dead row's heap page to read its queue.
            models.Index(fields=["queue", "finished_at"], name="leasequeue_job_dead", condition=Q(status="dead")),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["unique_key"], name="leasequeue_job_unique_retained",
                condition=Q(unique_key__isnull=False, unique_scope="retained"),
            ),
            models.UniqueConstraint(
                fields=["unique_key"], name="leasequeue_job_unique_active",
                condition=Q(unique_key__isnull=False, unique_scope="active", status__in=["ready", "waiting", "leased"]),
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


class HaltedSequence(Job):
    """Proxy of :class:`Job` restricted to the dead jobs that halt their sequence (``sequence_key``
    set, ``sequence_halts`` true), for the admin's "Halted sequences" page."""

    class Meta:
        proxy = True
        verbose_name = "halted sequence"
        verbose_name_plural = "halted sequences"


class WorkflowKind(models.TextChoices):
    """How a workflow was built (the admin shows it; the rules are the same for every kind)."""

    CHAIN = "chain", "chain"
    GROUP = "group", "group"
    CHORD = "chord", "chord"
    BATCH = "batch", "batch"
    GRAPH = "graph", "dependency graph"


class Workflow(models.Model):
    """A chain, group, chord, batch or dependency graph of jobs, with its progress counters.

    The ``members_*`` counters are kept by the database trigger ``leasequeue_job_settled`` in the
    transaction that moves a member into or out of a finished state, so they are exact at every
    commit. When the workflow is closed (``closed_at`` set; a batch is open until ``close()``) and
    no member is pending, its callbacks are released: ``on_complete`` always, ``on_success`` when
    every member is done (else the workflow's ``on_dependency_dead`` policy decides). Because the
    release is a state change of the callback row (``waiting`` to ``ready``) under the workflow
    row's lock, it happens exactly once, whoever finishes last.
    """

    id = models.BigAutoField(primary_key=True)
    kind = models.CharField(max_length=10, choices=WorkflowKind.choices)
    name = models.CharField(max_length=255, blank=True, default="")
    unique_key = models.CharField(max_length=255, null=True, blank=True,
                                  help_text="building a workflow with a taken key returns the existing one")
    on_dependency_dead = models.CharField(
        max_length=6, choices=DependencyPolicy.choices, default=DependencyPolicy.HOLD,
        help_text="default policy of its steps and of its on_success callback")
    created_at = models.DateTimeField()
    closed_at = models.DateTimeField(null=True, blank=True, help_text="null: an open batch (members may be added)")
    progressed_at = models.DateTimeField(help_text="last member settled, added or replayed")
    finished_at = models.DateTimeField(null=True, blank=True,
                                       help_text="closed, no member pending, no callback pending")
    members = models.PositiveIntegerField(default=0)
    members_pending = models.PositiveIntegerField(default=0, help_text="waiting, ready or leased")
    members_done = models.PositiveIntegerField(default=0)
    members_dead = models.PositiveIntegerField(default=0)
    members_cancelled = models.PositiveIntegerField(default=0)
    on_success = models.ForeignKey(Job, null=True, blank=True, on_delete=models.DO_NOTHING, related_name="+",
                                   db_constraint=False, db_index=False)
    on_complete = models.ForeignKey(Job, null=True, blank=True, on_delete=models.DO_NOTHING, related_name="+",
                                    db_constraint=False, db_index=False)

    class Meta:
        db_table = "leasequeue_workflow"
        ordering = ["-id"]
        indexes = [
            # Monitoring: the unfinished workflows, oldest progress first.
            models.Index(fields=["progressed_at"], name="leasequeue_workflow_active",
                         condition=Q(finished_at__isnull=True)),
        ]
        constraints = [
            models.UniqueConstraint(fields=["unique_key"], name="leasequeue_workflow_unique",
                                    condition=Q(unique_key__isnull=False)),
        ]

    def __str__(self) -> str:
        label = f" {self.name}" if self.name else ""
        return f"{self.kind} #{self.id}{label}"


class Dependency(models.Model):
    """An edge of a dependency graph: ``job`` waits for ``depends_on``.

    ``name`` is the dependency's step name (its job id as text when it is not a step of the same
    workflow): the key under which its result is passed to ``job``. ``resolved`` becomes true, once,
    when the edge stops holding ``job`` back (the dependency is done, or dead and ``job`` runs
    anyway); ``job.waiting_on`` counts the unresolved edges.
    """

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(Job, on_delete=models.DO_NOTHING, related_name="dependency_edges",
                            db_constraint=False)
    depends_on = models.ForeignKey(Job, on_delete=models.DO_NOTHING, related_name="dependent_edges",
                                   db_constraint=False, db_index=False)
    name = models.CharField(max_length=255)
    resolved = models.BooleanField(default=False)

    class Meta:
        db_table = "leasequeue_dependency"
        constraints = [
            models.UniqueConstraint(fields=["job", "depends_on"], name="leasequeue_dependency_edge"),
        ]
        indexes = [
            models.Index(fields=["depends_on"], name="leasequeue_dependency_from"),
        ]

    def __str__(self) -> str:
        return f"#{self.job_id} waits for #{self.depends_on_id} ({self.name})"


# The scheduler's bookkeeping of a schedule: written by the scheduler's own statements (and by
# Schedule.save() only when recomputing it under the row lock), never from a copy of the row.
SCHEDULE_BOOKKEEPING = ("last_occurrence_at", "next_occurrence_at", "skipped_occurrences", "paused_skipped",
                        "paused_coalesced", "paused_log")

PAUSED_LOG_SIZE = 20
"""Entries kept in ``Schedule.paused_log`` (the newest ones)."""


class Schedule(models.Model):
    """A recurring job: one job per cron occurrence, evaluated in ``timezone``.

    Validation (``full_clean()``, hence the admin form and the settings sync, and every ``save()``)
    refuses an invalid cron expression, an unknown time zone, an unregistered task (for an enabled
    schedule), arguments that do not round-trip through JSON, a priority outside -100..100, a queue
    that ``LEASEQUEUE["QUEUES"]`` does not allow and a ``catch_up_limit`` below 1; each message
    names the offending value. The checks run in :meth:`clean_fields`, Django's per-field hook, so
    a ModelForm that leaves a field out does not get errors for it; they are the schedules
    service's (:func:`django_leasequeue.schedules.definition_errors`).

    ``save()`` keeps ``next_occurrence_at`` right for the scheduler (see docs/howto/schedules.md): a
    new schedule starts with the first occurrence after its creation; a changed cron expression or
    time zone, or a re-enabled schedule, gets the first occurrence after the save under the new
    definition (no back-fill, no burst, never an occurrence already emitted); a disabled one has
    none. Saving an existing schedule writes only its definition fields, under the row lock: the
    scheduler's bookkeeping (last occurrence, next occurrence, skipped count) is never written back
    from a copy, so a form loaded before, or saved during, a scheduler tick cannot rewind it. Times
    are database time. The planning is the schedules service's
    (:func:`django_leasequeue.schedules.save`), which the app config installs.
    """

    class CatchUp(models.TextChoices):
        LATEST = "latest", "latest missed occurrence only"
        ALL = "all", "every missed occurrence (capped)"
        NONE = "none", "skip missed occurrences"

    class WhenPaused(models.TextChoices):
        LATEST = "latest", "keep one pending job: the latest occurrence"
        SKIP = "skip", "skip occurrences while paused"
        ALL = "all", "keep every occurrence's job"

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
    # What an occurrence due while the target queue is paused becomes (docs/howto/schedules.md).
    # db_default: the statements that insert schedule rows (the settings sync) need not list them.
    when_paused = models.CharField(
        max_length=10, choices=WhenPaused.choices, default=WhenPaused.LATEST, db_default=WhenPaused.LATEST,
        help_text="while the target queue is paused: latest (one pending job), skip, or all")
    paused_skipped = models.PositiveBigIntegerField(
        default=0, db_default=0, help_text="occurrences not emitted because the queue was paused (when_paused=skip)")
    paused_coalesced = models.PositiveBigIntegerField(
        default=0, db_default=0,
        help_text="occurrences superseded by a later one while the queue was paused (when_paused=latest)")
    paused_log = models.JSONField(
        default=list, db_default=[], blank=True,
        help_text="the newest skipped or coalesced occurrences: [{occurrence, action, queue, job, kept, at}, ...]")
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

        The planning and the locked, definition-only write are the schedules service's
        (:func:`django_leasequeue.schedules.save`): a new schedule is inserted with the first
        occurrence after its creation; an existing one is updated under its row lock, writing only
        the definition fields (never the scheduler's bookkeeping, :data:`SCHEDULE_BOOKKEEPING`), and
        its ``next_occurrence_at`` is recomputed when the cron expression or time zone changes or
        the schedule is re-enabled, and cleared when it is disabled. The instance's bookkeeping
        attributes are refreshed from the locked row.

        Args:
            **kwargs: as :meth:`django.db.models.Model.save` (``using``, ``update_fields``...).

        Raises:
            ValidationError: the schedule is invalid (nothing is written).
            ImproperlyConfigured: the app registry is not ready (no schedules service installed).
        """
        self.full_clean(validate_unique=False, validate_constraints=False)
        _schedule_service().save(self, super().save, **kwargs)

    @property
    def zone_name(self) -> str:
        """The IANA zone the cron expression is read in: ``timezone``, or ``settings.TIME_ZONE`` if blank."""
        return schedule_zone_name(self.timezone)

    def clean_fields(self, exclude: Iterable[str] | None = None) -> None:
        """Django's field validation plus the schedule's own checks (see the class docstring and
        :func:`django_leasequeue.schedules.definition_errors`).

        Raises:
            ValidationError: keyed by field, each message naming the offending value.
            ImproperlyConfigured: the app registry is not ready (no schedules service installed).
        """
        service = _schedule_service()
        errors: dict[str, Any] = {}
        exclude = set(exclude or ())
        # Arguments first: our message names the offending value, Django's says "Value must be valid JSON".
        others = {f.name for f in self._meta.fields} - {"args", "kwargs"}
        for field, message in service.definition_errors(self, exclude | others):
            errors.setdefault(field, []).append(ValidationError(message, code="invalid_schedule"))
        try:
            super().clean_fields(exclude=exclude | set(errors))
        except ValidationError as exc:
            errors = exc.update_error_dict(errors)
        for field, message in service.definition_errors(self, exclude | set(errors) | {"args", "kwargs"}):
            errors.setdefault(field, []).append(ValidationError(message, code="invalid_schedule"))
        if errors:
            raise ValidationError(errors)


def schedule_zone_name(timezone: str) -> str:
    """The IANA zone a schedule with this ``timezone`` field is read in.

    Args:
        timezone: the field's value; blank means the project's zone.

    Returns:
        ``timezone``, else ``settings.TIME_ZONE``, else ``"UTC"``.
    """
    from django.conf import settings

    return timezone or settings.TIME_ZONE or "UTC"


class ScheduleService(Protocol):
    """What :class:`Schedule` asks of the schedules service (:mod:`django_leasequeue.schedules`).

    The model imports no service: the app config's ``ready()`` installs the service with
    :func:`install_schedule_service`, so the imports flow one way (service -> model).
    """

    def definition_errors(self, schedule: Schedule, skip: set[str]) -> Iterator[tuple[str, str]]:
        """``(field, message)`` for each problem of the definition, skipping the fields in ``skip``."""
        ...

    def save(self, schedule: Schedule, write: Callable[..., None], **kwargs: Any) -> None:
        """Plan the next occurrence and write the schedule through ``write`` (``Model.save``)."""
        ...


_service: ScheduleService | None = None


def install_schedule_service(service: ScheduleService) -> None:
    """Install the service that validates and saves schedules (called by the app config's ``ready()``).

    Args:
        service: an object (or module) with ``definition_errors`` and ``save`` as in
            :class:`ScheduleService`.
    """
    global _service
    _service = service


def _schedule_service() -> ScheduleService:
    if _service is None:
        raise ImproperlyConfigured(
            "django_leasequeue's schedules service is not installed: add 'django_leasequeue' to "
            "INSTALLED_APPS and call django.setup() before validating or saving a Schedule")
    return _service


class QueueState(models.Model):
    """Operator state of a queue: paused or not, and rate-limit bookkeeping.

    Rows are created on first use (pause, or the first claim from a rate-limited queue). The
    rate-limit log (``rate_log``) is written only by ``store.job_claim`` while
    it holds this row's lock; see docs/howto/flow-control.md.
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
    fair_cursor = models.CharField(
        max_length=255, null=True, blank=True,
        help_text="fair queues: the fair key the latest claim served last (the next claim starts after it)")

    class Meta:
        db_table = "leasequeue_queue"

    def __str__(self) -> str:
        return f"{self.name}{' (paused)' if self.paused else ''}"


class RateKeyState(models.Model):
    """The sliding log of one rate key (task option ``rate_key``): the claims of its jobs inside
    the window, written only by the claim (``leasequeue_rate_admit()``) while it holds the key's
    advisory lock. Rows past ``expires_at`` are pruned by the reaper."""

    key = models.CharField(max_length=255, primary_key=True)
    log = models.JSONField(default=list, blank=True,
                           help_text="[[claim time as epoch seconds (database clock), jobs admitted], ...]")
    expires_at = models.DateTimeField(help_text="when the latest logged claim leaves the window")

    class Meta:
        db_table = "leasequeue_rate_key"

    def __str__(self) -> str:
        return self.key


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
    # Whether this process runs the reaper's sweep: runreaper, and every worker started without
    # --no-reaper. Monitoring counts the processes that reap from it (leasequeue_reapers_alive):
    # counting kind="reaper" rows reads 0 while the workers do the reaping.
    reaps = models.BooleanField(default=False, db_default=False)

    class Meta:
        db_table = "leasequeue_process"
        ordering = ["kind", "id"]
        verbose_name = "worker process"
        verbose_name_plural = "worker processes"

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
    ``leasequeue_now()``). The sweep times are written only by the reaper's statement
    (``store.JOB_REAP``): a silence longer than twice the reaper interval means no process could
    reach the database (an outage or restart hits every worker at once), so for one lease period
    after it the reaper leaves expired leases to their holders, who renew or complete them
    (docs/explanation/leases.md). A scheduler's tick (``store.PROCESS_HEARTBEAT``) writes only
    ``scheduler_tick_at``, and the retention pruner (``store.JOB_PRUNE_SAVE``) only its place, the
    ``prune_*`` fields; when either creates the row, before any sweep, ``last_sweep_at`` is the
    epoch (``store.NEVER_SWEPT``), which means "never swept"."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    last_sweep_at = models.DateTimeField()
    resumed_at = models.DateTimeField(null=True, blank=True)
    # The last tick of any scheduler (database time), written by the scheduler's tick: it outlives
    # the scheduler's process row, which is pruned once the scheduler stops, so monitoring can still
    # say how long ago the last tick was.
    scheduler_tick_at = models.DateTimeField(null=True, blank=True)
    # The retention pruner's place (store.job_prune): its current pass over the finished rows began
    # at prune_pass_started_at (statement clock), and its next batch walks the finished index from
    # (prune_from_finished_at, prune_from_id), the first row the last batch deleted: every finished
    # row before it has been deleted or passed over. Here rather than in the pruning process, so
    # that a pruner elected after another one was killed, or a runreaper --once started by cron,
    # continues where the last one stopped. NULL: from the oldest finished row.
    prune_pass_started_at = models.DateTimeField(null=True, blank=True)
    prune_from_finished_at = models.DateTimeField(null=True, blank=True)
    prune_from_id = models.BigIntegerField(null=True, blank=True)
    # The same for the move of done jobs into the time-partitioned history (store.history_maintain,
    # LEASEQUEUE["HISTORY"]): its pass began at history_pass_started_at, and its next batch walks
    # from (history_from_finished_at, history_from_id), the first row the last batch moved.
    history_pass_started_at = models.DateTimeField(null=True, blank=True)
    history_from_finished_at = models.DateTimeField(null=True, blank=True)
    history_from_id = models.BigIntegerField(null=True, blank=True)

    class Meta:
        db_table = "leasequeue_reaper_sweep"

    def __str__(self) -> str:
        return f"last sweep {self.last_sweep_at}, resumed {self.resumed_at}"
