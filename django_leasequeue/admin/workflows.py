"""The workflow admin: every chain, group, chord, batch and dependency graph with its progress and
state, and a page per workflow listing its steps, with Replay on each dead member and "Cancel the
rest".

The list reads only the workflow rows: progress comes from the counters the settle trigger keeps
on each row, and the state is one SQL ``CASE`` over them (see :func:`workflow_state`), so a page
of 100 workflows is one statement however many jobs they hold. The page of one workflow shows at
most :data:`STEPS_SHOWN` members, so a 10,000-member batch costs the same handful of statements
as a chain of three.

Both pages refresh their figures in place (:mod:`.live`): the list from ``workflow/live/`` with
the list's own query string (the same page of rows), a workflow's page from
``workflow/<id>/live/`` (its counts, and the status and attempts of each step and callback shown).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias

from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import PermissionDenied
from django.db.models import Case, CharField, Exists, OuterRef, Q, QuerySet, Value, When
from django.db.models.functions import Now
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html

from .. import store
from ..models import Dependency, Job, JobStatus, Workflow, WorkflowRole
from ..workflows.handle import PENDING, WorkflowHandle
from .actions import replay_jobs
from .common import APP, _by, parse_id, search_id
from .jobs import STATUS_COLOURS
from .listing import EstimatedCountPaginator
from .live import live_response
from .states import time_field

if TYPE_CHECKING:
    _WorkflowAdminBase: TypeAlias = admin.ModelAdmin[Workflow]
else:
    _WorkflowAdminBase = admin.ModelAdmin

#: Members listed on a workflow's page; the rest are counted and linked (the job list filtered by
#: the workflow), so a batch of 10,000 members renders as fast as a short chain.
STEPS_SHOWN = 500

#: Dead members named at the top of a workflow's page, each with its Replay button.
DEAD_SHOWN = 20

FAILED = (JobStatus.DEAD, JobStatus.CANCELLED)

#: The states of a workflow on its list and in the state filter, with their labels.
WORKFLOW_STATES = {
    "open": "open batch, not closed",
    "running": "running",
    "blocked": "held by a dead member",
    "finished": "finished",
}


def workflow_state() -> Case:
    """The state of a workflow row as one SQL expression (annotate or filter with it).

    ``"open"``: a batch not closed yet. ``"finished"``: ``finished_at`` is set. ``"blocked"``: a dead
    or cancelled member holds back a waiting job of the workflow (an unresolved dependency edge),
    or holds its ``on_success`` callback (no member pending and the callback still ``waiting``).
    ``"running"``: the rest (an ``on_complete`` callback released after a member died is running).

    This is :attr:`WorkflowHandle.state <django_leasequeue.workflows.handle.WorkflowHandle.state>`
    without its split of "finished" and without dead dependencies outside the workflow: the edge
    check runs only for rows whose counters show a failed member (a ``CASE`` branch is evaluated
    only when its condition holds), so the list does not read the jobs of healthy workflows.

    Returns:
        A ``Case`` expression whose value is one of the keys of :data:`WORKFLOW_STATES`.
    """
    held_edge = Dependency.objects.filter(
        depends_on__workflow_id=OuterRef("pk"), depends_on__status__in=FAILED, resolved=False,
        job__status=JobStatus.WAITING)
    held_callback = Job.objects.filter(pk=OuterRef("on_success_id"), status=JobStatus.WAITING)
    failed = Q(members_dead__gt=0) | Q(members_cancelled__gt=0)
    return Case(
        When(closed_at__isnull=True, then=Value("open")),
        When(finished_at__isnull=False, then=Value("finished")),
        When(failed, then=Case(
            When(Q(members_pending=0) & Exists(held_callback), then=Value("blocked")),
            When(Exists(held_edge), then=Value("blocked")),
            default=Value("running"))),
        default=Value("running"),
        output_field=CharField(),
    )


class WorkflowStateFilter(admin.SimpleListFilter):
    """Filter workflows by :func:`workflow_state`."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]) -> list[tuple[str, str]]:
        return list(WORKFLOW_STATES.items())

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value in WORKFLOW_STATES:
            return queryset.filter(lq_state=value)
        return queryset


