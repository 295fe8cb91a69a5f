"""Helpers of the monitoring tests: a row factory, an in-thread job runner and a queuehealth runner."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.core.management import call_command

from django_leasequeue import store
from django_leasequeue.conf import get_settings
from django_leasequeue.context import JobContext
from django_leasequeue.executor import Executor
from django_leasequeue.models import Job
from django_leasequeue.worker.completer import Completer


def make_job(**fields: Any) -> Job:
    """Insert a job row directly, in any state and at any time (River's test-factory idea).

    A finished job (done, dead) is inserted leased and then moved to its status in a second
    statement, as a worker would finish it: the chart counters (and so the health snapshot's recent
    done and dead counts) count moves, not rows, and date the move by its ``finished_at``."""
    at = fields.pop("at", None) or store.db_now()
    defaults = {"task": "tests.monitoring.factory", "queue": "default", "status": "ready", "run_at": at,
                "created_at": at, "max_attempts": 5}
    defaults.update(fields)
    final = defaults["status"]
    if final not in ("done", "dead"):
        return Job.objects.create(**defaults)
    job = Job.objects.create(**{**defaults, "status": "leased", "finished_at": None,
                                "attempted_at": defaults.get("attempted_at") or defaults.get("finished_at") or at})
    Job.objects.filter(id=job.id).update(status=final, finished_at=defaults.get("finished_at"))
    job.refresh_from_db()
    return job


def run_jobs(jobs: Sequence[store.ClaimedJob], *, worker: str = "host:1:test") -> list[str]:
    """Run claimed jobs in this thread through the real executor and completer; return outcomes."""
    alias = store.db_alias()
    completer = Completer(alias=alias)
    executor = Executor(worker_id=worker, settings=get_settings(), alias=alias, complete=completer.submit)
    outcomes = []
    for job in jobs:
        ctx = JobContext(job_id=job.id, task=job.task, queue=job.queue, attempt=job.attempts,
                         max_attempts=job.max_attempts, lease_version=job.lease_version, worker_id=worker,
                         leased_until=job.leased_until, lease_seconds=job.lease_seconds, alias=alias)
        outcomes.append(executor.run(job, ctx))
    completer.flush()
    return outcomes


def claim(*, now: datetime | None = None, queues: Sequence[str] | None = None, limit: int = 100,
          lease: float = 30.0, worker: str = "host:1:test") -> list[store.ClaimedJob]:
    """Claim due jobs (explicit ``now`` optional)."""
    return store.job_claim(queues=queues, limit=limit, worker_id=worker, lease=lease, now=now)


@dataclass
class HealthRun:
    """Outcome of one ``queuehealth`` run."""

    code: int
    output: str

    @property
    def json(self) -> dict[str, Any]:
        return json.loads(self.output)


def queuehealth(*args: str, defaults: bool = False) -> HealthRun:
    """Run ``manage.py queuehealth`` in-process; return its exit code and output.

    Without ``defaults`` it passes ``--no-default-thresholds``, so that a test of one check sees
    only the flags it gives (the default checks have tests of their own)."""
    out = io.StringIO()
    extra = () if defaults else ("--no-default-thresholds",)
    try:
        call_command("queuehealth", *args, *extra, stdout=out)
        code = 0
    except SystemExit as exc:
        code = int(exc.code)
    return HealthRun(code, out.getvalue())


def ago(now: datetime, seconds: float) -> datetime:
    return now - timedelta(seconds=seconds)
