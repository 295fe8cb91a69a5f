"""The operator's surface: jobs, dead letters, replay, schedules and a queue dashboard in the admin.

Pages (all under the app "Lease queue"):

* **Jobs** (:class:`JobAdmin`): every job, newest first, with status, task, queue, attempts,
  ``run_at``, age and the last error's type and message; filters by status, queue, task and "has
  errors"; search by id, task or unique key. The change page is read-only: arguments pretty-printed,
  every failed attempt with its traceback (collapsible), the operator history (replays, edits,
  cancels, releases), and buttons for Replay, "Edit arguments and replay", Cancel and Retry now.
* **Dead letters** (:class:`DeadLetterAdmin`, the ``DeadLetter`` proxy): only ``dead`` jobs,
  newest death first, with counts grouped by task and error type at the top and a Replay button per
  row.
* **Schedules** (:class:`ScheduleAdmin`): cron in words (cron-descriptor), the next five occurrences
  in the schedule's zone, enable/disable, "run now", validation on the form.
* **Queue dashboard** (:class:`DashboardAdmin`, ``admin/django_leasequeue/dashboard/``): per queue
  due, scheduled, leased and dead counts, the oldest due job's age, done and dead-lettered jobs in
  the last 5 minutes and hour, paused state with pause/resume, live processes and the last
  scheduler tick, all read through :func:`django_leasequeue.health.snapshot` (the same query layer
  as monitoring).

Writes: every change of a job's state goes through :mod:`django_leasequeue.store` (``job_replay``,
``job_request_cancel``, ``job_retry_now``, ``queue_pause``/``queue_resume``): one statement per
action however many rows are selected (10,000 selected rows, or "select all" across a filter, cost a
handful of queries, never a ``save()`` per row). Detail-page buttons and bulk actions share one code
path per operation (C32: a replay button that silently did nothing while the list action worked).
Every write is a POST through the admin's CSRF protection; replay needs the ``replay_job``
permission, cancel and retry-now need ``change_job``, pause/resume needs ``change_queuestate``.

Large tables (C24): the job list never loads ``args``, ``kwargs``, ``errors``, ``history`` or
``result`` (deferred; the last error is a short annotation), never counts the whole table (an
estimated count beyond :data:`EXACT_COUNT_LIMIT` rows), and offers filter choices without a
``SELECT DISTINCT`` over the job table.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias, cast
from zoneinfo import ZoneInfo

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db.models import Count, Q, QuerySet
from django.db.models.fields.json import KT
from django.db.models.functions import Left
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.http import url_has_allowed_host_and_scheme, urlencode
from django.utils.timesince import timesince

from . import arguments, cron, registry, store
from .conf import get_settings, queue_name_problem
from .enqueueing import build_job, insert_jobs
from .exceptions import LeaseQueueError
from .models import Dashboard, DeadLetter, Job, JobStatus, QueueState, Schedule

if TYPE_CHECKING:
    # django-stubs makes these classes generic; at runtime they are not subscriptable (no
    # django-stubs-ext monkeypatch), so the parametrised bases exist only for the type checker.
    _JobAdminBase: TypeAlias = admin.ModelAdmin[Job]
    _ScheduleAdminBase: TypeAlias = admin.ModelAdmin[Schedule]
    _DashboardAdminBase: TypeAlias = admin.ModelAdmin[Dashboard]
    _ScheduleFormBase: TypeAlias = forms.ModelForm[Schedule]
    _PaginatorBase: TypeAlias = Paginator[Any]
else:
    _JobAdminBase = _ScheduleAdminBase = _DashboardAdminBase = admin.ModelAdmin
    _ScheduleFormBase = forms.ModelForm
    _PaginatorBase = Paginator

#: What ``list_filter`` holds in the job admins (field names and filter classes).
_ListFilter: TypeAlias = "str | type[admin.SimpleListFilter]"

APP = Job._meta.app_label

#: Up to this many matching rows the job list shows an exact count; beyond it, the planner's
#: estimate (an exact count of a million rows costs a scan per page load).
EXACT_COUNT_LIMIT = 10_000

#: Bulk actions send ids to the store in statements of at most this many ids.
BULK_CHUNK = 10_000

#: Columns the job list never loads (C24: a 1 MB kwargs must not travel for a list row).
HEAVY_FIELDS = ("args", "kwargs", "errors", "history", "result")

#: Characters of pretty-printed JSON shown on a change page before it is cut (the replay form
#: always shows the whole payload).
JSON_DISPLAY_LIMIT = 64 * 1024

STATUS_COLOURS = {
    "ready": "#1f6feb", "leased": "#9a6700", "done": "#1a7f37", "dead": "#cf222e", "cancelled": "#6e7781",
}


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def _by(request: HttpRequest) -> str:
    """The operator's name as recorded in job history."""
    return request.user.get_username() or f"user #{request.user.pk}"


