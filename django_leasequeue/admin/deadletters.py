"""The dead-letter admin: only ``dead`` jobs, newest death first, counts grouped by task and error
type, and a Replay button per row (through the job admin's replay view)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db.models import Count, QuerySet, TextField, Value
from django.db.models.functions import Cast, Concat, Left, NullIf
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode

from ..models import DeadLetter, Dependency, Job, JobStatus
from .common import APP, duration, error_name
from .jobs import JobAdmin
from .listing import DeadQueueFilter, DeadTaskFilter, JobChangeList
from .search import IncidentSearchFilter
from .states import show_time

# Changelist parameters that are not filters: the page, the ordering, the popup and error markers.
_NOT_FILTERS = {"p", "o", "_popup", "_to_field", "e", "all"}


class DeadLetterChangeList(JobChangeList):
    """The dead-letter list, plus for each dead job on the page that has dependents the number of
    jobs waiting on it, read in one statement for the whole page (none when no row has dependents)."""

    def get_queryset(self, request: HttpRequest,
                     exclude_parameters: list[str | None] | None = None) -> QuerySet[Any]:
        # The start of the arguments, for "for whom?" (one line, cut short): the JSON columns
        # stay deferred, only these 160 characters are read.
        qs = super().get_queryset(request, exclude_parameters)
        # Empty kwargs ({}) and args ([]) are left out (NULL in a Concat is "").
        arguments = Concat(NullIf(Cast("kwargs", TextField()), Value("{}", output_field=TextField())), Value(" "),
                           NullIf(Cast("args", TextField()), Value("[]", output_field=TextField())),
                           output_field=TextField())
        annotated: QuerySet[Any] = qs.annotate(lq_arguments=Left(arguments, 160))
        return annotated

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        holders = [job.pk for job in self.result_list if job.has_dependents]
        waiting: dict[int, int] = {}
        if holders:
            waiting = dict(Dependency.objects.filter(depends_on_id__in=holders, resolved=False,
                                                     job__status=JobStatus.WAITING)
                           .order_by().values("depends_on_id").annotate(n=Count("id"))
                           .values_list("depends_on_id", "n"))
        for job in self.result_list:
            job.lq_waiting_dependents = waiting.get(job.pk, 0)


@admin.register(DeadLetter)
class DeadLetterAdmin(JobAdmin):
    """Dead letters: only ``dead`` jobs, newest death first, grouped counts on top, Replay per row."""

    # No attempts column: a dead job has used its attempts (its page says how many); the width goes
    # to the last error, the column this page is read for.
    # "N jobs wait on this job" shares the Replay button's cell (the fix is to replay it).
    list_display = ("id", "task_display", "queue_link", "died", "replay_button", "arguments_short",
                    "last_error_short")
    list_filter = (DeadQueueFilter, DeadTaskFilter, IncidentSearchFilter)
    list_display_links = ("id", "task_display")
    sortable_by = ("id", "task_display", "queue_link", "died")
    ordering = ("-finished_at", "-id")  # served by the partial index (status, finished_at)
    actions = ["replay_selected", "delete_finished_selected"]
    change_list_template = "admin/django_leasequeue/deadletter/change_list.html"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        return super().get_queryset(request).filter(status=JobStatus.DEAD)

    # A dead letter is a job: users with the job permissions may work with dead letters.
    def has_view_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return super().has_view_permission(request, obj) or request.user.has_perm(f"{APP}.view_job") \
            or request.user.has_perm(f"{APP}.change_job")

    def has_change_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return super().has_change_permission(request, obj) or request.user.has_perm(f"{APP}.change_job")

    def has_delete_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return super().has_delete_permission(request, obj) or (
            obj is not None and obj.status == "dead" and request.user.has_perm(f"{APP}.delete_deadletter"))

    def has_delete_finished_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return super().has_delete_finished_permission(request, obj) or request.user.has_perm(
            f"{APP}.delete_deadletter")

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return DeadLetterChangeList

    def get_list_display(self, request: HttpRequest) -> tuple[str, ...]:
        if self.has_replay_permission(request):
            return self.list_display
        return tuple("dependents_waiting" if c == "replay_button" else c for c in self.list_display)

    @admin.display(description="died", ordering="finished_at")
    def died(self, obj: Job) -> str:
        if not obj.finished_at:
            return "—"
        # The largest unit only ("3 min ago"): the exact time, to the second, is the title.
        largest = " ".join(duration((self._now(obj) - obj.finished_at).total_seconds()).split(" ")[:2])
        return format_html('<span title="{}">{} ago</span>', show_time(obj.finished_at), largest)

    @admin.display(description="")
    def replay_button(self, obj: Job) -> str:
        # The changelist is one <form> with the CSRF token; this button posts it to the replay URL.
        url = reverse(f"admin:{APP}_job_replay", args=[obj.pk])
        return format_html('<button type="submit" class="button lq-replay" formaction="{}" formmethod="post" '
                           'name="_from" value="list" data-job="{}">Replay</button>{}', url, obj.pk,
                           self.dependents_waiting(obj))

    @admin.display(description="arguments")
    def arguments_short(self, obj: Job) -> str:
        """The job's kwargs, then its args, as JSON on one line (cut short; the whole in the tooltip):
        who the failure hit, without opening each job."""
        text = (getattr(obj, "lq_arguments", "") or "").strip()
        return format_html('<span class="lq-args" title="{}">{}</span>', text, text)

    @admin.display(description="holds")
    def dependents_waiting(self, obj: Job) -> str:
        n = int(getattr(obj, "lq_waiting_dependents", 0))
        if not n:
            return ""
        url = reverse(f"admin:{APP}_job_change", args=[obj.pk])
        return format_html('<a class="lq-blocked" href="{}">{} job{} wait{} on this job</a>', url, n,
                           "" if n == 1 else "s", "s" if n == 1 else "")

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        response = super().changelist_view(request, extra_context)
        context: dict[str, Any] | None = getattr(response, "context_data", None)
        cl = context.get("cl") if context else None
        if cl is not None and context is not None:
            groups = list(
                cl.queryset.order_by().values("task", "last_error_type")
                .annotate(n=Count("pk")).order_by("-n", "task")[:25]
            )
            # The list's own filters and search (a queue, "failed within the last hour", text in
            # the error) stay in every group's links: a group counted under them must select, and
            # replay, exactly the jobs counted, not every dead job of its task and error type.
            kept = {k: v for k, v in request.GET.items() if k not in _NOT_FILTERS}
            for g in groups:
                g["error_type"] = error_name(g["last_error_type"])
                # The search that selects exactly this group: its task and its stored error type
                # (the full name, so an equally named class of another module stays out); "-"
                # selects the dead jobs without an error.
                g["query"] = urlencode({**kept, "task": g["task"], "error_type": g["last_error_type"] or "-"})
            context["lq_groups"] = groups
            context["lq_bulk_url"] = reverse(f"admin:{APP}_deadletter_bulk", args=["x"]).removesuffix("x/")
            context["lq_can_replay"] = self.has_replay_permission(request)
            context["lq_can_delete"] = self.has_delete_finished_permission(request)
            context["lq_group_total"] = sum(g["n"] for g in groups)
        return response
