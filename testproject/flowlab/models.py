"""Probe rows: what flow-control handlers observed, stamped with the database clock."""

from django.db import models


class Probe(models.Model):
    """One observation by a handler: ``event`` for the job ``job_id`` at database time ``at``."""

    key = models.CharField(max_length=100)
    event = models.CharField(max_length=30)
    job_id = models.BigIntegerField()
    attempt = models.PositiveIntegerField(default=0)
    at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["key", "event"], name="flowlab_probe_key_event")]

    def __str__(self) -> str:
        return f"{self.key} {self.event} #{self.job_id}"
