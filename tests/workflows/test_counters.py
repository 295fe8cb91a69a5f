"""The workflow counters move exactly once on every path that finishes a member, or takes it out
of a finished state: the batched completion, fenced_atomic(), a failure to dead, an operator's
cancel, a cascade cancel, the reaper's dead-lettering, a replay. Members finished by one statement
are counted into the workflow row once, at the end of the statement (migration 0012); a rolled
back statement counts nothing."""

from datetime import timedelta

import pytest
from django.db import connection, transaction

from django_leasequeue import Batch, Workflow, store
from django_leasequeue.enqueueing import task
from django_leasequeue.models import Job
from django_leasequeue.models import Workflow as WorkflowRow
from django_leasequeue.testing import drain

pytestmark = pytest.mark.django_db


@task(name="tests.wfc.member")
def member(n):
    return n


@task(name="tests.wfc.callback")
def callback():
    return "called"


@task(name="tests.wfc.fenced", takes_context=True)
def fenced(ctx, n):
    with ctx.fenced_atomic():
        pass
    return n


def counts(workflow_id: int) -> tuple[int, int, int, int, int, bool]:
    """(members, pending, done, dead, cancelled, finished) of the workflow row."""
    w = WorkflowRow.objects.get(id=workflow_id)
    return (w.members, w.members_pending, w.members_done, w.members_dead, w.members_cancelled,
            w.finished_at is not None)


def claim(ids: list[int], now) -> dict[int, int]:
    """Lease the jobs; return id -> token."""
    leased = store.job_claim_ids(ids, worker_id="w1", lease=30, now=now)
    assert sorted(j.id for j in leased) == sorted(ids)
    return {j.id: j.lease_version for j in leased}


def status(job_id: int) -> str:
    return Job.objects.get(id=job_id).status


def workflow_updates() -> int:
    """Rows of the workflow table this transaction updated so far."""
    with connection.cursor() as c:
        c.execute("SELECT n_tup_upd FROM pg_stat_xact_user_tables WHERE relname = 'leasequeue_workflow'")
        return c.fetchone()[0]


def test_batched_completion_counts_each_statement_once_and_settles_on_the_last():
    b = Batch.open(on_success=callback.step(), on_complete=callback.step())
    ids = b.add_many(member, [[i] for i in range(5)])
    b.close()
    now = store.db_now()
    tokens = claim(ids, now)
    before = workflow_updates()
    done = store.job_complete([(i, tokens[i], "1") for i in ids[:3]], now=now)
    assert sorted(done) == ids[:3]
    assert workflow_updates() - before == 1  # three members, one update of the workflow row
    assert counts(b.id) == (5, 2, 3, 0, 0, False)
    cbs = b.callbacks()
    assert (cbs["on_success"].status, cbs["on_complete"].status) == ("waiting", "waiting")
    store.job_complete([(i, tokens[i], None) for i in ids[3:]], now=now)
    assert counts(b.id) == (5, 0, 5, 0, 0, False)
    assert (status(cbs["on_success"].id), status(cbs["on_complete"].id)) == ("ready", "ready")
    drain()
    assert counts(b.id) == (5, 0, 5, 0, 0, True)
    assert Job.objects.filter(task="tests.wfc.callback", status="done").count() == 2


def test_one_statement_finishing_members_of_two_workflows_counts_both():
    a = Batch.open(on_complete=callback.step())
    b = Batch.open(on_complete=callback.step())
    a_ids = a.add_many(member, [[1], [2], [3]])
    b_ids = b.add_many(member, [[4], [5]])
    a.close()
    b.close()
    now = store.db_now()
    tokens = claim(a_ids + b_ids, now)
    order = [a_ids[0], b_ids[0], a_ids[1], b_ids[1], a_ids[2]]  # interleaved
    assert len(store.job_complete([(i, tokens[i], None) for i in order], now=now)) == 5
    assert counts(a.id) == (3, 0, 3, 0, 0, False)
    assert counts(b.id) == (2, 0, 2, 0, 0, False)
    assert status(a.callbacks()["on_complete"].id) == "ready"
    assert status(b.callbacks()["on_complete"].id) == "ready"


