"""Live updates in a real browser: the dashboard's numbers change in place after a poll (no
navigation), Pause stops the polls and Resume starts them again; the dashboard's tables fit a
laptop's and a phone's width (bug 15).

The page's timers run on Playwright's fake clock (``page.clock``), so a poll happens when the test
moves the clock on, never after a real wait; the poll's request itself is real.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User

from django_leasequeue import store
from tests.admin import browser

from .factories import make_job

pytestmark = [*browser.MARKS, pytest.mark.django_db(transaction=True)]

DUE = "#lq-queues [data-live='q:default:ready_due']"


@pytest.fixture
def ops(monkeypatch, settings):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    settings.LEASEQUEUE_SCHEDULES = {}
    return User.objects.create_superuser("ops", "ops@example.com", "pw")


def test_the_dashboards_numbers_change_in_place_and_pause_stops_them(live_server, ops):
    make_job("ready", queue="default")
    polls: list[str] = []

    def count(request):
        if "/dashboard/live/" in request.url:
            polls.append(request.url)

    for page in browser.open_browser(browser.WIDTHS["desktop"]):
        browser.log_in(page, live_server.url)
        page.evaluate("window.localStorage.clear()")
        page.on("request", count)
        page.clock.install()
        page.goto(f"{live_server.url}/admin/django_leasequeue/dashboard/")
        page.evaluate("window.lqMarker = 'same document'")  # gone if the page were reloaded
        toggle = page.locator(".lq-live .lq-live-toggle")
        assert toggle.inner_text() == "Pause updates"
        assert page.inner_text(DUE) == "1"
        assert "live every 5 s · updated " in page.inner_text(".lq-live-status")

        make_job("ready", queue="default")
        page.clock.run_for(5_000)  # the poll's timer fires; its request and answer are real
        page.wait_for_function("(sel) => document.querySelector(sel).textContent === '2'", arg=DUE)
        assert page.evaluate("window.lqMarker") == "same document" and len(polls) == 1
        assert page.inner_text(".lq-live-status").startswith("live every 5 s · updated ")

        toggle.click()
        assert toggle.inner_text() == "Resume updates"
        assert page.evaluate("window.localStorage.getItem('lq-live-paused')") == "1"
        assert page.inner_text(".lq-live-status").startswith("paused · updated ")
        make_job("ready", queue="default")
        page.clock.run_for(60_000)  # twelve intervals: no poll while paused
        assert len(polls) == 1 and page.inner_text(DUE) == "2"

        # Paused holds across a reload (localStorage); Resume polls at once.
        page.reload()
        assert page.locator(".lq-live .lq-live-toggle").inner_text() == "Resume updates"
        page.clock.run_for(60_000)
        assert len(polls) == 1 and page.inner_text(DUE) == "3"  # the reload rendered it
        make_job("ready", queue="default")
        page.locator(".lq-live .lq-live-toggle").click()
        page.wait_for_function("(sel) => document.querySelector(sel).textContent === '4'", arg=DUE)
        assert len(polls) == 2
        assert page.evaluate("window.localStorage.getItem('lq-live-paused')") is None


def test_a_new_queue_asks_for_a_reload_and_a_refused_poll_stops(live_server, ops):
    make_job("ready", queue="default")
    for page in browser.open_browser(browser.WIDTHS["desktop"]):
        browser.log_in(page, live_server.url)
        page.evaluate("window.localStorage.clear()")
        page.clock.install()
        page.goto(f"{live_server.url}/admin/django_leasequeue/dashboard/")
        assert not page.locator(".lq-live-reload").is_visible()
        make_job("ready", queue="mail")  # a row the page does not have
        page.clock.run_for(5_000)
        page.wait_for_selector(".lq-live-reload", state="visible")
        # The operator loses the permission: the next poll is refused and polling stops.
        ops.is_superuser = False
        ops.save()
        page.clock.run_for(5_000)
        page.wait_for_function("document.querySelector('.lq-live-status').textContent.includes('permission denied')")
        assert page.locator(".lq-live .lq-live-toggle").inner_text() == "Resume updates"
        page.clock.run_for(60_000)
        assert "permission denied" in page.inner_text(".lq-live-status")  # no poll after a refusal


def test_a_workflow_steps_status_badge_follows_its_text(live_server, ops):
    from django_leasequeue import chain

    from .test_workflow_admin import complete, step, steps_of

    handle = chain(step.step(1), step.step(), name="live chain").enqueue()
    first, _ = steps_of(handle)
    badge = f"[data-live='j:{first}:status']"
    for page in browser.open_browser(browser.WIDTHS["phone"]):
        browser.log_in(page, live_server.url)
        page.evaluate("window.localStorage.clear()")
        page.clock.install()
        page.goto(f"{live_server.url}/admin/django_leasequeue/workflow/{handle.id}/change/")
        assert page.inner_text(badge) == "ready" and page.inner_text("#lq-progress") == "0/2 done"
        complete(first)
        page.clock.run_for(5_000)
        page.wait_for_function("(sel) => document.querySelector(sel).textContent === 'done'", arg=badge)
        assert page.get_attribute(badge, "class") == "lq-status lq-done"
        assert page.inner_text("#lq-progress") == "1/2 done"


@pytest.mark.parametrize("width", sorted(browser.WIDTHS.values()))
def test_the_dashboards_tables_fit(live_server, ops, width):
    now = store.db_now()
    for queue in ("default", "invoices-and-partner-reports", "orders"):
        make_job("ready", queue=queue, run_at=now - timedelta(minutes=7))
        make_job("dead", queue=queue, finished_at=now - timedelta(minutes=2))
    store.process_register(process_id="worker-host-eu-west-1.internal:12345:invoices-worker", kind="worker",
                           host="worker-host-eu-west-1.internal", pid=12345, queues=["default", "orders"],
                           concurrency=8)
    for page in browser.open_browser(width):
        browser.log_in(page, live_server.url)
        page.goto(f"{live_server.url}/admin/django_leasequeue/dashboard/")
        browser.assert_fits(page, "#lq-queue-table")
        browser.assert_fits(page, "#lq-process-table")
        # What the wrapper scrolls to stays reachable: the state column with its Pause button.
        assert page.locator("#lq-queues tr[data-queue='orders'] button").count() == 1
        assert "health.snapshot()" not in page.inner_text("#content")
        browser.shot(page, f"dashboard-{width}.png")
