"""Building a workflow refuses bad input before anything is written: each refusal raises its exact
error, and the job, workflow and dependency tables have exactly the rows they had before."""

from __future__ import annotations

import dataclasses
import re

import pytest

from django_leasequeue import Batch, Workflow, chain, chord, enqueue, group
from django_leasequeue.exceptions import ArgumentsMismatch, EnqueueError, PayloadNotSerializable, UnknownTask
from django_leasequeue.models import Job
from django_leasequeue.steps import Step
from django_leasequeue.workflows import build
from tests.workflows.wf_tasks import add, collect, refused, rows, total

pytestmark = pytest.mark.django_db

POLICIES = re.escape("('hold', 'cancel', 'run')")


def _unused_id() -> int:
    return (Job.objects.order_by("-id").values_list("id", flat=True).first() or 0) + 1000


# --- the graph ---------------------------------------------------------------------------------

def test_a_two_step_cycle_is_refused():
    wf = Workflow("loop")
    wf.add("a", add.step(1), depends_on=["b"])
    wf.add("b", add.step(2), depends_on=["a"])
    with refused(EnqueueError, "^the workflow has a cycle: (a -> b -> a|b -> a -> b)$"):
        wf.enqueue()


def test_a_three_step_cycle_behind_a_valid_step_is_refused():
    wf = Workflow()
    wf.add("start", add.step(1))
    wf.add("a", add.step(1), depends_on=["start", "c"])
    wf.add("b", add.step(2), depends_on=["a"])
    wf.add("c", add.step(3), depends_on=["b"])
    with refused(EnqueueError, "^the workflow has a cycle: ") as info:
        wf.enqueue()
    cycle = str(info.value).removeprefix("the workflow has a cycle: ").split(" -> ")
    assert len(cycle) == 4 and cycle[0] == cycle[-1] and sorted(cycle[:3]) == ["a", "b", "c"]


def test_a_self_dependency_is_refused():
    wf = Workflow()
    wf.add("a", add.step(1), depends_on=["a"])
    with refused(EnqueueError, "^step 'a' depends on itself$"):
        wf.enqueue()


def test_a_missing_dependency_name_is_refused():
    wf = Workflow()
    wf.add("a", add.step(1))
    wf.add("b", add.step(1), depends_on=["a", "zz"])
    with refused(EnqueueError, re.escape("step 'b' depends on 'zz', which is not a step of this workflow "
                                         "(its steps: ['a', 'b'])")):
        wf.enqueue()


def test_a_duplicate_step_name_is_refused_when_added():
    wf = Workflow()
    wf.add("a", add.step(1))
    with refused(EnqueueError, "^step name 'a' is used twice in this workflow$"):
        wf.add("a", add.step(2))
    assert len(wf) == 1  # the refused step was not kept


def test_a_dependency_named_twice_is_refused():
    wf = Workflow()
    wf.add("a", add.step(1))
    with refused(EnqueueError, re.escape("step 'b' names a dependency twice: ['a', 'a']")):
        wf.add("b", add.step(1), depends_on=["a", "a"])


@pytest.mark.parametrize("bad", [1.5, None, True, b"a", Job()])
def test_a_dependency_that_is_neither_a_name_nor_a_saved_job_is_refused(bad):
    wf = Workflow()
    with refused(EnqueueError, "^step 'b': depends_on takes step names, job ids or Job objects, got "):
        wf.add("b", add.step(1), depends_on=[bad])


def test_a_dependency_id_that_does_not_exist_is_refused_and_the_existing_one_is_not_marked():
    existing = add.enqueue(1)
    missing = _unused_id()
    wf = Workflow()
    wf.add("a", add.step(1), depends_on=[existing.id, missing])
    with refused(EnqueueError, re.escape(f"depends_on names jobs that do not exist: [{missing}]")):
        wf.enqueue()
    existing.refresh_from_db()
    assert existing.has_dependents is False  # the lock-and-mark statement was rolled back too
    assert existing.status == "ready"


def test_a_job_object_of_another_database_is_refused():
    same_id = add.enqueue(1)
    foreign = Job(id=same_id.id, task=same_id.task)
    foreign._state.db = "elsewhere"
    foreign._state.adding = False
    wf = Workflow()
    with refused(EnqueueError, "read from database 'elsewhere', but jobs are in 'default'"):
        wf.add("a", add.step(1), depends_on=[foreign])
        wf.enqueue()
    with refused(EnqueueError, "^depends_on: job #.* read from database 'elsewhere'"):
        enqueue(add, [1], depends_on=[foreign])


# --- options -----------------------------------------------------------------------------------

def test_a_bogus_workflow_policy_is_refused():
    with refused(EnqueueError, f"^on_dependency_dead must be one of {POLICIES}, got 'bogus'$"):
        Workflow(on_dependency_dead="bogus")
    with refused(EnqueueError, f"^on_dependency_dead must be one of {POLICIES}, got 'bogus'$"):
        chain(add.step(1), on_dependency_dead="bogus")
    with refused(EnqueueError, f"^on_dependency_dead must be one of {POLICIES}, got 'bogus'$"):
        Batch.open(on_dependency_dead="bogus")


