"""A rolling deploy on real ``runworker`` processes: an old worker and a new one side by side, and
only the new one knows a task (``LEASEQUEUE_EXTRA_TASKS=1`` imports ``qa.deploy_tasks``). The old
worker must not spend a single attempt on that task's jobs; the new one runs them all."""

import pytest
from django.db import connection
from qa import deploy_tasks
from qa.models import Execution

from django_leasequeue.models import Job, WorkerProcess
from tests.support import wait_for

pytestmark = [pytest.mark.process]

JOBS = 10


def listening_backends() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND query LIKE 'LISTEN %%'")
        return cur.fetchone()[0]


def test_old_and_new_workers_side_by_side_the_new_task_runs_only_on_the_new_worker(spawn):
    # The old worker polls fast (it would claim first more often than not); both wake on NOTIFY.
    spawn("runworker", "--concurrency", "4", "--worker-id", "old",
          env={"LEASEQUEUE_POLL_INTERVAL": "0.05", "LEASEQUEUE_REAPER_INTERVAL": "0.5"})
    spawn("runworker", "--concurrency", "1", "--worker-id", "new",
          env={"LEASEQUEUE_EXTRA_TASKS": "1", "LEASEQUEUE_POLL_INTERVAL": "1", "LEASEQUEUE_REAPER_INTERVAL": "0.5"})
    wait_for(lambda: WorkerProcess.objects.filter(kind="worker").count() == 2 and listening_backends() == 2,
             timeout=60, what="both workers to listen")
    tasks = dict(WorkerProcess.objects.values_list("id", "tasks"))
    old_id, new_id = (next(k for k in tasks if k.endswith(f":{name}")) for name in ("old", "new"))
    assert "qa.new_task" not in tasks[old_id] and "qa.record" in tasks[old_id]
    assert "qa.new_task" in tasks[new_id]

    ids = [deploy_tasks.new_task.enqueue(str(i)).id for i in range(JOBS)]
    wait_for(lambda: not Job.objects.filter(pk__in=ids, status__in=["ready", "leased"]).exists(), timeout=60,
             what="every job of the new task to finish")
    jobs = list(Job.objects.filter(pk__in=ids))
    by_status = {s: sum(1 for j in jobs if j.status == s) for s in ("done", "dead")}
    # The old worker never claims a task it lacks, so none is dead-lettered as UnknownTask.
    assert by_status == {"done": JOBS, "dead": 0}
    assert {(j.attempts, j.lease_version, len(j.errors)) for j in jobs} == {(1, 1, 0)}
    assert {j.leased_by for j in jobs} == {new_id}
    runs = list(Execution.objects.filter(job_id__in=ids).values_list("worker", flat=True))
    assert sorted(runs) == [new_id] * JOBS
    # The old worker's attempts spent on the new task: none.
    assert not Job.objects.filter(pk__in=ids, leased_by=old_id).exists()
