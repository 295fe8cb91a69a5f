"""What a real ``manage.py runscheduler`` prints: at start the schedules it serves, each with its
next occurrence as an aware time in the schedule's own zone; at stop, that it stopped."""

from __future__ import annotations

import re
import signal
from zoneinfo import ZoneInfo

import pytest

from django_leasequeue.models import Job

from ..conftest import wait_for
from .conftest import make_schedule

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]


def test_start_lists_each_schedule_with_its_next_occurrence_in_its_zone_and_stop_says_so(spawn):
    berlin = make_schedule("nightly", cron="0 2 * * *", timezone="Europe/Berlin")
    new_york = make_schedule("monday-report", cron="30 9 * * 1", timezone="America/New_York")
    make_schedule("retired", cron="0 3 * * *", enabled=False)
    for row in (berlin, new_york):
        row.refresh_from_db()
        assert row.next_occurrence_at is not None
    proc = spawn("runscheduler", "--no-sync")
    wait_for(lambda: "nightly:" in proc.output(), what="the start banner")
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    lines = proc.output().splitlines()

    def next_text(row, zone: str) -> str:
        at = row.next_occurrence_at.astimezone(ZoneInfo(zone)).isoformat()
        return re.escape(at) + r" \(in \d+[dhms]( \d+[hms])?\)"

    assert re.fullmatch(rf"scheduler \S+:{proc.pid}:scheduler: 2 enabled schedule\(s\) \(1 disabled\); "
                        r"SIGTERM or Ctrl-C stops\.", lines[0]), lines
    assert re.fullmatch(r"  monday-report: invoices\.tasks\.noop, cron '30 9 \* \* 1' in America/New_York, next "
                        + next_text(new_york, "America/New_York"), lines[1]), lines
    assert re.fullmatch(r"  nightly: invoices\.tasks\.noop, cron '0 2 \* \* \*' in Europe/Berlin, next "
                        + next_text(berlin, "Europe/Berlin"), lines[2]), lines
    # The zone's own offset, not UTC's: 02:00 in Berlin, 09:30 in New York.
    assert "T02:00:00+01:00 " in lines[2] or "T02:00:00+02:00 " in lines[2]
    assert "T09:30:00-05:00 " in lines[1] or "T09:30:00-04:00 " in lines[1]
    stopped = [line for line in lines if " stopped" in line]
    assert len(stopped) == 1 and re.fullmatch(rf"scheduler \S+:{proc.pid}:scheduler stopped: [1-9]\d* tick\(s\), "
                                              r"0 job\(s\) emitted", stopped[0]), lines
    assert Job.objects.count() == 0


def test_with_no_schedule_it_says_how_to_add_one(spawn):
    proc = spawn("runscheduler", "--no-sync")
    wait_for(lambda: "enabled schedule(s)" in proc.output(), what="the start banner")
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    lines = proc.output().splitlines()
    assert len(lines) == 3, lines
    assert lines[0] == f"scheduler {lines[0].split()[1]} 0 enabled schedule(s); SIGTERM or Ctrl-C stops."
    assert lines[1] == "  none: declare LEASEQUEUE_SCHEDULES or add one in the admin (Schedules)"
    assert re.fullmatch(rf"scheduler \S+:{proc.pid}:scheduler stopped: [1-9]\d* tick\(s\), 0 job\(s\) emitted",
                        lines[2]), lines
