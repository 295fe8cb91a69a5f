"""Batches, in-process: members added over several transactions, callbacks that wait for the
close, closing twice, adding after the close, an empty batch, Batch.get()."""

from __future__ import annotations

import re

import pytest
from django.db import transaction

from django_leasequeue import Batch, WorkflowHandle, chain
from django_leasequeue.exceptions import ArgumentsMismatch, EnqueueError
from django_leasequeue.testing import drain
from django_leasequeue.workflows import BatchHandle
from tests.workflows.wf_tasks import add, collect, flaky, refused, rows, statuses

pytestmark = pytest.mark.django_db

COUNTS0 = {"waiting": 0, "ready": 0, "leased": 0, "done": 0, "dead": 0, "cancelled": 0}


def counts(**values: int) -> dict[str, int]:
    return {**COUNTS0, **values}


def counters(handle) -> tuple[int, int, int, int, int]:
    row = handle.row()
    return (row.members, row.members_pending, row.members_done, row.members_dead, row.members_cancelled)


def test_members_added_over_several_transactions_and_callbacks_that_wait_for_the_close():
    b = Batch.open("nightly", on_success=collect.step().set(pass_result=True),
                   on_complete=add.step(0, 1))
    assert isinstance(b, BatchHandle) and b.created is True
    assert (b.row().kind, b.row().name, b.row().closed_at) == ("batch", "nightly", None)
    assert b.state == "open"
    assert statuses(b) == ["waiting", "waiting"]  # the two callbacks

    with transaction.atomic():
        first = b.add(add.step(1), add.step(2))
    with transaction.atomic():
        second = b.add_many(add, [[3], ([4], {"y": 1})], priority=5)
    assert counters(b) == (4, 4, 0, 0, 0)

    # Every member done, but the batch is open: the callbacks wait.
    result = drain()
    assert sorted(r.job_id for r in result) == sorted(first + second)
    assert counters(b) == (4, 0, 4, 0, 0)
    assert b.state == "open" and b.is_finished() is False
    assert [c.status for c in b.callbacks().values()] == ["waiting", "waiting"]

    with transaction.atomic():
        third = b.add(add.step(6))
    assert b.close() is True
    assert b.close() is False  # closed already
    assert b.state == "running"

    result = drain()

    callbacks = b.callbacks()
    assert list(callbacks) == ["on_success", "on_complete"]
    assert [r.job_id for r in result] == [*third, callbacks["on_success"].id, callbacks["on_complete"].id]
    assert (callbacks["on_success"].status, callbacks["on_success"].result) == ("done", [1, 2, 3, 5, 6])
    assert (callbacks["on_complete"].status, callbacks["on_complete"].result) == ("done", 1)
    assert b.results() == [1, 2, 3, 5, 6]
    assert counters(b) == (5, 0, 5, 0, 0)
    assert b.state == "succeeded" and b.is_finished() is True


def test_a_rolled_back_add_leaves_no_member_and_no_count():
    b = Batch.open()
    before = rows()
    with pytest.raises(RuntimeError), transaction.atomic():
        b.add(add.step(1))
        raise RuntimeError("the caller's transaction fails")
    assert rows() == before
    assert counters(b) == (0, 0, 0, 0, 0)


def test_adding_to_a_closed_batch_is_refused_and_writes_nothing():
    b = Batch.open(on_complete=add.step(1))
    b.add(add.step(1))
    assert b.close() is True
    message = f"^batch #{b.id} is closed \\(or does not exist\\): open a new batch$"
    with refused(EnqueueError, message):
        b.add(add.step(2))
    with refused(EnqueueError, message):
        b.add_many(add, [[1], [2]])
    assert counters(b) == (1, 1, 0, 0, 0)
    assert b.add() == []  # nothing to add: no check, nothing written


def test_an_invalid_member_is_refused_and_writes_nothing():
    b = Batch.open()
    b.add(add.step(1))
    with refused(ArgumentsMismatch, "^batch member 2: task 'tests.wfx.add' cannot take these arguments"):
        b.add(add.step(1), add.step(1, 2, 3))
    with refused(EnqueueError, "^batch member 1 must be a Step"):
        b.add("x")
    with refused(EnqueueError, re.escape("args must be a list or tuple")):
        b.add_many(add, ["12"])
    assert counters(b) == (1, 1, 0, 0, 0)


