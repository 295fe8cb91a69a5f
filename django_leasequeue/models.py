"""Tables of django-leasequeue: jobs, schedules, queue state and the process registry.

Models here are data only. Every statement that claims, leases or moves a job between states lives
in :mod:`django_leasequeue.store`; the admin and monitoring read through these models and call the
store for writes. Indexes are few and partial (DESIGN.md section 6): ``leased_until`` is in no
index, so heartbeat renewals can be HOT updates.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q


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
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
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
    schedule = models.ForeignKey(
        "Schedule", null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs", db_index=False
    )
    occurrence_at = models.DateTimeField(null=True, blank=True)
    errors = models.JSONField(default=list, blank=True)
    history = models.JSONField(default=list, blank=True, help_text="operator events: replay, edit, cancel")
    result = models.JSONField(null=True, blank=True)
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
    def last_error(self) -> dict | None:
        """The newest entry of :attr:`errors`, or None."""
        return self.errors[-1] if self.errors else None


class DeadLetter(Job):
    """Proxy of :class:`Job` restricted to dead jobs, for the admin's "Dead letters" page."""

    class Meta:
        proxy = True
        verbose_name = "dead letter"
        verbose_name_plural = "dead letters"


class Schedule(models.Model):
    """A recurring job: one job per cron occurrence, evaluated in ``timezone``."""

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