def test_a_bogus_step_policy_is_refused():
    # Step.set() raises EnqueueError, as every other refusal of a step's options does.
    with pytest.raises(EnqueueError, match=f"^on_dependency_dead must be one of {POLICIES}, got 'bogus'$"):
        add.step(1).set(on_dependency_dead="bogus")
    # A Step built without set() is checked when the workflow is built.
    bad = dataclasses.replace(add.step(1), on_dependency_dead="bogus")
    wf = Workflow()
    wf.add("a", add.step(1))
    wf.add("b", bad, depends_on=["a"])
    with refused(EnqueueError, f"^step 'b': on_dependency_dead must be one of {POLICIES}, got 'bogus'$"):
        wf.enqueue()


def test_a_bogus_chord_policy_is_refused():
    with refused(EnqueueError, "^chord policy must be 'all_succeeded' or 'all_finished', got 'bogus'$"):
        chord([add.step(1)], total.step(), policy="bogus")


def test_unknown_step_options_are_refused():
    wf = Workflow()
    wf.add("a", Step(add, (1,), {}, {"unique_key": "k", "bogus": 1}))
    with refused(EnqueueError, re.escape("step 'a': unknown step options ['bogus', 'unique_key']; a step takes "
                                         "['queue', 'priority', 'run_at', 'max_attempts']")):
        wf.enqueue()


def test_a_bad_step_option_value_is_refused():
    with refused(EnqueueError, "^step '2': .*priority"):
        chain(add.step(1), add.step().set(priority=500)).enqueue()


def test_bad_workflow_names_and_keys_are_refused():
    with refused(EnqueueError, "workflow name"):
        Workflow("x" * 256)
    with refused(EnqueueError, "workflow unique_key"):
        Workflow(unique_key="")
    with refused(EnqueueError, "step name"):
        Workflow().add("x" * 256, add.step(1))


# --- tasks and arguments -----------------------------------------------------------------------

def test_an_unregistered_task_is_refused():
    with refused(UnknownTask, "^cannot enqueue 'tests.wfx.nobody': no task is registered under that name"):
        chain(add.step(1), Step("tests.wfx.nobody")).enqueue()


def test_a_value_that_is_not_a_step_is_refused():
    with refused(EnqueueError, "^chain step 2 must be a Step \\(my_task.step\\(...\\)\\), got 'x'$"):
        chain(add.step(1), "x")
    with refused(EnqueueError, "^group member 1 must be a Step"):
        group([lambda: 1])
    with refused(EnqueueError, "^chord callback must be a Step"):
        chord([add.step(1)], total)
    with refused(EnqueueError, "^step 'a' must be a Step"):
        Workflow().add("a", add)


def test_arguments_that_do_not_bind_are_refused():
    with refused(ArgumentsMismatch, "^step '1': task 'tests.wfx.add' cannot take these arguments: too many "
                                    "positional arguments"):
        chain(add.step(1, 2, 3)).enqueue()
    with refused(ArgumentsMismatch, "^step 'a': task 'tests.wfx.add' cannot take these arguments: missing a "
                                    "required argument: 'x'"):
        wf = Workflow()
        wf.add("a", add.step())
        wf.enqueue()


def test_the_bind_check_counts_the_passed_result():
    # Step 2 of a chain receives step 1's value as its first argument: add(x, y) has room for one more.
    with refused(ArgumentsMismatch, "^step '2': task 'tests.wfx.add' cannot take these arguments: too many"):
        chain(add.step(1), add.step(1, 2)).enqueue()
    # Without the passed result the same arguments bind.
    h = chain(add.step(1), add.step(1, 2).set(pass_result=False)).enqueue()
    assert [j.args for j in h.members()] == [[1], [1, 2]]
    # A chord callback receives the results list; a callback that takes nothing more is refused.
    with refused(ArgumentsMismatch, "^on_success: task 'tests.wfx.total' cannot take these arguments: too many"):
        chord([add.step(1)], total.step(5)).enqueue()
    # A batch's callbacks receive nothing unless pass_result=True: total() then misses its argument.
    with refused(ArgumentsMismatch, "^on_success: task 'tests.wfx.total' cannot take these arguments: missing"):
        Batch.open(on_success=total.step())


def test_arguments_that_are_not_json_are_refused():
    with refused(PayloadNotSerializable, "^step '1': "):
        chain(add.step({1, 2})).enqueue()
    with refused(PayloadNotSerializable, "^member 2: "):
        group(add.step(1), add.step(object())).enqueue()


# --- shapes ------------------------------------------------------------------------------------

