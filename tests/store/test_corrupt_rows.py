"""One bad row harms only itself: claimed rows are decoded one at a time, and the database refuses
the values a claim computes with.

A 5,000-digit integer in one claimed row's args dead-letters that row with a ``CorruptRow`` error;
the other rows of the batch are returned and run to ``done`` (a claim that raised after it had
committed would leave the whole batch leased, none run). A row with ``lease_seconds = 1e300``
would make every claim fail ("interval out of range"), so the database refuses such a row
(migration 0004's CHECK constraints), and so for the other values a claim computes with
(attempts, token, times, errors).

The robustness of the claim against ``lease_seconds = 1e300`` is shown by the database refusing the
row (the constraint makes it impossible), not by dropping the constraint: with it dropped the claim
statement would still fail ("interval out of range"). The decoder is tested through real claims of
rows poisoned with raw SQL, and directly (``store._decode_claims``) for the fence.
"""

from __future__ import annotations

import importlib
from datetime import UTC, datetime

import pytest
from django.db import IntegrityError, connection, transaction
from qa.tasks import record

from django_leasequeue.models import Job
from tests.support import claim, run_claimed

BIG_INT = "9" * 5000


def _poison(job_id: int, assignment: str) -> None:
    with connection.cursor() as cur:
        cur.execute(f"UPDATE leasequeue_job SET {assignment} WHERE id = %s", [job_id])


@pytest.mark.django_db
@pytest.mark.parametrize("assignment", [
    f"args = '[{BIG_INT}]'",
    f"kwargs = '{{\"n\": {BIG_INT}}}'",
    "args = '{\"not\": \"a list\"}'",
    "kwargs = '[1, 2]'",
], ids=["args_5000_digits", "kwargs_5000_digits", "args_object", "kwargs_array"])
def test_a_corrupt_row_in_a_claimed_batch_is_dead_lettered_and_the_rest_runs(assignment):
    innocent = [record.using(max_attempts=1).enqueue(f"innocent-{i}") for i in range(3)]
    corrupt = record.using(max_attempts=1, priority=10).enqueue("corrupt")  # first in claim order
    _poison(corrupt.pk, assignment)
    claimed = claim(limit=10, worker_id="h:1:w")
    assert sorted(c.id for c in claimed) == sorted(j.pk for j in innocent)
    row = Job.objects.get(pk=corrupt.pk)
    assert (row.status, row.attempts, row.lease_version, row.leased_until) == ("dead", 1, 1, None)
    (error,) = row.errors
    assert (error["type"], error["attempt"], error["worker"]) == ("CorruptRow", 1, "h:1:w")
    assert error["message"].startswith("job row cannot be decoded: ")
    assert [run_claimed(c) for c in claimed] == ["done"] * 3
    assert sorted(Job.objects.values_list("status", flat=True)) == ["dead", "done", "done", "done"]


@pytest.mark.django_db
def test_a_corrupt_row_is_dead_lettered_on_its_new_token_only():
    from django_leasequeue import store

    job = record.enqueue("corrupt")
    _poison(job.pk, f"args = '[{BIG_INT}]', status = 'leased', lease_version = 7")  # claimed again since
    # A claim result for the same row with the older token 1 (the columns the claim statements return).
    stale = {"id": job.pk, "task": "qa.record", "queue": "default", "args": f"[{BIG_INT}]", "kwargs": "{}",
             "attempts": 1, "max_attempts": 3, "lease_version": 1, "leased_until_us": 0, "lease_seconds": 30.0,
             "claimed_at_us": 0, "priority": 0, "created_at_us": 0, "started_at_us": None, "error_count": 0,
             "run_at_us": 0, "trace_context": None}
    decoded = store._decode_claims([tuple(stale.values())], tuple(stale), store.db_alias(), worker_id="w", now=None)
    assert decoded == []
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.lease_version, row.errors) == ("leased", 7, [])  # the fence refused it


@pytest.mark.django_db
@pytest.mark.parametrize("assignment", [
    "lease_seconds = 1e300", "lease_seconds = 'NaN'", "lease_seconds = -1", "attempts = 2147483647",
    "max_attempts = 0", "snoozes = 2147483647", "lease_version = 9223372036854775807", "attempts = 2000000",
    "concurrency_limit = 0", "run_at = '-infinity'", "run_at = 'infinity'", "created_at = '10000-01-01'",
    "leased_until = '9999-12-31 12:00+00'", "errors = '{}'", "history = 'null'",
])
def test_the_database_refuses_a_value_a_claim_cannot_compute_with(assignment):
    # A CHECK constraint refuses the value: with lease_seconds = 1e300 stored, every claim would fail
    # ("interval out of range") and no job would run.
    job = record.enqueue("x")
    with pytest.raises(IntegrityError, match="violates check constraint \"leasequeue_job_"):
        with transaction.atomic():
            _poison(job.pk, assignment)
    assert [c.id for c in claim()] == [job.pk]


