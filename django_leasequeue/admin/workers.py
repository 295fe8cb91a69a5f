"""The workers page (``admin/django_leasequeue/workerprocess/``): every registered process and the
jobs each one is running now.

For each process: kind, host, pid, queues, concurrency, uptime and the age of its last heartbeat,
alive or stale by monitoring's own rule (:func:`django_leasequeue.health.process_infos`, judged by
the database clock). For each holder, its leased jobs (at most :data:`JOBS_SHOWN`, then a link to
the rest in the job list) with the attempt, the lease expiry (relative and absolute), how long
the attempt has run, and two marks: a handler past its task's timeout (the ``timed_out`` history
entry of the current fencing token, the rule of ``store.read.PROCESSES``), and a lease already
expired, with a "Release now" button for an operator who knows the holder is gone. Jobs held by a
process whose registry row was pruned are listed under their holder's id.

The page is three statements in one read-only snapshot (:func:`store.read.workers_page_rows`),
however many processes and jobs there are. Its ages, lease expiries and counts refresh in place
from ``workerprocess/live/`` (the same three statements; :mod:`.live`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeAlias

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.defaultfilters import pluralize
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, URLPattern, path, reverse
from django.utils import timezone
from django.utils.dateformat import format as date_format
from django.utils.http import urlencode

from .. import health
from ..conf import get_settings
from ..models import WorkerProcess
from ..store import read
from .common import APP, duration
from .live import live_response

if TYPE_CHECKING:
    _WorkerAdminBase: TypeAlias = admin.ModelAdmin[WorkerProcess]
else:
    _WorkerAdminBase = admin.ModelAdmin

#: Running jobs shown per process; the rest are counted and linked to the job list.
JOBS_SHOWN = 200


def relative(seconds: float) -> str:
    """A signed number of seconds from now in words: ``"in 4 min"``, ``"12 s ago"``, ``"now"``.

    Args:
        seconds: positive for the future, negative for the past.

    Returns:
        The words, rounded as :func:`~django_leasequeue.admin.common.duration` rounds.
    """
    if round(seconds) == 0:
        return "now"
    return f"in {duration(seconds)}" if seconds > 0 else f"{duration(-seconds)} ago"


@dataclass
class RunningJob:
    """One leased job as the workers page shows it (times in seconds, database clock).

    Attributes:
        id, task, queue, attempts, max_attempts: the job's own.
        leased_until: its lease's expiry (aware datetime).
        lease_left: seconds until the lease expires (negative: expired that long ago).
        running_for: seconds since the current attempt was claimed (None: no claim time).
        timed_out: its handler is past its task's timeout and still running.
        url: the job's admin page.
        release_url: the "Release now" action, or None when the lease has not expired or the
            release view is not installed.
    """

    id: int
    task: str
    queue: str
    attempts: int
    max_attempts: int
    leased_until: datetime | None
    lease_left: float
    running_for: float | None
    timed_out: bool
    url: str
    release_url: str | None = None

    @property
    def expired(self) -> bool:
        """The lease has passed by the database clock."""
        return self.lease_left < 0

    @property
    def lease_words(self) -> str:
        """``"in 12 s"`` or ``"lease expired 5 s ago"``."""
        return f"lease expired {duration(-self.lease_left)} ago" if self.expired else relative(self.lease_left)

    @property
    def running_words(self) -> str:
        """How long the current attempt has run, in words."""
        return duration(self.running_for)


@dataclass
class ProcessRow:
    """One process on the page: its :class:`~django_leasequeue.health.WorkerInfo` (None for a holder
    that is no longer registered), its running jobs and how many more it holds."""

    holder: str
    info: health.WorkerInfo | None
    uptime: float | None
    jobs: list[RunningJob] = field(default_factory=list)
    total: int = 0
    more_url: str = ""

    @property
    def uptime_words(self) -> str:
        """Time since the process started, in words."""
        return duration(self.uptime)

    @property
    def heartbeat_words(self) -> str:
        """Age of the last heartbeat, in words (``"3 s ago"``)."""
        return relative(-self.info.heartbeat_age_seconds) if self.info is not None else "—"

    @property
    def state_words(self) -> str:
        """``"alive"``, or ``"stopped heartbeating 40 s ago"``; ``""`` for a holder not registered."""
        if self.info is None:
            return ""
        return "alive" if self.info.alive else f"stopped heartbeating {self.heartbeat_words}"

    @property
    def more(self) -> int:
        """Leased jobs held but not shown."""
        return self.total - len(self.jobs)

    @property
    def expired(self) -> int:
        """Shown jobs whose lease has expired."""
        return sum(1 for j in self.jobs if j.expired)


def _release_url(job_id: int) -> str | None:
    # The release view belongs to the job admin; until it exists the page shows no button.
    try:
        return reverse(f"admin:{APP}_job_release", args=[job_id])
    except NoReverseMatch:
        return None


def workers_page(now: datetime | None = None, *, can_release: bool = False,
                 limit: int = JOBS_SHOWN) -> tuple[datetime, list[ProcessRow]]:
    """Read the workers page's rows (three statements in one snapshot, whatever the sizes).

    Args:
        now: aware datetime to judge by; None reads the database clock.
        can_release: give expired leases a release URL (the viewer may release jobs).
        limit: running jobs shown per process.

    Returns:
        ``(the clock reading, one ProcessRow per registered process in registry order, then one
        per holder that is not registered, by id)``.

    Raises:
        django.db.DatabaseError: the database cannot be read.
    """
    clock_now, process_rows, job_rows = read.workers_page_rows(limit=limit, now=now)
    infos = health.process_infos(process_rows, clock_now, float(get_settings().process_alive_within))
    rows = {i.id: ProcessRow(holder=i.id, info=i, uptime=(clock_now - i.started_at).total_seconds()) for i in infos}
    job_page = reverse(f"admin:{APP}_job_change", args=[0]).replace("/0/", "/{}/")
    orphans: dict[str, ProcessRow] = {}
    for holder, job_id, task, queue, attempts, max_attempts, until, attempted_at, total, timed_out in job_rows:
        row = rows.get(holder) or orphans.setdefault(holder, ProcessRow(holder=holder, info=None, uptime=None))
        row.total = total
        left = (until - clock_now).total_seconds() if until is not None else 0.0
        job = RunningJob(id=job_id, task=task, queue=queue, attempts=attempts, max_attempts=max_attempts,
                         leased_until=until, lease_left=left, timed_out=bool(timed_out),
                         running_for=(clock_now - attempted_at).total_seconds() if attempted_at else None,
                         url=job_page.format(job_id))
        if job.expired and can_release:
            job.release_url = _release_url(job_id)
        row.jobs.append(job)
    job_list = reverse(f"admin:{APP}_job_changelist")
    for row in [*rows.values(), *orphans.values()]:
        row.more_url = f"{job_list}?{urlencode({'status': 'leased', 'leased_by': row.holder})}"
    return clock_now, [*rows.values(), *(orphans[k] for k in sorted(orphans))]


def _summary(now: datetime, rows: list[ProcessRow]) -> dict[str, str]:
    """The page's headline figures in words, as the page and its live endpoint show them."""
    alive = sum(1 for r in rows if r.info is not None and r.info.alive)
    stale = sum(1 for r in rows if r.info is not None and not r.info.alive)
    expired = sum(r.expired for r in rows)
    stuck = sum(1 for r in rows for j in r.jobs if j.timed_out)
    return {
        "now": date_format(timezone.localtime(now), "Y-m-d H:i:s T"),
        "alive": f"{alive} process{pluralize(alive, 'es')} alive",
        "stale": f"{stale} stopped heartbeating" if stale else "",
        "expired": f"{expired} expired lease{pluralize(expired)}" if expired else "",
        "stuck": f"{stuck} handler{pluralize(stuck)} past {pluralize(stuck, 'its,their')} timeout" if stuck else "",
    }


