"""Confirmed bulk actions over a set of jobs (a search result, an error group, "Select all N"):
Replay, Cancel and Delete (finished jobs only).

The admin action's first POST (or a GET of the ``..._bulk`` URL with the list's filters, the link
of an error group) shows a confirmation page and writes nothing: the exact number of jobs the
action will act on, the number it will skip by reason (the same reason expressions the store's
write uses, so the page and the result message agree), and a sample of up to ten rows. The set is
pinned on that page (its ids travel in one hidden field), so the confirming POST acts on exactly
the jobs that were counted, in one set-based store statement, whatever their number.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from .. import store
from ..models import Job
from .actions import cancel_jobs, delete_jobs, replay_jobs
from .common import error_name, parse_id

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

#: The POST field that says "confirmed" (its value is ``"yes"``).
CONFIRM_FIELD = "lq_confirm"
#: The POST field that pins the confirmed set: the job ids, comma-separated.
IDS_FIELD = "lq_ids"
#: Rows shown on the confirmation page.
SAMPLE_SIZE = 10


@dataclass(frozen=True)
class BulkAction:
    """One confirmed bulk action.

    Attributes:
        key (str): its name in the ``..._bulk`` URL (``"replay"``).
        admin_action (str): the ModelAdmin action it is (``"replay_selected"``).
        label (str): the button's text (``"Replay"``).
        does (str): what it does, for the page (``"replay"``).
        reason_sql (str): the store's skip-reason expression of its write.
        run (Callable[[HttpRequest, list[int]], Any]): the write (one code path with the buttons).
        permission (str): the ModelAdmin permission it needs (``"replay"``: ``has_replay_permission``).
        danger (bool): a destructive action (its button is red).
    """

    key: str
    admin_action: str
    label: str
    does: str
    reason_sql: str
    run: Callable[[HttpRequest, list[int]], Any]
    permission: str
    danger: bool = False


ACTIONS = {
    "replay": BulkAction("replay", "replay_selected", "Replay", "replayed: ready and due now, attempts reset",
                         store.REPLAY_SKIP_REASON, replay_jobs, "replay"),
    "cancel": BulkAction("cancel", "cancel_selected", "Cancel",
                         "cancelled (ready and waiting jobs at once; running ones are asked to stop)",
                         store.CANCEL_SKIP_REASON, cancel_jobs, "operate", danger=True),
    "delete": BulkAction("delete", "delete_finished_selected", "Delete", "deleted for good (finished jobs only)",
                         store.DELETE_SKIP_REASON, delete_jobs, "delete_finished", danger=True),
}


def selected_ids(queryset: QuerySet[Job]) -> list[int]:
    """The ids of a selection in one query (only the id column, no ordering)."""
    return list(queryset.order_by().values_list("pk", flat=True))


def _pinned_ids(request: HttpRequest) -> list[int] | None:
    raw = request.POST.get(IDS_FIELD)
    if raw is None:
        return None
    # A tampered field (a Unicode digit, a number past bigint) pins nothing rather than a 500.
    ids = [parse_id(part) for part in raw.split(",") if part]
    return [] if None in ids else sorted({i for i in ids if i is not None})


def allowed(model_admin: ModelAdmin[Any], request: HttpRequest, action: BulkAction) -> bool:
    """Whether the user may run ``action`` (the ModelAdmin's ``has_<permission>_permission``)."""
    check: Callable[[HttpRequest], bool] = getattr(model_admin, f"has_{action.permission}_permission")
    return check(request)


def confirm_or_run(model_admin: ModelAdmin[Any], request: HttpRequest, queryset: QuerySet[Job],
                   action: BulkAction) -> HttpResponse | None:
    """The body of a confirmed admin action: the confirmation page, or, on the confirming POST,
    the write on the pinned set.

    Args:
        model_admin: the job or dead-letter admin.
        request: the action's POST (from the changelist, or from the confirmation page).
        queryset: the admin's selection (the ticked rows, or the whole filtered list with "Select all").
        action: which action.

    Returns:
        The confirmation page, or None after the write (the admin then redirects to the list,
        filters kept, where the result message shows).
    """
    if request.POST.get(CONFIRM_FIELD) == "yes":
        ids = _pinned_ids(request)
        action.run(request, selected_ids(queryset) if ids is None else ids)
        return None
    return confirmation_page(model_admin, request, selected_ids(queryset), action, request.get_full_path())


def confirmation_page(model_admin: ModelAdmin[Any], request: HttpRequest, ids: list[int], action: BulkAction,
                      post_url: str) -> TemplateResponse:
    """The confirmation page of ``action`` on ``ids``: counts by reason and a sample, one read.

    Args:
        model_admin: the job or dead-letter admin.
        request: the request.
        ids: the selected job ids.
        action: which action.
        post_url: where the confirming form posts (the changelist with its filters).

    Returns:
        The page (nothing is written).
    """
    preview = store.bulk_preview(ids, action.reason_sql, sample=SAMPLE_SIZE)
    opts = model_admin.model._meta
    sample = [{"row": row, "error_type": error_name(row.error_type)} for row in preview.sample]
    context = {
        **model_admin.admin_site.each_context(request),
        "title": f"{action.label} {preview.acting:,} job{'s' if preview.acting != 1 else ''}?",
        "opts": opts,
        "action": action,
        "preview": preview,
        "selected": len(ids),
        "skipped_total": sum(preview.skipped.values()),
        # Counts as the result message writes them ("9,981").
        "n": {"selected": f"{len(ids):,}", "acting": f"{preview.acting:,}",
              "skipped": f"{sum(preview.skipped.values()):,}",
              "reasons": [(reason, f"{count:,}") for reason, count in preview.skipped.items()]},
        "sample": sample,
        "post_url": post_url,
        "ids": ",".join(str(i) for i in ids),
        "first_id": ids[0] if ids else "",
        "confirm_field": CONFIRM_FIELD,
        "ids_field": IDS_FIELD,
        "changelist_url": post_url,
    }
    return TemplateResponse(request, "admin/django_leasequeue/job/bulk_confirm.html", context)


def bulk_view(model_admin: ModelAdmin[Any], request: HttpRequest, key: str) -> HttpResponse:
    """GET ``<list>/bulk/<action>/?<the list's filters>``: the confirmation page of ``action`` on
    every job the filtered list holds (an error group's "Replay…" link). The confirming form posts
    to the list as the admin action would.

    Raises:
        Http404: unknown action.
        PermissionDenied: the user may not run it.
    """
    action = ACTIONS.get(key)
    if action is None or action.admin_action not in (model_admin.actions or ()):
        raise Http404("no such bulk action here")
    if not allowed(model_admin, request, action):
        raise PermissionDenied
    changelist = model_admin.get_changelist_instance(request)
    ids = selected_ids(changelist.get_queryset(request))
    post_url = request.path.rsplit("bulk/", 1)[0] + (f"?{request.GET.urlencode()}" if request.GET else "")
    return confirmation_page(model_admin, request, ids, action, post_url)
