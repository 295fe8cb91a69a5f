"""The queue dashboard (``admin/django_leasequeue/dashboard/``): per-queue counts, workers and the
scheduler tick read through :func:`django_leasequeue.health.snapshot`, the throughput chart and
the latency table read from the outcome counters (:mod:`django_leasequeue.health.charts`), the page
of each queue (:mod:`.queues`) and pause/resume (a pause is confirmed first when asked for with a
GET, as the queue page does; each pause and resume writes an admin log entry on the queue)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.defaultfilters import pluralize
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.dateformat import format as date_format
from django.utils.http import urlencode

from .. import health, store
from ..conf import queue_name_problem
from ..models import Dashboard
from .actions import log_queue_action
from .charts import throughput_svg
from .common import APP, _by, _DashboardAdminBase, duration
from .live import live_interval, live_response
from .queues import chart_choice, latency_rows, queue_context, queue_live

# The texts of the page's live figures, shared by the template (which renders them) and the live
# endpoint (which sends them), so that a poll replaces a figure with text of the same form.
_QUEUE_FIGURES = ("ready_due", "scheduled", "leased", "dead", "done_recent_short", "dead_recent_short",
                  "done_recent_long", "dead_recent_long")


def _queue_texts(q: health.QueueStats) -> dict[str, str]:
    texts = {name: str(getattr(q, name)) for name in _QUEUE_FIGURES}
    texts["oldest"] = duration(q.oldest_ready_age_seconds) if q.ready_due else "—"
    texts["state"] = "paused" if q.paused else "running"
    texts["expired"] = f"{q.leased_expired} expired" if q.leased_expired else ""
    texts["no_worker"] = "" if q.workers_serving else "no worker"
    return texts


def _process_texts(w: health.WorkerInfo) -> dict[str, str]:
    return {"heartbeat": f"{duration(w.heartbeat_age_seconds)} ago",
            "state": "alive" if w.alive else "no heartbeat",
            "past_timeout": f"{w.stuck_handlers} stuck" if w.stuck_handlers else ""}


def _summary_texts(snap: health.Snapshot) -> dict[str, str]:
    tick = snap.scheduler_last_tick_age_seconds
    schedulers = snap.alive_by_kind.get("scheduler", 0)
    stuck = snap.stuck_handlers
    return {
        "now": date_format(timezone.localtime(snap.now), "Y-m-d H:i:s T"),
        "workers_alive": f"{snap.workers_alive} worker{pluralize(snap.workers_alive)} alive",
        "tick": "never" if tick is None else f"{duration(tick)} ago",
        # A tick age without a live scheduler is the last tick of one that stopped (bug 12: the
        # dashboard said "never" once its row was gone).
        "scheduler": "" if schedulers or tick is None else "no scheduler running",
        "past_timeout": f"{stuck} stuck handler{pluralize(stuck)}" if stuck else "",
    }


def dashboard_values(snap: health.Snapshot) -> dict[str, str]:
    """The dashboard's live figures of one snapshot, keyed as the page marks them (``data-live``).

    Args:
        snap: a :class:`~django_leasequeue.health.Snapshot`.

    Returns:
        ``{"summary:<name>": text, "total:<figure>": text, "q:<queue>:<figure>": text,
        "p:<process id>:<figure>": text}``, the texts the page renders for the same snapshot.
    """
    values = {f"summary:{k}": v for k, v in _summary_texts(snap).items()}
    if len(snap.queues) > 1:
        total = _queue_texts(snap.total())
        values.update({f"total:{k}": total[k] for k in (*_QUEUE_FIGURES, "oldest")})
    for q in snap.queues:
        values.update({f"q:{q.queue}:{k}": v for k, v in _queue_texts(q).items()})
    for w in snap.workers:
        values.update({f"p:{w.id}:{k}": v for k, v in _process_texts(w).items()})
    return values


def _queue_name(name: str) -> bool:
    """Whether ``name`` (str) can be a queue's name at all: 1 to 100 characters, no NUL (which
    PostgreSQL text cannot hold: sent as a parameter, the statement fails with a 500)."""
    return 0 < len(name) <= 100 and "\x00" not in name


@admin.register(Dashboard)
class DashboardAdmin(_DashboardAdminBase):
    """The queue dashboard: ``admin/django_leasequeue/dashboard/``, read through ``health.snapshot()``.

    Visible to users who may view jobs (or the dashboard); pause/resume needs ``change_queuestate``.
    """

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Dashboard | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Dashboard | None = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Dashboard | None = None) -> bool:
        user = request.user
        return user.has_perm(f"{APP}.view_dashboard") or user.has_perm(f"{APP}.view_job") \
            or user.has_perm(f"{APP}.change_job")

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_pause_permission(self, request: HttpRequest) -> bool:
        """Pausing and resuming queues needs ``change_queuestate``."""
        return request.user.has_perm(f"{APP}.change_queuestate")

    def get_urls(self) -> list[URLPattern]:
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        wrap = self.admin_site.admin_view
        return [
            path("", wrap(self.changelist_view), name=f"{prefix}_changelist"),
            path("live/", wrap(self.live_view), name=f"{prefix}_live"),
            path("pause/", wrap(self.pause_view), name=f"{prefix}_pause"),
            path("resume/", wrap(self.resume_view), name=f"{prefix}_resume"),
            # The queue page's live endpoint has a prefix of its own: a queue name may hold "/".
            path("queue-live/<path:name>/", wrap(self.queue_live_view), name=f"{self.opts.app_label}_queue_live"),
            path("queue/<path:name>/", wrap(self.queue_view), name=f"{self.opts.app_label}_queue"),
        ]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        snap = health.snapshot()
        period = chart_choice(request.GET.get("range"), health.RANGES)
        window = chart_choice(request.GET.get("latency"), health.LATENCY_WINDOWS)
        series = health.throughput(period, now=snap.now)
        job_list = reverse(f"admin:{APP}_job_changelist")
        dead_list = reverse(f"admin:{APP}_deadletter_changelist")
        rows = []
        for q in snap.queues:
            rows.append({
                "stats": q,
                "live": _queue_texts(q),
                # Encoded: a queue name written before names had a grammar may hold & # + or spaces.
                "ready_url": f"{job_list}?{urlencode({'status': 'ready', 'queue': q.queue})}",
                "leased_url": f"{job_list}?{urlencode({'status': 'leased', 'queue': q.queue})}",
                "dead_url": f"{dead_list}?{urlencode({'queue': q.queue})}",
                "page_url": reverse(f"admin:{APP}_queue", args=[q.queue]),
            })
        workers = [{"info": w, "live": _process_texts(w)} for w in snap.workers]
        context = {
            **self.admin_site.each_context(request),
            "title": "Queue dashboard",
            "opts": self.opts,
            "snap": snap,
            "rows": rows,
            "total": _queue_texts(snap.total()),
            "summary": _summary_texts(snap),
            "workers": workers,
            "can_pause": self.has_pause_permission(request),
            "live_url": reverse(f"admin:{APP}_dashboard_live"),
            # ?refresh=N, the old whole-page refresh's parameter, now sets the live interval.
            "live_interval": live_interval(request.GET.get("refresh")),
            "live_at": snap.now,
            "job_list_url": job_list, "dead_list_url": dead_list,
            "schedule_list_url": reverse(f"admin:{APP}_schedule_changelist"),
            "workers_url": reverse(f"admin:{APP}_workerprocess_changelist"),
            "workflows_url": reverse(f"admin:{APP}_workflow_changelist"),
            "period": period, "window": window, "ranges": list(health.RANGES),
            "windows": list(health.LATENCY_WINDOWS), "series": series,
            "chart": throughput_svg(series, title="Jobs done, failed and dead, every queue"),
            "latency": latency_rows(health.latency(window, now=snap.now)),
        }
        context.update(extra_context or {})
        return TemplateResponse(request, "admin/django_leasequeue/dashboard.html", context)

    def queue_live_view(self, request: HttpRequest, name: str) -> HttpResponse:
        """GET: the queue page's live figures as JSON (:func:`.queues.queue_live`), with the page's
        permission (403 otherwise)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        if not _queue_name(name):
            raise Http404("No such queue name")
        values, now = queue_live(name)
        return live_response(request, values, at=now)

    def queue_view(self, request: HttpRequest, name: str) -> HttpResponse:
        """The page of queue ``name`` (:func:`.queues.queue_context`); ``?range=hour|day|month``
        picks the chart's range, ``?latency=hour|day`` the latency window."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        if not _queue_name(name):
            raise Http404("No such queue name")
        from .. import health

        user = request.user
        context = {
            **self.admin_site.each_context(request),
            **queue_context(name, period=chart_choice(request.GET.get("range"), health.RANGES),
                            window=chart_choice(request.GET.get("latency"), health.LATENCY_WINDOWS),
                            can_pause=self.has_pause_permission(request),
                            can_replay=user.has_perm(f"{APP}.replay_job"),
                            can_release=user.has_perm(f"{APP}.change_job")),
            "title": f"Queue {name}",
            "opts": self.opts,
            "live_url": reverse(f"admin:{APP}_queue_live", args=[name]),
            "live_interval": live_interval(request.GET.get("refresh")),
        }
        return TemplateResponse(request, "admin/django_leasequeue/queue.html", context)

    def live_view(self, request: HttpRequest) -> HttpResponse:
        """GET: the dashboard's figures as JSON (:func:`~.live.live_response`), for ``live.js``.

        The keys are the ``data-live`` marks of the page: ``summary:<name>``, ``total:<figure>``,
        ``q:<queue>:<figure>`` and ``p:<process id>:<figure>``. The same permission as the page
        (403 otherwise); one health snapshot, as the page.
        """
        if not self.has_view_permission(request):
            raise PermissionDenied
        snap = health.snapshot()
        return live_response(request, dashboard_values(snap), at=snap.now)

    def _toggle(self, request: HttpRequest, pause: bool) -> HttpResponse:
        # A GET naming a queue asks before pausing it; any other GET changes nothing.
        if request.method == "GET" and pause and "queue" in request.GET:
            if not self.has_pause_permission(request):
                raise PermissionDenied
            return self._confirm_pause(request)
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_pause_permission(request):
            raise PermissionDenied
        name = request.POST.get("queue", "").strip()
        changed = False
        if not _queue_name(name):
            messages.error(request, "No queue given.")
        elif pause and queue_name_problem(name):
            # Resuming stays possible for a queue paused under a name written before the grammar.
            messages.error(request, str(queue_name_problem(name)))
        elif pause:
            changed = store.queue_pause(name, by=_by(request))
            messages.success(request, f"Queue {name!r} is paused: no job of it starts until it is resumed; "
                                      "running jobs finish." if changed
                             else f"Queue {name!r} was already paused.")
            if changed:  # a no-op (already paused) is not an action worth a history line
                log_queue_action(request, name, f"Paused queue {name!r}")
        else:
            changed = store.queue_resume(name)
            messages.success(request, f"Queue {name!r} runs again." if changed else f"Queue {name!r} was not paused.")
            if changed:
                log_queue_action(request, name, f"Resumed queue {name!r}")
        if request.POST.get("_from") == "queue" and _queue_name(name):
            return HttpResponseRedirect(reverse(f"admin:{APP}_queue", args=[name]))
        return HttpResponseRedirect(reverse(f"admin:{APP}_dashboard_changelist"))

    def _confirm_pause(self, request: HttpRequest) -> HttpResponse:
        """GET ``?queue=<name>``: the page that asks before pausing (its form POSTs the pause)."""
        name = request.GET.get("queue", "").strip()
        if not _queue_name(name):
            raise Http404("No queue given")
        from .. import health

        stats = health.snapshot(queues=[name]).queue(name)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Pause queue {name}?",
            "opts": self.opts,
            "queue": name,
            "stats": stats,
            "queue_url": reverse(f"admin:{APP}_queue", args=[name]),
            "from_page": request.GET.get("_from", ""),
        }
        return TemplateResponse(request, "admin/django_leasequeue/queue_pause.html", context)

    def pause_view(self, request: HttpRequest) -> HttpResponse:
        """POST ``queue=<name>``: pause the queue (``store.queue_pause``); GET ``?queue=<name>``: ask first."""
        return self._toggle(request, True)

    def resume_view(self, request: HttpRequest) -> HttpResponse:
        """POST ``queue=<name>``: resume the queue (``store.queue_resume``)."""
        return self._toggle(request, False)
