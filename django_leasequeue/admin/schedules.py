"""The schedule admin: the form, cron in words, the next five occurrences, enable/disable and
"run now"."""

from __future__ import annotations

import json
import uuid
from datetime import UTC
from typing import Any, cast
from zoneinfo import ZoneInfo

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join

from .. import cron, registry, store
from ..enqueueing import build_job, insert_jobs
from ..exceptions import LeaseQueueError
from ..models import Job, Schedule
from .common import APP, _ScheduleAdminBase, _ScheduleFormBase, check_json_field, parse_id
from .schedule_history import HISTORY_SHOWN, history_html, in_zone, in_zone_cell
from .states import time_field
from .workers import relative

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
    except Exception as exc:  # cron-descriptor is only a description; validation is the cron package's
        return f"(cannot describe: {exc})"


class ScheduleForm(_ScheduleFormBase):
    """Schedule form. Validation is the model's own (``Schedule.clean_fields``: cron, zone, task,
    JSON arguments, queue, priority, catch-up limit), which the ModelForm runs through
    ``full_clean()``, so each problem is shown on its field."""

    class Meta:
        model = Schedule
        fields = ("name", "task", "cron", "timezone", "args", "kwargs", "queue", "priority", "enabled",
                  "catch_up", "catch_up_limit", "when_paused")
        help_texts = {
            "cron": "5 fields (minute hour day month weekday), or 6 with seconds last; @daily, @hourly… "
                    "Evaluated on the wall clock of the time zone below.",
            "timezone": "IANA name such as Europe/Berlin; blank: the project's TIME_ZONE.",
            "when_paused": "What an occurrence due while the target queue is paused becomes: latest keeps one "
                           "pending job (the latest occurrence, older pending ones are cancelled as coalesced), "
                           "skip emits nothing, all emits every occurrence.",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A form posted without the field (a script written before it existed) keeps the stored
        # policy, or the default for a new schedule, instead of failing as "required".
        if "when_paused" in self.fields:
            self.fields["when_paused"].required = False

    def clean_when_paused(self) -> str:
        value = self.cleaned_data.get("when_paused")
        if not value:
            value = self.instance.when_paused if self.instance.pk else Schedule.WhenPaused.LATEST
        return str(value)

    # The model reports bad arguments with code "invalid", which a ModelForm replaces by the form
    # field's own "invalid" message ("Enter a valid JSON.") for JSON fields; checking them here
    # keeps the precise message (and the model then skips the fields that failed).
    def _json_of(self, name: str, kind: type) -> Any:
        value = self.cleaned_data.get(name)
        if not isinstance(value, kind):
            what = "list of positional arguments" if kind is list else "object of keyword arguments"
            raise ValidationError(f"{name} must be a JSON {what}, got {json.dumps(value)}")
        check_json_field(value, name)
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
    # Few columns, so that next and last run stay visible on a laptop and a phone (bug 1): the raw
    # cron is under its words, the zone is in the times themselves (bug 9), when_paused is a filter.
    list_display = ("name", "task", "cron_words", "enabled", "next_run", "last_run", "paused_record")
    list_filter = ("enabled", "source", "when_paused")
    search_fields = ("name", "task")
    actions = ["enable_selected", "disable_selected", "run_now_selected"]
    change_list_template = "admin/django_leasequeue/schedule/change_list.html"
    readonly_fields = ("cron_words", "next_five", "next_run", "next_run_relative", "history_table",
                       "last_occurrence_at_display", "next_occurrence_at_display",
                       "skipped_occurrences", "source", "created_at_display", "updated_at_display", "paused_skipped",
                       "paused_coalesced", "paused_log_table")
    change_form_template = "admin/django_leasequeue/schedule/change_form.html"

    def get_fieldsets(self, request: HttpRequest, obj: Schedule | None = None) -> Any:
        return (
            (None, {"fields": ("name", "task", "args", "kwargs", "queue", "priority", "enabled")}),
            ("When", {"fields": ("cron", "timezone", "cron_words", "next_five", "catch_up", "catch_up_limit")}),
            ("History", {"fields": ("next_run_relative", "history_table"), "classes": ("lq-history-set",)}),
            ("State", {"fields": ("last_occurrence_at_display", "next_occurrence_at_display", "skipped_occurrences",
                                  "source", "created_at_display", "updated_at_display")}),
            ("While the queue is paused", {"fields": ("when_paused", "paused_skipped", "paused_coalesced",
                                                      "paused_log_table")}),
        )

    @admin.display(description="while paused: skipped / coalesced")
    def paused_record(self, obj: Schedule) -> str:
        return f"{obj.paused_skipped} / {obj.paused_coalesced}"

    @admin.display(description="recent skipped or coalesced occurrences")
    def paused_log_table(self, obj: Schedule) -> str:
        if not obj or not obj.paused_log:
            return "—"
        rows = []
        for entry in reversed(obj.paused_log):  # newest first
            job = entry.get("job")
            link = (format_html('<a href="{}">#{}</a>', reverse(f"admin:{APP}_job_change", args=[job]), job)
                    if job else "—")
            rows.append((entry.get("occurrence", ""), entry.get("action", ""), entry.get("queue", ""), link,
                         entry.get("kept") or "—", entry.get("at", "")))
        return format_html(
            "<table class='lq-paused-log'><thead><tr><th>occurrence</th><th>action</th><th>queue</th>"
            "<th>cancelled job</th><th>kept occurrence</th><th>at</th></tr></thead><tbody>{}</tbody></table>",
            format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                             rows))

    @admin.display(description="when")
    def cron_words(self, obj: Schedule) -> str:
        if not obj or not obj.cron:
            return "—"
        return format_html('{}<br><code class="lq-meta">{}</code>', describe_cron(obj.cron), obj.cron)

    def _zone(self, obj: Schedule) -> ZoneInfo | None:
        try:
            return ZoneInfo(obj.zone_name)
        except (ValueError, KeyError):
            return None

    last_occurrence_at_display = time_field("last_occurrence_at", "last occurrence (admin time zone)")
    next_occurrence_at_display = time_field("next_occurrence_at", "next occurrence (admin time zone)")
    created_at_display = time_field("created_at", "created")
    updated_at_display = time_field("updated_at", "updated")

    @admin.display(description="next run", ordering="next_occurrence_at")
    def next_run(self, obj: Schedule) -> str:
        """The next occurrence in the schedule's zone, to the second, with the zone."""
        if not obj or obj.next_occurrence_at is None:
            return "—" if not obj or obj.enabled else "— (disabled)"
        return in_zone_cell(obj.next_occurrence_at, self._zone(obj) or UTC)

    @admin.display(description="next run")
    def next_run_relative(self, obj: Schedule) -> str:
        """The next occurrence in the schedule's zone and how far off it is by the database clock."""
        if not obj or obj.next_occurrence_at is None:
            return self.next_run(obj)
        left = (obj.next_occurrence_at - store.db_now()).total_seconds()
        return format_html('{} <span class="lq-meta">({})</span>',
                           in_zone(obj.next_occurrence_at, self._zone(obj) or UTC), relative(left))

    @admin.display(description="last run", ordering="last_occurrence_at")
    def last_run(self, obj: Schedule) -> str:
        """The last occurrence emitted, in the schedule's zone."""
        return in_zone_cell(obj.last_occurrence_at, self._zone(obj) or UTC) if obj else "—"

    @admin.display(description=f"last {HISTORY_SHOWN} occurrences")
    def history_table(self, obj: Schedule) -> str:
        if not obj or not obj.pk:
            return "—"
        return history_html(obj, self._zone(obj) or UTC, store.db_now())

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
        schedule_id = parse_id(object_id)  # "abc" or "²" would make the lookup raise ValueError (a 500)
        if schedule_id is None:
            raise Http404("no such schedule")
        schedule = get_object_or_404(Schedule, pk=schedule_id)
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
