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


class LedgerEntry(models.Model):
    """One handler execution of the chaos suite's execution ledger (``qa.ledger``): a row per
    handler start, completed with the time it returned or raised.

    It is written on a connection of its own in autocommit (never inside the job's transaction),
    so a rolled-back or fenced-out job transaction does not erase it. Times are the database's
    ``clock_timestamp()``; when the database could not be reached at that moment (an outage) the
    worker's wall clock is stored instead and ``*_clock`` says "local" (the server runs on the same
    machine, so both clocks agree there, except in the clock-skew run, which has no outage)."""

    key = models.UUIDField(unique=True)
    job_id = models.BigIntegerField(db_index=True)
    lease_version = models.BigIntegerField()
    attempt = models.PositiveIntegerField()
    task = models.CharField(max_length=100)
    worker = models.CharField(max_length=255)
    pid = models.IntegerField()
    concurrency_key = models.CharField(max_length=255, blank=True, default="")
    started_at = models.DateTimeField()
    started_clock = models.CharField(max_length=5, default="db")
    returned_at = models.DateTimeField(null=True)
    returned_clock = models.CharField(max_length=5, blank=True, default="")
    outcome = models.CharField(max_length=10, blank=True, default="",
                               help_text="'returned', 'raised', 'timed_out' or ''")

    def __str__(self) -> str:
        return f"job {self.job_id} token {self.lease_version} by {self.worker}: {self.outcome or 'running'}"