def _badge(status: str, label: str | None = None, live: str | None = None) -> str:
    if live is not None:  # live.js sets the text and the class (data-live-class) and drops the colour
        return format_html('<span class="lq-status lq-{}" style="color:{}" data-live="{}" '
                           'data-live-class="lq-status lq-{{}}">{}</span>', status,
                           STATUS_COLOURS.get(status, "inherit"), live, label or status)
    return format_html('<span class="lq-status lq-{}" style="color:{}">{}</span>', status,
                       STATUS_COLOURS.get(status, "inherit"), label or status)


def _counts_text(counts: dict[str, int]) -> str:
    return " · ".join(f"{status} {n}" for status, n in counts.items())


def _figures(workflow: Workflow) -> dict[str, str]:
    """A workflow row's figures in words, as its page and the list show them (keys of the live endpoints)."""
    state = str(getattr(workflow, "lq_state", "running"))
    return {
        "state": WORKFLOW_STATES.get(state, state),
        "progress": f"{workflow.members_done}/{workflow.members}",
        "done": f"{workflow.members_done}/{workflow.members} done",
        "pending": f"{workflow.members_pending} pending",
        "dead": str(workflow.members_dead),
        "dead_words": f"{workflow.members_dead} dead",
        "cancelled": str(workflow.members_cancelled),
        "cancelled_words": f"{workflow.members_cancelled} cancelled",
    }


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def jobs_of_workflow_url(workflow_id: int) -> str:
    """The job list filtered to one workflow's jobs (members and callbacks).

    Args:
        workflow_id: the workflow's id.

    Returns:
        The admin URL (``.../job/?workflow__id__exact=<id>``).
    """
    return f"{reverse(f'admin:{APP}_job_changelist')}?workflow__id__exact={workflow_id}"