def test_a_rolled_back_completion_counts_nothing_and_leaves_no_delta_behind():
    b = Batch.open(on_complete=callback.step())
    ids = b.add_many(member, [[1], [2]])
    b.close()
    now = store.db_now()
    tokens = claim(ids, now)

    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        store.job_complete([(ids[0], tokens[ids[0]], None)], now=now)
        assert counts(b.id) == (2, 1, 1, 0, 0, False)
        raise Abort
    assert counts(b.id) == (2, 2, 0, 0, 0, False)
    assert status(ids[0]) == "leased"
    store.job_complete([(ids[1], tokens[ids[1]], None)], now=now)
    assert counts(b.id) == (2, 1, 1, 0, 0, False)
    assert status(b.callbacks()["on_complete"].id) == "waiting"


def test_failure_to_dead_holds_on_success_and_a_replay_moves_the_counters_back():
    b = Batch.open(on_success=callback.step(), on_complete=callback.step())
    ids = b.add_many(member, [[1], [2]], max_attempts=1)
    b.close()
    now = store.db_now()
    tokens = claim(ids, now)
    store.job_complete([(ids[0], tokens[ids[0]], None)], now=now)
    assert store.job_fail(ids[1], tokens[ids[1]], {"type": "Boom", "message": "boom"}, retry_delay=None,
                          now=now)[0] == "dead"
    assert counts(b.id) == (2, 0, 1, 1, 0, False)
    cbs = b.callbacks()
    assert (status(cbs["on_success"].id), status(cbs["on_complete"].id)) == ("waiting", "ready")

    assert store.job_replay([ids[1]], by="test", now=now).replayed == [ids[1]]
    assert counts(b.id) == (2, 1, 1, 0, 0, False)
    [again] = store.job_claim_ids([ids[1]], worker_id="w1", lease=30, now=now)
    store.job_complete([(ids[1], again.lease_version, None)], now=now)
    assert counts(b.id) == (2, 0, 2, 0, 0, False)
    assert status(cbs["on_success"].id) == "ready"
    assert Job.objects.filter(task="tests.wfc.callback", status="ready").count() == 2


def test_operator_cancel_and_reaper_dead_letter_count_once():
    b = Batch.open(on_complete=callback.step())
    ids = b.add_many(member, [[1], [2], [3]], max_attempts=1)
    b.close()
    counts_cancel = store.job_request_cancel(ids[:2], by="test")
    assert counts_cancel.cancelled == 2
    assert counts(b.id) == (3, 1, 0, 0, 2, False)
    assert store.job_request_cancel(ids[:2], by="test").unchanged == 2  # finished: not counted again
    assert counts(b.id) == (3, 1, 0, 0, 2, False)

    now = store.db_now()
    tokens = claim([ids[2]], now)
    assert store.job_expire_lease(ids[2], tokens[ids[2]], now=now)
    reaped = store.job_reap_expired(now=now + timedelta(seconds=1), silence=None)
    assert [(r.id, r.status) for r in reaped] == [(ids[2], "dead")]
    assert counts(b.id) == (3, 0, 0, 1, 2, False)
    assert status(b.callbacks()["on_complete"].id) == "ready"


def test_a_cascade_cancel_counts_every_cancelled_member():
    w = Workflow("cascade", on_dependency_dead="cancel")
    w.add("a", member.step(1).set(max_attempts=1))
    w.add("b", member.step(2), depends_on=["a"])
    w.add("c", member.step(3), depends_on=["b"])
    w.add("d", member.step(4))
    w.on_complete(callback.step())
    h = w.enqueue()
    by_step = dict(Job.objects.filter(workflow_id=h.id, workflow_role="member").values_list("workflow_step", "id"))
    now = store.db_now()
    tokens = claim([by_step["a"], by_step["d"]], now)
    store.job_complete([(by_step["d"], tokens[by_step["d"]], None)], now=now)
    assert counts(h.id) == (4, 3, 1, 0, 0, False)
    store.job_fail(by_step["a"], tokens[by_step["a"]], {"type": "Boom", "message": "boom"}, retry_delay=None,
                   now=now)
    assert (status(by_step["b"]), status(by_step["c"])) == ("cancelled", "cancelled")
    assert counts(h.id) == (4, 0, 1, 1, 2, False)
    assert status(h.callbacks()["on_complete"].id) == "ready"


@pytest.mark.django_db(transaction=True)
def test_fenced_atomic_completions_count_once():
    b = Batch.open(on_success=callback.step())
    b.add_many(fenced, [[1], [2], [3]])
    b.close()
    drain()
    assert counts(b.id) == (3, 0, 3, 0, 0, True)
    assert b.callbacks()["on_success"].status == "done"
    assert b.results() == [1, 2, 3]
