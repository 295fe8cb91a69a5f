"""HTTP views: the Prometheus metrics endpoint.

Access (``LEASEQUEUE`` settings): a request is let in when it carries ``Authorization: Bearer
<token>`` with one of ``METRICS_TOKEN``, or comes from an active staff user's session while
``METRICS_ALLOW_STAFF`` is True. Without credentials the answer is 401 (with a
``WWW-Authenticate: Bearer`` challenge), with a wrong token 401, for a logged-in non-staff user 403.
The figures name queues and task volumes, so the endpoint is never public by default.
"""

from __future__ import annotations

import hmac
import logging

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from .conf import Settings, get_settings

logger = logging.getLogger("django_leasequeue.views")


def _bearer(request: HttpRequest) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def check_access(request: HttpRequest, settings: Settings) -> int | None:
    """Return None when the request may read the metrics, else the HTTP status to refuse with.

    Tokens are compared in constant time (``hmac.compare_digest``) against every configured one.
    """
    token = _bearer(request)
    if token is not None:
        supplied = token.encode()
        if any(hmac.compare_digest(supplied, t.encode()) for t in settings.metrics_tokens):
            return None
        return 401
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        if settings.metrics_allow_staff and user.is_active and user.is_staff:
            return None
        return 403
    return 401


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Serve the queue health in the Prometheus text format (see :mod:`django_leasequeue.metrics`).

    Returns 401/403 when access is refused, 503 when the database cannot be read (so the scrape
    fails and Prometheus's ``up`` goes to 0, rather than reporting stale or zero figures).
    """
    from prometheus_client import CONTENT_TYPE_LATEST

    from .metrics import render

    refused = check_access(request, get_settings())
    if refused is not None:
        response = HttpResponse("metrics need a bearer token or a staff session\n", status=refused,
                                content_type="text/plain")
        if refused == 401:
            response["WWW-Authenticate"] = 'Bearer realm="leasequeue"'
        return response
    try:
        body = render()
    except DatabaseError as exc:
        logger.exception("metrics: the health snapshot failed")
        return HttpResponse(f"health snapshot failed: {type(exc).__name__}\n", status=503,
                            content_type="text/plain")
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
