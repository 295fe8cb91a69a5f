"""Building members that depend on nothing (batch add/add_many, group, chord, a graph without
edges) in one lean INSERT: every member is still checked (the first bad one is named and nothing
is written), the rows hold exactly the values given, in member order, and no edge is written."""

from datetime import timedelta

import pytest
from django.test import override_settings

from django_leasequeue import Batch, Workflow, chord, group
from django_leasequeue.enqueueing import task
from django_leasequeue.exceptions import ArgumentsMismatch, EnqueueError, PayloadNotSerializable, PayloadTooLarge
from django_leasequeue.models import Dependency, Job
from django_leasequeue.models import Workflow as WorkflowRow
from django_leasequeue.steps import Step
from django_leasequeue.testing import drain

pytestmark = pytest.mark.django_db


@task(name="tests.wfm.add")
def add(x, y=0):
    return x + y


@task(name="tests.wfm.mul")
def mul(x, factor=2):
    return x * factor


@task(name="tests.wfm.total")
def total(results):
    return sum(results)


@task(name="tests.wfm.keyed", concurrency_key="k{0}", concurrency_limit=1)
def keyed(n):
    return n


def test_add_many_refuses_a_bad_value_naming_the_member_and_writes_nothing():
    b = Batch.open()
    with pytest.raises(PayloadNotSerializable) as refused:
        b.add_many(add, [[1], [2], [{1, 2}], [4]])
    assert str(refused.value).startswith("batch member 3: argument 'x' is a builtins.set")
    with pytest.raises(PayloadNotSerializable, match=r"^batch member 2: keyword argument 'y' is nan"):
        b.add_many(add, [[1], ([2], {"y": float("nan")})])
    assert b.row().members == 0
    assert Job.objects.filter(workflow_id=b.id).count() == 0


def test_add_many_checks_the_signature_of_every_call_shape():
    b = Batch.open()
    # Members 1 and 2 bind (one shape, checked once); member 3 has another shape, which does not.
    with pytest.raises(ArgumentsMismatch) as refused:
        b.add_many(add, [[1], [2], [1, 2, 3]])
    assert str(refused.value).startswith("batch member 3: task 'tests.wfm.add' cannot take these arguments: "
                                         "too many positional arguments")
    with pytest.raises(ArgumentsMismatch, match=r"^batch member 2: .*unexpected keyword argument 'z'"):
        b.add_many(add, [([1], {"y": 1}), ([1], {"z": 1})])
    assert b.row().members == 0
    assert Job.objects.count() == 0


def test_add_many_refuses_a_member_over_the_payload_limit_and_writes_nothing():
    b = Batch.open()
    with override_settings(LEASEQUEUE={"MAX_PAYLOAD_BYTES": 100}):
        ids = b.add_many(add, [["x" * 40]] * 5)  # the five together are over 100 bytes, none alone
        assert len(ids) == 5
        with pytest.raises(PayloadTooLarge) as refused:
            b.add_many(add, [["a"], ["b"], ["x" * 200]])
    assert str(refused.value).startswith("batch member 3: job arguments are 206 bytes, over "
                                         "LEASEQUEUE['MAX_PAYLOAD_BYTES'] = 100")
    assert b.row().members == 5
    assert Job.objects.filter(workflow_id=b.id).count() == 5


def test_add_refuses_bad_options_and_a_closed_batch():
    b = Batch.open()
    with pytest.raises(EnqueueError, match=r"^batch member 2: unknown step options \['colour'\]"):
        b.add(add.step(1), Step(add, (2,), {}, {"colour": 1}))
    with pytest.raises(EnqueueError, match=r"^batch member 1: priority"):
        b.add(add.step(1).set(priority=500))
    b.close()
    with pytest.raises(EnqueueError, match=rf"^batch #{b.id} is closed"):
        b.add(add.step(1))
    assert Job.objects.filter(workflow_id=b.id).count() == 0


