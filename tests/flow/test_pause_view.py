"""The worker's pause view and the wait of ``queue_pause()``, without worker processes.

The pool tests drive a WorkerService whose threads were never started: the claimed jobs wait in
its pool like prefetched jobs behind busy threads, and ``run_job`` is called where a thread would
take the next job. Time is injected by ageing the view's evidence (its monotonic stamps), not by
sleeping.
"""

from __future__ import annotations

import io
import time

import pytest
from django.db import OperationalError, transaction
from qa.models import Execution
from qa.tasks import record

from django_leasequeue import enqueue_many, store
from django_leasequeue.models import Job, QueueState
from django_leasequeue.worker import InFlight, WorkerService
from django_leasequeue.worker.pause_view import PauseView
from django_leasequeue.worker.pool import PAUSED_REASON

pytestmark = pytest.mark.django_db


def prefetching_worker() -> WorkerService:
    worker = WorkerService(queues=["default"], concurrency=1, reap=False, notify=False, prefetch_wait=0.05,
                           prefetch_max=4)
    worker.pool.avg_runtime = 0.0001  # short jobs: prefetch the maximum
    return worker


def held(worker: WorkerService, n: int) -> list[InFlight]:
    """Enqueue ``n`` qa.record jobs, claim them all (1 thread + 4 prefetched), return them in order."""
    enqueue_many("qa.record", [[f"p{i}"] for i in range(n)])
    worker.run_once()
    items = []
    while not worker.pool.tasks.empty():
        item = worker.pool.tasks.get_nowait()
        if item is not None:
            items.append(item)
    assert len(items) == n and {i.started for i in items} == {False}
    return items


def age(view: PauseView, seconds: float) -> None:
    """Make every piece of the view's evidence ``seconds`` older."""
    view.read_at -= seconds
    for queue in view.claimed_at:
        view.claimed_at[queue] -= seconds


def released_reasons(job_id: int) -> list[str]:
    return [h["reason"] for h in Job.objects.get(pk=job_id).history if h["event"] == "released"]


def test_a_fresh_claim_is_evidence_enough_no_read_on_the_hot_path():
    worker = prefetching_worker()
    items = held(worker, 2)
    worker.pool.run_job(items[0])
    assert Execution.objects.filter(job_id=items[0].job.id).count() == 1
    assert worker.pool.pause_view.refreshes == 0
    worker.pool.pause_view.claimed(time.monotonic(), [items[1].job])  # as a claim just now would
    assert worker.pool.release_paused() == 0  # the heartbeat's round: evidence younger than grace/2
    assert worker.pool.pause_view.refreshes == 0


def test_a_prefetched_job_of_a_paused_queue_goes_back_without_an_attempt_and_its_token_moves():
    worker = prefetching_worker()
    items = held(worker, 3)
    assert store.queue_pause("default", by="test", wait=False)
    age(worker.pool.pause_view, store.PAUSE_GRACE)  # the claim's evidence is now too old to start on
    victim = items[1]
    worker.pool.run_job(victim)
    assert worker.pool.pause_view.refreshes == 1  # it read the paused queues first
    assert not Execution.objects.filter(job_id=victim.job.id).exists()
    row = Job.objects.get(pk=victim.job.id)
    assert (row.status, row.attempts, row.lease_version, row.started_at) == ("ready", 0, victim.job.lease_version + 1,
                                                                            None)
    assert released_reasons(victim.job.id) == [PAUSED_REASON]
    # The stale holder cannot write: its completion is refused by the token.
    assert store.job_complete([(victim.job.id, victim.job.lease_version, None)]) == set()
    # The next thread decides on the fresh read: released too, no second read.
    worker.pool.run_job(items[0])
    assert worker.pool.pause_view.refreshes == 1
    assert Job.objects.get(pk=items[0].job.id).status == "ready"
    assert worker.pool.pause_released == 2
    assert {i.job.id for i in worker.pool.inflight_snapshot()} == {items[2].job.id}


def test_the_heartbeat_gives_back_every_prefetched_job_of_the_paused_queue():
    worker = prefetching_worker()
    items = held(worker, 5)
    assert store.queue_pause("default", wait=False)
    age(worker.pool.pause_view, store.PAUSE_GRACE / 2)
    worker.heartbeat.run_once()
    assert worker.pool.pause_view.refreshes == 1
    assert worker.pool.inflight_snapshot() == []
    rows = {r.id: r for r in Job.objects.all()}
    assert {(r.status, r.attempts) for r in rows.values()} == {("ready", 0)}
    assert {rows[i.job.id].lease_version - i.job.lease_version for i in items} == {1}
    assert worker.pool.pause_released == 5
    assert not Execution.objects.exists()


