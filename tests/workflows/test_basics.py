"""First checks of workflows (drain() in-process): a chain passes results, a chord and a batch fire
their callback once with the members' results."""

import pytest

from django_leasequeue import Batch, chain, chord
from django_leasequeue.enqueueing import task
from django_leasequeue.testing import drain

pytestmark = pytest.mark.django_db

@task(name="tests.wf.add")
def add(x, y=0):
    return x + y

@task(name="tests.wf.total")
def total(results):
    return sum(results)

def test_chain():
    h = chain(add.step(1, 2), add.step(10), add.step(100)).enqueue()

    drain()

    assert h.results() == [3, 13, 113]
    assert h.state == "succeeded"

def test_chord():
    h = chord([add.step(i) for i in range(5)], total.step()).enqueue()
    drain()

    cb = h.callbacks()["on_success"]
    assert cb.result == 10
    assert h.state == "succeeded"

def test_batch():
    b = Batch.open(on_complete=total.step().set(pass_result=True))
    b.add_many(add, [[1], [2]])
    drain()
    assert b.callbacks()["on_complete"].status == "waiting"
    b.add(add.step(3))
    b.close()
    drain()
    assert b.callbacks()["on_complete"].result == 6


def test_add_many_refuses_a_string_as_arguments_and_writes_nothing():
    from django_leasequeue.exceptions import EnqueueError

    b = Batch.open()
    with pytest.raises(EnqueueError, match="args must be a list or tuple"):
        b.add_many(add, ["12"])
    assert b.row().members == 0
    assert b.members().count() == 0
