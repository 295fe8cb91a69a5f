"""On-time wake-ups without worker processes: the earliest future ``run_at`` of a worker's queues
(``store.job_next_run_at``), the notifications of jobs due later (enqueue, retry, snooze), their
payload as an older worker reads it, and the idle wait of a :class:`WorkerService` built from them.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction

from django_leasequeue import enqueue, enqueue_many, store
from django_leasequeue.conf import queue_name_problem
from django_leasequeue.models import Job
from django_leasequeue.notify import listen_connection, parse_payload
from django_leasequeue.worker import WorkerService
from tests.support import claim

CHANNEL = "leasequeue"


def later(seconds: float, queue: str = "ontime", priority: int = 0) -> Job:
    return enqueue("qa.digest", kwargs={"blob": f"{queue}+{seconds}"}, queue=queue, priority=priority,
                   run_at=timedelta(seconds=seconds))


def payloads(listener) -> list[tuple[str, float | None]]:
    return sorted((parse_payload(n.payload) for n in listener.notifies(timeout=0.5)),
                  key=lambda p: (p[0], p[1] or 0.0))


def test_parse_payload_and_older_workers_ignore_timed_payloads():
    assert parse_payload("emails") == ("emails", None)
    assert parse_payload("emails 1767225600.25") == ("emails", 1767225600.25)
    assert parse_payload("emails soon") == ("emails", None)  # malformed time: treated as due now
    # A worker of the previous version compares the whole payload with its queue names: a timed
    # payload is never a queue name, so it never wakes a worker that serves named queues.
    assert queue_name_problem("emails 1767225600.25") is not None


@pytest.mark.django_db
def test_next_run_at_is_the_earliest_future_ready_job_of_the_served_unpaused_queues():
    now = store.db_now()
    enqueue("qa.digest", kwargs={"blob": "due"}, queue="ontime", run_at=now - timedelta(seconds=5))
    a_low = enqueue("qa.digest", kwargs={"blob": "a0"}, queue="ontime", priority=0, run_at=now + timedelta(seconds=30))
    a_high = enqueue("qa.digest", kwargs={"blob": "a5"}, queue="ontime", priority=5, run_at=now + timedelta(seconds=20))
    a_neg = enqueue("qa.digest", kwargs={"blob": "a-3"}, queue="ontime", priority=-3,
                    run_at=now + timedelta(seconds=10))
    b = enqueue("qa.digest", kwargs={"blob": "b"}, queue="ontime-b", run_at=now + timedelta(seconds=5))
    enqueue("qa.digest", kwargs={"blob": "c"}, queue="ontime-c", run_at=now + timedelta(seconds=1))
    assert store.queue_pause("ontime-c", by="test")

    nxt = store.job_next_run_at(["ontime"], now=now)
    # Every priority level is looked at: the lowest one holds the earliest run_at.
    assert (nxt.now, nxt.at) == (now.timestamp(), a_neg.run_at.timestamp())
    assert nxt.seconds == pytest.approx(10.0)
    assert store.job_next_run_at(["ontime", "ontime-b"], now=now).at == b.run_at.timestamp()
    assert store.job_next_run_at(None, now=now).at == b.run_at.timestamp()  # the paused queue is left out
    assert store.job_next_run_at(["ontime-c"], now=now).at is None
    assert store.job_next_run_at(["nobody"], now=now).at is None
    # Strictly after now: a job due at now is the claim's, not a reason to sleep 0 s.
    assert store.job_next_run_at(["ontime"], now=a_neg.run_at).at == a_high.run_at.timestamp()
    # From ``since`` seconds before now: a job that became due after the worker's empty claim.
    since = store.job_next_run_at(["ontime"], now=a_neg.run_at + timedelta(seconds=2), since=3)
    assert (since.at, since.seconds) == (a_neg.run_at.timestamp(), pytest.approx(-2.0))
    Job.objects.filter(pk=a_high.pk).update(status="leased")  # not ready: not counted
    assert store.job_next_run_at(["ontime"], now=a_neg.run_at).at == a_low.run_at.timestamp()
    assert store.job_next_run_at(["ontime"], now=a_low.run_at).at is None


@pytest.mark.django_db(transaction=True)
def test_enqueues_due_later_notify_the_earliest_run_at_per_queue_and_statement():
    listener = listen_connection("default", CHANNEL)
    try:
        with transaction.atomic():
            one = later(7)
            many_count = enqueue_many("qa.digest", [([], {"blob": f"m{i}"}) for i in range(3)], queue="ontime-m",
                                      run_at=timedelta(seconds=4))
            due = enqueue("qa.digest", kwargs={"blob": "now"}, queue="ontime-now")
            assert list(listener.notifies(timeout=0.2)) == []  # delivered at commit only
        notes = payloads(listener)
    finally:
        listener.close()
    assert many_count == 3
    many_at = Job.objects.filter(queue="ontime-m").values_list("run_at", flat=True).distinct().get()
    assert due.run_at <= due.created_at
    assert notes == [("ontime", one.run_at.timestamp()), ("ontime-m", many_at.timestamp()), ("ontime-now", None)]


@pytest.mark.django_db(transaction=True)
def test_bulk_insert_notifies_once_per_queue_with_that_queues_earliest_run_at():
    from qa.tasks import digest

    from django_leasequeue.enqueueing import build_job, insert_jobs  # the insert path of the scheduler

    listener = listen_connection("default", CHANNEL)
    try:
        spec = [("ontime", 9), ("ontime", 3), ("ontime", 6), ("ontime-b", 2), ("ontime-b", 8)]
        insert_jobs([build_job(digest, kwargs={"blob": f"{q}{s}"}, queue=q, run_at=timedelta(seconds=s))
                     for q, s in spec])
        notes = payloads(listener)
    finally:
        listener.close()
    first = {q: min(Job.objects.filter(queue=q).values_list("run_at", flat=True)).timestamp()
             for q in ("ontime", "ontime-b")}
    assert notes == [("ontime", first["ontime"]), ("ontime-b", first["ontime-b"])]


@pytest.mark.django_db(transaction=True)
def test_retries_and_snoozes_notify_their_run_at_and_dead_letters_do_not():
    jobs = [enqueue("qa.record", kwargs={"tag": f"r{i}"}, queue="ontime") for i in range(4)]  # 3 attempts
    held = {c.id: c for c in claim(queues=["ontime"], limit=4)}
    assert sorted(held) == sorted(j.pk for j in jobs)
    listener = listen_connection("default", CHANNEL)
    try:
        r, s, d, z = (held[j.pk] for j in jobs)
        status, retry_at = store.job_fail(r.id, r.lease_version, {"type": "Boom"}, retry_delay=5.0)
        assert status == "ready"
        assert store.job_snooze(s.id, s.lease_version, 3.0, max_snoozes=10) == "ready"
        assert store.job_fail(d.id, d.lease_version, {"type": "Boom"}, retry_delay=None)[0] == "dead"
        assert store.job_fail(z.id, z.lease_version, {"type": "Boom"}, retry_delay=0.0)[0] == "ready"
        notes = [parse_payload(n.payload) for n in listener.notifies(timeout=0.5)]
    finally:
        listener.close()
    snoozed_at = Job.objects.get(pk=s.id).run_at
    # In order: the retry and the snooze carry their run time; the dead letter sends nothing; a
    # retry due at once sends the plain queue name, which workers of every version act on.
    assert notes == [("ontime", retry_at.timestamp()), ("ontime", snoozed_at.timestamp()), ("ontime", None)]


@pytest.mark.django_db
def test_idle_wait_ends_at_the_next_run_at_and_only_earlier_notifications_cut_it():
    worker = WorkerService(queues=["ontime"], concurrency=1, poll_interval=10, notify=False, reap=False,
                           prefetch_wait=0)
    assert worker.run_once() == 10.0  # nothing at all: the poll interval
    job = later(3)
    wait = worker.run_once()
    before = store.db_now()
    assert 2.5 < wait <= 3.0
    ends = worker._wait_ends_at
    assert ends is not None and abs(ends - job.run_at.timestamp()) < 1e-6
    assert worker.claimed == 0
    worker._wake.clear()
    worker.wake_for_run_at(ends + 1.0)  # due after the wait ends anyway: no wake-up
    assert not worker._wake.is_set()
    worker.wake_for_run_at(ends - 1.0)
    assert worker._wake.is_set()
    worker._wake.clear()
    # Once it is due the next turn claims it.
    Job.objects.filter(pk=job.pk).update(run_at=before)
    assert worker.run_once() == 0.0
    assert worker.claimed == 1
    # While it is not waiting (the pool is saturated, or it is claiming) every notification wakes it.
    job2 = later(2)
    assert worker.run_once() == 10.0  # saturated: the pool's freed thread wakes it, no look-up
    assert worker._wait_ends_at is None
    worker.wake_for_run_at(job2.run_at.timestamp() + 100)
    assert worker._wake.is_set()


@pytest.mark.django_db(transaction=True)
def test_listener_wakes_for_served_queues_only_and_only_for_times_before_the_wait_ends():
    worker = WorkerService(queues=["ontime"], concurrency=1, poll_interval=10, notify=True, reap=False)
    listener = worker.listener
    assert listener is not None
    try:
        listener.run_once()  # connects (and wakes the worker: anything enqueued meanwhile), no notification
        assert worker._wake.is_set()
        worker._wake.clear()
        ends = (store.db_now() + timedelta(seconds=30)).timestamp()
        worker._wait_ends_at = ends
        later(60)  # after the wait ends: it will be read then
        later(5, queue="ontime-other")  # not served
        listener.run_once()
        assert listener.received == 2 and not worker._wake.is_set()
        soon = later(5)
        listener.run_once()
        assert listener.received == 3 and worker._wake.is_set()
        assert soon.run_at.timestamp() < ends
        worker._wake.clear()
        enqueue("qa.digest", kwargs={"blob": "due"}, queue="ontime")  # due now: wakes whatever the wait
        listener.run_once()
        assert listener.received == 4 and worker._wake.is_set()
    finally:
        listener.on_stop()


@pytest.mark.django_db
def test_a_job_due_between_the_empty_claim_and_the_look_up_is_claimed_at_once():
    """The look-up starts from the claim's start: a job whose run_at fell between the claim that
    found nothing and the look-up is due, so the worker claims again at once instead of sleeping
    to the next run_at or the poll (10 s here)."""
    worker = WorkerService(queues=["ontime"], concurrency=1, poll_interval=10, notify=False, reap=False,
                           prefetch_wait=0)
    job = later(3)
    assert 2.5 < worker.run_once() <= 3.0
    # As if the claim had started 5 s ago and the job became due 1 s after it.
    Job.objects.filter(pk=job.pk).update(run_at=store.db_now() - timedelta(seconds=4))
    worker.producer.round_started -= 5.0
    assert worker._idle_wait() == 0.0
    assert worker.run_once() == 0.0 and worker.claimed == 1
