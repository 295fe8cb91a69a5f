"""``enqueue(depends_on=...)`` racing the completion of its dependency: the enqueuer locks the
dependency row until it commits, so the completion waits and then releases the new job; the new
job is never left waiting for a dependency that finished unseen."""

from __future__ import annotations

import threading

import pytest
from django.db import connections, transaction

from django_leasequeue import enqueue, store
from django_leasequeue.enqueueing import task
from django_leasequeue.models import Job

pytestmark = pytest.mark.django_db(transaction=True)


@task(name="tests.wf.race_step")
def race_step(n: int) -> int:
    return n


def test_a_dependency_completed_while_the_dependent_is_being_enqueued_releases_it():
    dep = race_step.enqueue(1)
    [claimed] = store.job_claim(queues=["default"], limit=1, worker_id="t", lease=30)
    locked = threading.Event()
    completed: list[set[int]] = []

    def complete_when_locked() -> None:
        locked.wait(10)
        try:
            # Blocks on the enqueuer's row lock until it commits, then runs the settle trigger.
            completed.append(store.job_complete([(claimed.id, claimed.lease_version, "1")]))
        finally:
            connections.close_all()

    finisher = threading.Thread(target=complete_when_locked)
    finisher.start()
    with transaction.atomic():
        dependent = enqueue(race_step, [2], depends_on=[dep])
        assert dependent.status == "waiting" and dependent.waiting_on == 1
        locked.set()
        finisher.join(0.5)
        assert finisher.is_alive()  # the completion waits for this transaction's lock
    finisher.join(10)
    assert completed == [{dep.id}]
    dependent.refresh_from_db()
    assert (dependent.status, dependent.waiting_on) == ("ready", 0)
    assert Job.objects.get(id=dep.id).status == "done"
