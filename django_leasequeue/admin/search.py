"""Incident search on the job list and Dead letters: by error type, text of the error message,
arguments (jsonb containment) and the time of the last failure, plus the state filter (the
operator's states, judged by the database clock).

The search is a list filter (:class:`IncidentSearchFilter`), so it composes with the other
filters, "Select all N" and the bulk actions, and keeps the list's large-table machinery
(listing.py: the bounded count, deferred heavy columns, no ``SELECT DISTINCT``). Invalid input (bad
JSON, an unknown state, a "from" after "to") is an error message above an empty list, never a 500.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import DateTimeField, F, Q, QuerySet
from django.db.models.fields.json import KT
from django.db.models.functions import Cast
from django.http import HttpRequest

from .. import store
from .states import STATES

#: The "failed within" choices: label and seconds.
FAILED_WITHIN = {"15m": ("last 15 min", 15 * 60), "1h": ("last hour", 3600), "24h": ("last 24 h", 86_400),
                 "7d": ("last 7 days", 7 * 86_400)}

#: The query parameters of the incident search.
SEARCH_PARAMS = ("error_type", "error", "args", "failed", "failed_from", "failed_to")


def parse_arguments(text: str) -> Any:
    """What "arguments contain" means: a JSON object (``{"customer": "ACME"}``), ``key=value``
    (``customer=ACME``; the value read as JSON when it is JSON, else as a string), any other JSON
    value (a positional argument), or a bare word (a positional string).

    Args:
        text: what the operator typed.

    Returns:
        The decoded value: a dict is matched against kwargs (and each positional dict), anything
        else against the positional arguments.

    Raises:
        forms.ValidationError: the text starts like JSON (``{`` or ``[``) and is not valid JSON.
    """
    text = text.strip()
    if text[:1] in "{[":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(f"arguments: not valid JSON ({exc.msg} at character {exc.pos + 1})")
    if "=" in text:
        key, _, raw = text.partition("=")
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        return {key.strip(): value}
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


class IncidentSearchForm(forms.Form):
    """The fields of the incident search (all optional); times are read in the admin's time zone."""

    error_type = forms.CharField(required=False, label="error type",
                                 help_text="the class name (ValueError), or its full name with the module")
    error = forms.CharField(required=False, label="error message contains")
    args = forms.CharField(required=False, label="arguments contain",
                           help_text='{"customer": "ACME"} or customer=ACME')
    failed = forms.ChoiceField(required=False, label="last failure",
                               choices=[("", "any time"), *((k, v[0]) for k, v in FAILED_WITHIN.items())])
    failed_from = forms.DateTimeField(required=False, label="failed from")
    failed_to = forms.DateTimeField(required=False, label="failed to")

    def clean_args(self) -> Any:
        text = self.cleaned_data.get("args") or ""
        return parse_arguments(text) if text.strip() else None

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        start, end = data.get("failed_from"), data.get("failed_to")
        if start and end and start > end:
            raise forms.ValidationError("failed from is after failed to")
        return data


def _last(params: dict[str, Any], name: str) -> str | None:
    value = params.pop(name, None)
    if isinstance(value, list):  # Django 5+ passes each parameter's values as a list
        value = value[-1] if value else None
    return None if value is None else str(value)


class IncidentSearchFilter(admin.ListFilter):
    """The incident search as a list filter: its form renders in the filter sidebar, its
    parameters are the form's fields (:data:`SEARCH_PARAMS`)."""

    title = "incident search"
    template = "admin/django_leasequeue/job/search_filter.html"

    def __init__(self, request: HttpRequest, params: dict[str, Any], model: Any, model_admin: Any) -> None:
        super().__init__(request, params, model, model_admin)
        data = {name: value for name in SEARCH_PARAMS if (value := _last(params, name)) is not None}
        self.used_parameters = dict(data)
        self.form = IncidentSearchForm(data)
        self.valid = self.form.is_valid()

    def has_output(self) -> bool:
        return True

    def expected_parameters(self) -> list[str | None]:
        return list(SEARCH_PARAMS)

    def choices(self, changelist: Any) -> Iterator[dict[str, Any]]:
        # The form is a GET form of its own: the list's other filters ride along as hidden fields.
        hidden = []
        for key, value in changelist.params.items():
            if key in SEARCH_PARAMS or key == "p":
                continue
            for item in value if isinstance(value, list) else [value]:
                hidden.append((key, item))
        yield {"form": self.form, "hidden": hidden, "active": bool(self.used_parameters),
               "clear": changelist.get_query_string(remove=list(SEARCH_PARAMS))}

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if not self.used_parameters:
            return queryset
        if not self.valid:
            errors = "; ".join(str(e) for errs in self.form.errors.values() for e in errs)
            messages.error(request, f"Search not applied: {errors}.")
            return queryset.none()
        return search(queryset, self.form.cleaned_data)


def search(queryset: QuerySet[Any], data: dict[str, Any], now: datetime | None = None) -> QuerySet[Any]:
    """Filter jobs by the incident search's cleaned fields.

    Args:
        queryset: jobs.
        data: :class:`IncidentSearchForm`'s cleaned data (``error_type``, ``error``, ``args``,
            ``failed``, ``failed_from``, ``failed_to``; empty ones are ignored).
        now: the database clock for "last 15 min" and the like (None: read it, one statement).

    Returns:
        The filtered queryset (jsonb containment ``@>`` for the arguments, a case-insensitive
        substring of the last error's message, the last error's type exactly or by class name).
    """
    kind = (data.get("error_type") or "").strip()
    if kind:
        queryset = queryset.alias(lq_type=KT("errors__-1__type"))
        if kind == "-":  # the error groups' "(no error recorded)"
            queryset = queryset.filter(errors=[])
        elif "." in kind:
            queryset = queryset.filter(lq_type=kind)
        else:
            queryset = queryset.filter(Q(lq_type=kind) | Q(lq_type__endswith=f".{kind}"))
    text = (data.get("error") or "").strip()
    if text:
        queryset = queryset.alias(lq_message=KT("errors__-1__message")).filter(lq_message__icontains=text)
    value = data.get("args")
    if value is not None:
        if isinstance(value, dict):
            queryset = queryset.filter(Q(kwargs__contains=value) | Q(args__contains=[value]))
        elif isinstance(value, list):
            queryset = queryset.filter(args__contains=value)
        else:
            queryset = queryset.filter(args__contains=[value])
    start, end = data.get("failed_from"), data.get("failed_to")
    if data.get("failed"):
        start = (now or store.db_now()) - timedelta(seconds=FAILED_WITHIN[data["failed"]][1])
    if start or end:
        queryset = queryset.alias(lq_failed=Cast(KT("errors__-1__at"), DateTimeField()))
        if start:
            queryset = queryset.filter(lq_failed__gte=start)
        if end:
            queryset = queryset.filter(lq_failed__lte=end)
    return queryset


class StateFilter(admin.SimpleListFilter):
    """Filter by the operator's state (:data:`~django_leasequeue.admin.states.STATES`): a stored
    status, or a refinement judged by the database clock (read once per page)."""

    title = "state"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(s, s) for s in STATES]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        if value not in STATES:
            messages.error(request, f"Unknown state {value!r}: choose one of {', '.join(STATES)}.")
            return queryset.none()
        if value in ("waiting", "done", "dead", "cancelled"):
            return queryset.filter(status=value)
        now = store.db_now()
        if value == "ready":
            return queryset.filter(status="ready", run_at__lte=now)
        if value == "leased":
            return queryset.filter(status="leased", leased_until__gte=now)
        if value == "lease expired":
            return queryset.filter(status="leased", leased_until__lt=now)
        later: QuerySet[Any] = queryset.filter(status="ready", run_at__gt=now)
        # Snoozed, retry wait and scheduled as admin/states.py tells them apart (a snooze writes no
        # error; a failed attempt always does, after the claim that made it).
        last_at = Cast(KT("errors__-1__at"), DateTimeField())
        later = later.alias(lq_failed=last_at)
        snooze = Q(snoozes__gt=0) & (Q(errors=[]) | Q(attempted_at__isnull=True) | Q(lq_failed__lt=F("attempted_at")))
        if value == "snoozed":
            chosen: QuerySet[Any] = later.filter(snooze)
        elif value == "retry wait":
            chosen = later.exclude(snooze).filter(attempts__gt=0)
        else:
            chosen = later.exclude(snooze).filter(attempts=0)
        return chosen
