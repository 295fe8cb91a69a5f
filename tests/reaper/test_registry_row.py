"""One bad row harms only itself, in the process registry.

Rolling deploys put the task names of every worker in its registry row (``WorkerProcess.tasks``,
a JSON list), and the reaper sweep of every worker reads them to judge ``UnknownTask``. A row whose
``tasks`` is not a list (written by hand, by another program, or by a later version that stores
something else there) must not fail that sweep in every process ("cannot extract elements from an
object"): it counts as a row that recorded no task list (a worker of an older version, taken to
know every task), and the sweep dead-letters the unknown tasks of the others as usual.
"""

from __future__ import annotations

import pytest
from django.db import connection

from django_leasequeue import reaper, store
from django_leasequeue.conf import build
from tests.support import job_in

SETTINGS = build({"UNKNOWN_TASK_GRACE": 0})


def odd_registry_row() -> None:
    """A live worker row serving every queue whose ``tasks`` is a JSON object."""
    with connection.cursor() as cur:
        cur.execute("INSERT INTO leasequeue_process (id, kind, host, pid, queues, concurrency, tasks, "
                    "started_at, last_heartbeat_at) VALUES ('odd:1:w', 'worker', 'odd', 1, '[\"*\"]', 1, "
                    "'{\"qa.record\": 2}', clock_timestamp() - interval '1 hour', "
                    "clock_timestamp() + interval '1 day')")


@pytest.mark.django_db
def test_a_registry_row_with_an_odd_task_list_fails_no_sweep():
    odd_registry_row()
    job = store.job_insert([store.NewJob(task="qa.nobody_knows", queue="default", priority=0, args_json="[]",
                                         kwargs_json="{}", max_attempts=3, run_at=None)],
                           notify=False, channel="leasequeue")[0]
    # A registry row whose task list is not a JSON array must not fail the sweep.
    assert reaper.dead_letter_unknown_tasks(SETTINGS, by="test") == []  # that row may know the task
    assert job_in(job.id, "ready")
