"""Dependency graphs: named steps passing {name: result} to a join, dependencies on jobs that
exist already (by Job or id, across separate enqueues), and dependencies that had finished, done
or dead, before their dependent was enqueued."""

from __future__ import annotations

import pytest

from django_leasequeue import Workflow, enqueue, store
from django_leasequeue.models import Dependency, Job
from django_leasequeue.testing import drain
from tests.workflows.wf_tasks import add, flaky, inspect_dependencies, merge, statuses

pytestmark = pytest.mark.django_db


def edges(job_id: int) -> list[tuple[int, str, bool]]:
    """A job's dependency edges, sorted by dependency id (the insert does not keep declaration order:
    see test_dependencies_are_listed_in_declaration_order)."""
    return sorted((d.depends_on_id, d.name, d.resolved) for d in Dependency.objects.filter(job_id=job_id))


def test_a_diamond_passes_name_to_result_to_the_join():
    wf = Workflow("diamond")
    # The join is added first: dependencies may name steps added later.
    wf.add("d", merge.step().set(pass_result=True), depends_on=["b", "c"])
    wf.add("a", add.step(1, 2))
    wf.add("b", add.step(10).set(pass_result=True), depends_on=["a"])
    wf.add("c", add.step(20).set(pass_result=True), depends_on=["a"])
    h = wf.enqueue()
    steps = h.steps()
    assert list(steps) == ["d", "a", "b", "c"]
    assert [steps[n].waiting_on for n in "dabc"] == [2, 0, 1, 1]
    assert [steps[n].status for n in "dabc"] == ["waiting", "ready", "waiting", "waiting"]
    assert edges(steps["d"].id) == [(steps["b"].id, "b", False), (steps["c"].id, "c", False)]
    assert (h.row().kind, h.row().name) == ("graph", "diamond")

    result = drain()

    order = [r.job_id for r in result]
    assert order[0] == steps["a"].id and order[-1] == steps["d"].id
    d = Job.objects.get(id=steps["d"].id)
    assert (d.args, d.result) == ([{"b": 13, "c": 23}], 36)
    assert edges(d.id) == [(steps["b"].id, "b", True), (steps["c"].id, "c", True)]
    assert h.results() == [36, 3, 13, 23]  # member order: the order the steps were added
    assert h.state == "succeeded"


def test_depends_on_jobs_and_ids_across_separate_enqueues():
    first = add.enqueue(1)
    second = enqueue(add, [2], depends_on=[first])
    third = enqueue(inspect_dependencies, ["x"], depends_on=[first.id, second.id])
    assert (second.status, second.waiting_on, second.workflow_id) == ("waiting", 1, None)
    assert (third.status, third.waiting_on) == ("waiting", 2)
    first.refresh_from_db()
    assert first.has_dependents is True
    assert edges(third.id) == [(first.id, str(first.id), False), (second.id, str(second.id), False)]

    result = drain()

    assert [r.job_id for r in result] == [first.id, second.id, third.id]
    third.refresh_from_db()
    assert third.result == {"args": ["x"], "workflow": None, "deps": {
        str(first.id): {"job": first.id, "status": "done", "result": 1, "resolved": True, "error": None},
        str(second.id): {"job": second.id, "status": "done", "result": 2, "resolved": True, "error": None}}}


def test_a_workflow_step_waits_for_an_existing_job_and_a_step_of_its_own():
    outside = add.enqueue(100)
    wf = Workflow()
    wf.add("a", add.step(1))
    wf.add("b", merge.step().set(pass_result=True), depends_on=["a", outside])
    h = wf.enqueue()
    b = h.steps()["b"]
    assert b.waiting_on == 2

    drain()

    b.refresh_from_db()
    assert (b.args, b.result) == ([{"a": 1, str(outside.id): 100}], 101)


def test_a_dependency_done_before_the_dependent_is_enqueued_releases_it_at_once():
    first = add.enqueue(5)
    drain()
    later = enqueue(add, [1], depends_on=[first])
    assert (later.status, later.waiting_on) == ("ready", 0)
    assert edges(later.id) == [(first.id, str(first.id), True)]
    drain()
    later.refresh_from_db()
    assert (later.status, later.result) == ("done", 1)


def test_a_workflow_step_whose_only_dependency_is_done_already_and_another_pending_gets_both_results():
    done_already = add.enqueue(5)
    drain()
    wf = Workflow()
    wf.add("a", add.step(1))
    wf.add("b", merge.step().set(pass_result=True), depends_on=["a", done_already.id])
    h = wf.enqueue()
    assert h.steps()["b"].waiting_on == 1
    drain()
    assert h.steps()["b"].args == [{"a": 1, str(done_already.id): 5}]


