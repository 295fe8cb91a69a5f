"""A web producer for the PgBouncer tests: each request enqueues inside the request's own
transaction, as a project's view would, through whatever connection the settings give it."""

from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from .models import Probe
from .tasks import record


class _RolledBack(Exception):
    """Raised inside the request's transaction to roll it back (the ``rollback`` mode)."""


@csrf_exempt
@require_POST
def enqueue_view(request: HttpRequest, mode: str) -> HttpResponse:
    """Write one ``Probe(kind="web-<mode>")`` row and enqueue one ``qa.record`` job tagged with the
    ``tag`` form field, in one transaction.

    ``mode``: ``atomic`` enqueues inside ``transaction.atomic()`` (the job row is part of the
    transaction); ``on_commit`` enqueues with ``enqueue_on_commit`` (after the commit); ``rollback``
    does both, then raises inside the transaction, so neither the row nor any job may be left.

    Returns 201 with the job id (``atomic``) or an empty body (``on_commit``), 409 after a rollback,
    404 for another mode.
    """
    tag = request.POST.get("tag", "")
    if mode not in ("atomic", "on_commit", "rollback"):
        return HttpResponse(f"unknown mode {mode!r}", status=404)
    try:
        with transaction.atomic():
            Probe.objects.create(job_id=0, lease_version=0, kind=f"web-{mode}"[:20], ok=True)
            if mode == "on_commit":
                record.enqueue_on_commit(tag=tag)
                return HttpResponse(status=201)
            job = record.enqueue(tag=tag)
            if mode == "rollback":
                record.enqueue_on_commit(tag=tag)
                raise _RolledBack
            return HttpResponse(str(job.id), status=201)
    except _RolledBack:
        return HttpResponse("rolled back", status=409)
