"""Retries through the real executor: attempts, backoff measured on the database clock, dead letters.

The backoff delay of each failed attempt is read back from the row as ``run_at - errors[i].at``:
both come from the same statement clock, so the difference is exactly the delay the executor asked
for, whatever the worker's own clock says.
"""

from datetime import timedelta

import pytest
from qa.models import Execution

from django_leasequeue import Backoff, enqueue, task
from django_leasequeue.models import Job
from tests.support import claim, error_time, run_claimed

pytestmark = pytest.mark.django_db


@task(name="tests.always_fails", max_attempts=4, backoff=Backoff(base=1, factor=2, max=3, jitter=0))
def always_fails(n: int) -> None:
    raise ConnectionError(f"down ({n})")


@task(name="tests.fails_default_backoff", max_attempts=3)
def fails_default_backoff() -> None:
    raise RuntimeError("boom")


def run_until_finished(job: Job, db_clock) -> list[str]:
    """Claim and run ``job`` until it is done or dead, moving the database clock to each run_at."""
    outcomes = []
    for _ in range(10):
        job.refresh_from_db()
        if job.status in ("done", "dead"):
            return outcomes
        (claimed,) = claim()
        outcomes.append(run_claimed(claimed))
        job.refresh_from_db()
        if job.status == "ready":
            db_clock.advance((job.run_at - error_time(job.errors[-1])).total_seconds())
    raise AssertionError("job did not finish")


def test_backoff_delays_from_database_time_and_dead_letter_at_max_attempts(db_clock):
    job = always_fails.enqueue(7)
    outcomes = run_until_finished(job, db_clock)
    assert outcomes == ["ready", "ready", "ready", "dead"]
    job.refresh_from_db()
    assert (job.status, job.attempts, job.lease_version) == ("dead", 4, 4)
    assert [e["attempt"] for e in job.errors] == [1, 2, 3, 4]
    assert {e["type"] for e in job.errors} == {"builtins.ConnectionError"}
    assert job.errors[0]["message"] == "down (7)" and "ConnectionError: down (7)" in job.errors[0]["traceback"]
    assert job.errors[0]["worker"] == "test:0:t"
    # Delays 1, 2, then capped at 3 s: each is run_at (set by the retry) minus the error's time.
    # Reconstruct them from the error times, since run_at is overwritten by each retry.
    times = [error_time(e) for e in job.errors]
    gaps = [(b - a).total_seconds() for a, b in zip(times, times[1:], strict=False)]
    # Each later attempt ran right after the clock reached its run_at (a few ms of real time).
    assert [round(g) for g in gaps] == [1, 2, 3]
    assert all(0 <= g - round(g) < 0.5 for g in gaps)
    assert job.finished_at == times[-1]


def test_each_retry_run_at_is_exactly_now_plus_delay(db_clock):
    job = always_fails.enqueue(1)
    delays = []
    for _ in range(3):
        (claimed,) = claim()
        assert run_claimed(claimed) == "ready"
        job.refresh_from_db()
        delays.append(job.run_at - error_time(job.errors[-1]))
        db_clock.advance(delays[-1].total_seconds())
    assert delays == [timedelta(seconds=1), timedelta(seconds=2), timedelta(seconds=3)]
    assert claim(limit=1)  # due again once the database clock reaches run_at


def test_default_backoff_from_settings_has_bounded_jitter(db_clock):
    # testproject: BACKOFF_BASE 1 s, jitter 0.5 -> attempt n waits in [0.5, 1] * 2 ** (n - 1).
    job = fails_default_backoff.enqueue()
    for n in (1, 2):
        (claimed,) = claim()
        assert run_claimed(claimed) == "ready"
        job.refresh_from_db()
        delay = (job.run_at - error_time(job.errors[-1])).total_seconds()
        assert 0.5 * 2 ** (n - 1) <= delay <= 2 ** (n - 1)
        assert claim(limit=1) == []  # not due before the backoff has passed
        db_clock.advance(delay)
    (claimed,) = claim()
    assert run_claimed(claimed) == "dead"


def test_flaky_job_succeeds_on_third_attempt(db_clock):
    job = enqueue("qa.flaky", kwargs={"failures": 2})
    assert run_until_finished(job, db_clock) == ["ready", "ready", "done"]
    job.refresh_from_db()
    assert (job.status, job.attempts, job.result, len(job.errors)) == ("done", 3, 3, 2)
    assert Execution.objects.filter(job_id=job.id).count() == 3


def test_max_attempts_one_runs_exactly_once(db_clock):
    """Case C02 (second part): max_attempts=1 and a ValueError: one execution, then dead."""
    job = enqueue("qa.fail_once")
    assert run_until_finished(job, db_clock) == ["dead"]
    job.refresh_from_db()
    assert (job.status, job.attempts, job.errors[0]["type"]) == ("dead", 1, "builtins.ValueError")
    assert Execution.objects.filter(job_id=job.id).count() == 1
