"""What a waiting step does when a dependency ends dead or cancelled: hold (the default), cancel
(transitively), or run (the failure passed in), per workflow and per step."""

from __future__ import annotations

import pytest

from django_leasequeue import Workflow, chain, store
from django_leasequeue.models import Job
from django_leasequeue.testing import drain
from tests.workflows.wf_tasks import add, collect, flaky, inspect_dependencies, statuses

pytestmark = pytest.mark.django_db

COUNTS0 = {"waiting": 0, "ready": 0, "leased": 0, "done": 0, "dead": 0, "cancelled": 0}


def counts(**values: int) -> dict[str, int]:
    return {**COUNTS0, **values}


def history(job_id: int) -> list[dict]:
    return Job.objects.get(id=job_id).history


def test_hold_is_the_default_and_holds_the_whole_branch():
    wf = Workflow()
    wf.add("a", flaky.step(1, fail=True))
    wf.add("b", add.step(1), depends_on=["a"])
    wf.add("c", add.step(2), depends_on=["b"])
    wf.add("side", add.step(3))
    h = wf.enqueue()
    assert h.row().on_dependency_dead == "hold"
    assert {j.on_dependency_dead for j in h.members()} == {"hold"}

    drain(raise_failures=False)

    assert statuses(h) == ["dead", "waiting", "waiting", "done"]
    assert h.state == "blocked"
    assert [j.id for j in h.blocked_by()] == [h.steps()["a"].id]  # c waits on b, which is not dead


def test_cancel_per_workflow_cancels_the_dependents_transitively():
    wf = Workflow(on_dependency_dead="cancel")
    wf.add("a", flaky.step(1, fail=True))
    wf.add("b", add.step(1), depends_on=["a"])
    wf.add("c", add.step(2), depends_on=["b"])
    wf.add("d", add.step(3), depends_on=["a", "side"])
    wf.add("side", add.step(4))
    wf.add("after_side", add.step(5), depends_on=["side"])
    h = wf.enqueue()
    steps = h.steps()
    a = steps["a"].id

    result = drain(raise_failures=False)

    assert sorted(r.job_id for r in result) == sorted([a, steps["side"].id, steps["after_side"].id])
    assert {name: j.status for name, j in h.steps().items()} == {
        "a": "dead", "b": "cancelled", "c": "cancelled", "d": "cancelled", "side": "done", "after_side": "done"}
    for name in ("b", "c", "d"):
        entry = history(steps[name].id)[-1]
        assert {k: entry[k] for k in ("event", "by", "reason")} == {
            "event": "cancelled", "by": f"dependency #{a}", "reason": f"dependency #{a} ended dead"}
    assert h.counts() == counts(done=2, dead=1, cancelled=3)
    row = h.row()
    assert (row.members, row.members_pending, row.members_done, row.members_dead, row.members_cancelled) == (
        6, 0, 2, 1, 3)
    assert h.state == "finished" and h.is_finished() is True
    assert h.blocked_by() == []


def test_cancel_per_step_stops_at_a_step_that_holds():
    wf = Workflow()
    wf.add("a", flaky.step(1, fail=True))
    wf.add("b", add.step(1).set(on_dependency_dead="cancel"), depends_on=["a"])
    wf.add("c", add.step(2), depends_on=["b"])
    h = wf.enqueue()
    a, b, c = (h.steps()[n].id for n in "abc")

    drain(raise_failures=False)

    assert statuses(h) == ["dead", "cancelled", "waiting"]
    assert h.state == "blocked"
    assert [j.id for j in h.blocked_by()] == [b]  # c holds on its cancelled dependency

    # Replaying the cancelled step puts it back to waiting (its dependency is still dead), then
    # replaying that dependency with its payload fixed runs the rest.
    assert store.job_replay([b]).replayed == [b]
    assert statuses(h) == ["dead", "waiting", "waiting"]
    assert [j.id for j in h.blocked_by()] == [a]
    store.job_replay([a], kwargs={"fail": False})
    assert [r.job_id for r in drain()] == [a, b, c]
    assert h.results() == [1, 1, 2]  # a graph step passes no result unless pass_result=True
    assert h.state == "succeeded"


def test_run_per_step_runs_with_the_failure_in_its_context():
    wf = Workflow()
    wf.add("ok", add.step(7))
    wf.add("bad", flaky.step(2, fail=True))
    wf.add("cleanup", inspect_dependencies.step("tail").set(on_dependency_dead="run", pass_result=True),
           depends_on=["ok", "bad"])
    wf.add("after", add.step(1).set(pass_result=False), depends_on=["cleanup"])
    h = wf.enqueue()
    ok, bad, cleanup, after = h.members()

    result = drain(raise_failures=False)

    assert [(r.job_id, r.outcome) for r in result] == [
        (ok.id, "done"), (bad.id, "dead"), (cleanup.id, "done"), (after.id, "done")]
    assert Job.objects.get(id=cleanup.id).result == {
        "args": [{"ok": 7, "bad": None}, "tail"],
        "workflow": h.id,
        "deps": {
            "ok": {"job": ok.id, "status": "done", "result": 7, "resolved": True, "error": None},
            "bad": {"job": bad.id, "status": "dead", "result": None, "resolved": True,
                    "error": ["builtins.ValueError", "flaky failed on 2"]},
        },
    }
    assert h.counts() == counts(done=3, dead=1)
    assert h.state == "finished"


def test_run_per_workflow_runs_steps_and_on_success_anyway():
    wf = Workflow(on_dependency_dead="run")
    wf.add("bad", flaky.step(2, fail=True))
    wf.add("next", add.step(5).set(pass_result=False), depends_on=["bad"])
    wf.on_success(collect.step().set(pass_result=True))
    h = wf.enqueue()

    drain(raise_failures=False)

    callback = h.callbacks()["on_success"]
    assert (callback.status, callback.result) == ("done", [None, 5])
    assert statuses(h) == ["dead", "done", "done"]
    assert h.state == "finished" and h.is_finished() is True


def test_cancel_per_workflow_cancels_on_success_when_a_member_died():
    wf = Workflow(on_dependency_dead="cancel")
    wf.add("bad", flaky.step(2, fail=True))
    wf.add("ok", add.step(1))
    wf.on_success(collect.step().set(pass_result=True))
    wf.on_complete(collect.step().set(pass_result=True))
    h = wf.enqueue()

    drain(raise_failures=False)

    on_success, on_complete = h.callbacks()["on_success"], h.callbacks()["on_complete"]
    assert on_success.status == "cancelled"
    entry = on_success.history[-1]
    assert {k: entry[k] for k in ("event", "by", "reason")} == {
        "event": "cancelled", "by": f"workflow #{h.id}", "reason": "a member ended dead or cancelled"}
    assert (on_complete.status, on_complete.result) == ("done", [None, 1])
    assert h.state == "finished" and h.is_finished() is True


def test_hold_per_workflow_with_a_step_that_runs_anyway_in_a_chain():
    h = chain(flaky.step(1, fail=True), inspect_dependencies.step().set(on_dependency_dead="run"),
              add.step(1).set(pass_result=False)).enqueue()
    one, two, three = h.members()
    drain(raise_failures=False)
    assert statuses(h) == ["dead", "done", "done"]
    assert Job.objects.get(id=two.id).result["args"] == [None]  # chain steps pass results by default