def _ids(queryset: QuerySet[Job]) -> list[int]:
    """The selected job ids in one query (only the id column)."""
    return list(queryset.order_by().values_list("pk", flat=True))


def _chunks(ids: list[int]) -> Iterator[list[int]]:
    for start in range(0, len(ids), BULK_CHUNK):
        yield ids[start:start + BULK_CHUNK]


# JobJSONDecoder reads an integer past Python's int<->str digit limit (a row written by hand or by
# an older version) as a Decimal. JSON has no way to write one from Python, so it is written as a
# marked string and the marks are removed: the page shows the number as it is stored. A NUL cannot
# occur in a jsonb string, so the mark never matches real data.
_BIG_NUMBER_MARK = "\x00lq-number:"
_BIG_NUMBER_RE = re.compile(r'"\\u0000lq-number:(-?[0-9]+)"')


def _big_number(value: Any) -> str:
    if isinstance(value, Decimal):
        return f"{_BIG_NUMBER_MARK}{value}"
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _pretty(value: Any) -> str:
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)
    except (TypeError, ValueError):
        text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=_big_number)
        return _BIG_NUMBER_RE.sub(r"\1", text)


def _pre(value: Any, limit: int = JSON_DISPLAY_LIMIT) -> str:
    text = _pretty(value)
    if len(text) > limit:
        return format_html('<pre class="lq-json">{}</pre><p class="help">… cut at {} of {} characters; '
                           'the replay form shows the whole value.</p>', text[:limit], limit, len(text))
    return format_html('<pre class="lq-json">{}</pre>', text)


def _parse_time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return None
    return None


def duration(seconds: float | None) -> str:
    """Seconds as a short human duration: ``"0 s"``, ``"42 s"``, ``"3 min 20 s"``, ``"2 h 5 min"``,
    ``"3 d 4 h"``; ``"—"`` for None."""
    if seconds is None:
        return "—"
    s = int(round(max(seconds, 0)))
    if s < 60:
        return f"{s} s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m} min {s} s" if s else f"{m} min"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(h, 24)
    return f"{d} d {h} h" if h else f"{d} d"


def _summarise_refusals(refused: dict[int, str], limit: int = 5) -> str:
    """Group refusal reasons: ``"3 × job is ready; ... (#1, #2, #3)"``, at most ``limit`` groups."""
    groups: dict[str, list[int]] = {}
    for job_id, reason in sorted(refused.items()):
        groups.setdefault(reason, []).append(job_id)
    parts = []
    for reason, ids in list(groups.items())[:limit]:
        shown = ", ".join(f"#{i}" for i in ids[:limit]) + (" …" if len(ids) > limit else "")
        parts.append(f"{len(ids)} × {reason} ({shown})")
    if len(groups) > limit:
        parts.append(f"and {len(groups) - limit} other reasons")
    return "; ".join(parts)


def replay_jobs(request: HttpRequest, ids: list[int], *, args: list[Any] | None = None,
                kwargs: dict[str, Any] | None = None) -> store.ReplayResult:
    """Replay jobs through :func:`store.job_replay` and tell the operator what happened.

    The one code path of the Replay button, the "edit and replay" form and the bulk action.
    """
    replayed: list[int] = []
    refused: dict[int, str] = {}
    for chunk in _chunks(ids):
        result = store.job_replay(chunk, by=_by(request), args=args, kwargs=kwargs)
        replayed += result.replayed
        refused.update(result.refused)
    if replayed:
        if len(replayed) == 1:
            url = reverse(f"admin:{APP}_job_change", args=[replayed[0]])
            messages.success(request, format_html(
                'Replayed job <a href="{}">#{}</a>: it is ready and due now{}.', url, replayed[0],
                " with the edited arguments" if (args is not None or kwargs is not None) else ""))
        else:
            messages.success(request, f"Replayed {len(replayed)} jobs: they are ready and due now.")
    if refused:
        level = messages.WARNING if replayed else messages.ERROR
        messages.add_message(request, level, f"Not replayed: {_summarise_refusals(refused)}.")
    return store.ReplayResult(replayed, refused)


