"""A schedule's run history on its admin page: its last occurrences, newest first, each with its
job, the job's state, attempts, run time and wait, merged with the occurrences its paused queue
cost it (``Schedule.paused_log``: skipped, or coalesced into a later one).

Occurrence jobs are read newest first through the partial index ``leasequeue_job_schedule``
(schedule, occurrence_at): one statement of at most :data:`HISTORY_SHOWN` rows, however many jobs
the schedule has emitted. Times are shown in the schedule's own zone, to the second.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, tzinfo
from zoneinfo import ZoneInfo

from django.urls import reverse
from django.utils.html import format_html, format_html_join

from ..models import Job, Schedule
from .common import APP, _parse_time, duration

#: Occurrences shown on a schedule's page.
HISTORY_SHOWN = 50

_HISTORY_FIELDS = ("id", "status", "attempts", "max_attempts", "occurrence_at", "run_at", "started_at",
                   "attempted_at", "finished_at", "queue")


@dataclass
class Occurrence:
    """One row of a schedule's history.

    Attributes:
        at: the occurrence (aware datetime).
        state: the job's status, or ``skipped`` / ``coalesced`` for an occurrence a paused queue cost.
        job_id, job_url: its job (for a coalesced occurrence the cancelled job), or None.
        attempts, max_attempts: the job's (None without a job).
        run_seconds: the latest attempt's run time: claim to finish, or to now while it runs.
        wait_seconds: from due (``run_at``) to the first claim, or to now while it waits.
        note: what the paused queue did (``"queue paused: coalesced into 10:05:00"``), or "".
    """

    at: datetime
    state: str
    job_id: int | None = None
    job_url: str | None = None
    attempts: int | None = None
    max_attempts: int | None = None
    run_seconds: float | None = None
    wait_seconds: float | None = None
    note: str = ""


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    return max((end - start).total_seconds(), 0.0) if start is not None and end is not None else None


def in_zone(moment: datetime | None, zone: tzinfo) -> str:
    """``moment`` in ``zone`` to the second with the zone's abbreviation (``"2026-03-29 03:30:00 CEST"``),
    or ``"—"`` for None."""
    return moment.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S %Z") if moment is not None else "—"


def in_zone_cell(moment: datetime | None, zone: tzinfo) -> str:
    """:func:`in_zone` as list-cell HTML: the date and the time with its zone in two unbreakable
    parts, so that a narrow column wraps between them instead of cutting the time off."""
    if moment is None:
        return "—"
    local = moment.astimezone(zone)
    return format_html('<span class="lq-nowrap">{}</span> <span class="lq-nowrap">{}</span>',
                       local.strftime("%Y-%m-%d"), local.strftime("%H:%M:%S %Z"))


def schedule_history(schedule: Schedule, now: datetime, *, limit: int = HISTORY_SHOWN) -> list[Occurrence]:
    """The last ``limit`` occurrences of ``schedule``, newest first (one statement).

    Args:
        schedule: the schedule (its ``paused_log`` is already loaded).
        now: the database clock reading, for jobs still waiting or running.
        limit: rows returned at most.

    Returns:
        Occurrences from its jobs and its paused log, by occurrence time, newest first; a coalesced
        job appears once, as coalesced.
    """
    page = reverse(f"admin:{APP}_job_change", args=[0]).replace("/0/", "/{}/")
    logged: dict[int, Occurrence] = {}
    found: list[Occurrence] = []
    for entry in schedule.paused_log or []:
        at = _parse_time(entry.get("occurrence"))
        if at is None:
            continue
        action = str(entry.get("action", ""))
        kept = _parse_time(entry.get("kept"))
        note = f"queue {entry.get('queue', '')} paused: " + (
            f"coalesced into {in_zone(kept, ZoneInfo(schedule.zone_name))}" if kept else action)
        row = Occurrence(at=at, state=action, note=note)
        job = entry.get("job")
        if isinstance(job, int):
            row.job_id, row.job_url = job, page.format(job)
            logged[job] = row
        found.append(row)
    jobs = (Job.objects.filter(schedule_id=schedule.pk, occurrence_at__isnull=False)
            .order_by("-occurrence_at").only(*_HISTORY_FIELDS)[:limit])
    for job in jobs:
        row = logged.get(job.pk) or Occurrence(at=job.occurrence_at or job.run_at, state=job.status,
                                                 job_id=job.pk, job_url=page.format(job.pk))
        row.attempts, row.max_attempts = job.attempts, job.max_attempts
        if job.attempted_at is not None:
            row.run_seconds = _seconds(job.attempted_at, job.finished_at or (now if job.status == "leased" else None))
        row.wait_seconds = _seconds(job.run_at, job.started_at or (now if job.status == "ready" else None))
        if job.pk not in logged:
            found.append(row)
    found.sort(key=lambda o: o.at, reverse=True)
    return found[:limit]


_ROW = ("<tr class='lq-occurrence lq-{}'><td>{}</td><td>{}</td><td>{}</td><td class='lq-num'>{}</td>"
        "<td class='lq-num'>{}</td><td class='lq-num'>{}</td><td>{}</td></tr>")


def history_html(schedule: Schedule, zone: tzinfo, now: datetime) -> str:
    """The history table of a schedule's page (:func:`schedule_history`), times in ``zone``, and the
    count of occurrences catch-up skipped (counted on the schedule, not logged one by one).

    Args:
        schedule: the schedule.
        zone: its zone (the project's when its own cannot be loaded).
        now: the database clock reading.

    Returns:
        Safe HTML.
    """
    rows = schedule_history(schedule, now)
    skipped = schedule.skipped_occurrences
    note = (format_html('<p class="help">Catch-up skipped {} missed occurrence{} in all (counted, not listed).</p>',
                        skipped, "s" if skipped != 1 else "") if skipped else "")
    if not rows:
        return format_html("<p>No occurrence yet.</p>{}", note)
    body = format_html_join("", _ROW, (
        (o.state, in_zone(o.at, zone),
         format_html('<a href="{}">#{}</a>', o.job_url, o.job_id) if o.job_url else "—",
         format_html('<span class="lq-status lq-{}">{}</span>', o.state, o.state),
         f"{o.attempts}/{o.max_attempts}" if o.attempts is not None else "—",
         duration(o.run_seconds), duration(o.wait_seconds), o.note) for o in rows))
    return format_html(
        "<div class='lq-scroll'><table class='lq-table lq-schedule-history'><thead><tr><th>occurrence ({})</th>"
        "<th>job</th><th>state</th><th class='lq-num'>attempts</th><th class='lq-num'>run time</th>"
        "<th class='lq-num'>wait</th><th></th></tr></thead><tbody>{}</tbody></table></div>{}",
        schedule.zone_name, body, note)