def test_release_refunds_exactly_the_claims_attempt_on_a_retry():
    """A retry held unstarted when its queue is paused keeps the attempts it had before the claim."""
    job = record.enqueue("r")
    (first,) = store.job_claim_ids([job.pk], worker_id="w", lease=30)
    outcome = store.job_fail(first.id, first.lease_version, {"attempt": 1, "type": "E", "message": "m"},
                             retry_delay=0.0)
    assert outcome is not None and outcome[0] == "ready"
    (second,) = store.job_claim_ids([job.pk], worker_id="w", lease=30)
    assert second.attempts == 2
    assert store.job_release([(second.id, second.lease_version)], reason=PAUSED_REASON) == {job.pk}
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.attempts, row.lease_version) == ("ready", 1, second.lease_version + 1)
    assert row.started_at is not None  # it did start once, at its first attempt


def test_evidence_order_a_newer_claim_beats_an_older_read_and_vice_versa():
    view = PauseView("default")
    assert view.may_start("q", time.monotonic()) is None  # no evidence yet
    QueueState.objects.create(name="q", paused=True, paused_at=store.db_now(), paused_by="t", rate_log=[])
    view.refresh()
    now = time.monotonic()
    assert view.may_start("q", now) is False
    assert view.may_start("other", now) is True  # the read covers every queue
    job = store.ClaimedJob(id=1, task="t", queue="q", args=[], kwargs={}, attempts=1, max_attempts=1,
                           lease_version=1, leased_until=store.db_now(), lease_seconds=30.0,
                           claimed_at=store.db_now())
    view.claimed(view.read_at - 0.001, [job])  # a claim sent before the read: the read wins
    assert view.may_start("q", now) is False
    view.claimed(view.read_at + 0.001, [job])  # sent after it (a resume in between): the claim wins
    assert view.may_start("q", now) is True
    assert view.may_start("q", view.read_at + 0.001 + store.PAUSE_GRACE) is None  # aged past the grace


def test_a_failed_read_of_the_paused_queues_starts_nothing(monkeypatch):
    worker = prefetching_worker()
    items = held(worker, 2)
    age(worker.pool.pause_view, store.PAUSE_GRACE)

    def unreachable(**kwargs):
        raise OperationalError("the database is away")

    monkeypatch.setattr(store, "queue_paused_names", unreachable)
    worker.pool.run_job(items[0])
    assert not Execution.objects.filter(job_id=items[0].job.id).exists()
    row = Job.objects.get(pk=items[0].job.id)
    assert (row.status, row.attempts) == ("ready", 0)
    assert released_reasons(row.pk) == ["could not confirm that the job's queue is not paused"]
    assert worker.pool.pause_released == 0  # not counted as a pause


def test_queue_pause_waits_at_commit_unless_told_not_to(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        assert store.queue_pause("a", wait=False)
    assert callbacks == []
    with django_capture_on_commit_callbacks() as callbacks:
        assert store.queue_pause("b")
        assert not store.queue_pause("b")  # already paused: still waits, the other pause may be in its grace
    assert callbacks == [store.queue_pause_wait, store.queue_pause_wait]


@pytest.mark.django_db(transaction=True)
def test_queue_pause_returns_a_grace_after_its_commit_and_inside_atomic_at_the_block_exit():
    bound = store.PAUSE_GRACE + store.PAUSE_MARGIN
    started = time.monotonic()
    assert store.queue_pause("c", by="test")
    assert time.monotonic() - started >= bound
    assert QueueState.objects.get(name="c").paused
    started = time.monotonic()
    with transaction.atomic():
        assert store.queue_pause("d")
        # Not yet: the pause commits with the block, and the wait is queued behind that commit.
        assert transaction.get_connection().run_on_commit[-1][1] is store.queue_pause_wait
    assert time.monotonic() - started >= bound


def test_the_admin_pause_action_and_the_command_wait_after_the_pause(django_capture_on_commit_callbacks,
                                                                      admin_client):
    from django.core.management import call_command
    from django.urls import reverse

    with django_capture_on_commit_callbacks() as callbacks:
        response = admin_client.post(reverse("admin:django_leasequeue_dashboard_pause"), {"queue": "mail"})
    assert response.status_code == 302 and QueueState.objects.get(name="mail").paused
    assert callbacks == [store.queue_pause_wait]
    with django_capture_on_commit_callbacks() as callbacks:
        call_command("leasequeue_queue", "pause", "x", "y", "z", by="test", stdout=io.StringIO())
    assert set(QueueState.objects.filter(paused=True).values_list("name", flat=True)) == {"mail", "x", "y", "z"}
    assert callbacks == [store.queue_pause_wait]  # one wait, after the last commit, covers all three
