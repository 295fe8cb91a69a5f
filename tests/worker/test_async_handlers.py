"""``async def`` handlers on the worker's event loop: outcomes, timeouts, cancels, snoozes, fencing,
and many handlers at once on one worker (in-process workers on the real database)."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from qa.models import Effect

from django_leasequeue import registry, store, task
from django_leasequeue.conf import build
from django_leasequeue.context import FencedCompletion, JobContext
from django_leasequeue.exceptions import LeaseLost, Snooze
from django_leasequeue.executor import SYNC_ONLY_HINT
from django_leasequeue.models import Job
from django_leasequeue.runtime import run_services
from django_leasequeue.worker import WorkerService
from django_leasequeue.worker.producer import AFTER_SHORT_CLAIM, ASYNC_RECHECK, ASYNC_RECHECK_MAX
from tests.support import tasks_registered, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

# What the handlers saw, per test (cleared by the fixture below).
TIMED_OUT = "django_leasequeue.exceptions.JobTimedOut"

SEEN: list[Any] = []
RUNNING = {"now": 0, "peak": 0}


@pytest.fixture(autouse=True)
def _clear() -> None:
    SEEN.clear()
    RUNNING.update(now=0, peak=0)


@task(name="tests.async.add")
async def add(a: int, b: int) -> int:
    SEEN.append(threading.current_thread().name)
    await asyncio.sleep(0.01)
    return a + b


@task(name="tests.async.boom", max_attempts=2, backoff=0)
async def boom() -> None:
    await asyncio.sleep(0)
    raise ValueError("boom")


@task(name="tests.async.hang", takes_context=True, timeout=0.5, max_attempts=2, backoff=0)
async def hang(ctx: JobContext, swallow: bool) -> str:
    SEEN.append(("start", ctx.attempt, time.monotonic()))
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        SEEN.append(("cancelled", ctx.attempt, time.monotonic()))
        if not swallow:
            raise
        await asyncio.sleep(1.0)  # swallowed: goes on past its timeout, then returns
    SEEN.append(("end", ctx.attempt, time.monotonic()))
    return "late"


@task(name="tests.async.cancellable", takes_context=True)
async def cancellable(ctx: JobContext) -> str:
    SEEN.append("started")
    for _ in range(600):
        ctx.check_cancel()
        await asyncio.sleep(0.05)
    return "not cancelled"


@task(name="tests.async.snoozing", takes_context=True)
async def snoozing(ctx: JobContext) -> str:
    await asyncio.sleep(0)
    raise Snooze(3600)


@task(name="tests.async.fenced", takes_context=True, max_attempts=3)
async def fenced(ctx: JobContext, key: str) -> str:
    if not SEEN:
        # Another worker takes the job over first: our token is stale by the time we write.
        SEEN.append(("stolen", ctx.lease_version))
        await sync_to_async(store.job_release, thread_sensitive=False)([(ctx.job_id, ctx.lease_version)],
                                                                       reason="taken over")

    def write(fence: FencedCompletion, key: str) -> int:
        Effect.objects.create(key=key, job_id=ctx.job_id, lease_version=ctx.lease_version)
        fence.set_result(key)
        return Effect.objects.count()

    try:
        count = await ctx.afenced_atomic(write, key)
    except LeaseLost:
        SEEN.append(("refused", ctx.lease_version))
        raise
    SEEN.append(("written", ctx.lease_version, count))
    return key


@task(name="tests.async.long", takes_context=True)
async def long(ctx: JobContext) -> None:
    SEEN.append("started")
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        SEEN.append("cancelled")
        raise


@task(name="tests.async.blocking")
async def blocking(seconds: float) -> None:
    time.sleep(seconds)  # noqa: ASYNC251 - the mistake the worker warns about


@task(name="tests.async.sync_name")
def sync_name() -> str:
    time.sleep(0.05)
    return threading.current_thread().name


@task(name="tests.async.async_name")
async def async_name() -> str:
    await asyncio.sleep(0.05)
    return threading.current_thread().name


@task(name="tests.async.nap")
async def nap(seconds: float) -> int:
    RUNNING["now"] += 1  # one event loop thread: no lock needed
    RUNNING["peak"] = max(RUNNING["peak"], RUNNING["now"])
    await asyncio.sleep(seconds)
    RUNNING["now"] -= 1
    return 1


@task(name="tests.async.unstorable", max_attempts=3, backoff=0)
async def unstorable() -> object:
    await asyncio.sleep(0)
    return {1, 2}  # a set: not JSON


def _offloaded_work(attempt: int) -> None:
    time.sleep(1.5)
    SEEN.append(("thread-end", attempt, time.monotonic()))


@task(name="tests.async.offloaded", takes_context=True, timeout=0.5, max_attempts=2, backoff=0)
async def offloaded(ctx: JobContext) -> None:
    SEEN.append(("start", ctx.attempt, time.monotonic()))
    await asyncio.to_thread(_offloaded_work, ctx.attempt)  # blocking work moved off the loop, as advised


@task(name="tests.async.orm_on_the_loop", max_attempts=1)
async def orm_on_the_loop() -> int:
    return Job.objects.count()  # the mistake: the ORM called from the event loop


# Registered only while this module's tests run: a registered async task makes every worker of
# the test session claim for its event loop too (other tests count their claims exactly).
ASYNC_TASKS = [add, boom, hang, cancellable, snoozing, fenced, long, blocking, sync_name, async_name, nap,
               unstorable, offloaded, orm_on_the_loop]
for _task in ASYNC_TASKS:
    registry._REGISTRY.pop(_task.name)


@pytest.fixture(autouse=True, scope="module")
def _registered():
    with tasks_registered(ASYNC_TASKS):
        yield


def drain(*, async_slots: int = 50, concurrency: int = 2, **settings: Any) -> WorkerService:
    worker = WorkerService(concurrency=concurrency, burst=True, poll_interval=0.05, notify=False, reap=False,
                           async_slots=async_slots, settings=build(settings) if settings else None)
    assert run_services([worker], install_signals=False) == 0
    return worker


def row(job_id: int) -> Job:
    return Job.objects.get(pk=job_id)


def test_an_async_task_completes_with_its_return_value_on_the_event_loop():
    jobs = [add.enqueue(i, 1) for i in range(5)]
    worker = drain()
    assert [(row(j.id).status, row(j.id).result, row(j.id).attempts) for j in jobs] == [
        ("done", i + 1, 1) for i in range(5)]
    assert set(SEEN) == {"leasequeue-async"}  # the loop's thread, not a handler thread
    counts = worker.counts()
    assert (counts.claimed, counts.done) == (5, 5)
    assert worker.pool.aio is not None and not worker.pool.aio._thread.is_alive()  # stopped with the worker


def test_with_no_async_slots_an_async_task_runs_on_a_handler_thread():
    job = add.enqueue(2, 3)
    worker = drain(async_slots=0)
    assert (row(job.id).status, row(job.id).result) == ("done", 5)
    assert SEEN[0].startswith("leasequeue-job-")
    assert worker.pool.aio is None


def test_an_async_task_that_raises_is_retried_then_dead_lettered():
    job = boom.enqueue()
    drain()
    r = row(job.id)
    assert (r.status, r.attempts) == ("dead", 2)
    assert [(e["type"], e["message"], e["attempt"]) for e in r.errors] == [
        ("builtins.ValueError", "boom", 1), ("builtins.ValueError", "boom", 2)]


def test_an_async_task_whose_return_value_cannot_be_stored_fails_at_once_not_on_the_loop():
    # The refused value is recorded as a failure (not retried: the same value would be refused),
    # on a recording thread: a write on the loop's thread raises SynchronousOnlyOperation, which
    # left the job leased, unrenewed, until the reaper charged it a LeaseExpired attempt.
    job = unstorable.enqueue()
    worker = drain()
    r = row(job.id)
    assert (r.status, r.attempts, [e["type"] for e in r.errors]) == (
        "dead", 1, ["django_leasequeue.exceptions.PayloadNotSerializable"])
    counts = worker.counts()
    assert (counts.claimed, counts.done) == (1, 0)


@pytest.mark.parametrize("async_slots", [50, 0])
def test_an_orm_call_on_the_loop_is_recorded_with_the_way_out(async_slots):
    # On the worker's loop and on a handler thread's private loop (no slots) alike, Django refuses
    # the call; the recorded failure says how an async handler reaches the database.
    job = orm_on_the_loop.enqueue()
    drain(async_slots=async_slots)
    r = row(job.id)
    assert (r.status, r.attempts) == ("dead", 1)
    ((kind, message),) = [(e["type"], e["message"]) for e in r.errors]
    assert kind == "django.core.exceptions.SynchronousOnlyOperation"
    assert message == "You cannot call this from an async context - use a thread or sync_to_async." + SYNC_ONLY_HINT
    assert "ctx.afenced_atomic(" in message and "docs/howto/async.md" in message


def test_the_retry_of_a_timed_out_handler_never_starts_beside_its_offloaded_thread():
    # Cancelled at its timeout while it awaits asyncio.to_thread(), the handler ends at once, but
    # the thread runs on (a thread cannot be stopped); the attempt is recorded as timed out and its
    # retry (backoff 0) must not start until that thread has ended, as for a sync handler.
    job = offloaded.enqueue()
    drain()
    r = row(job.id)
    assert (r.status, r.attempts) == ("dead", 2)
    wait_for(lambda: len([e for e in SEEN if e[0] == "thread-end"]) == 2, timeout=5, what="both threads ended")
    first_end = next(t for what, attempt, t in SEEN if what == "thread-end" and attempt == 1)
    second_start = next(t for what, attempt, t in SEEN if what == "start" and attempt == 2)
    assert second_start >= first_end


@pytest.mark.parametrize("swallow", [False, True])
def test_an_async_task_past_its_timeout_is_cancelled_and_its_retry_never_overlaps_it(swallow):
    """The coroutine is cancelled at the timeout: one failed attempt (JobTimedOut) per attempt; a
    handler that swallows the CancelledError keeps its slot and lease until it returns, so its
    retry starts only after it ended."""
    job = hang.enqueue(swallow)
    drain()
    r = row(job.id)
    assert (r.status, r.attempts) == ("dead", 2)
    assert [(e["type"], e["attempt"]) for e in r.errors] == [(TIMED_OUT, 1), (TIMED_OUT, 2)]
    assert "was cancelled (async handler) at its timeout" in r.errors[0]["message"]
    kinds = [(kind, attempt) for kind, attempt, _ in SEEN]
    if swallow:
        assert kinds == [("start", 1), ("cancelled", 1), ("end", 1), ("start", 2), ("cancelled", 2), ("end", 2)]
        end_1 = next(t for kind, attempt, t in SEEN if (kind, attempt) == ("end", 1))
        start_2 = next(t for kind, attempt, t in SEEN if (kind, attempt) == ("start", 2))
        assert start_2 >= end_1  # no overlap
    else:
        assert kinds == [("start", 1), ("cancelled", 1), ("start", 2), ("cancelled", 2)]
    assert [h["event"] for h in r.history].count("timed_out") == 2


def test_a_cancel_request_reaches_a_running_async_handler():
    job = cancellable.enqueue()
    worker, stop, thread = running_worker()
    try:
        wait_for(lambda: SEEN == ["started"], timeout=20, what="the handler to start")
        assert store.job_request_cancel([job.id]).requested == 1
        wait_for(lambda: row(job.id).status == "cancelled", timeout=20, what="the cancel")
    finally:
        stop.set()
        thread.join(30)
    r = row(job.id)
    assert (r.status, r.attempts, r.errors) == ("cancelled", 1, [])


def running_worker(**settings: Any) -> tuple[WorkerService, threading.Event, threading.Thread]:
    worker = WorkerService(concurrency=1, poll_interval=0.05, notify=False, reap=False, async_slots=10,
                           settings=build({"HEARTBEAT_INTERVAL": 0.1, **settings}))
    stop = threading.Event()
    thread = threading.Thread(target=run_services, args=([worker],),
                              kwargs={"install_signals": False, "stop_when": stop})
    thread.start()
    return worker, stop, thread


def test_a_lost_lease_cancels_the_async_handler_and_writes_nothing():
    job = long.enqueue()
    worker, stop, thread = running_worker()
    try:
        wait_for(lambda: SEEN == ["started"], timeout=20, what="the handler to start")
        token = row(job.id).lease_version
        # Taken from this worker: released (token bumped), then cancelled while ready.
        assert store.job_release([(job.id, token)], reason="taken over") == {job.id}
        assert store.job_request_cancel([job.id]).cancelled == 1
        wait_for(lambda: SEEN == ["started", "cancelled"], timeout=20, what="the handler to be cancelled")
        wait_for(lambda: not worker.pool.inflight_snapshot(), timeout=20, what="the slot to be freed")
    finally:
        stop.set()
        thread.join(30)
    r = row(job.id)
    assert (r.status, r.attempts, r.errors, r.lease_version) == ("cancelled", 0, [], token + 1)
    assert [h["event"] for h in r.history].count("lease_lost") == 1
    counts = worker.counts()
    assert (counts.claimed, counts.lease_lost) == (1, 1)


def test_a_blocking_call_in_an_async_handler_is_reported(caplog):
    job = blocking.enqueue(1.6)
    with caplog.at_level("WARNING", logger="django_leasequeue.worker"):
        drain()
    assert row(job.id).status == "done"
    (warning,) = [r.getMessage() for r in caplog.records if "event loop of the async handlers" in r.getMessage()]
    assert warning.startswith("the event loop of the async handlers has been blocked for ")
    assert warning.endswith(f"Async jobs running: [{job.id}]")


def test_an_async_task_snoozes():
    job = snoozing.enqueue()
    drain()
    r = row(job.id)
    assert (r.status, r.attempts, r.snoozes, r.errors) == ("ready", 0, 1, [])


def test_a_fenced_write_of_an_async_handler_under_a_stale_token_is_refused():
    job = fenced.enqueue("k1")
    drain()
    r = row(job.id)
    stolen_token = SEEN[0][1]
    assert SEEN[:2] == [("stolen", stolen_token), ("refused", stolen_token)]
    (written,) = SEEN[2:]
    assert written[0] == "written" and written[1] > stolen_token and written[2] == 1
    assert [(e.key, e.lease_version) for e in Effect.objects.filter(job_id=job.id)] == [("k1", written[1])]
    assert (r.status, r.result, r.lease_version) == ("done", "k1", written[1])


def test_many_async_jobs_run_at_once_on_one_worker():
    """200 jobs that each sleep 0.2 s on 200 async slots and 2 threads: all 200 run at once."""
    jobs = [nap.enqueue(0.2) for _ in range(200)]
    worker = drain(async_slots=200, concurrency=2)
    assert Job.objects.filter(id__in=[j.id for j in jobs], status="done").count() == 200
    assert RUNNING == {"now": 0, "peak": 200}
    counts = worker.counts()
    assert (counts.claimed, counts.done) == (200, 200)


def test_a_worker_with_both_kinds_of_tasks_fills_its_threads_and_its_async_slots():
    sync_jobs = [sync_name.enqueue() for _ in range(6)]
    async_jobs = [async_name.enqueue() for _ in range(30)]
    worker = drain(async_slots=30, concurrency=2)
    sync_rows = [row(j.id) for j in sync_jobs]
    async_rows = [row(j.id) for j in async_jobs]
    assert {(r.status, r.attempts) for r in sync_rows + async_rows} == {("done", 1)}
    assert {r.result.rsplit("-", 1)[0] for r in sync_rows} == {"leasequeue-job"}
    assert {r.result for r in async_rows} == {"leasequeue-async"}
    counts = worker.counts()
    assert (counts.claimed, counts.done) == (36, 36)


def test_async_slots_are_validated():
    with pytest.raises(ValueError, match="async_slots must be an int >= 0"):
        WorkerService(async_slots=-1)
    from django_leasequeue.exceptions import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"ASYNC_SLOTS'\] must be an int >= 0"):
        build({"ASYNC_SLOTS": -1})
    assert build({}).async_slots == 100


def test_the_async_claim_is_skipped_while_the_threads_are_busy_after_it_found_nothing():
    """A worker with async tasks, busy with thread jobs, does not send an async claim with every
    refill of its threads once one found nothing (ASYNC_RECHECK); that empty claim does not pause
    the next claim as a queue run dry would (AFTER_SHORT_CLAIM); an async job waits for the
    recheck while the threads stay busy."""
    for _ in range(3):
        sync_name.enqueue()
    worker = WorkerService(queues=["default"], concurrency=1, reap=False, notify=False, prefetch_wait=0,
                           async_slots=10)
    producer = worker.producer
    try:
        assert worker.run_once() == 0.0  # the thread's job; the async claim found nothing: not a dry queue
        assert (worker.claimed, producer.async_empty_until > 0) == (1, True)
        assert round(producer.async_empty_until - producer.async_claimed_at, 6) == ASYNC_RECHECK
        job = async_name.enqueue()
        # The thread is taken (its job is held, never run here): the async claim waits for the
        # recheck, and the loop sleeps until then. The recheck is put 30 s ahead, so that the time
        # the enqueue took on a loaded machine cannot end the skip before the next round.
        producer.async_empty_until = time.monotonic() + 30
        delay = worker.run_once()
        assert 25.0 < delay <= 30.0
        assert (worker.claimed, row(job.id).status) == (1, "ready")
        producer.async_empty_until = 0.0  # the recheck is due (instead of waiting 50 ms)
        worker.run_once()
        assert (worker.claimed, row(job.id).status) == (2, "leased")
    finally:
        worker.pool.stop_async()


def test_empty_async_claims_back_off_while_the_threads_stay_busy_and_a_notify_ends_the_backoff():
    """During a backlog of thread jobs, each async claim that finds nothing doubles the skip before
    the next (ASYNC_RECHECK up to ASYNC_RECHECK_MAX), and the saturated loop waits for the skip's end,
    not through the idle wait; a NOTIFY of an enqueue brings the skip back to ASYNC_RECHECK."""
    sync_name.enqueue()
    worker = WorkerService(queues=["default"], concurrency=1, reap=False, notify=False, prefetch_wait=0,
                           async_slots=10)
    producer = worker.producer
    try:
        assert worker.run_once() == 0.0  # the thread's job (held, never run here); no async job
        skips = []
        for _ in range(6):
            producer.async_empty_until = 0.0  # the skip is over (instead of waiting it out)
            delay = worker.run_once()  # the thread is taken: the async claim alone, finding nothing
            skip = producer.async_empty_until - producer.async_claimed_at
            skips.append(round(skip, 6))
            assert (producer.found_nothing, 0.0 < delay <= skip) == (False, True)
        assert skips == [0.1, 0.2, 0.4, 0.8, ASYNC_RECHECK_MAX, ASYNC_RECHECK_MAX]
        assert worker.claimed == 1
        worker.wake_for_due()  # what the listener does on a NOTIFY of a job due now
        assert (producer.async_recheck, producer.async_empty_until) == (
            ASYNC_RECHECK, producer.async_claimed_at + ASYNC_RECHECK)
        job = async_name.enqueue()
        producer.async_empty_until = 0.0
        worker.run_once()
        assert (worker.claimed, row(job.id).status, producer.async_recheck) == (2, "leased", ASYNC_RECHECK)
    finally:
        worker.pool.stop_async()


def test_a_notify_of_a_job_due_later_ends_the_async_backoff_by_its_run_at():
    """A NOTIFY of a job due later (a delayed enqueue, a retry, a snooze: no NOTIFY comes when it
    falls due) ends the grown skip of the async claim by the job's run_at, not up to
    ASYNC_RECHECK_MAX past it, and the backoff starts again from ASYNC_RECHECK; one due after the
    skip's end leaves the skip as it is."""
    sync_name.enqueue()
    worker = WorkerService(queues=["default"], concurrency=1, reap=False, notify=False, prefetch_wait=0,
                           async_slots=10)
    producer = worker.producer
    try:
        assert worker.run_once() == 0.0  # the thread's job (held, never run here)
        for _ in range(5):
            producer.async_empty_until = 0.0
            worker.run_once()  # the async claim alone, finding nothing: the skip grows
        claimed_at, clock = producer.async_claimed_at, producer.claim_clock_us / 1e6
        assert round(producer.async_empty_until - claimed_at, 6) == ASYNC_RECHECK_MAX
        started = producer.claim_started  # the last claim was that async claim, sent at claimed_at
        assert claimed_at <= started < claimed_at + ASYNC_RECHECK
        worker.wake_for_run_at(clock + ASYNC_RECHECK_MAX + 5.0)  # due after the skip's end
        assert (round(producer.async_empty_until - claimed_at, 6), producer.async_recheck) == (
            ASYNC_RECHECK_MAX, ASYNC_RECHECK_MAX)
        worker.wake_for_run_at(clock + 0.3)  # due 0.3 s after the last claim read the clock
        assert (producer.async_empty_until, producer.async_recheck) == (
            started + ((clock + 0.3) - clock), ASYNC_RECHECK_MAX)
        worker.wake_for_run_at(clock + 0.01)  # never sooner than ASYNC_RECHECK after the last async claim
        assert producer.async_empty_until == claimed_at + ASYNC_RECHECK
        # An empty async claim sent before the job due later (the skip ended sooner): its skip, of
        # ASYNC_RECHECK_MAX, ends by that run_at all the same.
        producer.async_due_at = None
        worker.wake_for_run_at(clock + 0.5)
        producer.async_empty_until = 0.0
        worker.run_once()
        assert (producer.async_empty_until, producer.async_due_at) == (started + ((clock + 0.5) - clock),) * 2
        assert worker.claimed == 1
    finally:
        worker.pool.stop_async()


