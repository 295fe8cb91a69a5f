"""Every path that finishes a workflow job moves the workflow's counters exactly once and releases
what it should, in the statement that finishes it: the batched completion, a failure that
dead-letters, the reaper, the worker's own cancel, an operator's cancel, and a replay (which moves
the counters back). Pruning keeps what a workflow still reads. Exact counters and states.
"""

from datetime import timedelta

import psycopg
import pytest
from django.db import connection

from django_leasequeue import Batch, chain, store
from django_leasequeue.enqueueing import enqueue, task
from django_leasequeue.models import Dependency, Job, Workflow

pytestmark = pytest.mark.django_db


@task(name="tests.wf_paths.member", max_attempts=1)
def member(x=0):
    return x


@task(name="tests.wf_paths.callback")
def callback(*args):
    return list(args)


ERROR = {"attempt": 1, "type": "builtins.RuntimeError", "message": "boom", "traceback": "", "worker": "t"}


def _claim(job_id):
    (claimed,) = store.job_claim_ids([job_id], worker_id="t", lease=30)
    return claimed


def _counters(workflow_id):
    w = Workflow.objects.get(pk=workflow_id)
    return (w.members, w.members_pending, w.members_done, w.members_dead, w.members_cancelled,
            w.finished_at is not None)


def _status(job_id):
    return Job.objects.get(pk=job_id).status


def _batch_of_two():
    b = Batch.open(on_success=callback.step(), on_complete=callback.step())
    first, second = b.add(member.step(1), member.step(2))
    b.close()
    return b, first, second


def test_a_batched_completion_counts_down_and_the_last_one_releases_both_callbacks():
    b, first, second = _batch_of_two()
    one, two = _claim(first), _claim(second)

    assert store.job_complete([(one.id, one.lease_version, "1")]) == {first}
    assert _counters(b.id) == (2, 1, 1, 0, 0, False)
    assert store.job_complete([(two.id, two.lease_version, "2")]) == {second}

    assert _counters(b.id) == (2, 0, 2, 0, 0, False)  # finished once the callbacks are
    callbacks = b.callbacks()
    assert (callbacks["on_success"].status, callbacks["on_complete"].status) == ("ready", "ready")


def test_a_failure_that_dead_letters_counts_dead_and_releases_only_on_complete():
    b, first, second = _batch_of_two()
    one, two = _claim(first), _claim(second)
    store.job_complete([(one.id, one.lease_version, "1")])

    assert store.job_fail(two.id, two.lease_version, ERROR, retry_delay=None)[0] == "dead"

    assert _counters(b.id) == (2, 0, 1, 1, 0, False)
    callbacks = b.callbacks()
    assert (callbacks["on_success"].status, callbacks["on_complete"].status) == ("waiting", "ready")


def test_a_retry_moves_no_counter():
    b = Batch.open(on_complete=callback.step())
    (only,) = b.add(member.step().set(max_attempts=3))
    b.close()
    claimed = _claim(only)

    assert store.job_fail(claimed.id, claimed.lease_version, ERROR, retry_delay=60)[0] == "ready"

    assert _counters(b.id) == (1, 1, 0, 0, 0, False)
    assert b.callbacks()["on_complete"].status == "waiting"


def test_the_reaper_dead_letters_an_expired_last_attempt_and_releases_on_complete():
    b, first, second = _batch_of_two()
    one, two = _claim(first), _claim(second)
    store.job_complete([(one.id, one.lease_version, "1")])
    assert store.job_expire_lease(two.id, two.lease_version)

    reaped = store.job_reap_expired(silence=None)

    assert [(r.id, r.status) for r in reaped] == [(second, "dead")]
    assert _counters(b.id) == (2, 0, 1, 1, 0, False)
    assert b.callbacks()["on_complete"].status == "ready"


def test_the_worker_cancelling_its_own_job_counts_it_cancelled():
    b, first, second = _batch_of_two()
    one = _claim(first)

    assert store.job_cancel_leased(one.id, one.lease_version)

    assert _counters(b.id) == (2, 1, 0, 0, 1, False)
    assert _status(second) == "ready"


def test_an_operator_cancel_of_a_waiting_step_cascades_nothing_but_counts_it():
    h = chain(member.step(1), callback.step(2), callback.step(3)).enqueue()
    first, second, third = h.jobs().order_by("id").values_list("id", flat=True)

    counts = store.job_request_cancel([second], by="test")

    assert counts.cancelled == 1
    assert [_status(j) for j in (first, second, third)] == ["ready", "cancelled", "waiting"]
    assert _counters(h.id)[:5] == (3, 2, 0, 0, 1)


