"""Row factories for the admin tests: jobs in any state, written directly (not through enqueue)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import connection

from django_leasequeue import store
from django_leasequeue.models import Job

ERROR = {"attempt": 1, "type": "ValueError", "message": "malformed payload: missing 'customer'",
         "traceback": 'Traceback (most recent call last):\n  File "tasks.py", line 3, in poison\n'
                      "ValueError: malformed payload: missing 'customer'\n",
         "worker": "host:1:w", "at": "2026-01-01T00:00:00+00:00"}


def job_fields(status: str = "ready", now: datetime | None = None, **fields: Any) -> dict[str, Any]:
    """Column values of a job in ``status`` (dead and cancelled jobs are finished, with one error)."""
    now = now or store.db_now()
    values: dict[str, Any] = {
        "task": "invoices.tasks.poison", "queue": "default", "status": status, "args": [],
        "kwargs": {"payload": {}}, "run_at": now - timedelta(minutes=5), "created_at": now - timedelta(minutes=10),
        "max_attempts": 3,
    }
    if status in ("dead", "cancelled", "done"):
        values.update(finished_at=now - timedelta(minutes=1), attempts=3, lease_version=3)
    if status == "dead":
        values["errors"] = [dict(ERROR, attempt=i) for i in (1, 2, 3)]
    if status == "leased":
        values.update(attempts=1, lease_version=1, leased_until=now + timedelta(seconds=30), leased_by="h:1:w")
    values.update(fields)
    return values


def make_job(status: str = "ready", **fields: Any) -> Job:
    """Insert one job in ``status`` with sensible columns; ``fields`` override them.

    A finished job is inserted leased and moved to its status by a second statement, as a worker
    finishes one, so that the chart counters (which count moves, not rows) count it at its
    ``finished_at``."""
    values = job_fields(status, **fields)
    if status not in ("done", "dead", "cancelled"):
        return Job.objects.create(**values)
    # The unique key comes with the move: inserted leased, an active-scope key would collide with
    # the ready or leased job that holds it (a finished job holds no active key).
    keys = {name: values.pop(name) for name in ("unique_key", "unique_scope") if name in values}
    job = Job.objects.create(**{**values, "status": "leased", "finished_at": None})
    Job.objects.filter(id=job.id).update(status=status, finished_at=values["finished_at"], **keys)
    job.refresh_from_db()
    return job


def make_jobs(n: int, status: str = "ready", **fields: Any) -> list[int]:
    """Insert ``n`` identical jobs (one through the ORM, the rest copied from it in one
    ``INSERT ... SELECT`` over ``generate_series``, fast even on a busy machine); return their ids."""
    first = make_job(status, **fields)
    columns = [f.column for f in Job._meta.concrete_fields if f.column != "id"]
    cols = ", ".join(columns)
    with connection.cursor() as cur:
        cur.execute(f"INSERT INTO {Job._meta.db_table} ({cols}) SELECT {cols} FROM {Job._meta.db_table}, "
                    f"generate_series(2, %s) WHERE id = %s RETURNING id", [n, first.id])
        return [first.id, *sorted(r[0] for r in cur.fetchall())]