def test_the_idle_wait_looks_for_the_next_run_at_from_the_thread_claim_not_the_async_claim_after_it():
    """With async tasks a round sends two claims, the thread claim first. The idle wait's look-up
    of the next run_at counts from the first: a thread job that fell due between the two claims
    is claimed at once, not at the next wake or poll (10 s here)."""
    job = sync_name.enqueue()
    Job.objects.filter(pk=job.id).update(run_at=store.db_now() + timedelta(seconds=3))
    worker = WorkerService(queues=["default"], concurrency=1, reap=False, notify=False, prefetch_wait=0,
                           poll_interval=10, async_slots=10)
    producer = worker.producer
    try:
        assert 2.5 < worker.run_once() <= 3.0  # both claims found nothing; the wait ends at the run_at
        assert producer.round_started < producer.claim_started  # the async claim came second
        # As if the thread claim had started 5 s ago, the async claim 1 s ago, and the job had
        # fallen due between them.
        Job.objects.filter(pk=job.id).update(run_at=store.db_now() - timedelta(seconds=4))
        producer.round_started -= 5.0
        producer.claim_started -= 1.0
        assert worker._idle_wait() == 0.0
        assert (worker.run_once(), worker.claimed, row(job.id).status) == (0.0, 1, "leased")
    finally:
        worker.pool.stop_async()


