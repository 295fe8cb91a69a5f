"""One bad row harms only itself: a fencing token at the bound of its CHECK constraint.

Migration 0004 bounds ``lease_version`` to ``0 .. 2**62`` so that no token can overflow, and keeps a
ready row's ``attempts`` one below its bound "so that the claim's attempts + 1 can never be refused
(which would fail the claim for every row of the batch)". Every claim, reap and release writes
``lease_version + 1``, so a row written by hand (the poison-row fault class) with the largest
token the constraint accepts must not break the statements that touch it:

* ready with ``lease_version = 2**62``: the claim steps over it and claims the others (a claim
  refused by the constraint would fail every claim of that queue, and a ``--burst`` worker would
  never drain the innocent jobs);
* ready with ``2**62 - 1``: claimed (token ``2**62``); its reap or its release on a graceful stop
  does not fail the other rows of the same statement;
* leased with ``2**62`` and an expired lease: the sweep goes on and recovers the other expired
  leases.

Rows whose token could not take a claim and a reap stay as they are, for an operator to read; the
reaper and the release never push a token past the bound: a row there is dead-lettered instead of
going back to ready.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from qa.tasks import record

from django_leasequeue import reaper, store
from django_leasequeue.conf import build
from django_leasequeue.models import Job
from tests.support import claim, job_in, run_claimed, wait_for

BOUND = 4611686018427387904  # 2**62, leasequeue_job_lease_version_range
SETTINGS = build({"LEASE": 3, "REAPER_INTERVAL": 0.5})


def _poison(job_id: int, assignment: str) -> None:
    with connection.cursor() as cur:
        cur.execute(f"UPDATE leasequeue_job SET {assignment} WHERE id = %s", [job_id])


@pytest.mark.django_db
@pytest.mark.parametrize("token", [BOUND, BOUND - 1], ids=["at_bound", "one_below"])
def test_a_ready_row_at_the_token_bound_fails_no_claim(token):
    innocent = [record.using(max_attempts=1).enqueue(f"innocent-{i}") for i in range(3)]
    poison = record.using(max_attempts=1, priority=10).enqueue("poison")  # first in claim order
    _poison(poison.pk, f"lease_version = {token}")  # accepted by the CHECK constraint
    claimed = claim(limit=10, lease=3)
    assert sorted(c.id for c in claimed) == sorted(j.pk for j in innocent)
    assert [run_claimed(c) for c in claimed] == ["done"] * 3
    row = Job.objects.get(pk=poison.pk)
    assert row.lease_version <= BOUND and row.status != "leased"


@pytest.mark.django_db
def test_a_leased_row_at_the_token_bound_does_not_stop_the_reaper():
    for i in range(3):
        record.enqueue(f"orphan-{i}")
    held = claim(limit=10, lease=3)
    assert len(held) == 3
    _poison(held[0].id, f"lease_version = {BOUND}")  # a hand-written lease, expired below
    assert reaper.reap_once(settings=SETTINGS) == []  # records the sweep; nothing expired yet
    later = store.db_now() + timedelta(seconds=60)
    reaped = reaper.reap_once(now=later, settings=SETTINGS)
    assert sorted(r.id for r in reaped) == sorted(j.id for j in held)
    rows = {j.pk: j for j in Job.objects.all()}
    assert rows[held[0].id].status == "dead" and rows[held[0].id].lease_version == BOUND
    assert [rows[j.id].status for j in held[1:]] == ["ready", "ready"]
    assert all(rows[j.id].lease_version == j.lease_version + 1 for j in held[1:])


@pytest.mark.django_db
def test_a_leased_row_at_the_token_bound_does_not_fail_the_release_of_the_others():
    for i in range(3):
        record.enqueue(f"held-{i}")
    held = claim(limit=10, lease=30)
    _poison(held[0].id, f"lease_version = {BOUND}")
    leases = [(held[0].id, BOUND), *((j.id, j.lease_version) for j in held[1:])]
    released = store.job_release(leases, interrupted=True)
    assert released == {j.id for j in held}
    rows = {j.pk: j for j in Job.objects.all()}
    assert rows[held[0].id].status == "dead" and rows[held[0].id].lease_version == BOUND
    assert [rows[j.id].status for j in held[1:]] == ["ready", "ready"]


@pytest.mark.process
def test_a_burst_worker_drains_the_innocent_jobs_beside_a_row_at_the_token_bound(spawn):
    innocent = [record.enqueue(f"innocent-{i}") for i in range(5)]
    poison = record.using(priority=10).enqueue("poison")
    _poison(poison.pk, f"lease_version = {BOUND}")
    worker = spawn("runworker", "--burst", "--concurrency", "2",
                   env={"LEASEQUEUE_LEASE": "3", "LEASEQUEUE_REAPER_INTERVAL": "0.5"})
    for job in innocent:
        wait_for(lambda job=job: job_in(job.pk, "done"), timeout=30, what=f"innocent job {job.pk}")
    assert worker.wait(30) == 0, worker.output()
    assert Job.objects.get(pk=poison.pk).status != "leased"
