"""The reaper's outage rule must not keep a really dead worker's jobs from being recovered, even
after the database clock was set back having run ahead.

The rule (``store.JOB_REAP``): each sweep records ``last_sweep_at = greatest(previous, now)`` by
the database's real clock; a sweep more than the silence after the previous one records
``resumed_at = now``, and expired leases wait until ``last_sweep_at >= resumed_at + lease``.

Let the database server's clock run ahead, by an hour say (a VM resumed with a wrong clock, a bad
NTP source), and then be set right. The first sweep after the jump forward sees an hour of
"silence" and records ``resumed_at`` an hour ahead, and ``greatest()`` keeps ``last_sweep_at`` an
hour ahead once the clock is right again. Without a guard, ``last_sweep_at >= resumed_at + lease``
would stay false until the real clock caught up with the wrong one, and no expired lease would be
taken back for that hour. (A backward step alone would also stall outage detection for its
length: ``last_sweep_at`` stays ahead, so no silence is ever seen.)

A clock step cannot be made on a shared server, so the tests leave the sweep record as such a
clock leaves it (the row's own two timestamps, an hour ahead), as ``tests/reaper/test_reaper_outage.py``
simulates a silence. The expiry itself is judged by the database clock as usual.

The rule held here: a recorded sweep time more than the silence ahead of the clock means the clock
went back; the sweep then restarts the record from the present clock, and the dead holder's jobs
are recovered one lease later, as after any outage.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection
from qa.tasks import record

from django_leasequeue import reaper, store
from django_leasequeue.conf import build
from django_leasequeue.models import Job, ReaperSweep
from tests.support import claim, job_in, wait_for

SETTINGS = build({"LEASE": 3, "REAPER_INTERVAL": 0.5})


def clock_was_ahead(seconds: float, *, resumed: bool = True) -> None:
    """Leave the sweep record as a database clock ``seconds`` ahead (now set right) left it."""
    with connection.cursor() as cur:
        cur.execute("UPDATE leasequeue_reaper_sweep SET last_sweep_at = clock_timestamp() + make_interval(secs => %s), "
                    "resumed_at = CASE WHEN %s THEN clock_timestamp() + make_interval(secs => %s) END",
                    [seconds, resumed, seconds])


@pytest.mark.django_db
@pytest.mark.parametrize("resumed", [True, False], ids=["jump_noticed_as_silence", "sweeps_only"])
def test_a_dead_holder_is_recovered_within_a_few_leases_after_the_clock_was_set_back(resumed):
    record.enqueue("orphan")
    (held,) = claim(limit=1, lease=3)
    assert reaper.reap_once(settings=SETTINGS) == []  # the sweep record exists
    clock_was_ahead(3600, resumed=resumed)
    later = store.db_now() + timedelta(seconds=60)  # the holder died: its lease ran out long ago
    reaped: list[store.Reaped] = []
    deadline = time.monotonic() + 4 * 3  # four leases, sweeping every 0.5 s
    while not reaped and time.monotonic() < deadline:
        reaped = reaper.reap_once(now=later, settings=SETTINGS)
        time.sleep(0.5)
    # A clock stepped back is not mistaken for a sweeper silence: the dead worker's job is reaped.
    assert [r.id for r in reaped] == [held.id]
    assert Job.objects.get(pk=held.id).status == "ready"


@pytest.mark.django_db
def test_an_outage_is_still_noticed_after_the_clock_was_set_back():
    record.enqueue("returned")
    (held,) = claim(limit=1, lease=3)
    assert reaper.reap_once(settings=SETTINGS) == []
    clock_was_ahead(3600, resumed=False)
    assert reaper.reap_once(settings=SETTINGS) == []  # the first sweep after the step back
    time.sleep(1.5)  # then no reaper reaches the database for longer than the silence (1 s)
    later = store.db_now() + timedelta(seconds=30)
    # Left to its holder for one lease (main: reaped, the silence went unseen while the recorded
    # last sweep was ahead of the clock).
    assert reaper.reap_once(now=later, settings=SETTINGS) == []
    assert Job.objects.get(pk=held.id).status == "leased"
    assert ReaperSweep.objects.get().resumed_at is not None


@pytest.mark.process
def test_a_sigkilled_workers_job_is_run_again_after_the_database_clock_was_set_back(spawn):
    env = {"LEASEQUEUE_LEASE": "2", "LEASEQUEUE_REAPER_INTERVAL": "0.5", "LEASEQUEUE_POLL_INTERVAL": "0.2"}
    job = record.enqueue("victim", sleep=60)
    victim = spawn("runworker", "--concurrency", "1", env=env)
    wait_for(lambda: job_in(job.pk, "leased"), timeout=60, what="the job to be claimed")
    wait_for(lambda: ReaperSweep.objects.exists(), timeout=10, what="a sweep")
    victim.kill()
    clock_was_ahead(3600)
    spawn("runworker", "--concurrency", "1", env=env)
    # One lease for the dead holder, one lease of outage rule, the start of the second worker.
    row = wait_for(lambda: Job.objects.filter(pk=job.pk, attempts=2).first(), timeout=30,
                   what="the dead worker's job to be claimed again (main: never, for an hour)")
    assert row.errors[0]["type"] == "LeaseExpired"