def test_the_async_claim_is_not_skipped_when_the_threads_find_nothing():
    """An idle worker (no thread job due) claims async jobs at once, however recently an async
    claim found nothing."""
    worker = WorkerService(queues=["default"], concurrency=1, reap=False, notify=False, prefetch_wait=0,
                           async_slots=10)
    try:
        before = time.monotonic()
        assert worker.producer.claim() is None  # nothing of either kind
        # Set from the claim's start (not compared with the clock after it: a loaded machine can
        # spend ASYNC_RECHECK between the claim and the assertion).
        assert worker.producer.async_empty_until >= before + ASYNC_RECHECK
        job = async_name.enqueue()
        worker.producer.claim()
        assert (worker.claimed, row(job.id).status, worker.producer.async_empty_until) == (1, "leased", 0.0)
    finally:
        worker.pool.stop_async()


def test_the_async_claim_waits_one_round_after_a_thread_claim_that_ran_dry():
    """When the thread claim leased jobs but fewer than it asked for (an idle worker woken for one
    job), the async claim is not sent in the same round: the handler thread starts first, and the
    async claim comes with the next round, AFTER_SHORT_CLAIM later."""
    sync_job = sync_name.enqueue()
    async_job = async_name.enqueue()
    worker = WorkerService(queues=["default"], concurrency=2, reap=False, notify=False, prefetch_wait=0,
                           async_slots=10)
    try:
        assert worker.producer.claim() == AFTER_SHORT_CLAIM
        assert (worker.claimed, row(sync_job.id).status, row(async_job.id).status) == (1, "leased", "ready")
        worker.producer.claim()
        assert (worker.claimed, row(async_job.id).status) == (2, "leased")
    finally:
        worker.pool.stop_async()