def cancel_jobs(request: HttpRequest, ids: list[int]) -> None:
    """Cancel ready jobs and ask leased ones to stop, through :func:`store.job_request_cancel`."""
    cancelled = requested = unchanged = 0
    for chunk in _chunks(ids):
        counts = store.job_request_cancel(chunk, by=_by(request))
        cancelled += counts.cancelled
        requested += counts.requested
        unchanged += counts.unchanged
    parts = []
    if cancelled:
        parts.append(f"cancelled {cancelled} ready job{'s' if cancelled != 1 else ''}")
    if requested:
        parts.append(f"asked {requested} running job{'s' if requested != 1 else ''} to stop (its worker's "
                     "completion will be refused and the job ends cancelled)")
    if parts:
        messages.success(request, "; ".join(parts).capitalize() + ".")
    if unchanged:
        messages.warning(request, f"{unchanged} job{'s were' if unchanged != 1 else ' was'} left alone: "
                                  "already finished or already asked to stop.")


def retry_now_jobs(request: HttpRequest, ids: list[int]) -> None:
    """Make ready jobs waiting on a retry backoff due now, through :func:`store.job_retry_now`."""
    changed = sum(store.job_retry_now(chunk, by=_by(request)) for chunk in _chunks(ids))
    if changed:
        messages.success(request, f"{changed} job{'s are' if changed != 1 else ' is'} due now.")
    if changed < len(ids):
        messages.warning(request, f"{len(ids) - changed} job{'s were' if len(ids) - changed != 1 else ' was'} "
                                  "left alone: only ready jobs waiting out a retry backoff are moved.")


# ---------------------------------------------------------------------------------------------
# Job list machinery: estimated count, deferred columns, cheap filters
# ---------------------------------------------------------------------------------------------


class EstimatedCountPaginator(_PaginatorBase):
    """A paginator that never counts more than :data:`EXACT_COUNT_LIMIT` rows.

    It counts at most ``EXACT_COUNT_LIMIT + 1`` rows (``SELECT count(*) FROM (... LIMIT n)``, bounded
    work whatever the table size); beyond that it takes PostgreSQL's row estimate for the same query
    (``EXPLAIN``), which is what ``pg_class.reltuples`` gives for the unfiltered table. The
    admin's pagination then says "about N". The idea is the common "estimated count" recipe for
    large PostgreSQL tables (e.g. the django-postgres-extra and Wagtail discussions); the bounded
    exact count keeps small filtered lists exact.
    """

    is_estimate = False
    is_lower_bound = False

    @cached_property
    def count(self) -> int:
        qs = cast("QuerySet[Any]", self.object_list)  # the admin always paginates a QuerySet
        exact = qs.order_by()[: EXACT_COUNT_LIMIT + 1].count()
        if exact <= EXACT_COUNT_LIMIT:
            return exact
        self.is_estimate = True
        try:
            plan = json.loads(qs.order_by().explain(format="json"))
            estimate = int(plan[0]["Plan"]["Plan Rows"])
        except Exception:  # an estimate is a nicety; never fail the page for it
            estimate = 0
        if estimate <= exact:
            # The planner guessed below what was just counted (correlated filters): say "more than".
            self.is_lower_bound = True
            return exact - 1
        return estimate

    @property
    def display_count(self) -> str:
        """The count for people: ``"1,234"``, ``"about 1,000,400"`` or ``"more than 10,000"``."""
        if self.is_lower_bound:
            return f"more than {self.count:,}"
        return f"about {self.count:,}" if self.is_estimate else f"{self.count:,}"


class JobChangeList(ChangeList):
    """The job list's query: heavy JSON columns deferred, the last error as a short annotation."""

    def get_queryset(self, request: HttpRequest,
                     exclude_parameters: list[str | None] | None = None) -> QuerySet[Any]:
        qs = super().get_queryset(request, exclude_parameters)
        result: QuerySet[Any] = qs.defer(*HEAVY_FIELDS).annotate(
            last_error_type=KT("errors__-1__type"),
            last_error_message=Left(KT("errors__-1__message"), 200),
        )
        return result


def known_queues() -> list[str]:
    """Queue names known without reading the job table: settings, queue rows and task defaults."""
    settings = get_settings()
    names = {settings.default_queue}
    if settings.queues:
        names.update(settings.queues)
    names.update(QueueState.objects.values_list("name", flat=True))
    registry.autodiscover()
    names.update(t.queue for t in registry.registered_tasks().values() if t.queue)
    return sorted(names)


class _NameFilter(admin.SimpleListFilter):
    """Filter on one name column (``field``) with choices computed without scanning the job table,
    plus the current value, so a filter on a name that is not (or no longer) known still shows."""

    field = ""

    def names(self) -> list[str]:
        """The known names, sorted."""
        raise NotImplementedError

    def label(self, name: str, names: list[str]) -> str:
        """How a name is shown in the filter."""
        return name

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]) -> list[tuple[str, str]]:
        names = self.names()
        value = self.value()
        if value and value not in names:
            names.append(value)
        return [(n, self.label(n, names)) for n in names]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(**{self.field: self.value()}) if self.value() else queryset


