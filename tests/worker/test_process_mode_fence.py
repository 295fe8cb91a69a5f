"""Process execution mode kills handlers at their timeout and stays fenced, for a child that
outlives its SIGTERM.

At the timeout the worker sends its child SIGTERM, waits ``CHILD_TERM_GRACE`` (2 s), then SIGKILLs
it. A handler that ignores SIGTERM (one that installs its own handler, as some libraries do) runs
on for those 2 s. The child times its own ``JobContext`` out at the task's timeout (a timer started
before it tells the worker that the handler starts, so never later than the worker's deadline):
``fenced_atomic()`` in that window refuses to commit in the child, as it does in a thread, and the
attempt ends as ``JobTimedOut`` with no effect.
"""

from __future__ import annotations

import pytest
from qa.models import Effect

from django_leasequeue import enqueue
from django_leasequeue.models import Job

pytestmark = pytest.mark.process

TIMED_OUT = "django_leasequeue.exceptions.JobTimedOut"


def test_a_child_that_ignores_sigterm_cannot_commit_fenced_work_after_its_timeout(spawn):
    job = enqueue("qa.adv_sigterm_fenced", ["late"])
    worker = spawn("runworker", "--burst", "--execution", "process", env={"LEASEQUEUE_LEASE": "5"})
    assert worker.wait(90) == 0, worker.output()
    row = Job.objects.get(pk=job.id)
    effects = list(Effect.objects.filter(key="late").values_list("lease_version", flat=True))
    assert effects == [], f"fenced effect committed past the timeout (job {row.status}, errors {row.errors})"
    assert row.status == "dead" and [e["type"] for e in row.errors] == [TIMED_OUT]
