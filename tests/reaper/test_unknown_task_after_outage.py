"""Rolling deploys after a database outage: a job is dead-lettered as ``UnknownTask`` only after
``UNKNOWN_TASK_GRACE`` with no live worker knowing its task, and an outage must not fake that.

The sweep judges liveness by the process rows' heartbeats (``PROCESS_ALIVE_WITHIN``, 30 s by
default). A database outage longer than that leaves every worker's row stale at once. When the
database is back, the processes reconnect one by one: the first sweep (an old worker's embedded
reaper, or runreaper) can run while only some workers have beaten their row again. If the one that
has not yet is the only one that knows a task, that task's due jobs (a backlog older than the
grace, which an outage readily makes) would look unknown although a worker that knows them is
running. The reaper's outage rule covers this misreading of a silence too.

Played with the store's statements and the sweep record (the registry rows as two workers leave
them across a 60 s outage, the old one's heartbeat back first), as ``tests/worker/test_rolling_deploy.py``
and ``tests/reaper/test_reaper_outage.py`` do: for ``PROCESS_ALIVE_WITHIN`` after the database came
back (the sweep record's ``resumed_at``), no job is dead-lettered as UnknownTask; every live worker
has beaten its row by then.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection

from django_leasequeue import reaper, store
from django_leasequeue.conf import build
from django_leasequeue.models import Job

pytestmark = pytest.mark.django_db

SETTINGS = build({"LEASE": 3, "REAPER_INTERVAL": 0.5, "UNKNOWN_TASK_GRACE": 300, "PROCESS_ALIVE_WITHIN": 30})


def register(process_id: str, at, tasks: list[str]) -> None:
    store.process_register(process_id=process_id, kind="worker", host="h", pid=1, queues=["default"],
                           concurrency=1, tasks=tasks, now=at)


def raw_job(task: str, run_at) -> int:
    new = store.NewJob(task=task, queue="default", priority=0, args_json="[]", kwargs_json="{}", max_attempts=3,
                       run_at=run_at)
    (job,) = store.job_insert([new], notify=False, channel="leasequeue")
    return job.id


def test_no_unknown_task_dead_letter_while_the_workers_beat_again_after_an_outage():
    t0 = store.db_now()
    register("old:1:w", t0, ["qa.record"])
    register("new:1:w", t0, ["qa.new_task", "qa.record"])
    job = raw_job("qa.new_task", t0)
    now = t0 + timedelta(seconds=1000)  # a backlog: due, and both workers registered, for over the grace
    # Both beat until the outage began 60 s ago; the old one has beaten again since it ended.
    assert store.process_heartbeat("old:1:w", now=now - timedelta(seconds=61))
    assert store.process_heartbeat("new:1:w", now=now - timedelta(seconds=61))
    assert reaper.reap_once(settings=SETTINGS) == []  # the sweep record exists
    with connection.cursor() as cur:  # no reaper reached the database for 60 s
        cur.execute("UPDATE leasequeue_reaper_sweep SET last_sweep_at = clock_timestamp() - interval '60 s'")
    assert store.process_heartbeat("old:1:w", now=now)
    reaper.reap_once(settings=SETTINGS)  # the old worker's sweep after the outage: resumed now
    dead = reaper.dead_letter_unknown_tasks(SETTINGS, now=now, by="old:1:w")
    assert [d.id for d in dead] == []
    assert Job.objects.get(pk=job).status == "ready"
    # The new worker beats again: it knows the task, so nothing is dead-lettered then either.
    later = now + timedelta(seconds=1)
    assert store.process_heartbeat("new:1:w", now=later)
    assert reaper.dead_letter_unknown_tasks(SETTINGS, now=later, by="old:1:w") == []
    assert Job.objects.get(pk=job).status == "ready"


def test_without_an_outage_an_unknown_task_is_still_dead_lettered_after_the_grace():
    t0 = store.db_now()
    register("old:1:w", t0, ["qa.record"])
    job = raw_job("qa.new_task", t0)
    now = t0 + timedelta(seconds=1000)
    assert store.process_heartbeat("old:1:w", now=now)
    reaper.reap_once(settings=SETTINGS)
    assert [d.id for d in reaper.dead_letter_unknown_tasks(SETTINGS, now=now, by="old:1:w")] == [job]
