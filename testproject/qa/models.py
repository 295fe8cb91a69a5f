"""Rows written by the test tasks in ``qa.tasks``: what ran, which effects committed, what a
stale worker observed. None of them has a unique constraint on purpose: a duplicate execution or
effect must show up as a second row, not be hidden by an IntegrityError."""

from django.db import models


class Execution(models.Model):
    """One handler execution (written outside any fence, so every run is counted)."""

    job_id = models.BigIntegerField(db_index=True)
    lease_version = models.BigIntegerField()
    attempt = models.PositiveIntegerField()
    worker = models.CharField(max_length=255)
    tag = models.CharField(max_length=100, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.attempt} by {self.worker}"


class Effect(models.Model):
    """A business effect committed inside ``fenced_atomic()`` (at most one per job if fencing works)."""

    key = models.CharField(max_length=100)
    job_id = models.BigIntegerField()
    lease_version = models.BigIntegerField()

    def __str__(self) -> str:
        return f"{self.key} by job {self.job_id} token {self.lease_version}"


class Probe(models.Model):
    """What a handler observed about its lease: ``kind`` is "heartbeat" or "fenced"; ``ok`` False
    means the write was refused (0 rows / LeaseLost)."""

    job_id = models.BigIntegerField()
    lease_version = models.BigIntegerField()
    kind = models.CharField(max_length=20)
    ok = models.BooleanField()

    def __str__(self) -> str:
        return f"job {self.job_id} token {self.lease_version} {self.kind}={self.ok}"