@admin.register(Workflow)
class WorkflowAdmin(_WorkflowAdminBase):
    """Workflows: a read-only list with progress and state, and a page per workflow with its steps,
    Replay on each dead member and "Cancel the rest"."""

    list_display = ("id", "kind", "name", "progress", "dead", "cancelled", "state_badge", "created_at_display",
                    "progressed_at_display")
    list_display_links = ("id", "name")
    list_filter: ClassVar[tuple[Any, ...]] = ("kind", WorkflowStateFilter)
    search_fields = ("=id", "name", "=unique_key")
    search_help_text = "Workflow id (12 or #12), part of its name, or an exact unique key."
    list_per_page = 100
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    sortable_by: ClassVar[tuple[str, ...]] = ("id", "kind", "name", "created_at_display", "progressed_at_display")
    change_form_template = "admin/django_leasequeue/workflow/change_form.html"
    change_list_template = "admin/django_leasequeue/workflow/change_list.html"
    fieldsets = (
        (None, {"fields": (("id", "kind", "name"), ("unique_key", "on_dependency_dead"))}),
        ("Times (database clock, admin time zone)", {"fields": (("created_at_display", "closed_at_display"),
                                                                 ("progressed_at_display", "finished_at_display"))}),
    )
    readonly_fields = ("id", "kind", "name", "unique_key", "on_dependency_dead", "created_at_display",
                       "closed_at_display", "progressed_at_display", "finished_at_display")
    created_at_display = time_field("created_at", "created")
    closed_at_display = time_field("closed_at", "closed (— : an open batch)")
    progressed_at_display = time_field("progressed_at", "progressed (a member settled, added or replayed)")
    finished_at_display = time_field("finished_at", "finished")

    if hasattr(admin, "ShowFacets"):
        show_facets = admin.ShowFacets.NEVER

    class Media:
        css = {"all": ("django_leasequeue/admin.css",)}

    # -- permissions ---------------------------------------------------------------------------

    # Workflows are built by code and change only through their jobs: no add, edit or delete.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Workflow | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Workflow | None = None) -> bool:
        return False

    # A workflow is a set of jobs: users who may see jobs may see workflows.
    def has_view_permission(self, request: HttpRequest, obj: Workflow | None = None) -> bool:
        return super().has_view_permission(request, obj) or request.user.has_perm(f"{APP}.view_job") \
            or request.user.has_perm(f"{APP}.change_job")

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_replay_permission(self, request: HttpRequest) -> bool:
        """Replay needs ``replay_job``, as on the job pages."""
        return request.user.has_perm(f"{APP}.replay_job")

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """"Cancel the rest" needs ``change_job``, as the job pages' Cancel."""
        return request.user.has_perm(f"{APP}.change_job")

    # -- list ------------------------------------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet[Workflow]:
        queryset = super().get_queryset(request).annotate(lq_state=workflow_state())
        if getattr(request, "_lq_live", False):
            # A live poll's time: the rows' own statement's database time, not one statement more.
            queryset = queryset.annotate(lq_now=Now())
        return queryset

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Any],
                           search_term: str) -> tuple[QuerySet[Workflow], bool]:
        """Search by id (``12`` or ``#12``), name (substring) or unique key (exact)."""
        term = search_term.strip()
        if not term:
            return queryset, False
        q = Q(name__icontains=term) | Q(unique_key=term)
        if (row_id := search_id(term)) is not None:
            q |= Q(pk=row_id)
        return queryset.filter(q), False

    # Each figure carries its live key (wf:<id>:<figure>, see live_list_view).
    @admin.display(description="progress")
    def progress(self, obj: Workflow) -> str:
        return format_html('<span class="lq-num" title="done / members; {} pending" '
                           'data-live="wf:{}:progress">{}/{}</span>',
                           obj.members_pending, obj.pk, obj.members_done, obj.members)

    @admin.display(description="dead", ordering="members_dead")
    def dead(self, obj: Workflow) -> str:
        return format_html('<span class="{}" data-live="wf:{}:dead" data-live-nonzero="lq-dead">{}</span>',
                           "lq-dead" if obj.members_dead else "", obj.pk, obj.members_dead)

    @admin.display(description="cancelled", ordering="members_cancelled")
    def cancelled(self, obj: Workflow) -> str:
        return format_html('<span data-live="wf:{}:cancelled">{}</span>', obj.pk, obj.members_cancelled)

    @admin.display(description="state")
    def state_badge(self, obj: Workflow) -> str:
        state = str(getattr(obj, "lq_state", "running"))
        return format_html('<span class="lq-wf-state lq-wf-{}" data-live="wf:{}:state">{}</span>', state, obj.pk,
                           WORKFLOW_STATES.get(state, state))

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        live = reverse(f"admin:{APP}_workflow_live_list")
        query = request.GET.urlencode()
        # The live endpoint rebuilds the same page of rows from the same query string. No live_at:
        # the list reads no clock, and one more statement for the bar's first time is not worth it.
        extra: dict[str, Any] = {"live_url": f"{live}?{query}" if query else live}
        extra.update(extra_context or {})
        return super().changelist_view(request, extra)

    def live_list_view(self, request: HttpRequest) -> HttpResponse:
        """GET with the list's query string: the figures of the rows that page shows, as JSON
        (``wf:<id>:progress``, ``wf:<id>:dead``, ``wf:<id>:cancelled``, ``wf:<id>:state``), for
        ``live.js``. The list's permission (403 otherwise); its change list's statements (the
        page's row and count statements), without rendering. 400 for a query the list refuses."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        request._lq_live = True  # type: ignore[attr-defined]
        try:
            changelist = self.get_changelist_instance(request)
        except IncorrectLookupParameters:
            return HttpResponseBadRequest("bad filter")
        values: dict[str, str] = {}
        at = None
        for workflow in changelist.result_list:
            at = workflow.lq_now
            figures = _figures(workflow)
            for key in ("progress", "dead", "cancelled", "state"):
                values[f"wf:{workflow.pk}:{key}"] = figures[key]
        # No row: nothing to refresh, and no statement read a time; the clock is read for the bar.
        return live_response(request, values, at=at if at is not None else store.db_now())

    # -- change page -----------------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        wrap = self.admin_site.admin_view
        return [
            path("live/", wrap(self.live_list_view), name=f"{prefix}_live_list"),
            path("<path:object_id>/replay/", wrap(self.replay_view), name=f"{prefix}_replay"),
            path("<path:object_id>/cancel/", wrap(self.cancel_view), name=f"{prefix}_cancel"),
            path("<path:object_id>/live/", wrap(self.live_view), name=f"{prefix}_live"),
            *super().get_urls(),
        ]

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Workflow | None:
        # Read once per request: change_view reads it for the page's context, then Django's view again.
        cached: dict[str, Workflow | None] = request.__dict__.setdefault("_lq_workflows", {})
        if object_id not in cached:
            try:
                cached[object_id] = self.get_queryset(request).get(pk=int(object_id))
            except (ValueError, Workflow.DoesNotExist):
                cached[object_id] = None
        return cached[object_id]

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if request.method == "POST":
            # Nothing on this page is a form field; the operations have their own POST views.
            return HttpResponseNotAllowed(["GET", "HEAD"])
        extra: dict[str, Any] = {"title": f"Workflow #{object_id}"}
        workflow = self.get_object(request, object_id)
        if workflow is not None:
            extra.update(self._page_context(request, workflow))
        extra.update(extra_context or {})
        return super().change_view(request, object_id, form_url, extra)

    def _page_context(self, request: HttpRequest, workflow: Workflow) -> dict[str, Any]:
        """The steps, callbacks, dead members and buttons of a workflow's page (five statements)."""
        members = list(
            Job.objects.filter(workflow_id=workflow.pk, workflow_role=WorkflowRole.MEMBER)
            .only("id", "task", "status", "attempts", "max_attempts", "workflow_step", "waiting_on", "run_at")
            .order_by("id")[:STEPS_SHOWN])
        callback_ids = [i for i in (workflow.on_success_id, workflow.on_complete_id) if i is not None]
        callbacks = {job.pk: job for job in Job.objects.filter(pk__in=callback_ids).only(
            "id", "task", "status", "attempts", "max_attempts", "workflow_role", "waiting_on")} \
            if callback_ids else {}
        shown = [job.pk for job in members] + list(callbacks)
        edges: dict[int, list[dict[str, Any]]] = {}
        for edge in (Dependency.objects.filter(job_id__in=shown).order_by("id")
                     .values("job_id", "depends_on_id", "name", "resolved", "depends_on__status")):
            edges.setdefault(edge["job_id"], []).append(dict(edge))
        dead_members = list(
            Job.objects.filter(workflow_id=workflow.pk, status=JobStatus.DEAD)
            .only("id", "task", "workflow_step", "workflow_role").order_by("id")[:DEAD_SHOWN])
        counts = WorkflowHandle(workflow.pk).counts()

        def row(job: Job, role: str | None = None) -> dict[str, Any]:
            deps = edges.get(job.pk, [])
            blocked = [d["depends_on_id"] for d in deps if not d["resolved"] and d["depends_on__status"] in FAILED] \
                if job.status == JobStatus.WAITING else []
            return {
                "job": job, "role": role, "badge": _badge(job.status, live=f"j:{job.pk}:status"),
                "url": reverse(f"admin:{APP}_job_change", args=[job.pk]),
                "depends_on": [{"name": d["name"], "id": d["depends_on_id"], "status": d["depends_on__status"],
                                "url": reverse(f"admin:{APP}_job_change", args=[d["depends_on_id"]])}
                               for d in deps],
                "blocked_by": [{"id": i, "url": reverse(f"admin:{APP}_job_change", args=[i])} for i in blocked],
            }

        callback_rows = []
        for role, job_id in (("on_success", workflow.on_success_id), ("on_complete", workflow.on_complete_id)):
            if job_id is not None and job_id in callbacks:
                callback_rows.append(row(callbacks[job_id], role))
            elif job_id is not None:
                callback_rows.append({"role": role, "missing": job_id})
        unfinished = workflow.finished_at is None and (
            workflow.members_pending > 0 or any(c.status in PENDING for c in callbacks.values()))
        return {
            "lq_workflow": workflow,
            "lq_state": WORKFLOW_STATES.get(str(getattr(workflow, "lq_state", "")), ""),
            "lq_state_key": getattr(workflow, "lq_state", ""),
            "lq_counts": counts,
            "lq_counts_text": _counts_text(counts),
            "lq_figures": _figures(workflow),
            "live_url": reverse(f"admin:{APP}_workflow_live", args=[workflow.pk]),
            "lq_steps": [row(job) for job in members],
            "lq_more": max(workflow.members - len(members), 0),
            "lq_jobs_url": jobs_of_workflow_url(workflow.pk),
            "lq_callbacks": callback_rows,
            "lq_dead": [{"job": job, "url": reverse(f"admin:{APP}_job_change", args=[job.pk])}
                        for job in dead_members],
            "lq_dead_more": max(workflow.members_dead + sum(c.status == JobStatus.DEAD for c in callbacks.values())
                                - len(dead_members), 0),
            "lq_can_replay": self.has_replay_permission(request),
            "lq_can_cancel": unfinished and self.has_operate_permission(request),
            "lq_replay_url": reverse(f"admin:{APP}_workflow_replay", args=[workflow.pk]),
            "lq_cancel_url": reverse(f"admin:{APP}_workflow_cancel", args=[workflow.pk]),
            "lq_dashboard_url": reverse(f"admin:{APP}_dashboard_changelist"),
        }

    def live_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """GET: one workflow's figures as JSON, for ``live.js``: ``wf:<figure>`` (state, done,
        pending, dead_words, cancelled_words, counts) and ``j:<job id>:status`` / ``j:<job id>:attempts``
        of the members and callbacks its page lists. The page's permission (403 otherwise); at most
        four statements (the row, the counts, the members shown, the callbacks), fewer than the page."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        request._lq_live = True  # type: ignore[attr-defined]
        workflow = self.get_object(request, object_id)
        if workflow is None:
            raise Http404("no such workflow")
        figures = _figures(workflow)
        values = {f"wf:{k}": figures[k] for k in ("state", "done", "pending", "dead_words", "cancelled_words")}
        values["wf:counts"] = _counts_text(WorkflowHandle(workflow.pk).counts())
        members = (Job.objects.filter(workflow_id=workflow.pk, workflow_role=WorkflowRole.MEMBER)
                   .order_by("id").values_list("id", "status", "attempts", "max_attempts")[:STEPS_SHOWN])
        callback_ids = [i for i in (workflow.on_success_id, workflow.on_complete_id) if i is not None]
        callbacks = Job.objects.filter(pk__in=callback_ids).values_list("id", "status", "attempts", "max_attempts") \
            if callback_ids else []
        for job_id, status, attempts, max_attempts in [*members, *callbacks]:
            values[f"j:{job_id}:status"] = status
            values[f"j:{job_id}:attempts"] = f"{attempts}/{max_attempts}"
        at: datetime = workflow.lq_now  # type: ignore[attr-defined]  # annotated for live polls
        return live_response(request, values, at=at)

    def _workflow_or_404(self, request: HttpRequest, object_id: str) -> Workflow:
        try:
            workflow = Workflow.objects.filter(pk=int(object_id)).first()
        except ValueError:
            workflow = None
        if workflow is None:
            raise Http404("no such workflow")
        return workflow

    def _back(self, workflow: Workflow) -> HttpResponse:
        return HttpResponseRedirect(reverse(f"admin:{APP}_workflow_change", args=[workflow.pk]))

    def replay_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST ``job=<id>``: replay that dead (or cancelled) job of the workflow; ``job=dead``:
        replay every dead job of the workflow. Through :func:`~django_leasequeue.admin.replay_jobs`,
        the code path of the job pages' Replay. Needs ``replay_job`` (403 otherwise); 404 for a job
        that is not in this workflow."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_replay_permission(request):
            raise PermissionDenied
        workflow = self._workflow_or_404(request, object_id)
        jobs = Job.objects.filter(workflow_id=workflow.pk)
        choice = request.POST.get("job", "").strip().lstrip("#")
        if choice == "dead":
            ids = list(jobs.filter(status=JobStatus.DEAD).order_by("id").values_list("id", flat=True))
            if not ids:
                messages.warning(request, f"Workflow #{workflow.pk} has no dead job to replay.")
                return self._back(workflow)
        elif (job_id := parse_id(choice)) is not None and jobs.filter(pk=job_id).exists():
            ids = [job_id]
        else:
            raise Http404(f"no job {choice!r} in workflow #{workflow.pk}")
        replay_jobs(request, ids)
        return self._back(workflow)

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST: cancel the rest of the workflow through :meth:`WorkflowHandle.cancel
        <django_leasequeue.workflows.handle.WorkflowHandle.cancel>` (waiting and ready jobs are
        cancelled now, leased ones asked to stop; finished jobs stay as they are). Needs
        ``change_job`` (403 otherwise)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_operate_permission(request):
            raise PermissionDenied
        workflow = self._workflow_or_404(request, object_id)
        counts = WorkflowHandle(workflow.pk).cancel(by=_by(request))
        parts = []
        if counts.cancelled:
            parts.append(f"cancelled {_plural(counts.cancelled, 'waiting or ready job')}")
        if counts.requested:
            parts.append(f"asked {_plural(counts.requested, 'running job')} to stop (each ends cancelled "
                         "at its worker's next write)")
        if parts:
            messages.success(request, f"Workflow #{workflow.pk}: " + "; ".join(parts) + ".")
        else:
            messages.warning(request, f"Workflow #{workflow.pk} has no unfinished job to cancel.")
        if counts.unchanged:
            messages.warning(request, f"{_plural(counts.unchanged, 'job')} finished meanwhile and "
                                      f"{'were' if counts.unchanged != 1 else 'was'} left alone.")
        return self._back(workflow)

