"""``fenced_atomic()`` misuse: the job's completion and the block's writes commit together or not
at all, whatever the handler does around the block.

A fenced block inside an outer ``atomic()`` would only release a savepoint, so the outer block's
rollback would undo the effect and the job's ``done`` while the executor reported "done"; such a
block is refused (``fenced_atomic()`` must be the outermost transaction). A second fenced block in
the same attempt is refused with a clear error, not a ``LeaseLost`` after the first has committed.
"""

import logging
import threading

import pytest
from django.db import connection, connections
from qa.models import Effect, Execution

from django_leasequeue import enqueue, signals, store
from django_leasequeue.worker import WorkerService
from tests.support import claim, run_claimed

pytestmark = pytest.mark.django_db(transaction=True)  # fenced_atomic() must be the outermost transaction


def effects(job_id: int) -> list[str]:
    return sorted(Effect.objects.filter(job_id=job_id).values_list("key", flat=True))


def test_fenced_atomic_inside_an_outer_atomic_refuses_to_start_and_commits_nothing():
    job = enqueue("qa.adv_fenced_nested", ["N"])
    (claimed,) = claim()
    assert run_claimed(claimed) == "dead"  # max_attempts=1
    job.refresh_from_db()
    assert (job.status, job.attempts, job.leased_until) == ("dead", 1, None)
    (error,) = job.errors
    assert error["type"] == "builtins.RuntimeError"
    assert error["message"] == "A durable atomic block cannot be nested within another atomic block."
    assert effects(job.id) == []


def test_second_fenced_atomic_in_one_attempt_is_refused_before_it_runs(caplog):
    job = enqueue("qa.adv_fenced_twice", ["T"])
    (claimed,) = claim()
    with caplog.at_level(logging.WARNING, logger="django_leasequeue.executor"):
        assert run_claimed(claimed) == "done"
    job.refresh_from_db()
    assert (job.status, job.attempts, job.errors) == ("done", 1, [])
    assert effects(job.id) == ["T-1"]  # the first block committed with the completion; the second never ran
    assert Execution.objects.filter(job_id=job.id).count() == 1
    (record,) = [r for r in caplog.records if "raised after its fenced completion" in r.getMessage()]
    assert "fenced_atomic() already completed this attempt" in record.getMessage()


def test_fenced_block_marked_for_rollback_commits_neither_the_effect_nor_the_completion():
    job = enqueue("qa.adv_fenced_set_rollback", ["R"])
    (claimed,) = claim()
    assert run_claimed(claimed) == "dead"  # max_attempts=1; not "done"
    job.refresh_from_db()
    assert (job.status, job.attempts, job.leased_until) == ("dead", 1, None)
    assert job.errors[-1]["type"] == "django.db.transaction.TransactionManagementError"
    assert effects(job.id) == []


def test_heartbeat_does_not_renew_a_job_completed_by_fenced_atomic():
    """A handler still cleaning up after its fenced block: the job is done, so the heartbeat must
    neither renew it nor report its lease as lost (a false fence rejection in the lease report)."""
    lost = []
    lock = threading.Lock()

    def on_lost(sender, job_id, **fields):
        with lock:
            lost.append(job_id)

    signals.job_lease_lost.connect(on_lost, dispatch_uid="adversarial-fenced-hb")
    try:
        job = enqueue("qa.record")
        worker = WorkerService(concurrency=1, lease=3, notify=False, reap=False)
        (claimed,) = store.job_claim(queues=None, limit=1, worker_id=worker.worker_id, lease=3)
        # In flight, as the worker would hold it (no handler thread started).
        worker.pool.dispatch(worker.pool.track(claimed))
        (item,) = worker.pool.inflight_snapshot()
        with item.ctx.fenced_atomic():
            Effect.objects.create(key="E", job_id=job.id, lease_version=claimed.lease_version)
        item.next_renewal = 0.0  # a renewal is due
        worker.heartbeat.run_once()
    finally:
        signals.job_lease_lost.disconnect(dispatch_uid="adversarial-fenced-hb")
    job.refresh_from_db()
    assert (job.status, job.lease_version, job.history) == ("done", claimed.lease_version, [])
    assert (item.ctx.lease_lost, lost) == (False, [])
    assert effects(job.id) == ["E"]


def test_fenced_block_whose_commit_fails_is_a_failed_attempt_not_a_completion():
    """The completion is flagged just before COMMIT (see the next test); a commit that fails (a
    deferred foreign key) must clear the flag, or the executor would report the job done."""
    job = enqueue("qa.adv_fenced_commit_fails", ["C"])
    (claimed,) = claim()
    assert run_claimed(claimed) == "ready"  # "done" if the flag had stayed set
    job.refresh_from_db()
    assert (job.status, job.attempts, job.leased_until) == ("ready", 1, None)
    assert job.errors[-1]["type"] == "django.db.utils.IntegrityError"
    assert effects(job.id) == []


def test_renewal_that_finds_the_job_just_completed_by_fenced_atomic_is_not_a_lost_lease():
    """The heartbeat checked the job (not yet completed), then the handler's fenced_atomic()
    committed, then the renewal statement ran and found the job done: that is a completion, not a
    lost lease (no lease_lost event, no note in the job's history)."""
    lost = []
    signals.job_lease_lost.connect(lambda sender, job_id, **kw: lost.append(job_id), weak=False,
                                   dispatch_uid="adversarial-fenced-race")
    try:
        job = enqueue("qa.record")
        worker = WorkerService(concurrency=1, lease=3, notify=False, reap=False)
        (claimed,) = store.job_claim(queues=None, limit=1, worker_id=worker.worker_id, lease=3)
        worker.pool.dispatch(worker.pool.track(claimed))
        (item,) = worker.pool.inflight_snapshot()
        item.next_renewal = 0.0

        def commit_elsewhere() -> None:  # the handler thread, on its own connection
            try:
                with item.ctx.fenced_atomic():
                    Effect.objects.create(key="E", job_id=job.id, lease_version=claimed.lease_version)
            finally:
                connections.close_all()

        def complete_just_before_the_renewal(execute, sql, params, many, context):
            if sql == store.JOB_RENEW and not item.ctx.completed_in_transaction:
                handler = threading.Thread(target=commit_elsewhere)
                handler.start()
                handler.join(10)
            return execute(sql, params, many, context)

        with connection.execute_wrapper(complete_just_before_the_renewal):
            worker.heartbeat.run_once()  # in this thread, on this test's connection
    finally:
        signals.job_lease_lost.disconnect(dispatch_uid="adversarial-fenced-race")
    job.refresh_from_db()
    assert item.ctx.completed_in_transaction is True
    assert (job.status, job.history, item.ctx.lease_lost, lost) == ("done", [], False, [])
    assert effects(job.id) == ["E"]