def test_replaying_a_dead_member_moves_the_counters_back_and_its_completion_releases_on_success():
    b, first, second = _batch_of_two()
    one, two = _claim(first), _claim(second)
    store.job_complete([(one.id, one.lease_version, "1")])
    store.job_fail(two.id, two.lease_version, ERROR, retry_delay=None)
    assert _counters(b.id) == (2, 0, 1, 1, 0, False)

    assert store.job_replay([second], by="test").replayed == [second]

    assert _counters(b.id) == (2, 1, 1, 0, 0, False)
    again = _claim(second)
    store.job_complete([(again.id, again.lease_version, "2")])
    assert _counters(b.id) == (2, 0, 2, 0, 0, False)
    on_success = b.callbacks()["on_success"]
    assert (on_success.status, on_success.args) == ("ready", [])


def test_a_callback_that_finishes_finishes_the_workflow():
    b, first, second = _batch_of_two()
    for job_id in (first, second):
        claimed = _claim(job_id)
        store.job_complete([(claimed.id, claimed.lease_version, "0")])
    for cb in b.callbacks().values():
        claimed = _claim(cb.id)
        store.job_complete([(claimed.id, claimed.lease_version, "null")])

    assert _counters(b.id) == (2, 0, 2, 0, 0, True)
    assert b.state == "succeeded"


# -- pruning -----------------------------------------------------------------------------------


def _finish_all(h):
    while True:
        ready = list(Job.objects.filter(workflow_id=h.id, status="ready").values_list("id", flat=True))
        if not ready:
            return
        for job_id in ready:
            claimed = _claim(job_id)
            store.job_complete([(claimed.id, claimed.lease_version, "1")])


def test_pruning_keeps_the_done_members_of_an_unfinished_workflow():
    b = Batch.open(on_complete=callback.step().set(pass_result=True))
    (early,) = b.add(member.step(1))
    _finish_all(b)
    later = store.clock_real_now() + timedelta(days=30)

    assert store.job_prune(older_than=86400, now=later) == 0  # the batch is still open

    b.add(member.step(2))
    b.close()
    _finish_all(b)
    assert b.callbacks()["on_complete"].args == [[1, 1]]  # the early member's result was still there
    assert b.state == "succeeded"
    assert store.job_prune(older_than=86400, now=later) == 3  # 2 members + the callback
    assert not Workflow.objects.filter(pk=b.id).exists()  # no job left: the workflow goes too
    assert not Job.objects.filter(pk=early).exists()


def test_pruning_deletes_the_edges_of_deleted_jobs_and_keeps_a_dependency_still_waited_on():
    h = chain(member.step(1), callback.step(2)).enqueue()
    first, second = h.jobs().order_by("id").values_list("id", flat=True)
    claimed = _claim(first)
    store.job_complete([(claimed.id, claimed.lease_version, "1")])
    # A job outside the workflow that waits on the first step and on a job that is not finished.
    blocker = member.enqueue(0)
    outsider = enqueue(member, depends_on=[first, blocker.id])
    later = store.clock_real_now() + timedelta(days=30)

    _finish_all(h)  # the second step; the workflow is finished
    assert store.job_prune(older_than=86400, now=later) == 1  # only the second step: the first is waited on

    assert Job.objects.filter(pk=first).exists() and not Job.objects.filter(pk=second).exists()
    assert not Dependency.objects.filter(job_id=second).exists()
    assert Workflow.objects.filter(pk=h.id).exists()  # its first step is still there
    assert _status(outsider.id) == "waiting"


def test_pruning_keeps_the_workflow_of_a_dead_member():
    b = Batch.open(on_dependency_dead="cancel", on_success=callback.step())
    first, second = b.add(member.step(1), member.step(2))
    b.close()
    one, two = _claim(first), _claim(second)
    store.job_complete([(one.id, one.lease_version, "1")])
    store.job_fail(two.id, two.lease_version, ERROR, retry_delay=None)
    assert b.callbacks()["on_success"].status == "cancelled"
    assert b.is_finished()
    later = store.clock_real_now() + timedelta(days=30)

    assert store.job_prune(older_than=86400, now=later) == 2  # the done member and the cancelled callback

    assert list(Job.objects.filter(workflow_id=b.id).values_list("id", "status")) == [(second, "dead")]
    assert Workflow.objects.filter(pk=b.id).exists()


