"""The job list's machinery for large tables (C24): an estimated count, deferred heavy columns
and filters whose choices never scan the job table."""

from __future__ import annotations

import json
from typing import Any, cast

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.db.models.fields.json import KT
from django.db.models.functions import Left
from django.http import HttpRequest
from django.utils.functional import cached_property

from .. import registry, store
from ..conf import get_settings
from ..models import QueueState
from .common import _PaginatorBase, parse_id

#: Up to this many matching rows the job list shows an exact count; beyond it, the planner's
#: estimate (an exact count of a million rows costs a scan per page load).
EXACT_COUNT_LIMIT = 10_000

#: Columns the job list never loads (C24: a 1 MB kwargs must not travel for a list row). The trace
#: context too: no list shows it, and a row written by hand may hold megabytes, or JSON nested too
#: deeply for Python to decode (the whole page would fail on that one row).
HEAVY_FIELDS = ("args", "kwargs", "errors", "history", "result", "trace_context")


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
            last_error_at=KT("errors__-1__at"),
        )
        return result

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        # The states on the page ("retry wait", "snoozed", "lease expired") are judged by the
        # database clock, read once for the page.
        self.lq_now = store.db_now()
        for job in self.result_list:
            job.lq_now = self.lq_now


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


def queues_with_jobs() -> list[str]:
    """The job list's queue choices: :func:`known_queues` plus every queue that holds a ready or
    waiting job, found by a skip scan of the claim and waiting indexes (one index probe per queue,
    never a ``SELECT DISTINCT`` over the job table; :func:`~django_leasequeue.store.queue_names_holding`)."""
    return store.queue_names_holding(known_queues())


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
        value = self.value()
        if not value:
            return queryset
        if "\x00" in value:
            # PostgreSQL text cannot hold a NUL, so no row has this name; sent as a parameter, the
            # database would refuse the statement (a 500 from a hand-edited URL).
            return queryset.none()
        return queryset.filter(**{self.field: value})


class QueueFilter(_NameFilter):
    """Filter by queue; the choices come from settings, queue rows, tasks and a skip scan of the
    claim index (:func:`queues_with_jobs`), not from a ``SELECT DISTINCT queue`` of the job table,
    which would read every row of a large table on each page load."""

    title = "queue"
    parameter_name = field = "queue"

    def names(self) -> list[str]:
        if getattr(self, "dead_only", False):
            return store.dead_queue_names()
        return queues_with_jobs()

    dead_only = False


class TaskFilter(_NameFilter):
    """Filter by task; the choices are the registered tasks, shown by their function name unless
    two tasks share it (then by the full name)."""

    title = "task"
    parameter_name = field = "task"

    dead_only = False

    def names(self) -> list[str]:
        if self.dead_only:
            return store.dead_task_names()
        registry.autodiscover()
        return sorted(registry.registered_tasks())

    def label(self, name: str, names: list[str]) -> str:
        short = name.rsplit(".", 1)[-1]
        return short if [n.rsplit(".", 1)[-1] for n in names].count(short) == 1 else name

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]) -> list[tuple[str, str]]:
        # Sorted by the label shown (a short name sorts where the operator looks for it).
        return sorted(super().lookups(request, model_admin), key=lambda choice: (choice[1].lower(), choice[0]))


class DeadQueueFilter(QueueFilter):
    """The queue filter of Dead letters: the queues that hold dead jobs (read from the dead rows only)."""

    dead_only = True


class DeadTaskFilter(TaskFilter):
    """The task filter of Dead letters: the tasks that have dead jobs, sorted by the label shown."""

    dead_only = True


class WorkflowFilter(admin.SimpleListFilter):
    """The jobs of one workflow (members and callbacks): ``?workflow__id__exact=<id>``, the link of a
    workflow's page. It offers no choices of its own (listing every workflow would read the workflow
    table on each page load); it shows only while active, so the operator sees it and can clear it."""

    title = "workflow"
    parameter_name = "workflow__id__exact"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]) -> list[tuple[str, str]]:
        value = self.value()
        return [(value, f"workflow #{value}")] if value else []

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        workflow_id = parse_id(value)
        if workflow_id is None:
            raise IncorrectLookupParameters(f"workflow id must be a number, got {value!r}")
        return queryset.filter(workflow_id=workflow_id)


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
