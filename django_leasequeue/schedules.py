"""The schedules service: validation of a schedule's definition and planning of its next occurrence.

:class:`~django_leasequeue.models.Schedule` is data only and imports no service. Its
``clean_fields()`` and ``save()`` call the hooks the app config's ``ready()`` installs from this
module (:func:`~django_leasequeue.models.install_schedule_service`), so every path that validates
or saves a schedule (the admin, user code, ``Schedule.objects.create``, the settings sync through
``full_clean()``) runs the same checks and the same planning.

Planning rules (docs/howto/schedules.md): a new schedule starts with the first occurrence after its
creation; a changed cron expression or time zone, or a re-enabled schedule, gets the first
occurrence after the save under the new definition (no back-fill, no burst, never an occurrence
already emitted); a disabled one has none. Saving an existing schedule writes only its definition
fields, under the row lock: the scheduler's bookkeeping is never written back from a copy. Times are
database time (:func:`store.db_now`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from django.db import router, transaction

from . import cron, payload, registry, store
from .conf import get_settings
from .exceptions import PayloadNotSerializable, UnknownTask
from .models import SCHEDULE_BOOKKEEPING, Schedule, schedule_zone_name


def definition_errors(schedule: Schedule, skip: set[str]) -> Iterator[tuple[str, str]]:
    """Check a schedule's definition beyond Django's own field validation.

    Refuses an invalid cron expression, an unknown time zone, an unregistered task (for an enabled
    schedule), arguments that are not a JSON list / object or do not round-trip through JSON, a
    queue that ``LEASEQUEUE["QUEUES"]`` does not allow, a priority outside -100..100 and a
    ``catch_up_limit`` below 1.

    Args:
        schedule: the (unsaved or saved) schedule to check; not modified.
        skip: field names not to check (excluded by the caller, or already in error).

    Yields:
        ``(field name, message)`` for each problem, the message naming the offending value.
    """
    if "cron" not in skip:
        try:
            cron.validate_cron(schedule.cron)
        except cron.InvalidCron as exc:
            yield "cron", str(exc)
    if "timezone" not in skip:
        try:
            cron.validate_timezone(schedule.zone_name)
        except cron.InvalidTimezone as exc:
            where = "" if schedule.timezone else " (blank timezone: the project's TIME_ZONE)"
            yield "timezone", f"{exc}{where}"
    if "task" not in skip and schedule.enabled:
        registry.autodiscover()
        try:
            registry.get_task(schedule.task)
        except UnknownTask:
            hint = registry.did_you_mean(schedule.task)
            hint = f"; {hint}" if hint else ""
            yield "task", (f"task {schedule.task!r} is not registered (no @task of that name in an app's "
                           f"tasks.py / jobs.py or in LEASEQUEUE['IMPORTS']){hint}")
    if "args" not in skip:
        if not isinstance(schedule.args, list):
            yield "args", f"args must be a JSON list of positional arguments, got {schedule.args!r}"
        else:
            yield from _json_errors(schedule.args, "args")
    if "kwargs" not in skip:
        if not isinstance(schedule.kwargs, dict):
            yield "kwargs", f"kwargs must be a JSON object of keyword arguments, got {schedule.kwargs!r}"
        else:
            yield from _json_errors(schedule.kwargs, "kwargs")
    if "queue" not in skip and schedule.queue:
        settings = get_settings()
        if not settings.queue_allowed(schedule.queue):
            allowed = sorted(settings.queues or [])
            yield "queue", f"unknown queue {schedule.queue!r}; LEASEQUEUE['QUEUES'] allows {allowed}"
    if "priority" not in skip and isinstance(schedule.priority, int) and not -100 <= schedule.priority <= 100:
        yield "priority", f"priority must be from -100 to 100, got {schedule.priority!r}"
    if ("catch_up_limit" not in skip and isinstance(schedule.catch_up_limit, int)
            and schedule.catch_up_limit < 1):
        yield "catch_up_limit", f"catch_up_limit must be >= 1, got {schedule.catch_up_limit!r}"


def _json_errors(value: Any, field: str) -> Iterator[tuple[str, str]]:
    try:
        payload.check_json(value, field)
    except PayloadNotSerializable as exc:
        yield field, str(exc)


def save(schedule: Schedule, write: Callable[..., None], **kwargs: Any) -> None:
    """Keep ``next_occurrence_at`` right, then write the (already validated) schedule.

    A new schedule is inserted with the first occurrence after its creation. An existing one is
    updated in one transaction that first locks its row (:func:`store.schedule_lock_for_save`):
    only the definition fields are written (``update_fields``, minus the scheduler's bookkeeping
    :data:`~django_leasequeue.models.SCHEDULE_BOOKKEEPING`), so a copy read before a scheduler tick
    (an admin form) cannot put that bookkeeping back. When the save changes the cron expression or
    time zone, or re-enables the schedule, ``next_occurrence_at`` is recomputed under the lock from
    database time, never at or before the last occurrence already emitted; disabling clears it. The
    instance's bookkeeping attributes are refreshed from the locked row.

    Args:
        schedule: the schedule to save; its bookkeeping attributes are updated in place.
        write: Django's own ``Model.save`` bound to ``schedule``; called once with ``kwargs``
            (``update_fields`` narrowed for an existing row).
        **kwargs: as :meth:`django.db.models.Model.save` (``using``, ``update_fields``...).
    """
    using = kwargs.get("using") or router.db_for_write(type(schedule), instance=schedule)
    if schedule._state.adding or schedule.pk is None or kwargs.get("force_insert"):
        plan_new_occurrence(schedule, using)
        write(**kwargs)
        return
    with transaction.atomic(using=using):
        old = store.schedule_lock_for_save(schedule.pk, alias=using)
        if old is None:  # deleted meanwhile: Django's save() inserts it again, as a new row
            plan_new_occurrence(schedule, using)
            write(**kwargs)
            return
        replan = replan_next_occurrence(schedule, old, using)
        update_fields = kwargs.get("update_fields")
        owned = ({f.name for f in schedule._meta.concrete_fields if not f.primary_key} if update_fields is None
                 else set(update_fields)) - set(SCHEDULE_BOOKKEEPING)
        if replan:
            owned.add("next_occurrence_at")
        else:
            schedule.next_occurrence_at = old["next_occurrence_at"]
        schedule.last_occurrence_at = old["last_occurrence_at"]
        schedule.skipped_occurrences = old["skipped_occurrences"]
        schedule.paused_skipped = old["paused_skipped"]
        schedule.paused_coalesced = old["paused_coalesced"]
        schedule.paused_log = old["paused_log"]
        write(**{**kwargs, "update_fields": owned})


def plan_new_occurrence(schedule: Schedule, using: str) -> None:
    """Set ``next_occurrence_at`` of a schedule about to be inserted.

    Args:
        schedule: the schedule; modified in place.
        using: database alias whose clock is read.

    None if the schedule is disabled; else the first occurrence after database time, unless the
    caller already gave the bookkeeping (``last_occurrence_at`` or ``next_occurrence_at``).
    """
    if not schedule.enabled:
        schedule.next_occurrence_at = None
    elif schedule.last_occurrence_at is None and schedule.next_occurrence_at is None:
        schedule.next_occurrence_at = cron.next_occurrence(schedule.cron, schedule.zone_name, store.db_now(using))


def replan_next_occurrence(schedule: Schedule, old: dict[str, Any], using: str) -> bool:
    """Recompute ``next_occurrence_at`` if this save changes what it depends on.

    Args:
        schedule: the schedule being saved; modified in place.
        old: the locked row's ``cron``, ``timezone``, ``enabled`` and bookkeeping fields.
        using: database alias whose clock is read.

    Returns:
        True when ``next_occurrence_at`` was recomputed (a new cron expression or time zone, or
        re-enabled: the first occurrence after database time and after the last one emitted)
        or cleared (disabled); False when the stored value stands.
    """
    if not schedule.enabled:
        schedule.next_occurrence_at = None
        return old["next_occurrence_at"] is not None
    if (old["cron"] == schedule.cron and schedule_zone_name(old["timezone"]) == schedule.zone_name
            and old["enabled"]):
        return False
    # From the later of now and the last occurrence emitted: no back-fill, and never an
    # occurrence the scheduler already emitted (its job may have been pruned since).
    after = _latest(store.db_now(using), old["last_occurrence_at"])
    schedule.next_occurrence_at = cron.next_occurrence(schedule.cron, schedule.zone_name, after)
    return True


def _latest(now: datetime, last: datetime | None) -> datetime:
    return now if last is None else max(now, last)
