"""A framework task's result stays readable after its job moved into the time-partitioned
history (LEASEQUEUE["HISTORY"]): ``get_result()`` finds it there, with its status and return value."""

from __future__ import annotations

from datetime import timedelta

import pytest

from django_leasequeue import store
from django_leasequeue.compat_tasks import TaskResultDoesNotExist, TaskResultStatus
from django_leasequeue.models import Job

from . import fw_tasks


@pytest.mark.django_db
def test_get_result_reads_a_moved_job_from_the_history():
    issued = fw_tasks.add.enqueue(2, 3)
    (claimed,) = store.job_claim_ids([int(issued.id)], worker_id="w", lease=30)
    assert store.job_complete([(claimed.id, claimed.lease_version, "5")]) == {claimed.id}
    now = store.db_now() + timedelta(hours=1)
    assert store.history_maintain("hour", move_after=60, retention=86400, now=now).moved == 1
    assert not Job.objects.exists()
    result = fw_tasks.add.get_result(issued.id)
    assert (result.id, result.status, result.args, result.return_value) == (
        issued.id, TaskResultStatus.SUCCESSFUL, [2, 3], 5)
    with pytest.raises(TaskResultDoesNotExist):
        fw_tasks.add.get_result(str(int(issued.id) + 1))
