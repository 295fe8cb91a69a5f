"""What the admin pages share: the typed ModelAdmin bases, the app label, the operator's name,
JSON shown on a page, times read from job history and durations in words."""

from __future__ import annotations

import json
import re
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, TypeAlias

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import HttpRequest
from django.utils.html import format_html

from .. import payload
from ..exceptions import LeaseQueueError
from ..models import Dashboard, Job, Schedule

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


#: Characters of pretty-printed JSON shown on a change page before it is cut (the replay form
#: always shows the whole payload).
JSON_DISPLAY_LIMIT = 64 * 1024


def _by(request: HttpRequest) -> str:
    """The operator's name as recorded in job history."""
    return request.user.get_username() or f"user #{request.user.pk}"


def parse_id(text: str) -> int | None:
    """A non-negative bigint written in ASCII digits (``"123"``), or None for anything else.

    ``str.isdigit`` alone is not enough: it accepts ``"²"`` and other Unicode digits that
    ``int()`` refuses (a 500 from a search box or a posted field), a number past the bigint
    range would make the database refuse the statement, and past 4300 digits ``int()`` raises.

    Args:
        text (str): the raw parameter.

    Returns:
        int | None: the number, within ``0 <= n < 2**63``.
    """
    # 2**63 has 19 digits; a longer string is out of range (and past 4300 digits int() raises).
    if not (text.isascii() and text.isdigit()) or len(text.lstrip("0")) > 19:
        return None
    value = int(text)
    return value if value < 2**63 else None


def search_id(term: str) -> int | None:
    """The row id a search term names (``123`` or ``#123``, within a bigint), or None."""
    return parse_id(term.lstrip("#"))


def check_json_field(value: Any, name: str) -> None:
    """Check a form's JSON arguments as enqueueing does (:func:`~django_leasequeue.payload.check_json`).

    Args:
        value: the decoded JSON value (a list or dict of arguments).
        name: the field's name, used in the message (``"args"`` or ``"kwargs"``).

    Raises:
        ValidationError: the value is refused; the message is the refusal's own.
    """
    try:
        payload.check_json(value, name)
    except LeaseQueueError as exc:
        raise ValidationError(str(exc))


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


def error_name(type_string: str | None) -> str:
    """An error's type as the console shows it: the last dotted component of the stored type.

    ``"builtins.ValueError"`` and ``"ValueError"`` read ``"ValueError"``;
    ``"asyncio.exceptions.CancelledError"`` reads ``"CancelledError"``: the module path of a class
    is where it is defined, not what the operator searches for.

    Args:
        type_string: the stored ``type`` of an error entry (``errors[n]["type"]``), or None.

    Returns:
        The class name; ``""`` for None or an empty string.
    """
    return (type_string or "").rsplit(".", 1)[-1]
