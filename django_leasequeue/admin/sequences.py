"""The halted-sequence admin: every dead job that holds its sequence (``sequence_on_dead="halt"``),
with its sequence key, when it died and how many jobs wait behind it, and two actions: replay the
dead job (it keeps its id, so it runs first) or skip it (it stays dead and the sequence goes on)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import Count, IntegerField, OuterRef, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.timesince import timesince

from .. import store
from ..models import HaltedSequence, Job, JobStatus
from .actions import _chunks
from .common import APP, _by, search_id
from .jobs import JobAdmin, _ids
from .listing import QueueFilter, TaskFilter


def skip_sequences(request: HttpRequest, ids: list[int]) -> list[int]:
    """Let the sequences halted by these dead jobs go on (:func:`store.sequence_skip`), and tell the
    operator what happened. The jobs stay dead.

    Returns:
        The ids whose sequence was released.
    """
    skipped: list[int] = []
    for chunk in _chunks(ids):
        skipped += store.sequence_skip(chunk, by=_by(request))
    if skipped:
        messages.success(request, f"Skipped {len(skipped)} dead job{'s' if len(skipped) != 1 else ''}: "
                                  "the next job of each sequence may start.")
    if len(skipped) < len(ids):
        left = len(ids) - len(skipped)
        messages.warning(request, f"{left} job{'s were' if left != 1 else ' was'} left alone: "
                                  "no longer a dead job halting its sequence.")
    return skipped


@admin.register(HaltedSequence)
class HaltedSequenceAdmin(JobAdmin):
    """Halted sequences: dead jobs with ``sequence_halts`` set, oldest death first, with the number
    of ready or leased jobs of the same sequence key enqueued after them."""

    list_display = ("sequence_key", "id", "task", "queue", "died", "waiting", "last_error_short")
    list_display_links = ("sequence_key", "id")
    list_filter = (QueueFilter, TaskFilter)
    search_help_text = "An exact sequence key or job id."
    sortable_by = ("sequence_key", "id", "task", "queue", "died", "waiting")
    ordering = ("finished_at", "id")
    actions = ["replay_selected", "skip_selected"]
    change_list_template = "admin/django_leasequeue/job/change_list.html"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        behind = (Job.objects.filter(sequence_key=OuterRef("sequence_key"), id__gt=OuterRef("pk"),
                                     status__in=[JobStatus.READY, JobStatus.LEASED])
                  .order_by().values("sequence_key").annotate(n=Count("pk")).values("n"))
        return (super().get_queryset(request)
                .filter(status=JobStatus.DEAD, sequence_key__isnull=False, sequence_halts=True)
                .annotate(waiting=Coalesce(Subquery(behind, output_field=IntegerField()), Value(0))))

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Any],
                           search_term: str) -> tuple[QuerySet[Job], bool]:
        """Search by exact sequence key, or by job id (``123`` or ``#123``)."""
        term = search_term.strip()
        if not term:
            return queryset, False
        row_id = search_id(term)
        if row_id is not None:
            return queryset.filter(pk=row_id) | queryset.filter(sequence_key=term), False
        return queryset.filter(sequence_key=term), False

    # Halted sequences are dead jobs: users with the job permissions may see them.
    def has_view_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return super().has_view_permission(request, obj) or request.user.has_perm(f"{APP}.view_job")

    def has_change_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return super().has_change_permission(request, obj) or request.user.has_perm(f"{APP}.change_job")

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    @admin.display(description="died", ordering="finished_at")
    def died(self, obj: Job) -> str:
        return format_html('<span title="{}">{} ago</span>', obj.finished_at, timesince(obj.finished_at)) \
            if obj.finished_at else "—"

    @admin.display(description="waiting behind", ordering="waiting")
    def waiting(self, obj: Job) -> int:
        return int(getattr(obj, "waiting", 0))

    @admin.action(description="Skip selected dead jobs (they stay dead; their sequences go on)",
                  permissions=["replay"])
    def skip_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        skip_sequences(request, _ids(queryset))
