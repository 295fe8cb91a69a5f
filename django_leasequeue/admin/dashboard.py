"""The queue dashboard (``admin/django_leasequeue/dashboard/``): per-queue counts, workers and the
scheduler tick read through :func:`django_leasequeue.health.snapshot`, the throughput chart and
the latency table read from the outcome counters (:mod:`django_leasequeue.health.charts`), the page
of each queue (:mod:`.queues`) and pause/resume (a pause is confirmed first when asked for with a
GET, as the queue page does; each pause and resume writes an admin log entry on the queue)."""

from __future__ import annotations

from typing import Any, cast

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.http import urlencode

from .. import store
from ..conf import queue_name_problem
from ..models import Dashboard, QueueState
from .charts import throughput_svg
from .common import APP, _by, _DashboardAdminBase, duration, parse_id
from .queues import chart_choice, latency_rows, queue_context


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
            path("pause/", wrap(self.pause_view), name=f"{prefix}_pause"),
            path("resume/", wrap(self.resume_view), name=f"{prefix}_resume"),
            path("queue/<path:name>/", wrap(self.queue_view), name=f"{self.opts.app_label}_queue"),
        ]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        from .. import health

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
                "oldest": duration(q.oldest_ready_age_seconds) if q.ready_due else "—",
                # Encoded: a queue name written before names had a grammar may hold & # + or spaces.
                "ready_url": f"{job_list}?{urlencode({'status': 'ready', 'queue': q.queue})}",
                "leased_url": f"{job_list}?{urlencode({'status': 'leased', 'queue': q.queue})}",
                "dead_url": f"{dead_list}?{urlencode({'queue': q.queue})}",
                "page_url": reverse(f"admin:{APP}_queue", args=[q.queue]),
            })
        workers = [{"info": w, "age": duration(w.heartbeat_age_seconds), "stuck": duration(w.stuck_seconds)}
                   for w in snap.workers]
        total = snap.total()
        refresh = request.GET.get("refresh", "")
        context = {
            **self.admin_site.each_context(request),
            "title": "Queue dashboard",
            "opts": self.opts,
            "snap": snap,
            "rows": rows,
            "total": total,
            "total_oldest": duration(total.oldest_ready_age_seconds) if total.ready_due else "—",
            "workers": workers,
            "tick_age": duration(snap.scheduler_last_tick_age_seconds),
            "has_scheduler_tick": snap.scheduler_last_tick_age_seconds is not None,
            "can_pause": self.has_pause_permission(request),
            "refresh": seconds if (seconds := parse_id(refresh)) is not None and 2 <= seconds <= 3600 else None,
            "job_list_url": job_list, "dead_list_url": dead_list,
            "schedule_list_url": reverse(f"admin:{APP}_schedule_changelist"),
            "period": period, "window": window, "ranges": list(health.RANGES),
            "windows": list(health.LATENCY_WINDOWS), "series": series,
            "chart": throughput_svg(series, title="Jobs done, failed and dead, every queue"),
            "latency": latency_rows(health.latency(window, now=snap.now)),
        }
        context.update(extra_context or {})
        return TemplateResponse(request, "admin/django_leasequeue/dashboard.html", context)

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
        }
        return TemplateResponse(request, "admin/django_leasequeue/queue.html", context)

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
        else:
            changed = store.queue_resume(name)
            messages.success(request, f"Queue {name!r} runs again." if changed else f"Queue {name!r} was not paused.")
        if changed:
            # The admin's own history: "Recent actions" and the queue row's history name the change.
            LogEntry.objects.log_actions(user_id=cast(int, request.user.pk), queryset=[QueueState(name=name)],
                                         action_flag=CHANGE, change_message="Paused" if pause else "Resumed",
                                         single_object=True)
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