def test_an_empty_batch_closed_runs_both_callbacks_at_once():
    b = Batch.open(on_success=collect.step().set(pass_result=True), on_complete=add.step(0))
    assert b.close() is True
    # No member is pending, and 0 of 0 members are done: both callbacks are released.
    assert [c.status for c in b.callbacks().values()] == ["ready", "ready"]
    assert b.state == "running"

    result = drain()

    callbacks = b.callbacks()
    assert len(result) == 2
    assert (callbacks["on_success"].args, callbacks["on_success"].result) == ([[]], [])
    assert callbacks["on_complete"].result == 0
    assert b.counts() == counts()
    assert b.state == "succeeded" and b.is_finished() is True


def test_an_empty_batch_without_callbacks_is_finished_when_closed():
    b = Batch.open()
    assert b.close() is True
    assert b.is_finished() is True and b.state == "succeeded"
    assert b.results() == []


def test_a_dead_member_holds_on_success_and_on_complete_runs():
    b = Batch.open(on_success=collect.step().set(pass_result=True), on_complete=collect.step().set(pass_result=True))
    [ok, bad] = b.add(add.step(1), flaky.step(2, fail=True))
    b.close()
    drain(raise_failures=False)
    callbacks = b.callbacks()
    assert callbacks["on_success"].status == "waiting"
    assert (callbacks["on_complete"].status, callbacks["on_complete"].result) == ("done", [1, None])
    assert b.state == "blocked"
    assert [j.id for j in b.blocked_by()] == [bad]


@pytest.mark.parametrize(("policy", "on_success_status"), [("cancel", "cancelled"), ("run", "done")])
def test_the_batch_policy_decides_on_success_when_a_member_died(policy, on_success_status):
    b = Batch.open(on_success=collect.step().set(pass_result=True), on_dependency_dead=policy)
    b.add(add.step(1), flaky.step(2, fail=True))
    b.close()
    drain(raise_failures=False)
    on_success = b.callbacks()["on_success"]
    assert on_success.status == on_success_status
    assert on_success.result == (None if policy == "cancel" else [1, None])
    assert b.state == "finished" and b.is_finished() is True


def test_batch_get_returns_the_handle_and_refuses_other_ids():
    b = Batch.open("x")
    again = Batch.get(b.id)
    assert isinstance(again, BatchHandle)
    assert (again.id, again.created) == (b.id, False)
    again.add(add.step(1))
    assert b.row().members == 1
    with pytest.raises(LookupError, match=f"^no batch #{b.id + 1000}$"):
        Batch.get(b.id + 1000)
    c = chain(add.step(1)).enqueue()
    with pytest.raises(LookupError, match=f"^no batch #{c.id}$"):
        Batch.get(c.id)
    assert WorkflowHandle.get(c.id).id == c.id
    with pytest.raises(LookupError, match=f"^no workflow #{c.id + 1000}$"):
        WorkflowHandle.get(c.id + 1000)


def test_opening_a_batch_with_a_taken_unique_key_returns_it_and_writes_nothing():
    b = Batch.open("first", unique_key="nightly-1", on_complete=add.step(1))
    before = rows()
    again = Batch.open("second", unique_key="nightly-1", on_success=add.step(2))
    assert (again.id, again.created) == (b.id, False)
    assert rows() == before
    assert b.row().name == "first" and list(again.callbacks()) == ["on_complete"]


def test_a_batch_whose_callback_takes_results_refuses_members_past_the_inline_limit(monkeypatch):
    import django_leasequeue.workflows.batch as batch_module
    from django_leasequeue.exceptions import EnqueueError

    monkeypatch.setattr(batch_module, "INLINE_RESULTS_MAX", 3)
    b = Batch.open(on_success=collect.step().set(pass_result=True))
    b.add(add.step(1), add.step(2))
    with pytest.raises(EnqueueError, match=r"a batch passes at most 3 of them in its arguments"):
        b.add(add.step(3), add.step(4))
    b.add(add.step(3))
    assert (b.row().members, b.members().count()) == (3, 3)  # the refused add wrote nothing

    by_reference = Batch.open(on_success=collect.step(None).set(pass_result=False))
    by_reference.add_many(add, [[i] for i in range(5)])
    assert by_reference.row().members == 5


def test_cancelling_an_open_batch_closes_it_and_cancels_its_callbacks_unreleased():
    from django_leasequeue.exceptions import EnqueueError

    b = Batch.open(on_success=collect.step().set(pass_result=True), on_complete=collect.step(None))
    b.add(add.step(1))
    drain()  # the member is done; the batch is still open, its callbacks wait

    counts = b.cancel()

    assert counts.cancelled == 2
    assert {role: (job.status, job.args) for role, job in b.callbacks().items()} == {
        "on_success": ("cancelled", []), "on_complete": ("cancelled", [None])}
    with pytest.raises(EnqueueError, match="is closed"):
        b.add(add.step(2))
    assert b.row().closed_at is not None and b.is_finished()