def test_empty_shapes_are_refused():
    with refused(EnqueueError, "^a chain needs at least one step$"):
        chain().enqueue()
    with refused(EnqueueError, "^a group needs at least one step$"):
        group([]).enqueue()
    with refused(EnqueueError, "^a chord needs at least one step$"):
        chord([], total.step()).enqueue()
    with refused(EnqueueError, "^a graph needs at least one step$"):
        Workflow().enqueue()
    with refused(EnqueueError, "^a chain needs at least one step$"):
        chain().enqueue_on_commit()


def test_a_step_reused_twice_makes_two_jobs():
    # A Step holds no database state: the same one may be given twice, in one workflow or several.
    step = add.step(1)
    before = rows()
    h = chain(step, step).enqueue()
    wf = Workflow()
    wf.add("a", step)
    wf.add("b", step)
    g = wf.enqueue()
    assert rows() == {"jobs": before["jobs"] + 4, "workflows": before["workflows"] + 2,
                      "dependencies": before["dependencies"] + 1}
    from django_leasequeue.testing import drain

    drain()
    assert h.results() == [1, 2]  # step 2 got step 1's 1 prepended: add(1, 1)
    assert g.results() == [1, 1]
    assert len({j.id for j in [*h.members(), *g.members()]}) == 4


def test_too_many_inline_results_are_refused(monkeypatch):
    # The callback would get every member's result in its arguments: beyond INLINE_RESULTS_MAX
    # members the chord is refused unless the callback reads the results by reference.
    assert build.INLINE_RESULTS_MAX == 10_000
    members = [add.step(i) for i in range(build.INLINE_RESULTS_MAX + 1)]
    with refused(EnqueueError, re.escape("on_success: 10001 members are too many results to pass in the "
                                         "callback's arguments (at most 10000); use .set(pass_result=False)")):
        chord(members, total.step()).enqueue()

    monkeypatch.setattr(build, "INLINE_RESULTS_MAX", 3)
    with refused(EnqueueError, "^on_complete: 4 members are too many results"):
        chord([add.step(i) for i in range(4)], collect.step(), policy="all_finished").enqueue()
    with refused(EnqueueError, "^on_success: 4 members are too many results"):
        group([add.step(i) for i in range(4)]).on_success(collect.step().set(pass_result=True)).enqueue()
    # At the limit, or without passing results, it is built.
    at_limit = chord([add.step(i) for i in range(3)], collect.step()).enqueue()
    by_reference = chord([add.step(i) for i in range(4)], add.step(0).set(pass_result=False)).enqueue()
    assert at_limit.row().members == 3 and by_reference.row().members == 4


# --- enqueue(depends_on=...) -------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["12", b"12", 12, None])
def test_enqueue_refuses_depends_on_that_is_not_a_list(bad):
    with refused(EnqueueError, "^depends_on must be a list of job ids or Job objects, got "):
        enqueue(add, [1], depends_on=bad)


@pytest.mark.parametrize("bad", ["12", 1.0, True, None, Job()])
def test_enqueue_refuses_a_depends_on_item_that_is_not_a_job(bad):
    with refused(EnqueueError, "^depends_on takes job ids or Job objects, got "):
        enqueue(add, [1], depends_on=[bad])


def test_enqueue_refuses_a_dependency_named_twice():
    first = add.enqueue(1)
    with refused(EnqueueError, re.escape(f"depends_on names a job twice: [{first.id}, {first.id}]")):
        enqueue(add, [1], depends_on=[first, first.id])


def test_enqueue_refuses_bad_policies():
    first = add.enqueue(1)
    with refused(EnqueueError, f"^on_dependency_dead must be one of {POLICIES}, got 'bogus'$"):
        enqueue(add, [1], depends_on=[first], on_dependency_dead="bogus")
    with refused(EnqueueError, "^on_dependency_dead is given without depends_on$"):
        enqueue(add, [1], on_dependency_dead="cancel")
    with refused(EnqueueError, "^depends_on does not take a unique_key"):
        enqueue(add, [1], depends_on=[first], unique_key="k")


def test_enqueue_refuses_bad_arguments_before_its_dependencies():
    first = add.enqueue(1)
    with refused(ArgumentsMismatch, "cannot take these arguments"):
        enqueue(add, [1, 2, 3], depends_on=[first])
    first.refresh_from_db()
    assert first.has_dependents is False


def test_enqueue_refuses_a_missing_dependency_and_the_callers_transaction_goes_on():
    first = add.enqueue(1)
    missing = _unused_id()
    with refused(EnqueueError, re.escape(f"depends_on names jobs that do not exist: [{missing}]")):
        enqueue(add, [1], depends_on=[first.id, missing])
    first.refresh_from_db()
    assert first.has_dependents is False


@pytest.mark.django_db(transaction=True)
def test_enqueue_refuses_a_missing_dependency_in_autocommit_and_writes_nothing():
    first = add.enqueue(1)
    missing = _unused_id()
    with refused(EnqueueError, re.escape(f"depends_on names jobs that do not exist: [{missing}]")):
        enqueue(add, [1], depends_on=[first.id, missing])
    first.refresh_from_db()
    assert first.has_dependents is False
