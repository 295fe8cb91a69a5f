"""Unique keys and isolation levels (documented in docs/howto/idempotency.md, "Unique keys and isolation
levels").

Unique-key enqueue relies on READ COMMITTED, Django's and PostgreSQL's default: a key committed by
another transaction while the caller's transaction runs is found and that job returned. Under
REPEATABLE READ or SERIALIZABLE, ``INSERT ... ON CONFLICT DO NOTHING`` meets a row its snapshot
cannot see and PostgreSQL raises a serialization failure (SQLSTATE 40001, Django's
``OperationalError``); the caller's transaction is aborted and must be retried as a whole, as for
any serialization failure, and the retry gets the existing job.
"""

import threading

import pytest
from django.db import OperationalError, connection, connections, transaction
from qa.models import Effect
from qa.tasks import record

from django_leasequeue import enqueue
from django_leasequeue.models import Job

pytestmark = pytest.mark.django_db(transaction=True)


def enqueue_elsewhere(key: str) -> Job:
    """Enqueue and commit from another connection (another request, another process)."""
    done: list[Job] = []

    def run() -> None:
        try:
            done.append(enqueue(record, ["other"], unique_key=key))
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(20)
    return done[0]


def begin(level: str) -> None:
    """Set the isolation level of the transaction just opened and take its snapshot."""
    with connection.cursor() as cur:
        cur.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
        cur.execute("SELECT count(*) FROM leasequeue_job")


def test_read_committed_caller_gets_the_job_committed_after_its_transaction_began():
    with transaction.atomic():
        begin("READ COMMITTED")
        other = enqueue_elsewhere("K")
        mine = enqueue(record, ["mine"], unique_key="K")
        Effect.objects.create(key="caller", job_id=mine.id, lease_version=0)  # the transaction goes on
    assert (mine.id, mine.args) == (other.id, ["other"])
    assert Job.objects.count() == 1 and Effect.objects.get().job_id == other.id


@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
def test_snapshot_isolation_caller_gets_a_serialization_failure_and_its_retry_gets_the_job(level):
    other = None
    with pytest.raises(OperationalError, match="could not serialize access due to concurrent update") as raised:
        with transaction.atomic():
            begin(level)
            other = enqueue_elsewhere("K")
            enqueue(record, ["mine"], unique_key="K")
    assert raised.value.__cause__.sqlstate == "40001"
    with transaction.atomic():  # the retry of the whole transaction: a new snapshot sees the key
        begin(level)
        again = enqueue(record, ["mine"], unique_key="K")
    assert (again.id, again.args) == (other.id, ["other"])
    assert Job.objects.count() == 1


@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
def test_snapshot_isolation_caller_gets_a_job_committed_before_its_snapshot(level):
    other = enqueue_elsewhere("K")
    with transaction.atomic():
        begin(level)
        mine = enqueue(record, ["mine"], unique_key="K")
    assert (mine.id, mine.args) == (other.id, ["other"])
    assert Job.objects.count() == 1