def test_group_of_mixed_tasks_and_options_keeps_member_order_and_values():
    h = group(add.step(1, 2), mul.step(3).set(queue="other", priority=7), add.step(5),
              mul.step(4, factor=10), add.step(6).set(run_at=timedelta(hours=1))).enqueue()
    rows = list(Job.objects.filter(workflow_id=h.id).order_by("id")
                .values_list("task", "queue", "priority", "status", "args", "kwargs", "workflow_role",
                             "workflow_step", "waiting_on", "has_dependents", "on_dependency_dead"))
    assert rows == [
        ("tests.wfm.add", "default", 0, "ready", [1, 2], {}, "member", None, 0, False, "hold"),
        ("tests.wfm.mul", "other", 7, "ready", [3], {}, "member", None, 0, False, "hold"),
        ("tests.wfm.add", "default", 0, "ready", [5], {}, "member", None, 0, False, "hold"),
        ("tests.wfm.mul", "default", 0, "ready", [4], {"factor": 10}, "member", None, 0, False, "hold"),
        ("tests.wfm.add", "default", 0, "ready", [6], {}, "member", None, 0, False, "hold"),
    ]
    later = Job.objects.filter(workflow_id=h.id).order_by("id").last()
    assert later.run_at - later.created_at == timedelta(hours=1)
    assert Dependency.objects.count() == 0
    assert h.row().members == 5 and h.row().members_pending == 5
    drain(queues=["default", "other"])
    assert h.results() == [3, 6, 5, 40, None]  # the last is due in an hour


def test_chord_members_and_callback_and_a_graph_of_named_steps_without_edges():
    h = chord([add.step(i) for i in range(4)], total.step()).enqueue()
    ids = list(Job.objects.filter(workflow_id=h.id, workflow_role="member").order_by("id").values_list("id", flat=True))
    cb = h.callbacks()["on_success"]
    assert len(ids) == 4 and cb.id > ids[-1] and cb.status == "waiting"
    drain()
    cb.refresh_from_db()
    assert (cb.status, cb.result) == ("done", 6)

    w = Workflow("named")
    w.add("a", add.step(1))
    w.add("b", mul.step(2).set(on_dependency_dead="cancel"))
    w.add(None, add.step(3))
    hw = w.enqueue()
    assert list(Job.objects.filter(workflow_id=hw.id).order_by("id")
                .values_list("workflow_step", "on_dependency_dead", "args")) == [
        ("a", "hold", [1]), ("b", "cancel", [2]), (None, "hold", [3])]


def test_members_of_a_task_with_per_job_keys_get_their_own_keys():
    b = Batch.open()
    ids = b.add_many(keyed, [[1], [2], [1]])
    assert list(Job.objects.filter(id__in=ids).order_by("id").values_list("concurrency_key", "concurrency_limit",
                                                                        "args")) == [
        ("k1", 1, [1]), ("k2", 1, [2]), ("k1", 1, [1])]
    assert WorkflowRow.objects.get(id=b.id).members == 3


def test_a_batch_of_more_than_one_insert_chunk_keeps_order():
    b = Batch.open()
    ids = b.add_many(add, [[i] for i in range(10_005)])
    assert len(ids) == 10_005 and ids == sorted(ids)
    assert list(Job.objects.filter(id__in=[ids[0], ids[-1]]).order_by("id").values_list("args", flat=True)) == [
        [0], [10_004]]
    assert b.row().members == 10_005


@pytest.mark.django_db(transaction=True)
def test_members_notify_each_queue_once_with_the_earliest_run_at():
    from django_leasequeue.notify import listen_connection, parse_payload

    conn = listen_connection("default", "leasequeue")
    try:
        h = group(add.step(1), add.step(2), mul.step(3).set(queue="other"),
                  add.step(4).set(run_at=timedelta(hours=1))).enqueue()
        later = group(add.step(5).set(run_at=timedelta(hours=2)), add.step(6).set(run_at=timedelta(hours=3))).enqueue()
        notes = [parse_payload(n.payload) for n in conn.notifies(timeout=0.5, stop_after=10)]
    finally:
        conn.close()
    assert Job.objects.filter(workflow_id=h.id).count() == 4
    first_later = Job.objects.get(workflow_id=later.id, args=[5]).run_at
    # One NOTIFY per queue and statement: "default" is due now (its earliest member), "other" too;
    # the second group is due later, and says when its earliest member is due.
    assert sorted(notes[:2]) == [("default", None), ("other", None)]
    assert notes[2:] == [("default", first_later.timestamp())]
