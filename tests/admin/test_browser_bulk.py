"""The confirmed bulk replay in a real browser (headless Chromium driven by Playwright), and the
job list, Dead letters and a job page fitting a laptop's and a phone's width (bugs 1, 4, 5, 15).

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
from tests.admin.browser import WIDTHS, assert_fits, log_in, shot

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
    for width in WIDTHS.values():
        page.set_viewport_size({"width": width, "height": 1000})
        assert_fits(page, "#lq-sample")
    page.set_viewport_size({"width": 1400, "height": 1000})
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


def test_job_list_dead_letters_and_a_job_page_fit_a_laptop_and_a_phone(live_server, monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # as the page fixture does: Playwright's loop
    User.objects.create_superuser("ops", "ops@example.com", "pw")
    jobs = dead_letters()
    job_id = jobs["value"][0]
    for name, width in WIDTHS.items():
        for page in browser.open_browser(width):
            log_in(page, live_server.url)
            page.goto(f"{live_server.url}/admin/django_leasequeue/job/")
            assert_fits(page, "#result_list")
            shot(page, f"jobs-{name}.png")
            # Bug 4: 50 dead letters with long errors make a page of ordinary height, not 5,000 px.
            page.goto(f"{live_server.url}/admin/django_leasequeue/deadletter/?error_type=ValueError")
            assert page.locator("#result_list tbody tr").count() == 50
            assert_fits(page, "#result_list")
            if width == WIDTHS["desktop"]:
                height = page.evaluate("document.documentElement.scrollHeight")
                assert height < 2500, height
                row = page.evaluate("document.querySelector('#result_list tbody tr').getBoundingClientRect().height")
                assert row < 45, row
            shot(page, f"dead-letters-{name}.png")
            page.goto(f"{live_server.url}/admin/django_leasequeue/job/{job_id}/change/")
            assert_fits(page, "#job_form")
            assert page.locator("h1").count() == 1
            # Bug 15: link-buttons are not underlined.
            decoration = page.evaluate("getComputedStyle(document.querySelector('#lq-edit-replay')).textDecorationLine")
            assert decoration == "none"
            shot(page, f"job-{name}.png")
            # Bug 11: the replay form's labels sit above their fields, flush with them.
            page.goto(f"{live_server.url}/admin/django_leasequeue/job/{job_id}/replay/")
            for field in ("args", "kwargs"):
                label = page.locator(f"label[for=id_{field}]").bounding_box()
                area = page.locator(f"#id_{field}").bounding_box()
                assert abs(label["x"] - area["x"]) <= 2 and label["y"] < area["y"], (field, label, area)
            assert page.get_attribute("#id_args", "rows") == "3" and page.get_attribute("#id_kwargs", "rows") == "3"
            assert_fits(page, "#content-main")
