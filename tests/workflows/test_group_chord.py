"""Groups and chords, in-process with ``drain()``: counts per state and results in member order,
and a chord callback that runs exactly once, held or run with the failures per its policy."""

from __future__ import annotations

import pytest

from django_leasequeue import chord, group, store
from django_leasequeue.models import Job
from django_leasequeue.testing import drain
from tests.workflows.wf_tasks import add, collect, flaky, total

pytestmark = pytest.mark.django_db

COUNTS0 = {"waiting": 0, "ready": 0, "leased": 0, "done": 0, "dead": 0, "cancelled": 0}


def counts(**values: int) -> dict[str, int]:
    return {**COUNTS0, **values}


def runs_of(result, job_id):
    return [run.outcome for run in result if run.job_id == job_id]


# --- group -------------------------------------------------------------------------------------

def test_a_group_counts_its_members_and_keeps_results_in_order_with_a_failing_member():
    h = group(add.step(i) for i in (1, 2)).enqueue()
    g = group(add.step(1), flaky.step(2, fail=True), add.step(3).set(priority=50), name="mixed").enqueue()
    first, bad, last = g.members()
    assert (g.row().kind, g.row().name, g.row().members) == ("group", "mixed", 3)
    assert g.counts() == counts(ready=3)
    assert g.state == "running"
    assert g.results() == [None, None, None]
    assert g.callbacks() == {} and g.steps() == {}

    result = drain(raise_failures=False)

    # The member with priority 50 ran first; the results are still in the order of the steps.
    assert result.runs[0].job_id == last.id
    assert runs_of(result, bad.id) == ["dead"]
    assert g.counts() == counts(done=2, dead=1)
    assert g.results() == [1, None, 3]
    assert h.results() == [1, 2] and h.state == "succeeded"
    assert g.state == "finished" and g.is_finished() is True
    assert g.blocked_by() == []  # nothing waits on the dead member
    row = g.row()
    assert (row.members_pending, row.members_done, row.members_dead, row.members_cancelled) == (0, 2, 1, 0)

    # Replaying the dead member reopens the group; its success finishes it as succeeded.
    store.job_replay([bad.id], kwargs={})
    assert g.counts() == counts(done=2, ready=1)
    assert g.state == "running" and g.is_finished() is False
    drain()
    assert g.results() == [1, 2, 3] and g.state == "succeeded"


def test_a_group_with_a_cancelled_member_and_every_member_cancelled():
    g = group(add.step(1), add.step(2)).enqueue()
    first, second = g.members()
    assert store.job_request_cancel([second.id]).cancelled == 1
    drain()
    assert g.counts() == counts(done=1, cancelled=1)
    assert g.results() == [1, None]
    assert g.state == "finished"

    c = group(add.step(1), add.step(2)).enqueue()
    c.cancel()
    assert c.state == "cancelled"


# --- chord -------------------------------------------------------------------------------------

def test_a_chord_callback_gets_the_results_in_member_order_and_runs_once():
    h = chord([add.step(i).set(priority=i) for i in range(5)], total.step()).enqueue()
    callback = h.callbacks()["on_success"]
    assert list(h.callbacks()) == ["on_success"]
    assert (callback.status, callback.pass_result, callback.args) == ("waiting", True, [])
    assert h.row().on_success_id == callback.id and h.row().on_complete_id is None

    result = drain()

    assert runs_of(result, callback.id) == ["done"]
    assert result.runs[-1].job_id == callback.id
    callback.refresh_from_db()
    assert (callback.status, callback.result, callback.args, callback.attempts) == ("done", 10, [[0, 1, 2, 3, 4]], 1)
    assert h.results() == [0, 1, 2, 3, 4]  # members only
    assert h.counts() == counts(done=5)
    assert h.state == "succeeded"


def test_all_succeeded_holds_the_callback_while_a_member_is_dead_and_releases_it_after_replay():
    h = chord([add.step(1), flaky.step(2, fail=True), add.step(3)], collect.step()).enqueue()
    _, bad, _ = h.members()
    callback = h.callbacks()["on_success"]

    result = drain(raise_failures=False)

    assert runs_of(result, callback.id) == []
    assert Job.objects.get(id=callback.id).status == "waiting"
    assert h.state == "blocked"
    assert [j.id for j in h.blocked_by()] == [bad.id]
    assert h.is_finished() is False
    assert len(drain()) == 0  # nothing claimable: the callback is held

    assert store.job_replay([bad.id], kwargs={"fail": False}).replayed == [bad.id]
    result = drain()

    assert [r.job_id for r in result] == [bad.id, callback.id]
    callback.refresh_from_db()
    assert (callback.status, callback.result, callback.attempts) == ("done", [1, 2, 3], 1)
    assert h.state == "succeeded"


def test_all_finished_runs_the_callback_with_none_for_the_failed_members():
    h = chord([add.step(1), flaky.step(2, fail=True), add.step(3), add.step(4)], collect.step(),
              policy="all_finished").enqueue()
    _, bad, _, cancelled = h.members()
    store.job_request_cancel([cancelled.id])
    assert list(h.callbacks()) == ["on_complete"]
    callback = h.callbacks()["on_complete"]

    result = drain(raise_failures=False)

    assert runs_of(result, callback.id) == ["done"]
    callback.refresh_from_db()
    assert (callback.status, callback.result, callback.attempts) == ("done", [1, None, 3, None], 1)
    assert h.counts() == counts(done=2, dead=1, cancelled=1)
    assert h.state == "finished" and h.is_finished() is True
    assert h.blocked_by() == []


def test_a_chord_built_from_a_group_takes_its_name_and_members():
    h = chord(group(add.step(1), add.step(2), name="pair"), total.step()).enqueue()
    assert (h.row().kind, h.row().name, h.row().members) == ("chord", "pair", 2)
    drain()
    assert h.callbacks()["on_success"].result == 3


def test_a_chord_callback_without_pass_result_reads_the_results_by_reference():
    h = chord([add.step(1), add.step(2)], add.step(7).set(pass_result=False)).enqueue()
    drain()
    callback = h.callbacks()["on_success"]
    assert (callback.args, callback.result) == ([7], 7)
