"""Store functions behind the admin: replay (C32) and retry-now, on the real database."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections
from invoices.tasks import poison

from django_leasequeue import store
from django_leasequeue.models import Job

from .factories import make_job

pytestmark = pytest.mark.django_db

C32_KWARGS = {"opts": {}, "tags": [], "name": "ü", "n": 0}


def kill(job_id: int, now) -> None:
    """Drive a job to dead through real claims and failures (max_attempts of poison is 3)."""
    for attempt in range(1, 4):
        (claimed,) = store.job_claim(queues=["default"], limit=1, worker_id="t", lease=30, now=now)
        assert claimed.id == job_id
        error = {"attempt": attempt, "type": "ValueError", "message": "bad", "traceback": "tb", "worker": "t"}
        store.job_fail(job_id, claimed.lease_version, error, retry_delay=0.0, now=now)


def test_c32_replay_keeps_args_resets_attempts_and_runs_once():
    job = poison.enqueue(payload=C32_KWARGS)
    now = store.db_now()
    kill(job.id, now)
    job.refresh_from_db()
    assert (job.status, job.attempts, job.lease_version, len(job.errors)) == ("dead", 3, 3, 3)

    later = now + timedelta(seconds=10)
    result = store.job_replay([job.id], by="alice", now=later)
    assert result == store.ReplayResult([job.id], {})
    job.refresh_from_db()
    assert job.status == "ready" and job.run_at == later and job.attempts == 0
    assert job.lease_version == 4  # moved forward, never reset
    assert job.kwargs == {"payload": C32_KWARGS} and job.args == []
    assert len(job.errors) == 3 and job.finished_at is None
    assert job.history[-1]["event"] == "replayed" and job.history[-1]["by"] == "alice"
    assert job.history[-1]["from_status"] == "dead" and job.history[-1]["token"] == 4

    # A second replay finds it ready: no second runnable copy, nothing changes.
    again = store.job_replay([job.id], by="bob", now=later)
    assert again.replayed == [] and "job is ready" in again.refused[job.id]
    assert Job.objects.filter(task=poison.name).count() == 1

    # The old token (3) is refused; the next claim gets 5 and its completion is accepted.
    assert store.job_complete([(job.id, 3, None)], now=later) == set()
    (claimed,) = store.job_claim(queues=["default"], limit=5, worker_id="t", lease=30, now=later)
    assert (claimed.id, claimed.lease_version, claimed.attempts) == (job.id, 5, 1)
    assert claimed.kwargs == {"payload": C32_KWARGS}
    assert store.job_complete([(job.id, 5, '"ok"')], now=later) == {job.id}
    job.refresh_from_db()
    assert job.status == "done"


def test_replay_with_edited_args_records_old_and_new():
    job = make_job("dead", args=[1], kwargs={"payload": {"x": 1}})
    new_kwargs = {"payload": {"customer": "ü"}}
    result = store.job_replay([job.id], by="alice", kwargs=new_kwargs)
    assert result.replayed == [job.id]
    job.refresh_from_db()
    assert job.args == [1] and job.kwargs == new_kwargs
    edited, replayed = job.history[-2:]
    assert edited["event"] == "edited" and edited["by"] == "alice"
    assert edited["old"] == {"args": [1], "kwargs": {"payload": {"x": 1}}}
    assert edited["new"] == {"args": [1], "kwargs": new_kwargs}
    assert replayed["event"] == "replayed"


def test_replay_with_unchanged_args_records_no_edit():
    job = make_job("cancelled", args=[1], kwargs={})
    store.job_replay([job.id], by="a", args=[1], kwargs={})
    job.refresh_from_db()
    assert [h["event"] for h in job.history] == ["replayed"]
    assert job.history[0]["from_status"] == "cancelled"


def test_replay_refuses_other_states_and_unknown_ids():
    ready, leased, done = make_job("ready"), make_job("leased"), make_job("done")
    dead = make_job("dead")
    result = store.job_replay([ready.id, leased.id, done.id, dead.id, 10**12])
    assert result.replayed == [dead.id]
    assert set(result.refused) == {ready.id, leased.id, done.id, 10**12}
    assert result.refused[10**12] == "no such job"
    assert "job is leased" in result.refused[leased.id]
    leased.refresh_from_db()
    assert (leased.status, leased.lease_version) == ("leased", 1)


def test_replay_respects_active_unique_keys():
    holder = make_job("ready", unique_key="k1", unique_scope="active")
    blocked = make_job("dead", unique_key="k1", unique_scope="active")
    older = make_job("dead", unique_key="k2", unique_scope="active")
    newer = make_job("dead", unique_key="k2", unique_scope="active")
    retained = make_job("dead", unique_key="k3", unique_scope="retained")
    result = store.job_replay([blocked.id, older.id, newer.id, retained.id], by="a")
    assert result.replayed == [newer.id, retained.id]
    assert result.refused[blocked.id] == f"unique key 'k1' is held by job #{holder.id}, which is ready or leased"
    assert f"shared with job #{newer.id}" in result.refused[older.id]
    assert Job.objects.get(id=blocked.id).status == "dead"


def test_replay_many_in_one_statement(django_assert_num_queries):
    ids = [make_job("dead").id for _ in range(5)]
    with django_assert_num_queries(3):  # savepoint, the statement, release
        result = store.job_replay(ids, by="a")
    assert result.replayed == ids


def test_retry_now_only_touches_backoff_waits():
    now = store.db_now()
    backoff = make_job("ready", attempts=1, run_at=now + timedelta(hours=1))
    delayed = make_job("ready", attempts=0, run_at=now + timedelta(hours=1))
    due = make_job("ready", attempts=1, run_at=now - timedelta(seconds=1))
    dead = make_job("dead")
    assert store.job_retry_now([backoff.id, delayed.id, due.id, dead.id], by="ops", now=now) == 1
    backoff.refresh_from_db()
    assert backoff.run_at == now
    assert backoff.history[-1]["event"] == "retry_now" and backoff.history[-1]["by"] == "ops"
    delayed.refresh_from_db()
    assert delayed.run_at == now + timedelta(hours=1)


@pytest.mark.django_db(transaction=True)
def test_c32_concurrent_double_replay_replays_once():
    job = make_job("dead")
    barrier = threading.Barrier(2)
    results = []

    def replay() -> None:
        try:
            barrier.wait()
            results.append(store.job_replay([job.id], by=threading.current_thread().name))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=replay, name=f"op{i}") for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(len(r.replayed) for r in results) == [0, 1]
    job.refresh_from_db()
    assert job.status == "ready" and job.lease_version == 4
    assert [h["event"] for h in job.history] == ["replayed"]
    assert connection.vendor == "postgresql"
