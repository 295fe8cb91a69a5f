"""The operator's job operations (replay, cancel, retry now) and the replay form.

Each operation is the one code path of its detail-page button and its bulk action (C32), writes
through :mod:`django_leasequeue.store` in one statement for any number of ids (set-based: the
same number of statements for 3 jobs or 10,000), reports exactly how many jobs were acted on and
how many were skipped, per reason, and writes an admin log entry (LogEntry): one per job for a
page's button, one summary entry for a bulk action."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, cast

from django import forms
from django.contrib import messages
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.core.exceptions import ValidationError
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from .. import payload, store
from ..conf import get_settings
from ..exceptions import LeaseQueueError
from ..models import Job, QueueState
from .common import APP, _by, check_json_field

#: Operations that go row group by row group (skipping halted sequences) send ids to the store in
#: statements of at most this many ids; the job operations send any number in one statement.
BULK_CHUNK = 10_000


def _chunks(ids: list[int]) -> Iterator[list[int]]:
    for start in range(0, len(ids), BULK_CHUNK):
        yield ids[start:start + BULK_CHUNK]


# A replay refused for a unique key names the key and its holder; counted by reason, every such
# refusal is one reason (otherwise 45 keys make "45 other reasons"). The same words as
# store.REPLAY_SKIP_REASON, so the confirmation page and the result message agree.
_KEY_HELD = "its unique key is held by another ready or leased job"
_KEY_SHARED = "its unique key is shared with another selected job, which was replayed instead"


def replay_reason(reason: str) -> str:
    """The reason a replay refusal is counted under: the refusal itself, except that the unique
    key and the holder's id are left out (``"unique key 'k' is held by job #7 ..."`` is
    :data:`_KEY_HELD`)."""
    if reason.startswith("unique key ") and " is held by job #" in reason:
        return _KEY_HELD
    if reason.startswith("unique key ") and " is shared with job #" in reason:
        return _KEY_SHARED
    return reason


def count_reasons(refused: dict[int, str]) -> dict[str, int]:
    """Refused ids counted by :func:`replay_reason`, largest count first."""
    counts: dict[str, int] = {}
    for reason in refused.values():
        counts[replay_reason(reason)] = counts.get(replay_reason(reason), 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def describe_skipped(skipped: dict[str, int]) -> str:
    """Skipped ids by reason with exact counts: ``"skipped 19: 12 × job is ready; 7 × no such job"``;
    ``""`` when nothing was skipped. Every reason is listed (they are few: the statements'
    reasons are a fixed set)."""
    total = sum(skipped.values())
    if not total:
        return ""
    parts = [f"{n:,} × {reason}" for reason, n in sorted(skipped.items(), key=lambda kv: (-kv[1], kv[0]))]
    return f"skipped {total:,}: " + "; ".join(parts)


def _summarise_refusals(refused: dict[int, str], limit: int = 5) -> str:
    """Refusals grouped by reason with exact counts and up to ``limit`` ids each:
    ``"3 × job is ready; ... (#1, #2, #3)"``. Every reason is listed."""
    groups: dict[str, list[int]] = {}
    for job_id, reason in sorted(refused.items()):
        groups.setdefault(replay_reason(reason), []).append(job_id)
    parts = []
    for reason, ids in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        shown = ", ".join(f"#{i}" for i in ids[:limit]) + (" …" if len(ids) > limit else "")
        parts.append(f"{len(ids):,} × {reason} ({shown})")
    return "; ".join(parts)


def log_job_action(request: HttpRequest, job_ids: list[int], message: str) -> None:
    """Write the admin log entry of an operator action (``django.contrib.admin`` LogEntry, so the
    job's "History" page and the admin's "Recent actions" show it).

    One entry on the first job of ``job_ids``: a page's button passes its one job (so every single
    action has its entry on its job), a bulk action its whole set (one summary entry).

    Args:
        request: the operator's request (its user is the entry's user).
        job_ids: the jobs acted on, in id order; nothing is logged for none.
        message: the entry's change message, e.g. ``"Replayed 9,981 jobs (skipped 19: ...)"``.
    """
    if not job_ids:
        return
    jobs = list(Job.objects.only("id", "task", "status").filter(pk=job_ids[0]))
    if not jobs:  # deleted by the action itself: the entry still names it
        jobs = [Job(pk=job_ids[0])]
    LogEntry.objects.log_actions(user_id=cast(int, request.user.pk), queryset=jobs, action_flag=CHANGE,
                                 change_message=message, single_object=True)


def log_queue_action(request: HttpRequest, name: str, message: str) -> None:
    """Write the admin log entry of an operator's action on a queue (pause, resume) on its
    ``QueueState`` row, so "Recent actions" and the row's "History" show who did it and when.

    Args:
        request: the operator's request (its user is the entry's user).
        name: the queue's name; nothing is logged when the queue has no ``QueueState`` row (the
            action changed nothing).
        message: the entry's change message, e.g. ``"Paused queue 'mail'"``.
    """
    states = list(QueueState.objects.filter(name=name))
    if states:
        LogEntry.objects.log_actions(user_id=cast(int, request.user.pk), queryset=states, action_flag=CHANGE,
                                     change_message=message, single_object=True)


def _jobs(n: int) -> str:
    return f"{n:,} job{'s' if n != 1 else ''}"


def replay_jobs(request: HttpRequest, ids: list[int], *, args: list[Any] | None = None,
                kwargs: dict[str, Any] | None = None) -> store.ReplayResult:
    """Replay jobs through :func:`store.job_replay` (one statement for any number of ids), tell
    the operator what happened with exact counts per reason, and write the admin log entry
    (per job for one job, one summary entry for several).

    The one code path of the Replay button, the "edit and replay" form and the bulk action.

    Args:
        request: the operator's request.
        ids: job ids.
        args: new positional arguments for every replayed job, or None to keep each job's own.
        kwargs: new keyword arguments, likewise.

    Returns:
        The store's :class:`~django_leasequeue.store.ReplayResult`.
    """
    result = store.job_replay(ids, by=_by(request), args=args, kwargs=kwargs)
    replayed, refused = result.replayed, result.refused
    edited = " with the edited arguments" if (args is not None or kwargs is not None) else ""
    if replayed:
        if len(replayed) == 1:
            url = reverse(f"admin:{APP}_job_change", args=[replayed[0]])
            messages.success(request, format_html(
                'Replayed job <a href="{}">#{}</a>: it is ready and due now{}.', url, replayed[0], edited))
        else:
            messages.success(request, f"Replayed {len(replayed):,} jobs: they are ready and due now.")
        skipped = describe_skipped(count_reasons(refused))
        log_job_action(request, replayed, f"Replayed {_jobs(len(replayed))}{edited}"
                                          + (f" ({skipped})" if skipped else ""))
    if refused:
        level = messages.WARNING if replayed else messages.ERROR
        messages.add_message(request, level, f"Not replayed: {_summarise_refusals(refused)}.")
    return result


def cancel_jobs(request: HttpRequest, ids: list[int]) -> store.CancelCounts:
    """Cancel ready jobs and ask leased ones to stop, through :func:`store.job_request_cancel`
    (one statement), with exact counts per reason and the admin log entry.

    Args:
        request: the operator's request.
        ids: job ids.

    Returns:
        The store's :class:`~django_leasequeue.store.CancelCounts`.
    """
    counts = store.job_request_cancel(ids, by=_by(request))
    cancelled, requested, unchanged = counts.cancelled, counts.requested, counts.unchanged
    parts = []
    if cancelled:
        parts.append(f"cancelled {cancelled:,} ready job{'s' if cancelled != 1 else ''}")
    if requested:
        parts.append(f"asked {requested:,} running job{'s' if requested != 1 else ''} to stop (its worker's "
                     "completion will be refused and the job ends cancelled)")
    if parts:
        messages.success(request, "; ".join(parts).capitalize() + ".")
        skipped = describe_skipped(counts.skipped)
        log_job_action(request, sorted(set(ids)), "; ".join(parts).capitalize() + (f" ({skipped})" if skipped else ""))
    if unchanged:
        reasons = "; ".join(f"{n:,} {reason}" for reason, n in
                            sorted(counts.skipped.items(), key=lambda kv: (-kv[1], kv[0])))
        messages.warning(request, f"{unchanged:,} job{'s were' if unchanged != 1 else ' was'} left alone: "
                                  f"{reasons or 'already finished or already asked to stop'}.")
    return counts


def retry_now_jobs(request: HttpRequest, ids: list[int]) -> None:
    """Make ready jobs waiting on a retry backoff due now, through :func:`store.job_retry_now`."""
    ids = sorted(set(ids))
    changed = store.job_retry_now(ids, by=_by(request))
    if changed:
        messages.success(request, f"{changed:,} job{'s are' if changed != 1 else ' is'} due now.")
        log_job_action(request, ids, f"Retry now: {_jobs(changed)} made due"
                                     + (f" (skipped {len(ids) - changed:,}: not waiting out a retry backoff)"
                                        if changed < len(ids) else ""))
    if changed < len(ids):
        messages.warning(request, f"{len(ids) - changed:,} job{'s were' if len(ids) - changed != 1 else ' was'} "
                                  "left alone: only ready jobs waiting out a retry backoff are moved.")


def _outcome_messages(request: HttpRequest, outcome: store.BulkOutcome, done: str, verb: str) -> None:
    """The result message of a :class:`~django_leasequeue.store.BulkOutcome` (exact counts per
    reason) and its admin log entry."""
    skipped = describe_skipped(outcome.skipped)
    if outcome.done:
        messages.success(request, f"{done} {_jobs(len(outcome.done))}" + (f"; {skipped}." if skipped else "."))
        log_job_action(request, outcome.done,
                       f"{done} {_jobs(len(outcome.done))}" + (f" ({skipped})" if skipped else ""))
    elif skipped:
        messages.error(request, f"No job was {verb}: {skipped}.")


def run_now_jobs(request: HttpRequest, ids: list[int], tokens: dict[int, int] | None = None) -> store.BulkOutcome:
    """Make ready jobs that are not yet due (retry wait, snoozed, scheduled) due now, through
    :func:`store.job_run_now`, with exact counts per reason and the admin log entry.

    Args:
        request: the operator's request.
        ids: job ids.
        tokens: optional ``{job id: lease_version}`` the operator saw (a job page's button).

    Returns:
        The store's :class:`~django_leasequeue.store.BulkOutcome`.
    """
    outcome = store.job_run_now(ids, by=_by(request), tokens=tokens)
    _outcome_messages(request, outcome, "Made due now:", "made due")
    return outcome


def release_jobs(request: HttpRequest, ids: list[int], tokens: dict[int, int] | None = None) -> store.BulkOutcome:
    """Take back expired leases on the operator's word, through :func:`store.job_release_expired`,
    with exact counts per reason and the admin log entry.

    Args:
        request: the operator's request.
        ids: job ids.
        tokens: optional ``{job id: lease_version}`` the operator saw.

    Returns:
        The store's :class:`~django_leasequeue.store.BulkOutcome`.
    """
    outcome = store.job_release_expired(ids, by=_by(request), tokens=tokens)
    _outcome_messages(request, outcome, "Released", "released")
    return outcome


def delete_jobs(request: HttpRequest, ids: list[int]) -> store.BulkOutcome:
    """Delete finished jobs through :func:`store.job_delete_finished`, with exact counts per
    reason and the admin log entry (on the first deleted job, which the entry still names).

    Args:
        request: the operator's request.
        ids: job ids.

    Returns:
        The store's :class:`~django_leasequeue.store.BulkOutcome`.
    """
    ids = sorted(set(ids))
    # The entry names its job as it was: read before the row goes (one statement).
    first = list(Job.objects.only("id", "task", "status").filter(pk=ids[0])) if ids else []
    outcome = store.job_delete_finished(ids)
    skipped = describe_skipped(outcome.skipped)
    if outcome.done:
        messages.success(request, f"Deleted {_jobs(len(outcome.done))}" + (f"; {skipped}." if skipped else "."))
        LogEntry.objects.log_actions(
            user_id=cast(int, request.user.pk), queryset=first or [Job(pk=outcome.done[0])], action_flag=DELETION,
            single_object=True,
            change_message=f"Deleted {_jobs(len(outcome.done))}" + (f" ({skipped})" if skipped else ""))
    elif skipped:
        messages.error(request, f"No job was deleted: {skipped}.")
    return outcome


class ReplayForm(forms.Form):
    """Arguments of a dead letter, editable before the replay (a fix for a bad payload)."""

    args = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 100, "class": "vLargeTextField lq-code"}),
                           help_text="JSON list of positional arguments.")
    kwargs = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 100, "class": "vLargeTextField lq-code"}),
                             help_text="JSON object of keyword arguments.")

    #: A textarea is as tall as its pretty-printed text, within these rows.
    MIN_ROWS, MAX_ROWS = 3, 30

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in ("args", "kwargs"):
            text = str((self.data.get(name) if self.is_bound else self.initial.get(name)) or "")
            lines = text.count("\n") + 1
            self.fields[name].widget.attrs["rows"] = min(self.MAX_ROWS, max(self.MIN_ROWS, lines))

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
