"""Database outages of any length cause 0 re-runs of jobs whose handler had already returned, with
``runreaper --once`` run from cron beside the workers.

A one-off sweep has no cadence to measure a silence by, so it judges by the clock alone
(docs/explanation/leases.md). Right after an outage, the workers' periodic sweeps leave expired
leases to their holders for one lease (their returned jobs wait for the completer's next flush);
a cron ``runreaper --once`` must not take those leases back, or the holders' completions would be
refused and every such job would run again.

A one-off sweep never declares an outage itself, but honours one that a periodic sweep recorded
(the sweep record's ``resumed_at``); with no periodic sweeper (workers run with ``--no-reaper`` and
only cron sweeps), it judges by the clock alone.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from qa.tasks import record

from django_leasequeue import reaper, store
from django_leasequeue.conf import build
from django_leasequeue.models import Job
from tests.support import claim

pytestmark = pytest.mark.django_db

SETTINGS = build({"LEASE": 3, "REAPER_INTERVAL": 0.5})


def test_a_one_off_sweep_honours_the_window_a_periodic_sweep_recorded_after_an_outage():
    record.enqueue("returned")
    (held,) = claim(limit=1, lease=3)
    assert reaper.reap_once(settings=SETTINGS) == []
    with connection.cursor() as cur:  # no reaper reached the database for a minute: an outage
        cur.execute("UPDATE leasequeue_reaper_sweep SET last_sweep_at = clock_timestamp() - interval '60 s'")
    later = store.db_now() + timedelta(seconds=30)  # the lease ran out during the outage
    assert reaper.reap_once(now=later, settings=SETTINGS) == []  # a worker's sweep: left to its holder
    # cron's runreaper --once, a moment later (main: the lease is taken back, the job runs again)
    assert reaper.reap_once(now=later, settings=SETTINGS, once=True) == []
    assert Job.objects.get(pk=held.id).status == "leased"
    # The holder writes its completion: the token decides, not the clock.
    assert store.job_complete([(held.id, held.lease_version, None)]) == {held.id}


def test_with_no_periodic_sweeper_a_one_off_sweep_judges_by_the_clock():
    record.enqueue("orphan")
    (held,) = claim(limit=1, lease=3)
    assert reaper.reap_once(settings=SETTINGS, once=True) == []
    with connection.cursor() as cur:  # the previous cron run, an hour ago
        cur.execute("UPDATE leasequeue_reaper_sweep SET last_sweep_at = clock_timestamp() - interval '1 hour'")
    later = store.db_now() + timedelta(seconds=30)
    assert [r.id for r in reaper.reap_once(now=later, settings=SETTINGS, once=True)] == [held.id]
