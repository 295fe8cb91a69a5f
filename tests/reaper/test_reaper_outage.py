"""The reaper after an outage that hit every process: expired leases are left to their holders for
one lease period after the database came back, judged in the database (the sweep record), while a
worker that died with the database up is still recovered at the first sweep after its lease.

A silence is simulated by moving the recorded last sweep back by the real clock, as if no reaper
had reached the database for a minute; expiry itself is judged by the database clock (``now=``).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from qa.tasks import record

from django_leasequeue import enqueue, reaper, store
from django_leasequeue.conf import build
from django_leasequeue.models import Job, ReaperSweep
from tests.support import claim

pytestmark = pytest.mark.django_db

SETTINGS = build({"LEASE": 3, "REAPER_INTERVAL": 0.5})  # an outage: no sweep for over 1 s


def silence(seconds: float) -> None:
    """Pretend that no reaper swept for ``seconds`` (real clock)."""
    with connection.cursor() as cur:
        cur.execute("UPDATE leasequeue_reaper_sweep SET last_sweep_at = clock_timestamp() - make_interval(secs => %s)",
                    [seconds])


def resumed_ago(seconds: float) -> None:
    """Pretend the database came back ``seconds`` ago, with sweeps since (real clock)."""
    with connection.cursor() as cur:
        cur.execute("UPDATE leasequeue_reaper_sweep SET resumed_at = clock_timestamp() - make_interval(secs => %s), "
                    "last_sweep_at = clock_timestamp()", [seconds])


def leases() -> list[store.ClaimedJob]:
    enqueue("qa.record", ["a"])
    record.using(lease=10).enqueue("b")
    return claim(limit=2, lease=3)


def test_a_dead_holder_is_reaped_at_the_first_sweep_after_its_lease_when_the_database_was_up():
    held = leases()
    assert reaper.reap_once(settings=SETTINGS) == []  # records the sweep; nothing expired yet
    later = store.db_now() + timedelta(seconds=30)
    reaped = reaper.reap_once(now=later, settings=SETTINGS)
    assert sorted(r.id for r in reaped) == sorted(j.id for j in held)
    assert ReaperSweep.objects.get().resumed_at is None


def test_after_a_silence_of_every_reaper_expired_leases_wait_one_lease_for_their_holders():
    held = {j.id: j for j in leases()}
    three, ten = sorted(held, key=lambda i: held[i].lease_seconds or 0)  # lease 3 (worker default), lease 10
    assert reaper.reap_once(settings=SETTINGS) == []
    silence(60)
    later = store.db_now() + timedelta(seconds=30)  # both leases ran out during the "outage"
    assert reaper.reap_once(now=later, settings=SETTINGS) == []
    sweep = ReaperSweep.objects.get()
    assert sweep.resumed_at is not None and sweep.resumed_at == sweep.last_sweep_at
    # The holders renew or complete meanwhile: the token decides, not the clock.
    assert set(store.job_renew([(three, held[three].lease_version, 3)])) == {three}
    resumed_ago(3.5)  # one lease (3 s) has passed for the first job, not the second's 10 s
    much_later = store.db_now() + timedelta(seconds=60)
    reaped = reaper.reap_once(now=much_later, settings=SETTINGS)
    assert [r.id for r in reaped] == [three]  # its renewed lease ran out too, by the given clock
    assert Job.objects.get(pk=ten).status == "leased"
    resumed_ago(10.5)
    assert [r.id for r in reaper.reap_once(now=much_later, settings=SETTINGS)] == [ten]


def test_a_one_off_sweep_judges_by_the_clock_alone():
    held = leases()
    assert reaper.reap_once(settings=SETTINGS) == []
    silence(3600)  # e.g. runreaper --once from cron, an hour after the last sweep
    later = store.db_now() + timedelta(seconds=30)
    assert sorted(r.id for r in reaper.reap_once(now=later, settings=SETTINGS, once=True)) == sorted(
        j.id for j in held)
