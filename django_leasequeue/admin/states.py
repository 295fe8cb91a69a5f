"""What the console calls a job's state, judged by the database clock: the stored status, refined
for the operator (a ready job is "ready", "scheduled", "retry wait" or "snoozed"; a leased job
whose lease ran out is "lease expired"), and the one way times are shown (to the second, in the
admin's time zone)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib import admin
from django.utils import timezone
from django.utils.dateformat import format as date_format

from ..models import Job
from .common import _parse_time, duration

#: How every time in the job pages is shown: to the second, in the admin's time zone.
TIME_FORMAT = "Y-m-d H:i:s T"

#: The states the console shows, in filter order; each is a stored status or a refinement of one.
STATES = ("ready", "scheduled", "retry wait", "snoozed", "waiting", "leased", "lease expired", "done", "dead",
          "cancelled")


@dataclass(frozen=True)
class JobState:
    """A job's state for the operator.

    Attributes:
        label (str): one of :data:`STATES` (``"leased, cancel requested"`` for a leased job asked to stop).
        css (str): the CSS class of its badge (``"lq-ready"``, ``"lq-expired"``, ...).
        detail (str): one line for the job's page (``"lease expired 42 s ago"``).
    """

    label: str
    css: str
    detail: str


def show_time(value: datetime | None) -> str:
    """A time to the second in the admin's current time zone (``"2026-12-02 19:04:05 UTC"``); ``"—"`` for None."""
    if value is None:
        return "—"
    return date_format(timezone.localtime(value), TIME_FORMAT)


def time_field(name: str, description: str) -> Callable[[Any, Any], str]:
    """A ModelAdmin display method for the datetime field ``name``, to the second (:func:`show_time`):
    Django's own display of a datetime follows ``DATETIME_FORMAT``, to the minute by default, and
    the console shows every time to the second (bug 9). Sorts by the field."""

    @admin.display(description=description, ordering=name)
    def show(self: Any, obj: Any) -> str:
        return show_time(getattr(obj, name, None))

    show.__name__ = f"{name}_display"
    return show


def snoozed(job: Job, last_error_at: datetime | None) -> bool:
    """A ready job whose last claim ended in a snooze (the snooze counter moved and no error was
    recorded after that claim; a snooze writes no error, a failed attempt always does)."""
    if not job.snoozes:
        return False
    if last_error_at is None or job.attempted_at is None:
        return True
    return last_error_at < job.attempted_at


def job_state(job: Job, now: datetime) -> JobState:
    """The operator's state of ``job`` at database time ``now``.

    Args:
        job: a job row; on the list its errors are deferred, and the ``last_error_at`` annotation
            (the last error's time, text) is read instead.
        now: the database clock (``store.db_now()``), never the web server's.

    Returns:
        :class:`JobState`.
    """
    status = job.status
    if status == "ready" and job.run_at and job.run_at > now:
        wait = duration((job.run_at - now).total_seconds())
        annotated: Any = getattr(job, "last_error_at", None)
        if "errors" in job.get_deferred_fields():
            last_at = _parse_time(annotated)
        else:
            last_at = _parse_time((job.errors[-1] or {}).get("at")) if job.errors else None
        if snoozed(job, last_at):
            return JobState("snoozed", "lq-snoozed", f"snoozed {job.snoozes} time{'s' if job.snoozes != 1 else ''}; "
                                                     f"due in {wait}")
        if job.attempts:
            return JobState("retry wait", "lq-retry", f"retry {job.attempts + 1} due in {wait}")
        return JobState("scheduled", "lq-scheduled", f"due in {wait}")
    if status == "ready":
        return JobState("ready", "lq-ready", f"due since {duration((now - job.run_at).total_seconds())}"
                        if job.run_at else "due")
    if status == "leased" and job.leased_until is not None and job.leased_until < now:
        ago = duration((now - job.leased_until).total_seconds())
        return JobState("lease expired", "lq-expired",
                        f"lease expired {ago} ago (held by {job.leased_by or 'unknown'}); "
                        "the reaper takes it back, or release it now")
    if status == "leased":
        label = "leased, cancel requested" if job.cancel_requested else "leased"
        left = duration((job.leased_until - now).total_seconds()) if job.leased_until else "?"
        return JobState(label, "lq-leased", f"held by {job.leased_by} for {left} more")
    return JobState(status, f"lq-{status}", "")
