"""The dashboard's charts and a queue's page in a real browser, at a laptop's and a phone's width:
the SVG chart is drawn and visible with its bars, and neither page nor its main tables overflow the
viewport (``browser.assert_fits``). Saves ``build/screenshots/{dashboard-charts,queue}-<width>.png``."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User

from django_leasequeue import store
from django_leasequeue.models import Schedule
from tests.admin import browser
from tests.monitoring.test_charts import run_jobs

from .factories import ERROR, make_job, make_jobs

pytestmark = browser.MARKS

QUEUE = "invoices"


def seed() -> None:
    User.objects.create_superuser("ops", "ops@example.com", "pw")
    now = store.db_now()
    run_jobs(now - timedelta(minutes=3), done=6, dead=2, queue=QUEUE)
    run_jobs(now, done=4, queue="orders")
    make_jobs(30, "ready", queue=QUEUE, run_at=now - timedelta(minutes=2))
    make_job("leased", queue=QUEUE)
    long = "could not reach the partner's billing endpoint after several retries: " + "x" * 120
    for message in (long, long, "malformed payload: missing 'customer'"):
        make_job("dead", queue=QUEUE, task="invoices.tasks.a_rather_long_module_path.send_invoice_reminder",
                 errors=[dict(ERROR, message=message)])
    store.process_register(process_id="worker-host-with-a-long-name.example.com:4242:w", kind="worker",
                           host="worker-host-with-a-long-name.example.com", pid=4242, queues=[QUEUE, "orders"],
                           concurrency=8)
    Schedule.objects.create(name="nightly invoice reminders for every partner", task="invoices.tasks.noop",
                            cron="30 2 * * *", timezone="Europe/Berlin", queue=QUEUE)


def chart_is_drawn(page) -> None:
    chart = page.locator("#lq-throughput svg.lq-chart")
    assert chart.is_visible()
    box = chart.bounding_box()
    assert box["width"] > 200 and box["height"] > 50
    assert page.locator("#lq-throughput svg .lq-bar").count() == 60
    assert page.locator("#lq-throughput svg rect.lq-seg").count() >= 1


@pytest.mark.parametrize("width", sorted(browser.WIDTHS.values()))
def test_the_dashboard_charts_and_the_queue_page_fit(live_server, width, monkeypatch, transactional_db):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    seed()
    for page in browser.open_browser(width):
        browser.log_in(page, live_server.url)
        page.goto(f"{live_server.url}/admin/django_leasequeue/dashboard/")
        chart_is_drawn(page)
        browser.assert_fits(page, "#lq-latency table")
        assert "invoices" in page.inner_text("#lq-latency table")
        browser.shot(page, f"dashboard-charts-{width}.png")

        page.click(f"a.lq-queue-link:text('{QUEUE}')")
        page.wait_for_selector("#lq-depth-table")
        chart_is_drawn(page)
        browser.assert_fits(page, "#lq-depth-table")
        for table in ("#lq-top-errors table", "#lq-queue-workers table", "#lq-queue-schedules table"):
            browser.assert_fits(page, table)
        assert page.inner_text("[data-live='ready_due']") == "30"
        assert "2" in page.inner_text("#lq-top-errors table")
        browser.shot(page, f"queue-{width}.png")

        page.click("a:text('last 30 days')")
        page.wait_for_selector("#lq-throughput svg")
        assert page.locator("#lq-throughput svg .lq-bar").count() == 30
        browser.assert_fits(page, "#lq-depth-table")


def test_the_chart_takes_the_admin_colours_of_the_dark_theme(live_server, monkeypatch, transactional_db):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    seed()
    fill = "(sel) => getComputedStyle(document.querySelector(sel)).fill"
    colours = {}
    for scheme in ("light", "dark"):
        for page in browser.open_browser(browser.WIDTHS["desktop"]):
            page.emulate_media(color_scheme=scheme)
            browser.log_in(page, live_server.url)
            page.goto(f"{live_server.url}/admin/django_leasequeue/dashboard/queue/{QUEUE}/")
            page.wait_for_selector("#lq-throughput svg rect.lq-done")
            colours[scheme] = (page.evaluate(fill, "#lq-throughput rect.lq-done"),
                               page.evaluate("(sel) => getComputedStyle(document.querySelector(sel)).color",
                                             "#lq-throughput svg text"))
            if scheme == "dark":
                browser.shot(page, "queue-dark.png")
    # Done bars: admin's --primary (#79aec8) in the light theme, the package's lighter blue (#5fa3c7)
    # in the dark one, where --primary (#264b5d) is too close to the background; the text follows
    # --body-fg (#333 light, #eeeeee dark).
    assert colours["light"] == ("rgb(121, 174, 200)", "rgb(51, 51, 51)")
    assert colours["dark"] == ("rgb(95, 163, 199)", "rgb(238, 238, 238)")
