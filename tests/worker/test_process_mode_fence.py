"""Adversarial review of issue 13: "process execution mode kills handlers at their timeout and stays
fenced", for a child that outlives its SIGTERM.

At the timeout the worker sends its child SIGTERM, waits ``CHILD_TERM_GRACE`` (2 s), then SIGKILLs
it. A handler that ignores SIGTERM (one that installs its own handler, as some libraries do) runs
on for those 2 s, and its ``JobContext`` in the child knew nothing of the timeout: a
``fenced_atomic()`` block in that window committed its effect and marked the job done, past the
timeout (main: the job ``done`` with its effect, the attempt's JobTimedOut refused as a lost
lease). In thread mode ``fenced_atomic()`` refuses to commit once the attempt timed out.

Now the child times its own context out at the task's timeout (a timer started before it tells
the worker that the handler starts, so never later than the worker's deadline): ``fenced_atomic()``
refuses in the child as in a thread.
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
