"""WorkflowHandle over a workflow's life (state, counts, results, steps, callbacks, is_finished),
idempotent building with a unique_key, and replays after the callbacks already ran."""

from __future__ import annotations

import pytest
from django.db import transaction

from django_leasequeue import Batch, Workflow, WorkflowHandle, chain, chord, group, store
from django_leasequeue.exceptions import EnqueueError
from django_leasequeue.models import Job
from django_leasequeue.testing import drain
from tests.workflows.wf_tasks import add, collect, flaky, rows, statuses

pytestmark = pytest.mark.django_db

COUNTS0 = {"waiting": 0, "ready": 0, "leased": 0, "done": 0, "dead": 0, "cancelled": 0}


def counts(**values: int) -> dict[str, int]:
    return {**COUNTS0, **values}


def claims(job_id: int) -> int:
    return Job.objects.get(id=job_id).attempts


# --- the lifecycle -----------------------------------------------------------------------------

def test_the_state_of_a_workflow_over_its_life():
    wf = Workflow("life")
    wf.add("a", add.step(1))
    wf.add("b", flaky.step(2, fail=True), depends_on=["a"])
    wf.add("c", add.step(3), depends_on=["b"])
    wf.on_complete(add.step(0))
    h = wf.enqueue()
    assert repr(h) == f"<WorkflowHandle #{h.id}>"
    assert h.created is True
    a, b, c = (h.steps()[n] for n in "abc")
    assert list(h.steps()) == ["a", "b", "c"]
    assert [j.id for j in h.members()] == [a.id, b.id, c.id]
    assert list(h.callbacks()) == ["on_complete"]
    assert [j.id for j in h.jobs()] == [a.id, b.id, c.id, h.callbacks()["on_complete"].id]

    assert (h.state, h.is_finished()) == ("running", False)
    assert h.counts() == counts(ready=1, waiting=2)
    assert h.results() == [None, None, None]

    drain(max_jobs=1)
    assert (h.state, h.counts()) == ("running", counts(done=1, ready=1, waiting=1))
    assert h.results() == [1, None, None]

    drain(raise_failures=False)
    assert (h.state, h.is_finished()) == ("blocked", False)
    assert h.counts() == counts(done=1, dead=1, waiting=1)
    assert [j.id for j in h.blocked_by()] == [b.id]
    assert h.callbacks()["on_complete"].status == "waiting"  # c is pending: not complete yet

    # The operator cancels the rest: c and the waiting on_complete callback too (cancel() takes
    # every pending job of the workflow, callbacks included), so the workflow finishes at once.
    on_complete = h.callbacks()["on_complete"]
    assert h.cancel() == store.CancelCounts(cancelled=2, requested=0, unchanged=0)
    assert statuses(h) == ["done", "dead", "cancelled", "cancelled"]
    assert Job.objects.get(id=on_complete.id).history[-1]["by"] == f"workflow #{h.id} cancelled"
    assert (h.state, h.is_finished()) == ("finished", True)
    assert h.counts() == counts(done=1, dead=1, cancelled=1)
    assert h.row().finished_at is not None
    assert len(drain()) == 0


def test_a_handle_reads_the_database_on_each_call():
    h = group(add.step(1), add.step(2)).enqueue()
    other = WorkflowHandle(h.id)
    assert other.created is True  # a handle built by hand claims nothing about the build
    drain()
    assert other.results() == [1, 2] and other.state == "succeeded"
    assert WorkflowHandle.get(h.id).created is False


# --- idempotent building -----------------------------------------------------------------------

def test_building_again_with_the_same_unique_key_returns_the_same_workflow_and_writes_nothing():
    h = chain(add.step(1), add.step(2), unique_key="import-1").enqueue()
    before = rows()
    again = chain(add.step(100), unique_key="import-1").enqueue()  # other steps: the key decides
    assert (again.id, again.created) == (h.id, False)
    assert rows() == before
    assert h.row().unique_key == "import-1"

    drain()
    assert h.state == "succeeded"
    # After it finished, the key is still taken: the finished workflow is returned, nothing runs.
    after = chain(add.step(1), add.step(2), unique_key="import-1").enqueue()
    assert (after.id, after.created, after.state) == (h.id, False, "succeeded")
    assert rows() == before
    assert len(drain()) == 0


def test_the_unique_key_is_shared_by_every_kind():
    c = chord([add.step(1)], collect.step(), unique_key="k").enqueue()
    g = group(add.step(1), unique_key="k").enqueue()
    b = Batch.open(unique_key="k")
    assert (g.id, g.created, b.id, b.created) == (c.id, False, c.id, False)
    # The handle Batch.open() returned is the chord's, which is closed: adding to it is refused.
    assert b.row().kind == "chord"
    with pytest.raises(EnqueueError, match=f"^batch #{c.id} is closed"):
        b.add(add.step(1))


