"""Timed-out attempts and interrupted attempts at the store and executor level: the refund bound of
interrupted attempts, prefetched jobs released freely, a late return of a timed-out handler,
fenced_atomic() refused after the timeout, the settings."""

from datetime import timedelta

import pytest
from qa.models import Effect

from django_leasequeue import enqueue, store, task
from django_leasequeue.conf import build, get_settings
from django_leasequeue.context import JobContext
from django_leasequeue.exceptions import ConfigurationError, JobTimedOut
from django_leasequeue.executor import Executor
from django_leasequeue.models import Job
from tests.support import claim, context_for

pytestmark = pytest.mark.django_db

TIMED_OUT = "django_leasequeue.exceptions.JobTimedOut"


def test_interrupted_attempts_are_refunded_max_interruptions_times_then_dead_lettered():
    """MAX_INTERRUPTIONS=2: the first two interrupted releases give the attempt back, the third
    dead-letters the job as Interrupted with its attempt counted."""
    job = enqueue("qa.record", ["forever"])
    seen = []
    for _ in range(3):
        (claimed,) = claim()
        released = store.job_release([(claimed.id, claimed.lease_version)], interrupted=True, max_interruptions=2)
        assert released == {job.id}
        row = Job.objects.get(pk=job.id)
        seen.append((row.status, row.attempts, row.interruptions, released.dead))
    assert seen == [("ready", 0, 1, set()), ("ready", 0, 2, set()), ("dead", 1, 3, {job.id})]
    row = Job.objects.get(pk=job.id)
    (error,) = row.errors
    assert (error["type"], error["attempt"]) == ("Interrupted", 1)
    assert error["message"].startswith("interrupted 3 times (worker shutdown); MAX_INTERRUPTIONS is 2")
    assert row.finished_at is not None and row.lease_version == 6  # three claims, three releases
    assert [h["interrupted"] for h in row.history if h["event"] == "released"] == [True, True, True]
    # A replay starts the count again.
    assert store.job_replay([job.id]).replayed == [job.id]
    row.refresh_from_db()
    assert (row.status, row.attempts, row.interruptions) == ("ready", 0, 0)


def test_max_interruptions_of_0_dead_letters_at_the_first_interruption():
    """The settings reference says so: 0 refunds no interrupted attempt."""
    assert build({"MAX_INTERRUPTIONS": 0}).max_interruptions == 0
    job = enqueue("qa.record", ["once"])
    (claimed,) = claim()
    released = store.job_release([(claimed.id, claimed.lease_version)], interrupted=True, max_interruptions=0)
    assert released.dead == {job.id}
    row = Job.objects.get(pk=job.id)
    assert (row.status, row.attempts, row.interruptions) == ("dead", 1, 1)
    assert row.errors[0]["type"] == "Interrupted"


def test_prefetched_jobs_that_never_ran_are_released_freely():
    job = enqueue("qa.record", ["prefetched"])
    for _ in range(8):
        (claimed,) = claim()
        assert store.job_release([(claimed.id, claimed.lease_version)], reason="prefetched job not started in time",
                                 max_interruptions=0) == {job.id}
    row = Job.objects.get(pk=job.id)
    assert (row.status, row.attempts, row.interruptions, row.errors) == ("ready", 0, 0, [])


def test_a_cancel_request_wins_over_the_interruption_bound():
    job = enqueue("qa.record", ["x"])
    (claimed,) = claim()
    store.job_request_cancel([job.id])
    assert store.job_release([(claimed.id, claimed.lease_version)], interrupted=True, max_interruptions=0) == {job.id}
    row = Job.objects.get(pk=job.id)
    assert (row.status, row.errors) == ("cancelled", [])


@task(name="tests.timeouts.late", takes_context=True, max_attempts=2, timeout=1, backoff=0.05)
def late(context: JobContext, fenced: bool = False) -> str:
    # What the heartbeat does at the timeout while the handler still runs.
    assert context.time_out()
    if fenced:
        with context.fenced_atomic():
            Effect.objects.create(key="late", job_id=context.job_id, lease_version=context.lease_version)
    return "late result"


def run(claimed: store.ClaimedJob) -> tuple[str, list[object]]:
    completions: list[object] = []
    executor = Executor(worker_id="t", settings=get_settings(), alias=store.db_alias(),
                        complete=lambda c, r: completions.append(r))
    return executor.run(claimed, context_for(claimed)), completions


def test_a_timed_out_handler_that_returns_late_fails_as_timed_out_and_its_result_is_discarded():
    job = enqueue("tests.timeouts.late")
    (claimed,) = claim()
    assert run(claimed) == ("ready", [])  # retried after backoff; nothing sent to the completer
    row = Job.objects.get(pk=job.id)
    assert (row.status, row.attempts, row.result) == ("ready", 1, None)
    (error,) = row.errors
    assert error["type"] == TIMED_OUT
    assert "ran past the task's timeout of 1 s" in error["message"]
    assert "returned; its return value was discarded" in error["message"]
    assert row.run_at > store.db_now() - timedelta(seconds=1)


