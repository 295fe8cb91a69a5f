"""The operator's job operations (replay, cancel, retry now) and the replay form.

Each operation is the one code path of its detail-page button and its bulk action (C32), and
writes through :mod:`django_leasequeue.store` in statements of at most :data:`BULK_CHUNK` ids."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, cast

from django import forms
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from .. import payload, store
from ..conf import get_settings
from ..exceptions import LeaseQueueError
from .common import APP, _by, check_json_field

#: Bulk actions send ids to the store in statements of at most this many ids.
BULK_CHUNK = 10_000


def _chunks(ids: list[int]) -> Iterator[list[int]]:
    for start in range(0, len(ids), BULK_CHUNK):
        yield ids[start:start + BULK_CHUNK]


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
        check_json_field(value, name)
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
                payload.encode_payload(data["args"], data["kwargs"], limit=get_settings().max_payload_bytes)
            except LeaseQueueError as exc:
                raise ValidationError(str(exc))
        return data