def workers_values(now: datetime, rows: list[ProcessRow]) -> dict[str, str]:
    """The workers page's live figures, keyed as the page marks them (``data-live``).

    Args:
        now: the clock reading of the rows (aware datetime).
        rows: :func:`workers_page`'s rows.

    Returns:
        ``{"summary:<name>": text, "p:<holder>:<figure>": text, "j:<job id>:<figure>": text}``.
    """
    values = {f"summary:{k}": v for k, v in _summary(now, rows).items()}
    for row in rows:
        if row.info is not None:
            values[f"p:{row.holder}:heartbeat"] = row.heartbeat_words
            values[f"p:{row.holder}:uptime"] = row.uptime_words
            values[f"p:{row.holder}:state"] = row.state_words
        for job in row.jobs:
            values[f"j:{job.id}:lease"] = job.lease_words
            values[f"j:{job.id}:running"] = job.running_words
    return values


@admin.register(WorkerProcess)
class WorkerProcessAdmin(_WorkerAdminBase):
    """The workers page: ``admin/django_leasequeue/workerprocess/``. Read only; visible to users who
    may view jobs or worker processes. The "Release now" buttons need ``change_job``."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: WorkerProcess | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: WorkerProcess | None = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: WorkerProcess | None = None) -> bool:
        user = request.user
        return user.has_perm(f"{APP}.view_workerprocess") or user.has_perm(f"{APP}.view_job")

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def get_urls(self) -> list[URLPattern]:
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        wrap = self.admin_site.admin_view
        return [path("", wrap(self.changelist_view), name=f"{prefix}_changelist"),
                path("live/", wrap(self.live_view), name=f"{prefix}_live")]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        now, rows = workers_page(can_release=request.user.has_perm(f"{APP}.change_job"))
        job_list = reverse(f"admin:{APP}_job_changelist")
        stale = [r for r in rows if r.info is not None and not r.info.alive]
        context = {
            **self.admin_site.each_context(request),
            "title": "Worker processes",
            "opts": self.opts,
            "now": now,
            "rows": rows,
            "stale": stale,
            "summary": _summary(now, rows),
            "alive_within": get_settings().process_alive_within,
            "jobs_shown": JOBS_SHOWN,
            "dashboard_url": reverse(f"admin:{APP}_dashboard_changelist"),
            "job_list_url": job_list,
            "live_url": reverse(f"admin:{APP}_workerprocess_live"),
            "live_at": now,
        }
        context.update(extra_context or {})
        return TemplateResponse(request, "admin/django_leasequeue/workerprocess/change_list.html", context)

    def live_view(self, request: HttpRequest) -> HttpResponse:
        """GET: the page's figures as JSON (:func:`~.live.live_response`, keys of
        :func:`workers_values`), for ``live.js``. The page's permission (403 otherwise) and its
        three statements."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        now, rows = workers_page()
        return live_response(request, workers_values(now, rows), at=now)
