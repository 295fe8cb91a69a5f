"""Chains, in-process with ``drain()``: results passed along, a dead step holds the rest until it
is replayed, and cancelling the rest."""

from __future__ import annotations

import pytest

from django_leasequeue import chain, store
from django_leasequeue.models import Job
from django_leasequeue.store import CancelCounts
from django_leasequeue.testing import drain
from tests.workflows.wf_tasks import add, echo, flaky, statuses

pytestmark = pytest.mark.django_db

COUNTS0 = {"waiting": 0, "ready": 0, "leased": 0, "done": 0, "dead": 0, "cancelled": 0}


def counts(**values: int) -> dict[str, int]:
    return {**COUNTS0, **values}


def test_each_step_gets_the_previous_result_prepended():
    h = chain(add.step(1, 2), add.step(10), echo.step("x", k=1)).enqueue()
    assert h.row().kind == "chain"
    assert list(h.steps()) == ["1", "2", "3"]
    assert statuses(h) == ["ready", "waiting", "waiting"]
    assert [j.args for j in h.members()] == [[1, 2], [10], ["x"]]

    result = drain()

    assert [run.task for run in result] == ["tests.wfx.add", "tests.wfx.add", "tests.wfx.echo"]
    assert h.results() == [3, 13, {"args": [13, "x"], "kwargs": {"k": 1}}]
    # The released steps' stored args have the passed value in front.
    assert [j.args for j in h.members()] == [[1, 2], [3, 10], [13, "x"]]
    assert h.state == "succeeded"


def test_a_step_with_pass_result_false_gets_only_its_own_arguments():
    h = chain(add.step(1), add.step(5).set(pass_result=False), add.step(100)).enqueue()
    drain()
    assert h.results() == [1, 5, 105]
    assert [j.pass_result for j in h.members()] == [False, False, True]  # step 1 has no dependency


def test_a_dead_middle_step_holds_the_rest_until_it_is_replayed():
    h = chain(add.step(1), flaky.step(fail=True), add.step(100)).enqueue()
    one, two, three = h.members()

    result = drain(raise_failures=False)

    assert [(run.job_id, run.outcome) for run in result] == [(one.id, "done"), (two.id, "dead")]
    assert statuses(h) == ["done", "dead", "waiting"]
    assert h.counts() == counts(done=1, dead=1, waiting=1)
    assert h.results() == [1, None, None]
    assert h.state == "blocked"
    assert [j.id for j in h.blocked_by()] == [two.id]
    assert Job.objects.get(id=two.id).errors[-1]["message"] == "flaky failed on 1"
    assert h.is_finished() is False

    # Replayed unchanged, it dies again and still holds step 3.
    assert store.job_replay([two.id]).replayed == [two.id]
    assert h.state == "running"
    assert [(r.job_id, r.outcome) for r in drain(raise_failures=False)] == [(two.id, "dead")]
    assert h.state == "blocked" and [j.id for j in h.blocked_by()] == [two.id]
    assert Job.objects.get(id=three.id).waiting_on == 1

    # Replayed with its payload fixed, the chain resumes from there: step 1 does not run again.
    replay = store.job_replay([two.id], kwargs={"fail": False}, by="operator")
    assert (replay.replayed, replay.refused) == ([two.id], {})
    assert [(r.job_id, r.outcome) for r in drain()] == [(two.id, "done"), (three.id, "done")]
    assert h.results() == [1, 1, 101]
    assert h.state == "succeeded" and h.is_finished() is True
    assert h.blocked_by() == []
    assert Job.objects.get(id=one.id).attempts == 1
    row = h.row()
    assert (row.members, row.members_pending, row.members_done, row.members_dead) == (3, 0, 3, 0)


def test_cancel_before_anything_ran_cancels_every_step():
    h = chain(add.step(1), add.step(2), add.step(3)).enqueue()

    assert h.cancel() == CancelCounts(cancelled=3, requested=0, unchanged=0)

    assert statuses(h) == ["cancelled"] * 3
    assert h.counts() == counts(cancelled=3)
    assert h.state == "cancelled" and h.is_finished() is True
    assert [j.history[-1]["by"] for j in h.members()] == [f"workflow #{h.id} cancelled"] * 3
    assert h.cancel() == CancelCounts(0, 0, 0)  # nothing pending is left
    assert len(drain()) == 0


def test_cancel_mid_chain_cancels_the_pending_steps_and_asks_the_running_one_to_stop():
    h = chain(add.step(1), add.step(2), add.step(3), add.step(4)).enqueue()
    one, two, three, four = h.members()
    assert [r.job_id for r in drain(max_jobs=1)] == [one.id]
    [leased] = store.job_claim(queues=["default"], limit=1, worker_id="w", lease=30)
    assert leased.id == two.id

    assert h.cancel(by="alice") == CancelCounts(cancelled=2, requested=1, unchanged=0)

    assert statuses(h) == ["done", "leased", "cancelled", "cancelled"]
    assert Job.objects.get(id=two.id).cancel_requested is True
    assert [j.history[-1]["event"] for j in h.members()[1:]] == ["cancel_requested", "cancelled", "cancelled"]
    assert {j.history[-1]["by"] for j in h.members()[1:]} == {"alice"}
    assert h.state == "running" and h.is_finished() is False
    assert h.cancel() == CancelCounts(cancelled=0, requested=0, unchanged=1,
                                     skipped={"already asked to stop": 1})

    # The running step's completion ends it cancelled (its value is dropped).
    completed = store.job_complete([(leased.id, leased.lease_version, "3")])
    assert set(completed.cancelled) == {two.id}
    assert statuses(h) == ["done", "cancelled", "cancelled", "cancelled"]
    assert h.counts() == counts(done=1, cancelled=3)
    assert h.results() == [1, None, None, None]
    assert h.state == "finished" and h.is_finished() is True