# -- notifications -----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_job_released_by_the_reaper_wakes_idle_workers():
    b = Batch.open(on_complete=callback.step())
    (only,) = b.add(member.step())
    b.close()
    claimed = _claim(only)
    assert store.job_expire_lease(claimed.id, claimed.lease_version)
    params = connection.get_connection_params()
    listener = psycopg.connect(**{k: v for k, v in params.items() if k != "cursor_factory"}, autocommit=True)
    try:
        listener.execute('LISTEN "leasequeue"')

        assert [r.status for r in store.job_reap_expired(silence=None)] == ["dead"]

        payloads = [n.payload for n in listener.notifies(timeout=2, stop_after=1)]
    finally:
        listener.close()
    assert payloads == ["default"]
    assert b.callbacks()["on_complete"].status == "ready"


def test_a_dead_chord_member_holding_the_callback_is_named_and_the_state_is_blocked():
    from django_leasequeue import chord

    h = chord([member.step(1), member.step(2)], callback.step()).enqueue()
    first, second = h.members().order_by("id").values_list("id", flat=True)
    one, two = _claim(first), _claim(second)
    store.job_complete([(one.id, one.lease_version, "1")])
    store.job_fail(two.id, two.lease_version, ERROR, retry_delay=None)

    assert [j.id for j in h.blocked_by()] == [second]
    assert h.state == "blocked"


def test_a_chord_whose_callback_died_is_finished_not_succeeded():
    from django_leasequeue import chord

    h = chord([member.step(1)], callback.step())
    h = h.enqueue()
    (only,) = h.members().values_list("id", flat=True)
    claimed = _claim(only)
    store.job_complete([(claimed.id, claimed.lease_version, "1")])
    cb = _claim(h.callbacks()["on_success"].id)

    store.job_fail(cb.id, cb.lease_version, ERROR, retry_delay=None)

    assert h.is_finished()
    assert h.state == "finished"


BIG = '"' + "x" * (9 * 1024 * 1024) + '"'  # 9 MiB of JSON text


def test_results_too_large_for_a_callback_dead_letter_the_callback_and_the_last_member_still_finishes():
    from django_leasequeue import chord

    h = chord([member.step(i) for i in range(8)], callback.step()).enqueue()  # 8 x 9 MiB > 64 MiB
    ids = list(h.members().order_by("id").values_list("id", flat=True))
    for job_id in ids:
        claimed = _claim(job_id)
        assert store.job_complete([(claimed.id, claimed.lease_version, BIG)]) == {job_id}

    callback_job = h.callbacks()["on_success"]
    assert callback_job.status == "dead"
    assert callback_job.args == []  # nothing was put into its arguments
    (error,) = callback_job.errors
    assert error["type"] == "django_leasequeue.exceptions.PayloadTooLarge"
    assert "over 64 MiB" in error["message"] and "pass_result=False" in error["message"]
    assert _counters(h.id) == (8, 0, 8, 0, 0, True)
    assert h.state == "finished"


def test_results_too_large_for_a_dependent_dead_letter_it_and_its_dependency_still_finishes():
    from django_leasequeue import Workflow

    wf = Workflow()
    for name in "abcdefgh":
        wf.add(name, member.step())
    wf.add("join", callback.step().set(pass_result=True), depends_on=list("abcdefgh"))
    h = wf.enqueue()
    steps = h.steps()
    for name in "abcdefgh":
        claimed = _claim(steps[name].id)
        assert store.job_complete([(claimed.id, claimed.lease_version, BIG)]) == {claimed.id}

    join = Job.objects.get(pk=steps["join"].id)
    assert (join.status, join.args) == ("dead", [])
    assert join.errors[-1]["worker"] == f"job #{steps['h'].id}"
    assert h.state == "finished"


def test_pruning_keeps_a_dependency_of_a_cancelled_dependent_for_its_replay():
    done_early = member.enqueue(7)
    claimed = _claim(done_early.id)
    store.job_complete([(claimed.id, claimed.lease_version, "7")])
    cancelled = enqueue(callback, depends_on=[done_early.id, member.enqueue(8).id])
    store.job_request_cancel([cancelled.id])
    later = store.clock_real_now() + timedelta(days=30)

    store.job_prune(older_than=86400, now=later)

    assert Job.objects.filter(pk=done_early.id).exists()  # the cancelled dependent may be replayed