@pytest.mark.django_db(transaction=True)
def test_enqueue_on_commit_builds_at_commit_and_a_second_build_with_the_key_writes_nothing():
    with transaction.atomic():
        chain(add.step(1), unique_key="on-commit").enqueue_on_commit()
        chain(add.step(1), unique_key="on-commit").enqueue_on_commit()
        assert rows() == {"jobs": 0, "workflows": 0, "dependencies": 0}
    assert rows() == {"jobs": 1, "workflows": 1, "dependencies": 0}


# --- replays after the callbacks ran -----------------------------------------------------------

def test_replaying_a_dead_member_after_on_complete_ran_does_not_run_it_again():
    b = Batch.open(on_success=collect.step().set(pass_result=True), on_complete=collect.step().set(pass_result=True))
    [ok, bad] = b.add(add.step(1), flaky.step(2, fail=True))
    b.close()
    drain(raise_failures=False)
    on_success, on_complete = b.callbacks()["on_success"], b.callbacks()["on_complete"]
    assert (on_complete.status, on_complete.result, claims(on_complete.id)) == ("done", [1, None], 1)
    assert on_success.status == "waiting"
    assert b.row().finished_at is None  # on_success is still pending
    row = b.row()
    assert (row.members_pending, row.members_done, row.members_dead) == (0, 1, 1)

    assert store.job_replay([bad], kwargs={"fail": False}).replayed == [bad]
    row = b.row()
    assert (row.members_pending, row.members_done, row.members_dead) == (1, 1, 0)
    assert b.state == "running"

    result = drain()

    assert [r.job_id for r in result] == [bad, on_success.id]  # on_complete is not run again
    row = b.row()
    assert (row.members, row.members_pending, row.members_done, row.members_dead) == (2, 0, 2, 0)
    on_success, on_complete = b.callbacks()["on_success"], b.callbacks()["on_complete"]
    assert (on_success.status, on_success.result, claims(on_success.id)) == ("done", [1, 2], 1)
    assert (on_complete.status, on_complete.result, claims(on_complete.id)) == ("done", [1, None], 1)
    assert b.state == "succeeded" and b.is_finished() is True


def test_replaying_a_dead_member_of_an_all_finished_chord_after_its_callback_ran():
    h = chord([add.step(1), flaky.step(2, fail=True)], collect.step(), policy="all_finished").enqueue()
    _, bad = h.members()
    drain(raise_failures=False)
    callback = h.callbacks()["on_complete"]
    assert (callback.status, callback.result) == ("done", [1, None])
    assert h.state == "finished" and h.is_finished() is True

    store.job_replay([bad.id], kwargs={"fail": False})
    assert h.is_finished() is False  # a member is pending again
    assert h.state == "running"
    result = drain()

    # The callback ran once, with the failure; the replayed member's result does not reach it.
    assert [r.job_id for r in result] == [bad.id]
    callback.refresh_from_db()
    assert (callback.result, callback.attempts) == ([1, None], 1)
    assert h.results() == [1, 2]
    assert h.state == "succeeded" and h.is_finished() is True


def test_a_cancelled_on_success_stays_cancelled_when_the_member_is_replayed_and_done():
    b = Batch.open(on_success=collect.step().set(pass_result=True), on_dependency_dead="cancel")
    [_, bad] = b.add(add.step(1), flaky.step(2, fail=True))
    b.close()
    drain(raise_failures=False)
    assert b.callbacks()["on_success"].status == "cancelled"
    store.job_replay([bad], kwargs={"fail": False})
    assert [r.job_id for r in drain()] == [bad]
    assert b.callbacks()["on_success"].status == "cancelled"
    # Every member is done now, but on_success was cancelled and never ran: finished, not succeeded.
    assert b.state == "finished" and b.is_finished() is True


def test_replaying_a_cancelled_chord_waits_for_its_members_again():
    h = chord([add.step(1), add.step(2)], collect.step()).enqueue()
    h.cancel()
    assert statuses(h) == ["cancelled"] * 3
    replay = store.job_replay([j.id for j in h.jobs()])
    assert len(replay.replayed) == 3
    assert h.callbacks()["on_success"].status == "waiting"

    drain()

    callback = h.callbacks()["on_success"]
    assert (callback.status, callback.args, callback.result) == ("done", [[1, 2]], [1, 2])
    assert h.state == "succeeded"


def test_replaying_a_dead_callback_reruns_it_with_the_results_it_received():
    h = chord([add.step(1), add.step(2)], flaky.step(fail=True)).enqueue()
    drain(raise_failures=False)
    callback = h.callbacks()["on_success"]
    assert (callback.status, callback.args) == ("dead", [[1, 2]])

    assert store.job_replay([callback.id], kwargs={"fail": False}).replayed == [callback.id]

    callback.refresh_from_db()
    assert (callback.status, callback.args) == ("ready", [[1, 2]])  # not prepended a second time
    drain()
    callback.refresh_from_db()
    assert (callback.status, callback.result) == ("done", [1, 2])  # flaky returns its value
    assert h.state == "succeeded"


