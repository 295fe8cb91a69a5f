"""Live updates: a console page refreshes its numbers in place from a JSON endpoint of its own view.

The mechanism, for any page (the dashboard, the workers page and the workflow pages use it):

1. **Mark the numbers.** Each element whose text may change carries ``data-live="<key>"``: a key
   unique on the page, e.g. ``q:mail:due`` (queue names and ids may be in it; the template escapes
   them). An element with ``data-live-nonzero="<class>"`` also gets that class while its text is
   not ``"0"`` (a dead count shown red).
2. **Serve the values.** Add a ``live/`` URL next to the page's, wrapped by the same
   ``self.admin_site.admin_view`` (login, CSRF-free GET, never cached) and checking the same
   permission as the page (raise ``PermissionDenied``: a 403), that computes the same figures the
   page does, without rendering, and returns ``live_response(request, values, at=now)``: a JSON
   object ``{"<key>": "<text>", ..., "at": "<ISO 8601 time of the figures>"}``. Compute the text
   with the same helpers as the template (``duration``, ``intcomma``...) so a value matches what
   the page rendered. The endpoint must cost no more statements than the page.
3. **Include the bar.** ``{% include "admin/django_leasequeue/_live.html" with live_url=... %}`` in
   the page's template: it renders the "Live" bar (a Pause/Resume button and "updated HH:MM:SS")
   and loads ``django_leasequeue/live.js``. Pass ``live_at`` (the aware datetime of the page's
   figures, for the first "updated"; optional) and ``live_interval`` (seconds, default
   :data:`DEFAULT_INTERVAL`) to poll at another rate. An element with
   ``data-live-class="lq-status lq-{}"`` also gets that class with ``{}`` replaced by its new text
   (a status badge).

``live.js`` (no framework, no CDN) polls the URL every ``live_interval`` seconds while the tab is
visible and the operator has not paused, sets the ``textContent`` of each marked element whose key
is in the answer, and shows the time of the figures. Pause is one state for the whole console,
kept in ``localStorage`` (``lq-live-paused``), so it holds across pages and reloads. A key on the
page that the answer lacks, or one in the answer that the page lacks (a queue, process or step
appeared or went away), shows "rows changed: reload", since only text is replaced in place, never
rows. A refused poll (a 403 after a permission change, the login page of a session that ended)
says so in the bar and stops polling until Resume or a reload; a failed one (an error status, the
server unreachable) says so and tries again at the next interval.

A page that needs the figures of the rows it shows (a change list's page of results) passes its
own query string to the endpoint in ``live_url`` so that the endpoint recomputes the same rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from django.http import HttpRequest, JsonResponse
from django.utils import timezone

#: Seconds between two polls unless the page says otherwise.
DEFAULT_INTERVAL = 5

#: Bounds of an interval a page (or the operator, ``?refresh=N`` on the dashboard) may ask for.
MIN_INTERVAL, MAX_INTERVAL = 2, 3600


def live_interval(value: str | None, default: int = DEFAULT_INTERVAL) -> int:
    """The polling interval asked for in a query parameter, within the bounds.

    Args:
        value: the parameter's text (``"10"``), or None.
        default: seconds when ``value`` is missing or not a whole number of seconds in
            [:data:`MIN_INTERVAL`, :data:`MAX_INTERVAL`].

    Returns:
        Seconds between polls.
    """
    if value and value.isascii() and value.isdigit() and len(value) < 8 and MIN_INTERVAL <= int(value) <= MAX_INTERVAL:
        return int(value)
    return default


def live_response(request: HttpRequest, values: Mapping[str, object], *, at: datetime) -> JsonResponse:
    """The answer of a page's live endpoint: ``{"<key>": "<text>", ..., "at": "<ISO 8601>"}``.

    Args:
        request: the request (the caller has checked its permission).
        values: key -> the text the page shows for it; each value is sent as ``str(value)``.
        at: the aware datetime the figures refer to (the database clock), sent in the current
            time zone so that the page shows it as the server rendered its own times.

    Returns:
        A JSON response that no cache keeps (``Cache-Control: no-store``).

    Raises:
        ValueError: ``at`` is naive, or ``values`` has an ``"at"`` key.
    """
    if at.tzinfo is None or at.utcoffset() is None:
        raise ValueError("live_response(at=...) needs an aware datetime")
    if "at" in values:
        raise ValueError('"at" is the time of the figures, not a key of the page')
    body = {key: str(value) for key, value in values.items()}
    body["at"] = timezone.localtime(at).isoformat(timespec="seconds")
    response = JsonResponse(body)
    response["Cache-Control"] = "no-store"
    return response
