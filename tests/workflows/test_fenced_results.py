"""A workflow step that completes inside ``fenced_atomic()`` hands its result on.

The fenced commit marks the job done and releases its dependents in one transaction, before the
handler returns, so the result dependents receive is the one set in the block with
``fence.set_result()``. A value returned after the block is stored a moment later; a dependent that
was already released got null, and the job's history says so.
"""

import pytest

from django_leasequeue import Batch, chain, store
from django_leasequeue.enqueueing import task
from django_leasequeue.exceptions import PayloadNotSerializable
from django_leasequeue.models import Job
from django_leasequeue.testing import drain

pytestmark = pytest.mark.django_db


@task(name="tests.wf_fenced.set_in_block", takes_context=True)
def set_in_block(ctx, x):
    with ctx.fenced_atomic() as fence:
        fence.set_result(x * 2)
    return "ignored: the fence set the result"


@task(name="tests.wf_fenced.returned_after", takes_context=True)
def returned_after(ctx, x):
    with ctx.fenced_atomic():
        pass
    return x * 2


@task(name="tests.wf_fenced.unstorable", takes_context=True, max_attempts=1)
def unstorable(ctx):
    with ctx.fenced_atomic() as fence:
        fence.set_result({1, 2})


@task(name="tests.wf_fenced.echo")
def echo(*args):
    return list(args)


def _events(job_id):
    return [e["event"] for e in Job.objects.get(pk=job_id).history]


def test_a_result_set_in_the_block_reaches_the_next_step():
    h = chain(set_in_block.step(21), echo.step("b")).enqueue()

    drain()

    first, second = h.jobs().order_by("id")
    assert (first.status, first.result) == ("done", 42)  # not the value returned after the block
    assert (second.status, second.result) == ("done", [42, "b"])
    assert "result_after_release" not in _events(first.id)


def test_a_value_returned_after_the_block_is_stored_but_the_released_step_got_null():
    h = chain(returned_after.step(21), echo.step("b")).enqueue()

    drain()

    first, second = h.jobs().order_by("id")
    assert (first.status, first.result) == ("done", 42)
    assert (second.status, second.result) == ("done", [None, "b"])
    assert _events(first.id).count("result_after_release") == 1


def test_a_callback_released_later_reads_the_late_result():
    # Only the last member's commit releases the callback: an earlier member's late result is on
    # its row by then, so nothing was missed and its history has no note.
    b = Batch.open(on_complete=echo.step().set(pass_result=True))
    (early,) = b.add(returned_after.step(1))
    drain()
    (last,) = b.add(set_in_block.step(5))
    b.close()

    drain()

    callback = b.callbacks()["on_complete"]
    assert (callback.status, callback.result) == ("done", [[2, 10]])
    assert "result_after_release" not in _events(early)
    assert "result_after_release" not in _events(last)


def test_an_unstorable_result_set_in_the_block_commits_nothing():
    h = chain(unstorable.step(), echo.step()).enqueue()

    result = drain(raise_failures=False)

    first, second = h.jobs().order_by("id")
    assert first.status == "dead"
    assert first.errors[-1]["type"].endswith(PayloadNotSerializable.__name__)
    assert first.result is None
    assert second.status == "waiting"  # held: its dependency is dead (the default policy)
    assert [run.outcome for run in result.runs] == ["dead"]


def test_a_falsy_result_set_in_the_block_is_passed_on():
    h = chain(set_in_block.step(0), echo.step()).enqueue()
    drain()
    first, second = h.jobs().order_by("id")
    assert [first.result, second.result] == [0, [0]]
    (dependency,) = store.job_dependencies(second.id)
    assert (dependency.status, dependency.result) == ("done", 0)
