"""A schedule's page: its last occurrences (job, state, attempts, run time, wait) merged with the
skipped and coalesced ones, the next run in its zone and as a relative time; the schedule list's
times in each schedule's own zone."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.urls import reverse

from django_leasequeue import store
from django_leasequeue.admin.schedule_history import HISTORY_SHOWN, schedule_history
from django_leasequeue.models import Schedule
from tests.admin.factories import make_job

pytestmark = pytest.mark.django_db

NOOP = "invoices.tasks.noop"
BERLIN = ZoneInfo("Europe/Berlin")


@pytest.fixture(autouse=True)
def _no_settings_schedules(settings):
    settings.LEASEQUEUE_SCHEDULES = {}


def schedule(**fields) -> Schedule:
    return Schedule.objects.create(name="nightly", task=NOOP, cron="*/5 * * * *", timezone="Europe/Berlin", **fields)


def page(client, s: Schedule) -> str:
    return client.get(reverse("admin:django_leasequeue_schedule_change", args=[s.pk])).content.decode()


def history_rows(html: str) -> list[list[str]]:
    table = re.search(r"<table class='lq-table lq-schedule-history'>(.*?)</table>", html, re.S).group(1)
    return [[re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr class='lq-occurrence[^']*'>(.*?)</tr>", table, re.S)]


def test_occurrences_newest_first_with_state_attempts_run_time_and_wait(admin_client, frozen_now):
    s = schedule()
    now = frozen_now.at
    t1, t2, t3 = (now - timedelta(minutes=m) for m in (15, 10, 5))
    done = make_job("done", schedule=s, occurrence_at=t1, run_at=t1, started_at=t1 + timedelta(seconds=3),
                    attempted_at=t1 + timedelta(seconds=3), finished_at=t1 + timedelta(seconds=45), attempts=1)
    dead = make_job("dead", schedule=s, occurrence_at=t2, run_at=t2, started_at=t2 + timedelta(seconds=1),
                    attempted_at=t2 + timedelta(minutes=2), finished_at=t2 + timedelta(minutes=2, seconds=7))
    waiting = make_job("ready", schedule=s, occurrence_at=t3, run_at=t3)
    make_job("done", schedule=s)  # a "run now" job: not an occurrence
    rows = history_rows(page(admin_client, s))
    local = [t.astimezone(BERLIN).strftime("%Y-%m-%d %H:%M:%S %Z") for t in (t3, t2, t1)]
    assert rows == [
        [local[0], f"#{waiting.id}", "ready", "0/3", "—", "5 min", ""],
        [local[1], f"#{dead.id}", "dead", "3/3", "7 s", "1 s", ""],
        [local[2], f"#{done.id}", "done", "1/3", "42 s", "3 s", ""],
    ]


def test_skipped_and_coalesced_occurrences_from_the_paused_log(admin_client):
    now = store.db_now().replace(microsecond=0)
    t1, t2, t3 = (now - timedelta(minutes=m) for m in (15, 10, 5))
    s = schedule()
    cancelled = make_job("cancelled", schedule=s, occurrence_at=t2, run_at=t2, attempts=0)
    kept = make_job("ready", schedule=s, occurrence_at=t3, run_at=t3)
    Schedule.objects.filter(pk=s.pk).update(paused_log=[
        {"occurrence": t1.isoformat(), "action": "skipped", "queue": "default", "job": None, "kept": None,
         "at": t1.isoformat()},
        {"occurrence": t2.isoformat(), "action": "coalesced", "queue": "default", "job": cancelled.id,
         "kept": t3.isoformat(), "at": t3.isoformat()},
    ], skipped_occurrences=4)
    html = page(admin_client, s)
    rows = history_rows(html)
    assert [r[:3] for r in rows] == [[t3.astimezone(BERLIN).strftime("%Y-%m-%d %H:%M:%S %Z"), f"#{kept.id}", "ready"],
                                     [t2.astimezone(BERLIN).strftime("%Y-%m-%d %H:%M:%S %Z"), f"#{cancelled.id}",
                                      "coalesced"],
                                     [t1.astimezone(BERLIN).strftime("%Y-%m-%d %H:%M:%S %Z"), "—", "skipped"]]
    kept_local = t3.astimezone(BERLIN).strftime("%Y-%m-%d %H:%M:%S %Z")
    assert rows[1][6] == f"queue default paused: coalesced into {kept_local}"
    assert rows[2][6] == "queue default paused: skipped"
    assert "Catch-up skipped 4 missed occurrences in all" in html


def test_at_most_HISTORY_SHOWN_occurrences_in_one_statement(django_assert_num_queries):
    s = schedule()
    now = store.db_now()
    for i in range(HISTORY_SHOWN + 5):
        make_job("done", schedule=s, occurrence_at=now - timedelta(minutes=5 * i))
    s.refresh_from_db()
    with django_assert_num_queries(1):
        rows = schedule_history(s, now)
    assert len(rows) == HISTORY_SHOWN
    assert rows[0].at == now and rows[-1].at == now - timedelta(minutes=5 * (HISTORY_SHOWN - 1))


def test_next_run_in_the_zone_and_relative_by_the_database_clock(admin_client, frozen_now):
    s = schedule()
    next_at = frozen_now.at + timedelta(minutes=4, seconds=0.3)
    Schedule.objects.filter(pk=s.pk).update(next_occurrence_at=next_at)
    local = next_at.astimezone(BERLIN).strftime("%Y-%m-%d %H:%M:%S %Z")
    assert f'{local} <span class="lq-meta">(in 4 min)</span>' in page(admin_client, s)
    frozen_now.advance(600.6)
    assert f'{local} <span class="lq-meta">(6 min ago)</span>' in page(admin_client, s)


def test_run_now_is_a_normal_admin_submit_button(admin_client):
    html = page(admin_client, schedule())
    assert '<input type="submit" class="default" id="lq-run-now" value="Run now">' in html


def test_schedule_list_shows_next_and_last_run_in_each_schedules_zone(admin_client):
    at = datetime(2026, 7, 1, 6, 30, tzinfo=UTC)
    Schedule.objects.create(name="berlin", task=NOOP, cron="30 8 * * *", timezone="Europe/Berlin",
                            next_occurrence_at=at, last_occurrence_at=at - timedelta(days=1))
    Schedule.objects.filter(name="berlin").update(next_occurrence_at=at, last_occurrence_at=at - timedelta(days=1))
    Schedule.objects.create(name="tokyo", task=NOOP, cron="30 15 * * *", timezone="Asia/Tokyo")
    Schedule.objects.filter(name="tokyo").update(next_occurrence_at=at)
    html = admin_client.get(reverse("admin:django_leasequeue_schedule_changelist")).content.decode()
    # The date and the time wrap as two unbreakable parts in a narrow column (bug 1).
    cell = '<td class="field-{}"><span class="lq-nowrap">{}</span> <span class="lq-nowrap">{}</span></td>'
    assert cell.format("next_run", "2026-07-01", "08:30:00 CEST") in html
    assert cell.format("last_run", "2026-06-30", "08:30:00 CEST") in html
    assert cell.format("next_run", "2026-07-01", "15:30:00 JST") in html
    assert "06:30:00" not in html and "column-zone" not in html
    assert '<div class="lq-scroll lq-schedule-list">' in html
