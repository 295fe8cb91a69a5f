"""The chart counters' model (:class:`JobStat`, table ``leasequeue_job_stat``) and its histogram
column: the outcome counts behind the console's charts, kept by migration 0015's trigger.
Re-exported by :mod:`django_leasequeue.models`."""

from __future__ import annotations

from typing import Any

from django.db import models

#: Upper bounds (seconds) of the wait-time and run-time histogram buckets of :class:`JobStat`;
#: migration 0015's trigger holds the same list (a test checks that they agree).
STAT_BOUNDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
#: The bucket spans of :class:`JobStat` (seconds): minute rows, then hour rows, then day rows.
STAT_SPANS = (60, 3600, 86400)


def zero_histogram() -> list[int]:
    """An empty wait or run histogram of :class:`JobStat`: one zero per bucket of ``STAT_BOUNDS``."""
    return [0] * (len(STAT_BOUNDS) + 1)


class HistogramField(models.Field):  # type: ignore[type-arg]
    """A ``bigint[]`` column of bucket counts (a list of ints in Python; psycopg adapts both ways).

    Django's ``ArrayField`` would do, but it requires ``django.contrib.postgres`` in
    ``INSTALLED_APPS``, a step every project would have to add for one column it never queries.
    """

    description = "bucket counts (bigint[])"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("default", zero_histogram)
        super().__init__(*args, **kwargs)

    def db_type(self, connection: Any) -> str:
        return "bigint[]"

    def deconstruct(self) -> Any:
        name, path, args, kwargs = super().deconstruct()
        if kwargs.get("default") is zero_histogram:
            del kwargs["default"]
        return name, path, args, kwargs


class JobStat(models.Model):
    """Counters of job outcomes per time bucket, queue and task: the console's charts read these,
    never the job table. Kept by a statement trigger on the job table (migration 0015), so every
    path that moves a job (claim, completion, ``fenced_atomic()``, failure, reap, cancel) counts.

    Each writing connection adds to its own row (``shard`` is its backend pid), so concurrent
    workers never wait on each other's counter rows; the reaper folds shards into shard 0, rolls
    minute rows into hour rows and hour rows into day rows, and deletes day rows past
    ``STATS_RETENTION``. Every event is in exactly one row at any time, so a sum over the rows of a
    window is exact whatever their spans.

    The histograms are lists of ``len(STAT_BOUNDS) + 1`` counts over ``STAT_BOUNDS`` (seconds):
    element ``i`` counts values below ``STAT_BOUNDS[i]`` and at least the bound before it; the last
    element counts values from the last bound up.
    """

    id = models.BigAutoField(primary_key=True)
    bucket = models.DateTimeField(help_text="start of the bucket (database time, UTC)")
    span = models.PositiveIntegerField(help_text="bucket length in seconds: 60, 3600 or 86400")
    queue = models.CharField(max_length=100)
    task = models.CharField(max_length=255)
    shard = models.IntegerField(default=0, help_text="the writer's backend pid; 0 once folded by the reaper")
    started = models.BigIntegerField(default=0, help_text="claims (attempts started)")
    done = models.BigIntegerField(default=0)
    failed = models.BigIntegerField(default=0, help_text="failed attempts that will be retried")
    dead = models.BigIntegerField(default=0, help_text="jobs dead-lettered")
    cancelled = models.BigIntegerField(default=0)
    wait_sum = models.FloatField(default=0.0, help_text="seconds from due to claim, summed over claims")
    wait_hist = HistogramField()
    run_sum = models.FloatField(default=0.0, help_text="seconds from claim to done, summed over done jobs")
    run_hist = HistogramField()

    class Meta:
        db_table = "leasequeue_job_stat"
        constraints = [
            models.UniqueConstraint(fields=["span", "bucket", "queue", "task", "shard"],
                                    name="leasequeue_job_stat_key"),
        ]

    def __str__(self) -> str:
        return f"{self.queue} {self.task} {self.bucket} +{self.span}s"