def test_replaying_members_and_a_released_callback_together_does_not_prepend_twice():
    h = chord([add.step(1), flaky.step(2, fail=True)], collect.step(), policy="all_finished").enqueue()
    drain(max_jobs=2, raise_failures=False)
    (callback,) = h.callbacks().values()
    assert (callback.status, callback.args) == ("ready", [[1, None]])
    h.cancel()  # the callback is cancelled while ready: it had received its results
    dead = h.members().get(status="dead")

    store.job_replay([dead.id, callback.id])

    callback.refresh_from_db()
    assert (callback.status, callback.args) == ("ready", [[1, None]])  # replayed as it was released


def test_a_step_cancelled_by_the_policy_and_replayed_after_its_dependency_gets_the_result():
    h = chain(flaky.step(5, fail=True), add.step(10), add.step(100), on_dependency_dead="cancel").enqueue()
    drain(raise_failures=False)
    first, second, third = h.jobs().order_by("id")
    assert [first.status, second.status, third.status] == ["dead", "cancelled", "cancelled"]
    store.job_replay([first.id], kwargs={"fail": False})
    drain()  # step 1 is done; steps 2 and 3 stay cancelled

    assert store.job_replay([second.id, third.id]).replayed == [second.id, third.id]

    second.refresh_from_db()
    third.refresh_from_db()
    assert (second.status, second.args, second.waiting_on) == ("ready", [5, 10], 0)
    assert (third.status, third.waiting_on) == ("waiting", 1)
    drain()
    assert h.results() == [5, 15, 115]


def test_a_dependent_cancelled_while_waiting_and_replayed_before_its_dependency_waits_for_it():
    h = chain(flaky.step(5, fail=True), add.step(10), on_dependency_dead="cancel").enqueue()
    drain(raise_failures=False)
    first, second = h.jobs().order_by("id")

    with transaction.atomic():  # replayed together: the dependency is pending again when the dependent is judged
        store.job_replay([first.id], kwargs={"fail": False})
        store.job_replay([second.id])

    second.refresh_from_db()
    assert (second.status, second.waiting_on) == ("waiting", 1)
    drain()
    assert h.results() == [5, 15]


def test_a_callback_cancelled_twice_while_it_waited_still_waits_for_its_members():
    h = chord([add.step(1), add.step(2)], collect.step()).enqueue()
    h.cancel()
    callback = h.callbacks()["on_success"]
    store.job_replay([callback.id])
    assert Job.objects.get(id=callback.id).status == "waiting"  # its members are cancelled
    store.job_request_cancel([callback.id])

    store.job_replay([callback.id])

    assert Job.objects.get(id=callback.id).status == "waiting"
    store.job_replay(list(h.members().values_list("id", flat=True)))
    drain()
    callback.refresh_from_db()
    assert (callback.status, callback.args, callback.result) == ("done", [[1, 2]], [1, 2])


def test_a_callback_replayed_after_its_members_are_done_starts_with_their_results():
    b = Batch.open(on_success=collect.step().set(pass_result=True), on_dependency_dead="cancel")
    [_, bad] = b.add(add.step(1), flaky.step(2, fail=True))
    b.close()
    drain(raise_failures=False)
    callback = b.callbacks()["on_success"]
    assert callback.status == "cancelled"
    store.job_replay([bad], kwargs={"fail": False})
    drain()

    store.job_replay([callback.id])

    callback.refresh_from_db()
    assert (callback.status, callback.args) == ("ready", [[1, 2]])
    drain()
    assert b.state == "succeeded"


def test_a_dependent_cancelled_twice_and_replayed_after_its_dependency_gets_the_result():
    h = chain(flaky.step(5, fail=True), add.step(10), on_dependency_dead="cancel").enqueue()
    drain(raise_failures=False)
    first, second = h.jobs().order_by("id")
    store.job_replay([second.id])
    assert Job.objects.get(id=second.id).status == "waiting"
    store.job_request_cancel([second.id])
    store.job_replay([first.id], kwargs={"fail": False})
    drain()

    store.job_replay([second.id])

    second.refresh_from_db()
    assert (second.status, second.args) == ("ready", [5, 10])


def test_edit_and_replay_of_a_cancelled_dependent_puts_the_results_before_the_edited_arguments():
    h = chain(flaky.step(5, fail=True), add.step(10), on_dependency_dead="cancel").enqueue()
    drain(raise_failures=False)
    first, second = h.jobs().order_by("id")
    store.job_replay([first.id], kwargs={"fail": False})
    drain()

    store.job_replay([second.id], args=[20])

    second.refresh_from_db()
    assert (second.status, second.args) == ("ready", [5, 20])
    drain()
    assert h.results() == [5, 25]