@pytest.mark.django_db
def test_the_migration_repairs_existing_bad_rows_before_validating():
    """Rows written before migration 0004 that violate a constraint are repaired in place (see the
    migration's docstring), then the constraint validates. Simulated inside the test's transaction:
    the constraints are dropped, bad rows written, the migration's repair and VALIDATE steps run."""
    migration = importlib.import_module("django_leasequeue.migrations.0004_check_constraints")
    jobs = [record.enqueue(f"old-{i}") for i in range(4)]
    with connection.cursor() as cur:
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")  # ALTER TABLE refuses pending deferred FK checks
        for name in migration.CONSTRAINTS:
            cur.execute(f"ALTER TABLE leasequeue_job DROP CONSTRAINT {name}")
        _poison(jobs[0].pk, "lease_seconds = 1e300, attempts = 2147483647")
        _poison(jobs[1].pk, "run_at = '-infinity', errors = '{\"a\": 1}'")
        _poison(jobs[2].pk, "max_attempts = 0")
        for name, (check, _) in migration.CONSTRAINTS.items():
            cur.execute(f"ALTER TABLE leasequeue_job ADD CONSTRAINT {name} CHECK ({check}) NOT VALID")
        cur.execute(migration.repair_sql())
        for name in migration.CONSTRAINTS:
            cur.execute(f"ALTER TABLE leasequeue_job VALIDATE CONSTRAINT {name}")
    rows = {j.pk: Job.objects.get(pk=j.pk) for j in jobs}
    first, second, third, untouched = (rows[j.pk] for j in jobs)
    assert (first.lease_seconds, first.attempts) == (None, 1_999_999)  # ready: a claim can still add 1
    ((note,),) = [first.history]
    assert (note["event"], note["constraints"]) == ("repaired", ["leasequeue_job_lease_seconds_range",
                                                                 "leasequeue_job_attempts_range"])
    assert [h["constraints"] for h in second.history] == [["leasequeue_job_times_range",
                                                           "leasequeue_job_errors_array"]]
    assert second.run_at == datetime(1, 1, 2, tzinfo=UTC) and second.errors == [{"a": 1}]
    assert third.max_attempts == 1
    assert untouched.history == [] and untouched.errors == []
    assert sorted(c.id for c in claim(limit=10)) == sorted(j.pk for j in jobs)  # every claim works again




@pytest.mark.django_db(transaction=True)
def test_a_worker_runs_the_innocent_jobs_of_a_batch_with_a_corrupt_row():
    """The issue's case through a real in-process worker: 3 innocent ``max_attempts=1`` jobs and a
    corrupt one claimed in one batch. Before: 0 of 4 ran and all stayed leased. After: 3 done, the
    corrupt one dead with CorruptRow."""
    from django_leasequeue.runtime import run_services
    from django_leasequeue.signals import job_dead_lettered
    from django_leasequeue.worker import WorkerService

    innocent = [record.using(max_attempts=1).enqueue(f"innocent-{i}") for i in range(3)]
    corrupt = record.using(max_attempts=1).enqueue("corrupt")
    _poison(corrupt.pk, f"args = '[{BIG_INT}]'")
    events: list[dict[str, object]] = []
    job_dead_lettered.connect(lambda sender, **kw: events.append(kw), dispatch_uid="corrupt-row-test", weak=False)
    try:
        worker = WorkerService(concurrency=4, burst=True, poll_interval=0.05, notify=False, reap=False)
        assert run_services([worker], install_signals=False) == 0
    finally:
        job_dead_lettered.disconnect(dispatch_uid="corrupt-row-test")
    # The dead letter is reported like any other (signal, log, metrics built on it).
    assert [(e["job_id"], e["task"], e["error"]) for e in events] == [(corrupt.pk, "qa.record", "CorruptRow")]
    assert {j.pk: Job.objects.get(pk=j.pk).status for j in innocent} == {j.pk: "done" for j in innocent}
    row = Job.objects.get(pk=corrupt.pk)
    assert (row.status, [e["type"] for e in row.errors]) == ("dead", ["CorruptRow"])
