"""Enqueue belongs to the caller's transaction: cases C08, C09, C10, and
``enqueue_on_commit``. These need real commits, so they run with ``transactional_db``."""

from decimal import Decimal

import pytest
from django.db import DatabaseError, connection, transaction
from qa.models import Execution
from qa.tasks import record

from django_leasequeue import PayloadNotSerializable, enqueue, enqueue_on_commit
from django_leasequeue.models import Job
from tests.support import claim, in_threads

pytestmark = pytest.mark.django_db(transaction=True)


class Boom(Exception):
    pass


def other_connection_claims() -> list[int]:
    """Job ids a worker on another connection can claim right now."""
    return [c.id for c in in_threads(1, lambda i: claim(limit=100))[0]]


def business_row(tag: str) -> Execution:
    """A stand-in for the caller's own business write (an order, a flag)."""
    return Execution.objects.create(job_id=0, lease_version=0, attempt=0, worker="web", tag=tag)


def test_c09_rolled_back_block_leaves_no_job():
    with pytest.raises(Boom):
        with transaction.atomic():
            enqueue(record, ["x"])
            business_row("order")
            raise Boom
    assert Job.objects.count() == 0 and Execution.objects.count() == 0
    assert other_connection_claims() == []


def test_c09_savepoint_rollback_inside_committed_transaction():
    with transaction.atomic():
        kept = enqueue(record, ["kept"])
        with pytest.raises(Boom):
            with transaction.atomic():  # a savepoint
                enqueue(record, ["dropped"])
                enqueue_on_commit(record, ["dropped on commit"])
                raise Boom
        business_row("order")
    assert list(Job.objects.values_list("id", "args")) == [(kept.id, ["kept"])]


def test_c09_rolled_back_enqueue_not_flushed_by_a_later_commit():
    with pytest.raises(Boom):
        with transaction.atomic():
            enqueue(record, ["a"])
            enqueue_on_commit(record, ["b"])
            raise Boom
    with transaction.atomic():
        business_row("unrelated")
    assert Job.objects.count() == 0
    assert other_connection_claims() == []


def test_c08_job_invisible_to_workers_until_commit():
    with transaction.atomic():
        job = enqueue(record, ["x"])
        business_row("order")
        assert other_connection_claims() == []
    assert other_connection_claims() == [job.id]


def test_enqueue_on_commit_runs_only_on_commit():
    with transaction.atomic():
        enqueue_on_commit(record, ["later"], {"sleep": 0.0})
        record.using(priority=5).enqueue_on_commit("via task")
        assert Job.objects.count() == 0  # not even visible to the same connection
    jobs = list(Job.objects.order_by("id").values_list("args", "kwargs", "priority"))
    assert jobs == [(["later"], {"sleep": 0.0}, 0), (["via task"], {}, 5)]


def test_enqueue_on_commit_snapshots_arguments_at_call_time():
    data = {"n": 1}
    with transaction.atomic():
        enqueue_on_commit(record, [data])
        data["n"] = 2
        data["later"] = Decimal("1")  # would not even be JSON any more
    assert list(Job.objects.values_list("args", flat=True)) == [[{"n": 1}]]


def test_enqueue_on_commit_outside_a_transaction_enqueues_at_once():
    assert connection.get_autocommit()
    enqueue_on_commit(record, ["now"])
    assert Job.objects.count() == 1


def test_enqueue_on_commit_validates_eagerly():
    with transaction.atomic():
        with pytest.raises(PayloadNotSerializable, match="keyword argument 'tag'"):
            enqueue_on_commit(record, [], {"tag": Decimal("1")})
        with pytest.raises(PayloadNotSerializable):
            record.enqueue_on_commit(Decimal("1"))
        business_row("still usable")  # the transaction was not touched
    assert Job.objects.count() == 0 and Execution.objects.count() == 1


@pytest.fixture
def reject_poison_jobs():
    """A real database failure for one task's insert: a trigger that raises (no mocking)."""
    with connection.cursor() as cur:
        cur.execute("""
            CREATE FUNCTION qa_reject_poison() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.task = 'qa.poison' THEN RAISE EXCEPTION 'queue table refuses qa.poison'; END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER qa_reject_poison BEFORE INSERT ON leasequeue_job
                FOR EACH ROW EXECUTE FUNCTION qa_reject_poison();
        """)
    yield
    with connection.cursor() as cur:
        cur.execute("DROP TRIGGER qa_reject_poison ON leasequeue_job; DROP FUNCTION qa_reject_poison();")


def test_c10_enqueue_failure_rolls_back_the_callers_transaction(reject_poison_jobs):
    with pytest.raises(DatabaseError, match="refuses qa.poison"):
        with transaction.atomic():
            business_row("notified")
            enqueue("qa.poison")
    assert Execution.objects.count() == 0 and Job.objects.count() == 0


def test_c10_enqueue_on_commit_failure_is_raised_not_swallowed(reject_poison_jobs):
    with pytest.raises(DatabaseError, match="refuses qa.poison"):
        with transaction.atomic():
            business_row("notified")
            enqueue_on_commit("qa.poison")
    # The business change committed before the deferred enqueue ran: that is the documented cost
    # of on_commit, and the caller heard about the failure.
    assert Execution.objects.count() == 1 and Job.objects.count() == 0