def test_fenced_atomic_inside_a_timed_out_handler_is_refused_and_commits_nothing():
    job = enqueue("tests.timeouts.late", kwargs={"fenced": True})
    (claimed,) = claim()
    assert run(claimed) == ("ready", [])
    row = Job.objects.get(pk=job.id)
    assert [e["type"] for e in row.errors] == [TIMED_OUT]
    assert "fenced_atomic() refused to commit" in row.errors[0]["message"]
    assert Effect.objects.filter(job_id=job.id).count() == 0


def test_the_timeout_cannot_fire_once_the_handler_returned():
    job = enqueue("qa.record", ["x"])
    (claimed,) = claim()
    ctx = context_for(claimed)
    assert ctx.handler_returned() is False
    assert ctx.time_out() is False and ctx.timed_out is False
    with pytest.raises(JobTimedOut):
        timed = context_for(claimed)
        timed.time_out()
        with timed.fenced_atomic():
            pass
    assert Job.objects.get(pk=job.id).status == "leased"


def test_note_timed_out_is_fenced_on_the_token():
    job = enqueue("qa.record", ["x"])
    (claimed,) = claim()
    assert store.job_note_timed_out(job.id, claimed.lease_version + 1, worker="w", timeout=1) is False
    assert store.job_note_timed_out(job.id, claimed.lease_version, worker="w", timeout=1.5) is True
    (note,) = Job.objects.get(pk=job.id).history
    assert {k: note[k] for k in ("event", "token", "attempt", "worker", "timeout")} == {
        "event": "timed_out", "token": claimed.lease_version, "attempt": 1, "worker": "w", "timeout": 1.5}


@pytest.mark.parametrize(("raw", "message"), [
    ({"EXECUTION": "fork"}, "LEASEQUEUE['EXECUTION'] must be one of 'thread', 'process', got 'fork'"),
    ({"STUCK_HANDLERS_MAX": 0}, "LEASEQUEUE['STUCK_HANDLERS_MAX'] must be None"),
    ({"STUCK_HANDLERS_MAX": True}, "LEASEQUEUE['STUCK_HANDLERS_MAX'] must be None"),
    ({"STUCK_EXIT_AFTER": 0}, "LEASEQUEUE['STUCK_EXIT_AFTER'] must be None (never) or a finite number"),
    ({"STUCK_EXIT_AFTER": float("inf")}, "LEASEQUEUE['STUCK_EXIT_AFTER'] must be None (never) or a finite"),
    ({"MAX_INTERRUPTIONS": -1}, "LEASEQUEUE['MAX_INTERRUPTIONS'] must be an int from 0 to 1000000, got -1"),
    ({"MAX_INTERRUPTIONS": 2.5}, "LEASEQUEUE['MAX_INTERRUPTIONS'] must be an int from 0 to 1000000, got 2.5"),
])
def test_timeout_settings_are_validated(raw, message):
    with pytest.raises(ConfigurationError) as raised:
        build(raw)
    assert message in str(raised.value)


def test_timeout_settings_defaults():
    settings = build({"STUCK_EXIT_AFTER": timedelta(minutes=2)})
    assert (settings.execution, settings.stuck_handlers_max, settings.stuck_exit_after, settings.max_interruptions) \
        == ("thread", None, 120.0, 5)
    assert build({"STUCK_EXIT_AFTER": None, "EXECUTION": "process"}).stuck_exit_after is None


@pytest.mark.parametrize(("ids", "why", "outcome"), [
    ([9], "1 handler stuck past its timeout (STUCK_HANDLERS_MAX: 1)", "(job 9 fails as JobTimedOut and is retried)"),
    ([9, 10], "2 handlers stuck past their timeout (STUCK_HANDLERS_MAX: 2)",
     "(jobs 9, 10 fail as JobTimedOut and are retried)"),
])
def test_the_stuck_handler_exit_line_says_job_or_jobs(monkeypatch, caplog, ids, why, outcome):
    """One stuck job was logged as "jobs 9 fail as JobTimedOut"."""
    from types import SimpleNamespace

    from django_leasequeue.worker import EXIT_STUCK, WorkerService

    worker = WorkerService(concurrency=len(ids), burst=True, notify=False, reap=False)
    stuck = [SimpleNamespace(job=SimpleNamespace(id=i), deadline=0.0, timed_out=True, is_async=False) for i in ids]
    monkeypatch.setattr(worker, "stuck", lambda: stuck)
    with caplog.at_level("ERROR", logger="django_leasequeue"):
        assert worker.check_stuck(now=1.0)
    assert worker.exit_code == EXIT_STUCK
    (line,) = [r.getMessage() for r in caplog.records if "stopping gracefully" in r.getMessage()]
    assert why in line and line.endswith(outcome), line
