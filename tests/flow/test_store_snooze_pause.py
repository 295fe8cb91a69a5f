"""Snooze bookkeeping, pause/resume and the flow metrics (store level)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from flowlab.tasks import customer_job, rated_noop

from django_leasequeue import store
from django_leasequeue.conf import RateLimit
from django_leasequeue.enqueueing import build_job
from django_leasequeue.models import Job, QueueState

pytestmark = pytest.mark.django_db


def new_job(**kw) -> Job:
    (job,) = store.job_insert([build_job(rated_noop, [0], queue="flow", **kw)], notify=False, channel="unused")
    return job


def claim(n: int = 1, now=None, queues=("flow",)):
    return store.job_claim(queues=list(queues), limit=n, worker_id="t", lease=30, now=now, rate_limits={})


def test_snooze_gives_the_attempt_back_and_counts_snoozes():
    job = new_job(max_attempts=2)
    t0 = store.db_now()
    for n in range(1, 4):
        (c,) = claim(now=t0)
        assert c.attempts == 1  # every run after a snooze is attempt 1 again
        assert store.job_snooze(c.id, c.lease_version, 30, max_snoozes=10, now=t0) == "ready"
        job.refresh_from_db()
        assert (job.status, job.attempts, job.snoozes, job.errors) == ("ready", 0, n, [])
        assert job.run_at == t0 + timedelta(seconds=30)
        assert claim(now=t0 + timedelta(seconds=29)) == []  # not due before the delay
        t0 += timedelta(seconds=30)
    # Snoozes never exhaust max_attempts=2: a real failure still gets its 2 attempts.
    (c,) = claim(now=t0)
    assert store.job_fail(c.id, c.lease_version, {"type": "E"}, retry_delay=0, now=t0)[0] == "ready"


def test_snooze_cap_dead_letters_a_runaway_job():
    job = new_job()
    t0 = store.db_now()
    for _ in range(3):
        (c,) = claim(now=t0)
        assert store.job_snooze(c.id, c.lease_version, 0, max_snoozes=3, now=t0) == "ready"
    (c,) = claim(now=t0)
    assert store.job_snooze(c.id, c.lease_version, 0, max_snoozes=3, now=t0) == "dead"
    job.refresh_from_db()
    assert (job.status, job.attempts, job.snoozes) == ("dead", 1, 4)
    assert job.errors[-1]["type"] == "SnoozeLimitExceeded"


def test_pause_and_resume():
    new_job()
    assert store.queue_pause("flow", by="ops") is True
    assert store.queue_pause("flow") is False
    assert claim() == []
    state = QueueState.objects.get(name="flow")
    assert state.paused and state.paused_by == "ops" and state.paused_at is not None
    assert store.queue_paused_names() == ["flow"]
    assert store.queue_resume("flow") is True
    assert store.queue_resume("flow") is False
    assert len(claim()) == 1
    assert store.queue_paused_names() == []


def test_pause_leaves_leased_jobs_alone():
    new_job()
    (c,) = claim()
    store.queue_pause("flow")
    assert store.job_complete([(c.id, c.lease_version, None)]) == {c.id}


def test_management_command(capsys):
    new_job()
    call_command("leasequeue_queue", "pause", "flow", "other", "--by", "ops")
    assert claim(queues=("flow", "other")) == []
    call_command("leasequeue_queue", "list")
    out = capsys.readouterr().out
    assert "flow: paused" in out and "other: paused" in out
    line = next(x for x in out.splitlines() if x.startswith("flow "))
    assert "paused" in line and "by ops" in line and " 1 " in line  # one ready job
    call_command("leasequeue_queue", "resume", "flow")
    assert "flow: resumed" in capsys.readouterr().out
    assert len(claim(queues=("flow",))) == 1


def test_management_command_refuses_unknown_queue(settings):
    from django.core.management.base import CommandError

    settings.LEASEQUEUE = {"QUEUES": {"flow": {}}}
    with pytest.raises(CommandError, match="unknown queue"):
        call_command("leasequeue_queue", "pause", "flw")
    with pytest.raises(CommandError, match="needs at least one queue"):
        call_command("leasequeue_queue", "resume")


def test_flow_metrics():
    store.job_insert([build_job(customer_job, [], {"customer": c, "seq": i}) for c in "ab" for i in range(4)],
                     notify=False, channel="unused")
    new_job()
    assert len(claim(10)) == 5  # 2 of a, 2 of b, the keyless one
    store.job_insert([build_job(rated_noop, [i], queue="rated") for i in range(3)], notify=False, channel="unused")
    store.job_claim(queues=["rated"], limit=5, worker_id="t", lease=30, rate_limits={"rated": RateLimit(1, 60)})
    store.queue_pause("paused-q")
    metrics = store.flow_metrics()
    assert metrics.waiting_on_key == {"flow": 4}
    assert metrics.throttled_claims == {"rated": 1}
    assert metrics.paused_queues == ["paused-q"]
    keys = store.flow_keys_waiting()
    assert sorted((k.key, k.limit, k.waiting, k.leased) for k in keys) == [
        ("customer-a", 2, 2, 2), ("customer-b", 2, 2, 2)]
    assert Job.objects.filter(status="ready", attempts=0, concurrency_key__isnull=False).count() == 4