def test_a_step_passing_results_from_a_dependency_done_already_receives_its_result():
    done_already = add.enqueue(5)
    drain()
    wf = Workflow()
    wf.add("a", add.step(10).set(pass_result=True), depends_on=[done_already])
    h = wf.enqueue()
    drain()
    a = h.steps()["a"]
    assert (a.args, a.result) == ([5, 10], 15)


def test_a_dependency_dead_before_the_dependent_is_enqueued_holds_it():
    dead = flaky.enqueue(1, fail=True)
    drain(raise_failures=False)
    held = enqueue(add, [1], depends_on=[dead])
    assert (held.status, held.waiting_on) == ("waiting", 1)
    assert edges(held.id) == [(dead.id, str(dead.id), False)]
    assert len(drain()) == 0

    store.job_replay([dead.id], kwargs={"fail": False})
    assert [r.job_id for r in drain()] == [dead.id, held.id]
    assert Job.objects.get(id=held.id).status == "done"


def test_a_dependency_dead_before_a_dependent_that_runs_anyway_runs_it_at_once():
    dead = flaky.enqueue(1, fail=True)
    drain(raise_failures=False)
    runs = enqueue(inspect_dependencies, [], depends_on=[dead], on_dependency_dead="run")
    assert (runs.status, runs.waiting_on, runs.on_dependency_dead) == ("ready", 0, "run")
    assert edges(runs.id) == [(dead.id, str(dead.id), True)]
    drain()
    runs.refresh_from_db()
    assert runs.result["deps"][str(dead.id)] == {"job": dead.id, "status": "dead", "result": None,
                                                 "resolved": True,
                                                 "error": ["builtins.ValueError", "flaky failed on 1"]}


def test_a_dependency_dead_before_a_dependent_that_cancels_cancels_it():
    dead = flaky.enqueue(1, fail=True)
    drain(raise_failures=False)
    doomed = enqueue(add, [1], depends_on=[dead], on_dependency_dead="cancel")
    assert doomed.status == "cancelled"
    assert doomed.history[-1]["by"] == f"dependency #{dead.id}"


def test_a_workflow_built_on_a_dead_job_with_the_cancel_policy_cancels_its_steps_and_finishes():
    dead = flaky.enqueue(1, fail=True)
    drain(raise_failures=False)
    wf = Workflow(on_dependency_dead="cancel")
    wf.add("a", add.step(1), depends_on=[dead])
    wf.add("b", add.step(2), depends_on=["a"])
    wf.add("c", add.step(3))
    h = wf.enqueue()

    assert {name: job.status for name, job in h.steps().items()} == {"a": "cancelled", "b": "cancelled", "c": "ready"}
    drain()
    row = h.row()
    assert (row.members, row.members_pending, row.members_done, row.members_cancelled) == (3, 0, 1, 2)
    assert h.is_finished()


def test_a_cancelled_dependency_behaves_like_a_dead_one():
    first = add.enqueue(1)
    held = enqueue(add, [2], depends_on=[first])
    cancels = enqueue(add, [3], depends_on=[first], on_dependency_dead="cancel")
    runs = enqueue(add, [4], depends_on=[first], on_dependency_dead="run")
    assert store.job_request_cancel([first.id]).cancelled == 1
    assert [Job.objects.get(id=j.id).status for j in (held, cancels, runs)] == ["waiting", "cancelled", "ready"]
    assert Job.objects.get(id=cancels.id).history[-1]["reason"] == f"dependency #{first.id} ended cancelled"
    drain()
    assert [Job.objects.get(id=j.id).status for j in (held, cancels, runs)] == ["waiting", "cancelled", "done"]


def test_a_long_chain_of_cancelling_dependents_is_cancelled_in_one_go():
    wf = Workflow(on_dependency_dead="cancel")
    wf.add("0", flaky.step(0, fail=True))
    for n in range(1, 200):
        wf.add(str(n), add.step(n), depends_on=[str(n - 1)])
    h = wf.enqueue()
    result = drain(raise_failures=False)
    assert len(result) == 1
    assert statuses(h) == ["dead"] + ["cancelled"] * 199
    assert h.row().members_cancelled == 199 and h.is_finished() is True


def test_dependencies_are_listed_in_declaration_order():
    wf = Workflow()
    for name in ("x", "y", "z"):
        wf.add(name, add.step(1))
    wf.add("join", inspect_dependencies.step(), depends_on=["x", "y", "z"])
    h = wf.enqueue()
    assert [d.name for d in store.job_dependencies(h.steps()["join"].id)] == ["x", "y", "z"]
