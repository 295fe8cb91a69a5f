"""The job admin: the read-only list and change page of every job, with replay, cancel and
retry-now buttons and bulk actions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, cast

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import Exists, OuterRef, Q, QuerySet, TextField
from django.db.models.functions import Cast, Left
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.safestring import mark_safe

from .. import store
from ..models import Dependency, Job
from . import bulk
from .actions import ReplayForm, cancel_jobs, release_jobs, replay_jobs, retry_now_jobs, run_now_jobs
from .common import APP, _JobAdminBase, _parse_time, _pre, _pretty, duration, error_name, parse_id, search_id
from .listing import (
    EstimatedCountPaginator,
    HasErrorsFilter,
    JobChangeList,
    QueueFilter,
    TaskFilter,
    WorkflowFilter,
)
from .search import IncidentSearchFilter, StateFilter
from .states import job_state, show_time

STATUS_COLOURS = {
    "ready": "#1f6feb", "waiting": "#8250df", "leased": "#9a6700", "done": "#1a7f37", "dead": "#cf222e",
    "cancelled": "#6e7781",
}

#: How the page and the list lay out a row's lease: the holder only while the job is leased (a
#: released, reaped or snoozed job keeps the column's last value, which is no longer true).
LEASE_FIELDS = ("lease_display", "lease_seconds")

#: Dependencies and dependents listed on a job's page; beyond that they are counted (a chord's
#: fan-in step may depend on thousands of members).
EDGES_SHOWN = 100


def _ids(queryset: QuerySet[Job]) -> list[int]:
    """The selected job ids in one query (only the id column)."""
    return list(queryset.order_by().values_list("pk", flat=True))


@admin.register(Job)
class JobAdmin(_JobAdminBase):
    """Jobs: a read-only view of the queue's rows plus replay, cancel and retry-now."""

    # Attempts share the status cell and the age the run-at cell's title, so that at 1280 px,
    # beside the admin's two sidebars, the last error keeps a readable width (bug 1).
    list_display: tuple[str, ...] = ("id", "status_badge", "task_display", "queue_link", "run_at_display",
                                     "last_error_short")
    list_display_links = ("id", "task_display")
    list_filter: ClassVar[tuple[Any, ...]] = (StateFilter, QueueFilter, TaskFilter, HasErrorsFilter,
                                              WorkflowFilter, IncidentSearchFilter)
    search_fields = ("=id", "task", "=unique_key")
    search_help_text = "Job id (123 or #123), part of a task name, or an exact unique key."
    list_per_page = 100
    show_full_result_count = False  # no second COUNT(*) of the whole table per page load
    paginator = EstimatedCountPaginator
    sortable_by: ClassVar[tuple[str, ...]] = ("id", "status_badge", "task_display", "queue_link", "run_at_display")
    actions = ["replay_selected", "cancel_selected", "delete_finished_selected", "retry_now_selected"]
    change_form_template = "admin/django_leasequeue/job/change_form.html"
    fieldsets = (
        (None, {"fields": (("id", "status_badge"), ("task", "queue", "priority"), ("unique_key", "unique_scope"),
                           ("schedule", "occurrence_at"))}),
        ("Flow control", {"fields": (("concurrency_key", "concurrency_limit"), ("sequence_key", "sequence_halts"),
                                     ("rate_key", "rate_limit_n", "rate_limit_secs"), "fair_key")}),
        ("Arguments", {"fields": ("args_pretty", "kwargs_pretty")}),
        ("Errors", {"fields": ("errors_display",)}),
        ("History", {"fields": ("history_display",)}),
        ("Attempts and lease", {"fields": (("attempts", "max_attempts", "lease_version"),
                                           LEASE_FIELDS,
                                           ("cancel_requested", "snoozes"))}),
        ("Times (database clock, admin time zone)", {"fields": (("run_at_display", "created_display"),
                                                                ("started_display", "attempted_display",
                                                                 "finished_display"),
                                                                ("wait_display", "run_time_display"))}),
        ("Result", {"classes": ("collapse",), "fields": ("result_pretty",)}),
    )
    #: Shown after the first fieldset for a job in a workflow or with dependencies or dependents.
    workflow_fieldset: ClassVar[Any] = ("Workflow", {"fields": (("workflow_link", "workflow_step", "workflow_role"),
                                                 ("waiting_on", "on_dependency_dead", "pass_result"),
                                                 "dependencies_display", "dependents_display")})

    # show_facets exists since Django 5.0: facet counts would count every filter choice per page.
    if hasattr(admin, "ShowFacets"):
        show_facets = admin.ShowFacets.NEVER

    class Media:
        css = {"all": ("django_leasequeue/admin.css",)}

    # -- permissions ---------------------------------------------------------------------------

    def has_add_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return False  # jobs are enqueued by code (and by "run now" on a schedule)

    def has_delete_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        # One finished job at a time, from its page: deleting a ready or leased job would drop work
        # silently, and the bulk "delete selected" (no obj) would list every selected row for
        # confirmation, which is no use on 10,000 rows.
        if obj is None or obj.status not in ("done", "dead", "cancelled"):
            return False
        return request.user.has_perm(f"{APP}.delete_job")

    def has_replay_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        """The ``replay_job`` permission (declared in ``Job.Meta.permissions``)."""
        return request.user.has_perm(f"{APP}.replay_job")

    def has_operate_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        """Cancel, retry-now, run-now and release need ``change_job``."""
        return request.user.has_perm(f"{APP}.change_job")

    def has_delete_finished_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        """The bulk "Delete finished jobs" needs ``delete_job``."""
        return request.user.has_perm(f"{APP}.delete_job")

    #: Shown last for a job stored with a trace context (enqueued while OpenTelemetry was on).
    trace_fieldset: ClassVar[Any] = ("Trace context", {"classes": ("collapse",), "fields": ("trace_context_display",)})

    def get_fieldsets(self, request: HttpRequest, obj: Job | None = None) -> Any:
        fieldsets = list(self.fieldsets or ())
        if obj is not None and self._in_workflow(obj):
            fieldsets.insert(1, self.workflow_fieldset)
        if obj is not None and getattr(obj, "lq_trace_text", None) is not None:
            fieldsets.append(self.trace_fieldset)
        return fieldsets

    @staticmethod
    def _in_workflow(obj: Job) -> bool:
        """A workflow member or callback, a job with dependents, or one enqueued with ``depends_on``."""
        if obj.workflow_id is not None or obj.has_dependents or obj.waiting_on:
            return True
        # get_object annotates it (no statement of its own); a row read elsewhere asks once.
        has_edges: bool | None = getattr(obj, "lq_has_edges", None)
        if has_edges is None:
            has_edges = Dependency.objects.filter(job_id=obj.pk).exists()
            obj.lq_has_edges = has_edges  # type: ignore[attr-defined]
        return has_edges

    def get_readonly_fields(self, request: HttpRequest, obj: Job | None = None) -> list[str]:
        names: list[str] = []
        for _, options in self.get_fieldsets(request, obj):
            for entry in options["fields"]:
                names.extend(entry if isinstance(entry, tuple) else (cast(str, entry),))
        return names

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return JobChangeList

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Any],
                           search_term: str) -> tuple[QuerySet[Job], bool]:
        """Search by id (``123`` or ``#123``), task name (substring) or unique key (exact)."""
        term = search_term.strip()
        if not term:
            return queryset, False
        q = Q(task__icontains=term) | Q(unique_key=term)
        if (row_id := search_id(term)) is not None:
            q = Q(pk=row_id) | Q(unique_key=term)
        return queryset.filter(q), False

    # -- list columns ----------------------------------------------------------------------------

    @staticmethod
    def _now(obj: Job) -> Any:
        """The database clock the row is judged by: the list's (read once per page) or the page's."""
        now = getattr(obj, "lq_now", None)
        if now is None:
            now = obj.lq_now = store.db_now()  # type: ignore[attr-defined]
        return now

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: Job) -> str:
        state = job_state(obj, self._now(obj))
        return format_html('<span class="lq-status lq-{} {}" title="{}" style="color:{}">{}</span>'
                           '<span class="lq-meta lq-attempts" title="attempts"> {}/{}</span>', obj.status,
                           state.css, state.detail, STATUS_COLOURS.get(obj.status, "inherit"), state.label,
                           obj.attempts, obj.max_attempts)

    @admin.display(description="task", ordering="task")
    def task_display(self, obj: Job) -> str:
        # A dotted name may break after its dots only, never inside a word.
        parts = obj.task.split(".")
        return format_html_join(mark_safe("<wbr>"), "{}", ((p + ("." if i < len(parts) - 1 else ""),)
                                                for i, p in enumerate(parts)))

    @admin.display(description="queue", ordering="queue")
    def queue_link(self, obj: Job) -> str:
        # The queue's page (admin/queues.py); reversing costs no statement.
        return format_html('<a href="{}" class="lq-queue-link">{}</a>', reverse(f"admin:{APP}_queue", args=[obj.queue]),
                           obj.queue)

    @admin.display(description="attempts")
    def attempts_display(self, obj: Job) -> str:
        return f"{obj.attempts}/{obj.max_attempts}"

    @admin.display(description="run at", ordering="run_at")
    def run_at_display(self, obj: Job) -> str:
        return format_html('<span title="created {} ago">{}</span>', self.age(obj), show_time(obj.run_at))

    @admin.display(description="age", ordering="created_at")
    def age(self, obj: Job) -> str:
        return duration((self._now(obj) - obj.created_at).total_seconds()) if obj.created_at else "—"

    @admin.display(description="last error")
    def last_error_short(self, obj: Job) -> str:
        kind = getattr(obj, "last_error_type", None)
        if kind is None:
            return ""
        message = getattr(obj, "last_error_message", "") or ""
        return format_html('<span class="lq-error" title="{}"><b>{}</b> {}</span>', message, error_name(kind),
                           message[:120] + ("…" if len(message) > 120 else ""))

    # -- times and lease, to the second in the admin's time zone ----------------------------------

    @admin.display(description="created")
    def created_display(self, obj: Job) -> str:
        return show_time(obj.created_at)

    @admin.display(description="first claim")
    def started_display(self, obj: Job) -> str:
        return show_time(obj.started_at)

    @admin.display(description="latest claim")
    def attempted_display(self, obj: Job) -> str:
        return show_time(obj.attempted_at)

    @admin.display(description="finished")
    def finished_display(self, obj: Job) -> str:
        return show_time(obj.finished_at)

    @admin.display(description="wait time")
    def wait_display(self, obj: Job) -> str:
        """Due to the start of the latest attempt (or, not started, how long it has been due)."""
        now = self._now(obj)
        if obj.attempted_at is not None and obj.run_at is not None:
            due = min(obj.run_at, obj.attempted_at)
            return f"{duration((obj.attempted_at - due).total_seconds())} (due to start of the latest attempt)"
        if obj.status == "ready" and obj.run_at and obj.run_at <= now:
            return f"waiting for {duration((now - obj.run_at).total_seconds())}"
        return "—"

    @admin.display(description="run time")
    def run_time_display(self, obj: Job) -> str:
        """The latest attempt's start to its finish, or "running for N s"."""
        if obj.attempted_at is None:
            return "—"
        if obj.status == "leased":
            return f"running for {duration((self._now(obj) - obj.attempted_at).total_seconds())}"
        end = obj.finished_at or _parse_time((obj.errors[-1] or {}).get("at") if obj.errors else None)
        if end is None or end < obj.attempted_at:
            return "—"
        return duration((end - obj.attempted_at).total_seconds())

    @admin.display(description="lease")
    def lease_display(self, obj: Job) -> str:
        if obj.status != "leased":
            return "not leased"
        state = job_state(obj, self._now(obj))
        return format_html('<span class="{}">{}</span> · until {}', state.css, state.detail,
                           show_time(obj.leased_until))

    # -- change page fields --------------------------------------------------------------------

    @admin.display(description="args")
    def args_pretty(self, obj: Job) -> str:
        return _pre(obj.args)

    @admin.display(description="kwargs")
    def kwargs_pretty(self, obj: Job) -> str:
        return _pre(obj.kwargs)

    @admin.display(description="result")
    def result_pretty(self, obj: Job) -> str:
        return _pre(obj.result) if obj.result is not None else "—"

    @admin.display(description="trace context")
    def trace_context_display(self, obj: Job) -> str:
        # Read as clipped text (get_object), never through JSONField: a row written by hand may
        # hold JSON nested too deeply to decode, or megabytes. Shown as a claim reads it.
        text: str | None = getattr(obj, "lq_trace_text", None)
        if text is None:
            return "—"
        carrier, problem = store.trace_carrier(text)
        if problem is not None:
            return format_html('unreadable: {} (the job runs traced without a link)<pre class="lq-json">{}</pre>',
                               problem, text[:200] + ("…" if len(text) > 200 else ""))
        return _pre(carrier)

    @admin.display(description="workflow")
    def workflow_link(self, obj: Job) -> str:
        if obj.workflow_id is None:
            return "—"
        url = reverse(f"admin:{APP}_workflow_change", args=[obj.workflow_id])
        return format_html('<a href="{}" id="lq-workflow-link">workflow #{}</a>', url, obj.workflow_id)

    @admin.display(description="depends on")
    def dependencies_display(self, obj: Job) -> str:
        edges = Dependency.objects.filter(job_id=obj.pk)
        rows = list(edges.order_by("id").values("depends_on_id", "name", "resolved", "depends_on__status")
                    [:EDGES_SHOWN + 1])
        items = []
        for row in rows[:EDGES_SHOWN]:
            status = row["depends_on__status"] or "deleted"
            note = ""
            if not row["resolved"] and obj.status == "waiting":
                note = f"blocked by job {row['depends_on_id']}: replay it to resume" \
                    if status in ("dead", "cancelled") else "not done yet"
            items.append(self._edge(row["depends_on_id"], row["name"], status, note))
        return self._edges(items, edges.count() - EDGES_SHOWN if len(rows) > EDGES_SHOWN else 0)

    @admin.display(description="dependents")
    def dependents_display(self, obj: Job) -> str:
        if not obj.has_dependents:
            return "none"
        edges = Dependency.objects.filter(depends_on_id=obj.pk)
        rows = list(edges.order_by("id").values("job_id", "job__workflow_step", "resolved", "job__status")
                    [:EDGES_SHOWN + 1])
        items = [self._edge(row["job_id"], row["job__workflow_step"] or "", row["job__status"] or "deleted",
                            "waits on this job" if not row["resolved"] and row["job__status"] == "waiting" else "")
                 for row in rows[:EDGES_SHOWN]]
        return self._edges(items, edges.count() - EDGES_SHOWN if len(rows) > EDGES_SHOWN else 0)

    @staticmethod
    def _edge(job_id: int, step: str, status: str, note: str) -> dict[str, Any]:
        return {"id": job_id, "step": step, "status": status, "note": note,
                "colour": STATUS_COLOURS.get(status, "inherit"),
                "url": reverse(f"admin:{APP}_job_change", args=[job_id])}

    @staticmethod
    def _edges(items: list[dict[str, Any]], more: int) -> str:
        """Dependency edges as job links with step names, states and notes (at most
        :data:`EDGES_SHOWN`, then the count of the rest)."""
        if not items:
            return "none"
        return render_to_string("admin/django_leasequeue/job/_edges.html", {"items": items, "more": more})

    @admin.display(description="failed attempts")
    def errors_display(self, obj: Job) -> str:
        if not obj.errors:
            return "none"
        replays = [_parse_time(h.get("at")) for h in obj.history if h.get("event") == "replayed"]
        entries = []
        for index, error in enumerate(obj.errors):
            at = _parse_time(error.get("at"))
            run = sum(1 for r in replays if r and at and r <= at)
            kind = error_name(str(error.get("type") or "Error"))
            entries.append({"n": index + 1, "error": error, "type": kind, "at": at, "run": run})
        return render_to_string("admin/django_leasequeue/job/_errors.html",
                                {"entries": list(reversed(entries)), "replayed": bool(replays)})

    @admin.display(description="operator history")
    def history_display(self, obj: Job) -> str:
        if not obj.history:
            return "none"
        rows = []
        for entry in reversed(obj.history):
            extra = {k: v for k, v in entry.items() if k not in ("event", "at", "by", "worker", "old", "new")}
            rows.append({"entry": entry, "at": _parse_time(entry.get("at")),
                         "who": entry.get("by") or entry.get("worker") or "",
                         "extra": ", ".join(f"{k}: {v}" for k, v in extra.items()),
                         "old": _pretty(entry["old"]) if "old" in entry else None,
                         "new": _pretty(entry["new"]) if "new" in entry else None})
        return render_to_string("admin/django_leasequeue/job/_history.html", {"rows": rows})

    # -- views -----------------------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        wrap = self.admin_site.admin_view
        return [
            # First: "bulk/replay/" would otherwise read as the replay URL of an object "bulk".
            path("bulk/<str:action>/", wrap(self.bulk_view), name=f"{prefix}_bulk"),
            path("<path:object_id>/replay/", wrap(self.replay_view), name=f"{prefix}_replay"),
            path("<path:object_id>/cancel/", wrap(self.cancel_view), name=f"{prefix}_cancel"),
            path("<path:object_id>/retry-now/", wrap(self.retry_now_view), name=f"{prefix}_retry_now"),
            path("<path:object_id>/run-now/", wrap(self.run_now_view), name=f"{prefix}_run_now"),
            path("<path:object_id>/release/", wrap(self.release_view), name=f"{prefix}_release"),
            *super().get_urls(),
        ]

    def save_model(self, request: HttpRequest, obj: Job, form: Any, change: Any) -> None:
        # Never write a job row from a form: only the store changes job state (see change_view).
        raise PermissionDenied("jobs are changed through the replay, cancel and retry-now actions")

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if request.method == "POST":
            # Every field is read-only and the operator actions have their own POST views. Django's
            # change form would save the whole row from the copy it read, a lost update racing the
            # workers (it could hand a job's fencing token to two holders), so refuse.
            return HttpResponseNotAllowed(["GET", "HEAD"])
        obj = self.get_object(request, object_id)
        extra: dict[str, Any] = {
            "title": f"Job #{object_id}",
            "subtitle": None,  # the title names the job; the row's repr under it said it twice
            "show_save": False, "show_save_and_continue": False, "show_save_and_add_another": False,
            "lq_dashboard_url": reverse(f"admin:{APP}_dashboard_changelist"),
        }
        if obj is not None:
            now = self._now(obj)  # the database clock: the page's one reading of it
            state = job_state(obj, now)
            operate = self.has_operate_permission(request)
            extra.update({
                "lq_job": obj,
                "lq_state": state,
                "lq_times": {"run_at": show_time(obj.run_at), "leased_until": show_time(obj.leased_until)},
                "lq_can_replay": obj.status in ("dead", "cancelled") and self.has_replay_permission(request),
                "lq_can_cancel": (obj.status in ("ready", "waiting")
                                  or (obj.status == "leased" and not obj.cancel_requested)) and operate,
                # Retry now: a retry waiting out its backoff; Run now: a snoozed or scheduled job.
                "lq_can_retry_now": state.label == "retry wait" and operate,
                "lq_can_run_now": state.label in ("snoozed", "scheduled") and operate,
                "lq_can_release": state.label == "lease expired" and operate,
                "lq_replay_url": reverse(f"admin:{APP}_job_replay", args=[obj.pk]),
                "lq_cancel_url": reverse(f"admin:{APP}_job_cancel", args=[obj.pk]),
                "lq_retry_now_url": reverse(f"admin:{APP}_job_retry_now", args=[obj.pk]),
                "lq_run_now_url": reverse(f"admin:{APP}_job_run_now", args=[obj.pk]),
                "lq_release_url": reverse(f"admin:{APP}_job_release", args=[obj.pk]),
            })
        extra.update(extra_context or {})
        return super().change_view(request, object_id, form_url, extra)

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Job | None:
        # The change page loads the whole row (the list defers the heavy columns), and whether the
        # job has dependencies, for its Workflow section (an index probe in the same statement).
        # The trace context is read as text clipped by the database (trace_context_display), never
        # decoded as JSON here: a hand-written value must not fail the page.
        try:
            return self.get_queryset(request).defer("trace_context").annotate(
                lq_has_edges=Exists(Dependency.objects.filter(job_id=OuterRef("pk"))),
                lq_trace_text=Left(Cast("trace_context", TextField()), store.TRACE_CONTEXT_MAX_BYTES + 1),
            ).get(pk=int(object_id))
        except (ValueError, Job.DoesNotExist):
            return None

    def _job_or_404(self, request: HttpRequest, object_id: str) -> Job:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        try:
            return get_object_or_404(Job.objects.defer("trace_context"), pk=int(object_id))
        except ValueError:
            raise Http404("no such job")

    def _back(self, request: HttpRequest, job: Job) -> HttpResponse:
        # A page elsewhere in this admin (the workers page) names where to go back to.
        target = request.POST.get("next") or request.GET.get("next")
        if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()},
                                                      require_https=request.is_secure()):
            return HttpResponseRedirect(target)
        if request.POST.get("_from") == "list":
            # Back to the list the button was on (with its filters), if that is this site's page.
            referer = request.META.get("HTTP_REFERER", "")
            if not url_has_allowed_host_and_scheme(referer, allowed_hosts={request.get_host()},
                                                   require_https=request.is_secure()):
                referer = reverse(f"admin:{APP}_deadletter_changelist")
            return HttpResponseRedirect(referer)
        return HttpResponseRedirect(reverse(f"admin:{APP}_job_change", args=[job.pk]))

    def replay_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """GET: the "edit arguments and replay" form. POST: replay (with the edited arguments when
        the form's fields are posted). Needs ``replay_job``; 403 otherwise."""
        if not self.has_replay_permission(request):
            raise PermissionDenied
        job = self._job_or_404(request, object_id)
        form = None
        if request.method == "POST":
            if "args" not in request.POST and "kwargs" not in request.POST:
                replay_jobs(request, [job.pk])
                return self._back(request, job)
            form = ReplayForm(request.POST)
            if form.is_valid():
                replay_jobs(request, [job.pk], args=form.cleaned_data["args"], kwargs=form.cleaned_data["kwargs"])
                return self._back(request, job)
        elif request.method != "GET":
            return HttpResponseNotAllowed(["GET", "POST"])
        if form is None:
            form = ReplayForm(initial={"args": _pretty(job.args), "kwargs": _pretty(job.kwargs)})
        context = {
            **self.admin_site.each_context(request),
            "title": f"Replay job #{job.pk}",
            "opts": Job._meta,
            "job": job,
            "form": form,
            "replayable": job.status in ("dead", "cancelled"),
            "last_error": job.last_error,
            "change_url": reverse(f"admin:{APP}_job_change", args=[job.pk]),
        }
        return TemplateResponse(request, "admin/django_leasequeue/job/replay.html", context)

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST: cancel a ready job, or ask a leased job to stop. Needs ``change_job``."""
        return self._operate(request, object_id, cancel_jobs)

    def retry_now_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST: make a ready job waiting on its retry backoff due now. Needs ``change_job``."""
        return self._operate(request, object_id, retry_now_jobs)

    def run_now_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST: make a snoozed, scheduled or retry-waiting ready job due now. Needs ``change_job``.
        With ``lease_version`` posted (the page sends the token it showed), only if the job's
        fencing token is still that one."""
        return self._operate(request, object_id, lambda r, ids: run_now_jobs(r, ids, self._token(r, ids)))

    def release_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST: release a leased job whose lease has expired, as the reaper would (the operator
        knows its worker is gone). Needs ``change_job``. With ``lease_version`` posted, only if
        the lease is still that one. Goes back to ``next`` (a page of this site) when posted,
        else to the list (``_from=list``) or the job's page. URL name
        ``admin:django_leasequeue_job_release``."""
        return self._operate(request, object_id, lambda r, ids: release_jobs(r, ids, self._token(r, ids)))

    @staticmethod
    def _token(request: HttpRequest, ids: list[int]) -> dict[int, int] | None:
        """The fencing token the operator saw (POST ``lease_version``), for the one job of a button."""
        token = parse_id(request.POST.get("lease_version", ""))
        return {ids[0]: token} if token is not None and len(ids) == 1 else None

    def bulk_view(self, request: HttpRequest, action: str) -> HttpResponse:
        """GET: the confirmation page of a bulk action (``replay``, ``cancel``, ``delete``) on every
        job of the list filtered by the query string (an error group's link); see :mod:`.bulk`."""
        return bulk.bulk_view(self, request, action)

    def _operate(self, request: HttpRequest, object_id: str,
                 operation: Callable[[HttpRequest, list[int]], Any]) -> HttpResponse:
        """One job's button (POST only, operate permission): run ``operation`` on it, then go back."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_operate_permission(request):
            raise PermissionDenied
        job = self._job_or_404(request, object_id)
        operation(request, [job.pk])
        return self._back(request, job)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        extra: dict[str, Any] = {"lq_dashboard_url": reverse(f"admin:{APP}_dashboard_changelist"),
                                 "title": str(self.opts.verbose_name_plural).capitalize()}
        extra.update(extra_context or {})
        return super().changelist_view(request, extra)

    # -- bulk actions ----------------------------------------------------------------------------

    @admin.action(description="Replay selected dead or cancelled jobs…", permissions=["replay"])
    def replay_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> HttpResponse | None:
        return bulk.confirm_or_run(self, request, queryset, bulk.ACTIONS["replay"])

    @admin.action(description="Cancel selected jobs (ready: now; running: ask to stop)…", permissions=["operate"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> HttpResponse | None:
        return bulk.confirm_or_run(self, request, queryset, bulk.ACTIONS["cancel"])

    @admin.action(description="Delete selected finished jobs…", permissions=["delete_finished"])
    def delete_finished_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> HttpResponse | None:
        return bulk.confirm_or_run(self, request, queryset, bulk.ACTIONS["delete"])

    @admin.action(description="Retry now (ready jobs waiting on a retry backoff)", permissions=["operate"])
    def retry_now_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        retry_now_jobs(request, _ids(queryset.filter(status="ready")))