class QueueFilter(_NameFilter):
    """Filter by queue; the choices come from settings, queue rows and tasks, not from the job table
    (a ``SELECT DISTINCT queue`` would read every row of a large table on each page load)."""

    title = "queue"
    parameter_name = field = "queue"

    def names(self) -> list[str]:
        return known_queues()


class TaskFilter(_NameFilter):
    """Filter by task; the choices are the registered tasks, shown by their function name unless
    two tasks share it (then by the full name)."""

    title = "task"
    parameter_name = field = "task"

    def names(self) -> list[str]:
        registry.autodiscover()
        return sorted(registry.registered_tasks())

    def label(self, name: str, names: list[str]) -> str:
        short = name.rsplit(".", 1)[-1]
        return short if [n.rsplit(".", 1)[-1] for n in names].count(short) == 1 else name


class HasErrorsFilter(admin.SimpleListFilter):
    """Jobs with at least one failed attempt recorded, or none."""

    title = "errors"
    parameter_name = "has_errors"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]) -> list[tuple[str, str]]:
        return [("yes", "has errors"), ("no", "no errors")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "yes":
            return queryset.exclude(errors=[])
        if self.value() == "no":
            return queryset.filter(errors=[])
        return queryset


class ReplayForm(forms.Form):
    """Arguments of a dead letter, editable before the replay (a fix for a bad payload)."""

    args = forms.CharField(widget=forms.Textarea(attrs={"rows": 6, "cols": 100, "class": "vLargeTextField lq-code"}),
                           help_text="JSON list of positional arguments.")
    kwargs = forms.CharField(widget=forms.Textarea(attrs={"rows": 14, "cols": 100, "class": "vLargeTextField lq-code"}),
                             help_text="JSON object of keyword arguments.")

    @staticmethod
    def _load(text: str, kind: type, name: str) -> Any:
        def no_constant(value: str) -> Any:
            raise ValidationError(f"{value} is not JSON (no NaN or Infinity)")

        try:
            value = json.loads(text, parse_constant=no_constant)
        except json.JSONDecodeError as exc:
            raise ValidationError(f"not valid JSON: {exc}")
        except ValueError as exc:  # an integer past Python's digit limit (4300 digits)
            raise ValidationError(f"{name}: {exc}; pass such a number as a JSON string")
        except RecursionError:
            raise ValidationError(f"{name} is nested too deeply to read")
        if not isinstance(value, kind):
            raise ValidationError(f"{name} must be a JSON {'list' if kind is list else 'object'}")
        try:
            arguments.check_json(value, name)
        except LeaseQueueError as exc:
            raise ValidationError(str(exc))
        return value

    def clean_args(self) -> list[Any]:
        args: list[Any] = self._load(self.cleaned_data["args"], list, "args")
        return args

    def clean_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = self._load(self.cleaned_data["kwargs"], dict, "kwargs")
        return kwargs

    def clean(self) -> dict[str, Any]:
        data = cast("dict[str, Any]", super().clean())  # Form.clean() returns cleaned_data
        if "args" in data and "kwargs" in data:
            try:
                arguments.encode_payload(data["args"], data["kwargs"], limit=get_settings().max_payload_bytes)
            except LeaseQueueError as exc:
                raise ValidationError(str(exc))
        return data


# ---------------------------------------------------------------------------------------------
# Jobs
# ---------------------------------------------------------------------------------------------


@admin.register(Job)
class JobAdmin(_JobAdminBase):
    """Jobs: a read-only view of the queue's rows plus replay, cancel and retry-now."""

    list_display: tuple[str, ...] = ("id", "status_badge", "task", "queue", "attempts_display", "run_at", "age",
                                     "last_error_short")
    list_display_links = ("id", "task")
    list_filter: ClassVar[tuple[_ListFilter, ...]] = ("status", QueueFilter, TaskFilter, HasErrorsFilter)
    search_fields = ("=id", "task", "=unique_key")
    search_help_text = "Job id (123 or #123), part of a task name, or an exact unique key."
    list_per_page = 100
    show_full_result_count = False  # no second COUNT(*) of the whole table per page load
    paginator = EstimatedCountPaginator
    sortable_by: ClassVar[tuple[str, ...]] = ("id", "status_badge", "task", "queue", "run_at", "age")
    actions = ["replay_selected", "cancel_selected", "retry_now_selected"]
    change_form_template = "admin/django_leasequeue/job/change_form.html"
    fieldsets = (
        (None, {"fields": (("id", "status_badge"), ("task", "queue", "priority"), ("unique_key", "unique_scope"),
                           ("schedule", "occurrence_at", "concurrency_key"))}),
        ("Arguments", {"fields": ("args_pretty", "kwargs_pretty")}),
        ("Errors", {"fields": ("errors_display",)}),
        ("History", {"fields": ("history_display",)}),
        ("Attempts and lease", {"fields": (("attempts", "max_attempts", "lease_version"),
                                           ("leased_until", "leased_by", "lease_seconds"),
                                           ("cancel_requested", "snoozes"))}),
        ("Times (database clock)", {"fields": (("run_at", "created_at"),
                                               ("started_at", "attempted_at", "finished_at"))}),
        ("Result", {"classes": ("collapse",), "fields": ("result_pretty",)}),
    )

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
        """Cancel and retry-now need ``change_job``."""
        return request.user.has_perm(f"{APP}.change_job")

    def get_readonly_fields(self, request: HttpRequest, obj: Job | None = None) -> list[str]:
        names: list[str] = []
        for _, options in self.fieldsets or ():
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
        digits = term.lstrip("#")
        if digits.isdigit() and int(digits) < 2**63:
            q = Q(pk=int(digits)) | Q(unique_key=term)
        return queryset.filter(q), False

    # -- list columns ----------------------------------------------------------------------------

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: Job) -> str:
        label = obj.status
        if obj.status == "ready" and obj.run_at and obj.run_at > timezone.now():
            label = "scheduled" if not obj.attempts else "retry wait"
        if obj.cancel_requested and obj.status == "leased":
            label = "leased, cancel requested"
        return format_html('<span class="lq-status lq-{}" style="color:{}">{}</span>', obj.status,
                           STATUS_COLOURS.get(obj.status, "inherit"), label)

    @admin.display(description="attempts")
    def attempts_display(self, obj: Job) -> str:
        return f"{obj.attempts}/{obj.max_attempts}"

    @admin.display(description="age", ordering="created_at")
    def age(self, obj: Job) -> str:
        return timesince(obj.created_at) if obj.created_at else "—"

    @admin.display(description="last error")
    def last_error_short(self, obj: Job) -> str:
        kind = getattr(obj, "last_error_type", None)
        if kind is None:
            return ""
        message = getattr(obj, "last_error_message", "") or ""
        return format_html('<span class="lq-error" title="{}"><b>{}</b> {}</span>', message,
                           kind.removeprefix("builtins."),
                           message[:80] + ("…" if len(message) > 80 else ""))

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

    @admin.display(description="failed attempts")
    def errors_display(self, obj: Job) -> str:
        if not obj.errors:
            return "none"
        replays = [_parse_time(h.get("at")) for h in obj.history if h.get("event") == "replayed"]
        entries = []
        for index, error in enumerate(obj.errors):
            at = _parse_time(error.get("at"))
            run = sum(1 for r in replays if r and at and r <= at)
            kind = str(error.get("type") or "Error").removeprefix("builtins.")
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
            path("<path:object_id>/replay/", wrap(self.replay_view), name=f"{prefix}_replay"),
            path("<path:object_id>/cancel/", wrap(self.cancel_view), name=f"{prefix}_cancel"),
            path("<path:object_id>/retry-now/", wrap(self.retry_now_view), name=f"{prefix}_retry_now"),
            *super().get_urls(),
        ]

    def save_model(self, request: HttpRequest, obj: Job, form: Any, change: Any) -> None:
        # Never write a job row from a form: only store.py changes job state (see change_view).
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
            "show_save": False, "show_save_and_continue": False, "show_save_and_add_another": False,
            "lq_dashboard_url": reverse(f"admin:{APP}_dashboard_changelist"),
        }
        if obj is not None:
            now = timezone.now()
            extra.update({
                "lq_job": obj,
                "lq_can_replay": obj.status in ("dead", "cancelled") and self.has_replay_permission(request),
                "lq_can_cancel": (obj.status == "ready" or (obj.status == "leased" and not obj.cancel_requested))
                and self.has_operate_permission(request),
                "lq_can_retry_now": obj.status == "ready" and obj.attempts > 0 and obj.run_at > now
                and self.has_operate_permission(request),
                "lq_replay_url": reverse(f"admin:{APP}_job_replay", args=[obj.pk]),
                "lq_cancel_url": reverse(f"admin:{APP}_job_cancel", args=[obj.pk]),
                "lq_retry_now_url": reverse(f"admin:{APP}_job_retry_now", args=[obj.pk]),
            })
        extra.update(extra_context or {})
        return super().change_view(request, object_id, form_url, extra)

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Job | None:
        # The change page loads the whole row (the list defers the heavy columns).
        try:
            return self.get_queryset(request).get(pk=int(object_id))
        except (ValueError, Job.DoesNotExist):
            return None

    def _job_or_404(self, request: HttpRequest, object_id: str) -> Job:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        try:
            return get_object_or_404(Job, pk=int(object_id))
        except ValueError:
            raise Http404("no such job")

    def _back(self, request: HttpRequest, job: Job) -> HttpResponse:
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

    @admin.action(description="Replay selected dead or cancelled jobs", permissions=["replay"])
    def replay_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        replay_jobs(request, _ids(queryset))

    @admin.action(description="Cancel selected jobs (ready: now; running: ask to stop)", permissions=["operate"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        cancel_jobs(request, _ids(queryset))

    @admin.action(description="Retry now (ready jobs waiting on a retry backoff)", permissions=["operate"])
    def retry_now_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        retry_now_jobs(request, _ids(queryset.filter(status="ready")))


@admin.register(DeadLetter)
class DeadLetterAdmin(JobAdmin):
    """Dead letters: only ``dead`` jobs, newest death first, grouped counts on top, Replay per row."""

    list_display = ("id", "task", "queue", "attempts_display", "died", "replay_button", "last_error_short")
    list_filter = (QueueFilter, TaskFilter)
    sortable_by = ("id", "task", "queue", "died")
    ordering = ("-finished_at", "-id")  # served by the partial index (status, finished_at)
    actions = ["replay_selected"]
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

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def get_list_display(self, request: HttpRequest) -> tuple[str, ...]:
        if self.has_replay_permission(request):
            return self.list_display
        return tuple(c for c in self.list_display if c != "replay_button")

    @admin.display(description="died", ordering="finished_at")
    def died(self, obj: Job) -> str:
        return format_html('<span title="{}">{} ago</span>', obj.finished_at, timesince(obj.finished_at)) \
            if obj.finished_at else "—"

    @admin.display(description="")
    def replay_button(self, obj: Job) -> str:
        # The changelist is one <form> with the CSRF token; this button posts it to the replay URL.
        url = reverse(f"admin:{APP}_job_replay", args=[obj.pk])
        return format_html('<button type="submit" class="button lq-replay" formaction="{}" formmethod="post" '
                           'name="_from" value="list" data-job="{}">Replay</button>', url, obj.pk)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        response = super().changelist_view(request, extra_context)
        context: dict[str, Any] | None = getattr(response, "context_data", None)
        cl = context.get("cl") if context else None
        if cl is not None and context is not None:
            groups = list(
                cl.queryset.order_by().values("task", "last_error_type")
                .annotate(n=Count("pk")).order_by("-n", "task")[:25]
            )
            for g in groups:
                g["error_type"] = (g["last_error_type"] or "").removeprefix("builtins.")
            context["lq_groups"] = groups
            context["lq_group_total"] = sum(g["n"] for g in groups)
        return response


# ---------------------------------------------------------------------------------------------
# Schedules
# ---------------------------------------------------------------------------------------------


_CRON_ALIASES = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
                 "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}


def describe_cron(expr: str) -> str:
    """The expression in words (cron-descriptor), e.g. ``"At 02:30, Monday through Friday"``.

    A 6-field expression has its seconds LAST (croniter's convention, see :mod:`cron`), while
    cron-descriptor expects them first, so the field is moved before describing.
    """
    from cron_descriptor import ExpressionDescriptor, Options

    text = (expr or "").strip()
    text = _CRON_ALIASES.get(text.lower(), text)
    fields = text.split()
    if len(fields) == 6:
        fields = [fields[5], *fields[:5]]
    options = Options()
    options.use_24hour_time_format = True  # explicit: the default varies with the environment
    try:
        return str(ExpressionDescriptor(" ".join(fields), options).get_description())
    except Exception as exc:  # cron-descriptor is only a description; validation is cron.py's
        return f"(cannot describe: {exc})"


class ScheduleForm(_ScheduleFormBase):
    """Schedule form. Validation is the model's own (``Schedule.clean_fields``: cron, zone, task,
    JSON arguments, queue, priority, catch-up limit), which the ModelForm runs through
    ``full_clean()``, so each problem is shown on its field."""

    class Meta:
        model = Schedule
        fields = ("name", "task", "cron", "timezone", "args", "kwargs", "queue", "priority", "enabled",
                  "catch_up", "catch_up_limit")
        help_texts = {
            "cron": "5 fields (minute hour day month weekday), or 6 with seconds last; @daily, @hourly… "
                    "Evaluated on the wall clock of the time zone below.",
            "timezone": "IANA name such as Europe/Berlin; blank: the project's TIME_ZONE.",
        }

    # The model reports bad arguments with code "invalid", which a ModelForm replaces by the form
    # field's own "invalid" message ("Enter a valid JSON.") for JSON fields; checking them here
    # keeps the precise message (and the model then skips the fields that failed).
    def _json_of(self, name: str, kind: type) -> Any:
        value = self.cleaned_data.get(name)
        if not isinstance(value, kind):
            what = "list of positional arguments" if kind is list else "object of keyword arguments"
            raise ValidationError(f"{name} must be a JSON {what}, got {json.dumps(value)}")
        try:
            arguments.check_json(value, name)
        except LeaseQueueError as exc:
            raise ValidationError(str(exc))
        return value

    def clean_args(self) -> list[Any]:
        args: list[Any] = self._json_of("args", list)
        return args

    def clean_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = self._json_of("kwargs", dict)
        return kwargs


def run_schedule_now(request: HttpRequest, schedule: Schedule, nonce: str | None = None) -> Job | None:
    """Enqueue one job of ``schedule`` now, with its own unique key (never an occurrence's key).

    The key is ``leasequeue:schedule:<id>:run-now:<nonce>``; the change page's button carries a
    nonce made when the page was rendered, so a double-submitted form enqueues one job. The job is
    written through :func:`~django_leasequeue.enqueueing.insert_jobs`, so it sends one ``enqueued``
    event like every other enqueue.

    Args:
        request: the admin request (its messages report the outcome).
        schedule: the schedule to run.
        nonce: the page's nonce; None: a fresh one (every call enqueues).

    Returns:
        The new job, the job this nonce already enqueued, or None when the schedule's task or
        arguments are refused (the message says why).
    """
    try:
        task_spec = registry.get_task(schedule.task)
        if not isinstance(task_spec, registry.TaskSpec):  # e.g. a Django tasks backend task: default options
            task_spec = registry.TaskSpec(func=task_spec, name=schedule.task)
        new = build_job(task_spec, schedule.args, schedule.kwargs, queue=schedule.queue or None,
                        priority=schedule.priority, schedule_id=schedule.pk,
                        unique_key=f"leasequeue:schedule:{schedule.pk}:run-now:{nonce or uuid.uuid4().hex}")
    except LeaseQueueError as exc:
        messages.error(request, f"Schedule {schedule.name!r} was not run: {exc}")
        return None
    rows = insert_jobs([new])
    if not rows:
        job = store.job_get_by_unique_key(cast(str, new.unique_key), new.unique_scope)
        if job is not None:
            messages.info(request, format_html('Schedule {} was already run from this page: job <a href="{}">#{}</a>.',
                                               schedule.name, reverse(f"admin:{APP}_job_change", args=[job.pk]),
                                               job.pk))
        return job
    job = rows[0]
    messages.success(request, format_html('Enqueued job <a href="{}">#{}</a> of schedule {}.',
                                          reverse(f"admin:{APP}_job_change", args=[job.pk]), job.pk, schedule.name))
    return job


@admin.register(Schedule)
class ScheduleAdmin(_ScheduleAdminBase):
    """Schedules: cron in words, the next five occurrences, enable/disable and "run now"."""

    form = ScheduleForm
    list_display = ("name", "task", "cron", "cron_words", "zone", "enabled", "next_occurrence_at",
                    "last_occurrence_at")
    list_filter = ("enabled", "source")
    search_fields = ("name", "task")
    actions = ["enable_selected", "disable_selected", "run_now_selected"]
    readonly_fields = ("cron_words", "next_five", "last_occurrence_at", "next_occurrence_at",
                       "skipped_occurrences", "source", "created_at", "updated_at")
    change_form_template = "admin/django_leasequeue/schedule/change_form.html"

    def get_fieldsets(self, request: HttpRequest, obj: Schedule | None = None) -> Any:
        return (
            (None, {"fields": ("name", "task", "args", "kwargs", "queue", "priority", "enabled")}),
            ("When", {"fields": ("cron", "timezone", "cron_words", "next_five", "catch_up", "catch_up_limit")}),
            ("State", {"fields": ("last_occurrence_at", "next_occurrence_at", "skipped_occurrences", "source",
                                  "created_at", "updated_at")}),
        )

    @admin.display(description="in words")
    def cron_words(self, obj: Schedule) -> str:
        return describe_cron(obj.cron) if obj and obj.cron else "—"

    @admin.display(description="time zone")
    def zone(self, obj: Schedule) -> str:
        return obj.timezone or f"({obj.zone_name})"

    @admin.display(description="next five occurrences")
    def next_five(self, obj: Schedule) -> str:
        if not obj or not obj.pk:
            return "—"
        zone_name = obj.zone_name
        try:
            zone = ZoneInfo(zone_name)
            start = store.db_now()
            found = []
            after = start
            for _ in range(5):
                after = cron.next_occurrence(obj.cron, zone_name, after)
                found.append(after)
        except (ValueError, LeaseQueueError, KeyError) as exc:
            return f"cannot compute: {exc}"
        return format_html("<ol class='lq-occurrences'>{}</ol>", format_html_join(
            "", "<li>{} <span class='quiet'>({} UTC)</span></li>",
            ((o.astimezone(zone).strftime("%a %Y-%m-%d %H:%M:%S %Z"), o.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S"))
             for o in found)))

    def get_urls(self) -> list[URLPattern]:
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        return [path("<path:object_id>/run-now/", self.admin_site.admin_view(self.run_now_view),
                     name=f"{prefix}_run_now"), *super().get_urls()]

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        extra: dict[str, Any] = {"lq_run_now_nonce": uuid.uuid4().hex,
                 "lq_can_run_now": self.has_change_permission(request)}
        extra.update(extra_context or {})
        return super().change_view(request, object_id, form_url, extra)

    def run_now_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST: enqueue one job of the schedule now. Needs ``change_schedule``."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_change_permission(request):
            raise PermissionDenied
        schedule = get_object_or_404(Schedule, pk=object_id)
        nonce = "".join(c for c in request.POST.get("nonce", "") if c.isalnum())[:32] or None
        run_schedule_now(request, schedule, nonce)
        return HttpResponseRedirect(reverse(f"admin:{APP}_schedule_change", args=[schedule.pk]))

    def _set_enabled(self, request: HttpRequest, queryset: QuerySet[Schedule], enabled: bool) -> None:
        # Schedules are few; save() each so the model keeps next_occurrence_at right (a re-enabled
        # schedule starts from now: runs missed while it was off are not caught up).
        changed = 0
        for schedule in queryset.filter(enabled=not enabled):
            schedule.enabled = enabled
            try:
                schedule.save()
            except ValidationError as exc:
                messages.error(request, f"Schedule {schedule.name!r} was not {'enabled' if enabled else 'disabled'}: "
                                        + "; ".join(m for ms in exc.message_dict.values() for m in ms))
                continue
            changed += 1
        verb = "Enabled" if enabled else "Disabled"
        messages.success(request, f"{verb} {changed} schedule{'s' if changed != 1 else ''}.")

    @admin.action(description="Enable selected schedules (from now on: missed runs are not caught up)",
                  permissions=["change"])
    def enable_selected(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._set_enabled(request, queryset, True)

    @admin.action(description="Disable selected schedules", permissions=["change"])
    def disable_selected(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._set_enabled(request, queryset, False)

    @admin.action(description="Run selected schedules now (one job each)", permissions=["change"])
    def run_now_selected(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        for schedule in queryset:
            run_schedule_now(request, schedule)


# ---------------------------------------------------------------------------------------------
# Queue dashboard
# ---------------------------------------------------------------------------------------------


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
        ]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        from . import health

        snap = health.snapshot()
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
            "refresh": int(refresh) if refresh.isdigit() and 2 <= int(refresh) <= 3600 else None,
            "job_list_url": job_list, "dead_list_url": dead_list,
            "schedule_list_url": reverse(f"admin:{APP}_schedule_changelist"),
        }
        context.update(extra_context or {})
        return TemplateResponse(request, "admin/django_leasequeue/dashboard.html", context)

    def _toggle(self, request: HttpRequest, pause: bool) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_pause_permission(request):
            raise PermissionDenied
        name = request.POST.get("queue", "").strip()
        if not name or len(name) > 100:
            messages.error(request, "No queue given.")
        elif pause and queue_name_problem(name):
            # Resuming stays possible for a queue paused under a name written before the grammar.
            messages.error(request, str(queue_name_problem(name)))
        elif pause:
            changed = store.queue_pause(name, by=_by(request))
            messages.success(request, f"Queue {name!r} is paused: workers claim nothing from it until it is "
                                      "resumed; running jobs finish." if changed
                             else f"Queue {name!r} was already paused.")
        else:
            changed = store.queue_resume(name)
            messages.success(request, f"Queue {name!r} runs again." if changed else f"Queue {name!r} was not paused.")
        return HttpResponseRedirect(reverse(f"admin:{APP}_dashboard_changelist"))

    def pause_view(self, request: HttpRequest) -> HttpResponse:
        """POST ``queue=<name>``: pause the queue (``store.queue_pause``)."""
        return self._toggle(request, True)

    def resume_view(self, request: HttpRequest) -> HttpResponse:
        """POST ``queue=<name>``: resume the queue (``store.queue_resume``)."""
        return self._toggle(request, False)
