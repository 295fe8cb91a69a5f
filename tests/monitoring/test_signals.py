"""Every lifecycle event is a signal and a structured log record with job id, task, queue, attempt
and token, and the token matches the attempt it is about."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from invoices.tasks import flaky_sync, poison

from django_leasequeue import enqueue, enqueue_many, reaper, signals, store
from django_leasequeue.models import Job

from .helpers import claim, run_jobs

pytestmark = pytest.mark.django_db

FIELDS = ("job_id", "task", "queue", "attempt", "token")


@pytest.fixture
def events():
    """Capture every lifecycle signal as (event, kwargs)."""
    seen: list[tuple[str, dict]] = []

    def receiver(sender, event, **kwargs):
        seen.append((event, kwargs))

    for signal in signals.SIGNALS.values():
        signal.connect(receiver, dispatch_uid="monitoring-test")
    yield seen
    for signal in signals.SIGNALS.values():
        signal.disconnect(dispatch_uid="monitoring-test")


def of(events, job_id):
    return [(name, tuple(kw[f] for f in FIELDS)) for name, kw in events if kw.get("job_id") == job_id]


def test_success_after_a_retry(events, db_clock):
    job = flaky_sync.enqueue("sig", failures=1)
    assert run_jobs(claim()) == ["ready"]
    db_clock.advance(60)  # past the retry's backoff
    assert run_jobs(claim()) == ["done"]
    t = (flaky_sync.name, "default")
    assert of(events, job.id) == [
        ("enqueued", (job.id, *t, 0, 0)),
        ("claimed", (job.id, *t, 1, 1)),
        ("retried", (job.id, *t, 1, 1)),
        ("claimed", (job.id, *t, 2, 2)),
        ("succeeded", (job.id, *t, 2, 2)),
    ]
    retried = next(kw for name, kw in events if name == "retried")
    assert retried["error"] == "builtins.ConnectionError" and retried["run_at"] is not None


def test_dead_letter_and_unknown_task(events):
    job = poison.using(max_attempts=1).enqueue({"x": 1})
    unknown = Job.objects.get(id=enqueue(flaky_sync, ["u"]).id)
    Job.objects.filter(id=unknown.id).update(task="no.such.task")
    assert sorted(run_jobs(claim())) == ["dead", "dead"]
    assert of(events, job.id)[1:] == [
        ("claimed", (job.id, poison.name, "default", 1, 1)),
        ("dead_lettered", (job.id, poison.name, "default", 1, 1)),
    ]
    # The claim of a job whose task is unknown is an event too, then its dead letter.
    assert [name for name, _ in of(events, unknown.id)] == ["enqueued", "claimed", "dead_lettered"]
    dead = [kw for name, kw in events if name == "dead_lettered" and kw["job_id"] == unknown.id][0]
    assert dead["error"] == "django_leasequeue.exceptions.UnknownTask"


def test_lease_expired_then_lease_lost_carry_the_expired_attempts_token(events, db_clock):
    job = flaky_sync.enqueue("lost", failures=0)
    (stale,) = claim(lease=5)
    db_clock.advance(10)
    assert [r.id for r in reaper.reap_once()] == [job.id]
    run_jobs([stale])  # the stale worker completes: refused
    t = (flaky_sync.name, "default")
    assert of(events, job.id) == [
        ("enqueued", (job.id, *t, 0, 0)),
        ("lease_expired", (job.id, *t, 1, 1)),
        ("claimed", (job.id, *t, 1, 1)),
        ("lease_lost", (job.id, *t, 1, 1)),
    ]
    lost = next(kw for name, kw in events if name == "lease_lost")
    assert (lost["write"], lost["timed_out"]) == ("complete", False)
    expired = next(kw for name, kw in events if name == "lease_expired")
    assert expired["status"] == "ready"


def test_lease_expired_on_the_last_attempt_is_also_a_dead_letter(events):
    job = poison.using(max_attempts=1).enqueue({})
    now = store.db_now()
    assert [c.id for c in claim(lease=5, now=now)] == [job.id]
    reaper.reap_once(now=now + timedelta(seconds=6))
    assert of(events, job.id)[1:] == [
        ("lease_expired", (job.id, poison.name, "default", 1, 1)),
        ("dead_lettered", (job.id, poison.name, "default", 1, 1)),
    ]


def test_enqueue_many_emits_one_enqueued_per_job(events):
    assert enqueue_many(flaky_sync, [["a"], ["b"], ["c"]]) == 3
    assert [(name, kw["attempt"], kw["token"]) for name, kw in events] == [("enqueued", 0, 0)] * 3
    assert len({kw["job_id"] for _, kw in events}) == 3


def test_structured_log_records_carry_the_fields(caplog, db_clock):
    caplog.set_level(logging.DEBUG, logger="django_leasequeue.events")
    job = poison.using(max_attempts=2).enqueue({})
    run_jobs(claim())
    db_clock.advance(60)
    run_jobs(claim())
    records = [r for r in caplog.records if r.name == "django_leasequeue.events" and r.job_id == job.id]
    assert [(r.event, r.levelname, r.attempt, r.token) for r in records] == [
        ("enqueued", "DEBUG", 0, 0),
        ("claimed", "DEBUG", 1, 1),
        ("retried", "INFO", 1, 1),
        ("claimed", "DEBUG", 2, 2),
        ("dead_lettered", "WARNING", 2, 2),
    ]
    assert all((r.task, r.queue) == (poison.name, "default") for r in records)
    # The plain log line says which task died and why, not only the job id.
    assert records[-1].getMessage() == (f"job {job.id} dead_lettered ({poison.name}, attempt 2): builtins.ValueError: "
                                        "malformed payload: missing 'customer' in []")
    assert records[2].getMessage().startswith(f"job {job.id} retried ({poison.name}, attempt 1): builtins.ValueError: ")
    assert "; next attempt at " in records[2].getMessage()


def test_signals_module_lists_every_event_named_in_the_issue():
    assert {"enqueued", "claimed", "succeeded", "retried", "dead_lettered", "lease_lost",
            "lease_expired"} <= set(signals.SIGNALS)


def test_store_is_unchanged_by_a_stale_note(now):
    job = flaky_sync.enqueue("n")
    assert store.job_note_lease_lost(job.id, 7, worker="w", write="renew", timed_out=True, now=now)
    job.refresh_from_db()
    assert (job.status, job.lease_version, job.attempts) == ("ready", 0, 0)
    assert job.history == [{"event": "lease_lost", "token": 7, "worker": "w", "write": "renew", "timed_out": True,
                            "at": job.history[0]["at"]}]
