"""The workers page and the schedule list and page in a real browser: a real ``runworker`` process
runs a slow job, and the page shows that worker and its job; the schedule list shows times in each
schedule's zone (on a phone), and the schedule page's "Run now" is a normal-size button. Every page's
width at a laptop and a phone is tests/admin/test_browser_widths.py's."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import User
from qa.tasks import record

from django_leasequeue.models import Job, Schedule, WorkerProcess
from tests.admin import browser
from tests.conftest import wait_for

pytestmark = [*browser.MARKS, pytest.mark.process]


def test_workers_page_shows_a_real_workers_current_job(live_server, spawn, monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    User.objects.create_superuser("ops", "ops@example.com", "pw")
    slow = record.using(queue="default").enqueue(tag="slow", sleep=60)
    spawn("runworker", "--queues", "default", "--concurrency", "1", "--worker-id", "browser", "--no-notify",
          env={"LEASEQUEUE_POLL_INTERVAL": "0.2"})
    wait_for(lambda: Job.objects.filter(pk=slow.id, status="leased").exists(), timeout=60, what="slow job leased")
    worker = WorkerProcess.objects.get(kind="worker")
    for page in browser.open_browser(browser.WIDTHS["desktop"]):
        browser.log_in(page, live_server.url)
        page.goto(f"{live_server.url}/admin/django_leasequeue/workerprocess/")
        block = page.locator(f"div.lq-process[data-process='{worker.id}']")
        text = block.inner_text()
        assert "alive" in text and "worker" in text and f"#{slow.id}" in text and "qa.record" in text
        assert "1/3" in text and "lease expired" not in text
        block.locator(f"a:text('#{slow.id}')").click()
        page.wait_for_url(f"**/job/{slow.id}/change/")
        page.go_back()
        page.wait_for_selector(".lq-running")
        browser.shot(page, "workers.png")


def test_schedule_list_shows_each_zone_and_the_page_a_normal_run_now_button(live_server, monkeypatch, settings,
                                                                             transactional_db):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    settings.LEASEQUEUE_SCHEDULES = {}
    User.objects.create_superuser("ops", "ops@example.com", "pw")
    at = datetime(2026, 7, 1, 6, 30, tzinfo=UTC)
    zones = ["Europe/Berlin", "America/Los_Angeles", "Asia/Kolkata", "Australia/Sydney", "UTC", "America/Sao_Paulo"]
    for i, zone in enumerate(zones):
        s = Schedule.objects.create(name=f"nightly invoices run for partners number {i}", task="invoices.tasks.noop",
                                    cron="30 2 * * 1-5", timezone=zone)
        Schedule.objects.filter(pk=s.pk).update(next_occurrence_at=at, last_occurrence_at=at)
    Job.objects.create(task="invoices.tasks.noop", schedule=s, occurrence_at=at, run_at=at, created_at=at,
                       status="done", finished_at=at, started_at=at, attempted_at=at, attempts=1)
    for page in browser.open_browser(browser.WIDTHS["phone"]):
        browser.log_in(page, live_server.url)
        page.goto(f"{live_server.url}/admin/django_leasequeue/schedule/")
        assert "2026-07-01 08:30:00 CEST" in page.inner_text("#result_list")
        browser.shot(page, "schedules-phone.png")
        page.goto(f"{live_server.url}/admin/django_leasequeue/schedule/{s.pk}/change/")
        # A normal-size admin button (bug 15): as tall as the form's own Save button.
        save = page.locator("input[name=_save]").bounding_box()["height"]
        assert page.locator("#lq-run-now").bounding_box()["height"] == save
        browser.shot(page, "schedule-phone.png")
