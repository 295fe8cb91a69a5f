"""The confirmed bulk replay in a real browser (headless Chromium driven by Playwright), bug 5.
The pages' widths (and the layout checks of bugs 4, 11 and 15) are tests/admin/test_browser_widths.py's.

An error group of 121 dead jobs (one of them with a unique key that a ready job holds) is opened
from the Dead letters' "by task and error" block; the operator ticks the page, takes "Select all
121", chooses Replay, reads the confirmation (120 to replay, 1 skipped and why, a sample of 10),
confirms, and reads the exact counts; the admin log holds one summary entry.
"""

from __future__ import annotations

from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User

from django_leasequeue.models import Job
from tests.admin import browser
from tests.admin.browser import log_in, shot

from .factories import ERROR, make_job, make_jobs

pytestmark = browser.MARKS

LONG = ("upstream refused the invoice: customer record 'ACME-0042' has no billing address on file; "
        "the partner API answered 422 Unprocessable Entity with body {\"field\": \"address\", \"code\": \"missing\"}")


def dead_letters() -> dict[str, list[int]]:
    value_errors = make_jobs(50, "dead", task="invoices.tasks.poison",
                             errors=[dict(ERROR, type="builtins.ValueError", message=LONG)])
    key_errors = make_jobs(120, "dead", task="invoices.tasks.import_order",
                           errors=[dict(ERROR, type="builtins.KeyError", message="'customer'")])
    make_job("ready", task="invoices.tasks.import_order", unique_key="order-9", unique_scope="active")
    held = make_job("dead", task="invoices.tasks.import_order", unique_key="order-9", unique_scope="active",
                    errors=[dict(ERROR, type="builtins.KeyError", message="'customer'")])
    return {"value": value_errors, "key": key_errors, "held": [held.id]}


def test_replay_an_error_group_with_select_all_and_a_confirmation(page, live_server):
    User.objects.create_superuser("ops", "ops@example.com", "pw")
    jobs = dead_letters()
    log_in(page, live_server.url)
    page.goto(f"{live_server.url}/admin/django_leasequeue/deadletter/")
    group = page.locator("#lq-groups tr.lq-group", has_text="KeyError")
    assert group.locator("td.lq-num").inner_text() == "121"
    group.locator("a.lq-group-link").click()
    page.wait_for_selector("#result_list")
    assert page.locator("#result_list tbody tr").count() == 100  # one page of the group
    page.click("#action-toggle")
    page.click(".actions .question a")  # "Select all 121 dead letters"
    page.select_option("select[name=action]", "replay_selected")
    page.click("button[name=index]")
    page.wait_for_selector("#lq-confirm-summary")
    summary = page.inner_text("#lq-confirm-summary")
    assert "Of the 121 selected jobs, 120 will be replayed" in summary and "1 will be skipped" in summary
    assert "its unique key is held by another ready or leased job" in page.inner_text("#lq-skip-reasons")
    assert page.locator("#lq-sample tbody tr").count() == 10
    assert "KeyError" in page.inner_text("#lq-sample")
    assert Job.objects.filter(pk__in=jobs["key"], status="dead").count() == 120  # nothing written yet
    shot(page, "bulk-confirm.png")
    page.click("#lq-confirm")
    page.wait_for_selector(".messagelist")
    messages = page.inner_text(".messagelist")
    assert "Replayed 120 jobs: they are ready and due now." in messages
    assert f"Not replayed: 1 × its unique key is held by another ready or leased job (#{jobs['held'][0]})" in messages
    assert Job.objects.filter(pk__in=jobs["key"], status="ready").count() == 120
    assert Job.objects.filter(pk__in=jobs["value"] + jobs["held"], status="dead").count() == 51
    (entry,) = LogEntry.objects.all()
    assert entry.change_message == ("Replayed 120 jobs (skipped 1: 1 × its unique key is held by another ready or "
                                    "leased job)")

