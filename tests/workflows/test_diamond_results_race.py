"""A step with several dependencies whose last two dependencies finish at the same moment in two
transactions: it is released once, and it should receive both results.

The second completion's release waits for the first one's lock on the dependent's row. The results
are read by a statement after that wait (migration 0012), so both are seen as done; read in the
statement that waited, with its older snapshot, the first one was passed as None.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections, transaction

from django_leasequeue import Workflow, store
from django_leasequeue.enqueueing import task
from django_leasequeue.models import Job
from django_leasequeue.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)


@task(name="tests.wf.diamond_value")
def diamond_value(x: int = 0) -> int:
    return x


@task(name="tests.wf.diamond_merge")
def diamond_merge(values: dict[str, int]) -> dict[str, int]:
    return values


def _blocked_lock_waits() -> int:
    with connection.cursor() as cursor:
        # Inside a transaction the activity view is read once; clear that snapshot on each poll.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND wait_event_type = 'Lock'")
        return int(cursor.fetchone()[0])


def _finish_b_and_c_together() -> Job:
    wf = Workflow("diamond race")
    wf.add("a", diamond_value.step(1))
    wf.add("b", diamond_value.step().set(pass_result=True), depends_on=["a"])
    wf.add("c", diamond_value.step().set(pass_result=True), depends_on=["a"])
    wf.add("d", diamond_merge.step().set(pass_result=True), depends_on=["b", "c"])
    handle = wf.enqueue()
    assert drain(max_jobs=1).done == 1  # a
    claimed = {c.id: c for c in store.job_claim(queues=["default"], limit=2, worker_id="t", lease=30)}
    steps = handle.steps()
    b, c = claimed[steps["b"].id], claimed[steps["c"].id]
    second: list[set[int]] = []

    def complete_c() -> None:
        try:
            second.append(store.job_complete([(c.id, c.lease_version, "20")]))
        finally:
            connections.close_all()

    finisher = threading.Thread(target=complete_c)
    with transaction.atomic():
        assert store.job_complete([(b.id, b.lease_version, "10")]) == {b.id}
        finisher.start()
        # Wait (bounded) until c's completion is queued on d's row lock; a poll for an observed
        # state, not a sleep the outcome depends on.
        deadline = time.monotonic() + 10
        while _blocked_lock_waits() == 0:
            assert time.monotonic() < deadline, "c's completion never waited for the lock on d"
            time.sleep(0.01)
        assert finisher.is_alive()
    finisher.join(10)
    assert second == [{c.id}]
    return Job.objects.get(id=steps["d"].id)


def test_two_last_dependencies_finishing_together_release_the_dependent_once():
    d = _finish_b_and_c_together()
    assert (d.status, d.waiting_on) == ("ready", 0)
    assert len(d.args) == 1 and set(d.args[0]) == {"b", "c"}
    assert d.args[0]["c"] == 20


def test_two_last_dependencies_finishing_together_pass_both_results():
    d = _finish_b_and_c_together()
    assert d.args == [{"b": 10, "c": 20}]
