"""The operator's walk through the admin in a real browser (headless Chromium driven by Playwright).

A partner's order dies for want of a customer; a flaky sync dies on its only attempt. The operator
logs in, opens Dead letters, reads why the order failed, adds the customer to its arguments and
replays it, replays the sync with the row's Replay button, sees both ready, and a worker
(``runworker --burst``, a real process) runs both to done. Screenshots of the dead-letter page, a
job page and the dashboard go to ``build/screenshots/`` (CI artifacts).

Needs Debian's ``chromium`` (``/usr/bin/chromium``, or ``LEASEQUEUE_CHROMIUM``) and the
``playwright`` Python package; ``scripts/test`` installs both. The test is skipped, saying which is
missing, when either is absent.
"""

from __future__ import annotations

import json
from datetime import timedelta

from django.contrib.auth.models import User
from invoices.tasks import flaky_sync, import_order, noop

from django_leasequeue.models import Job, QueueState, WorkerProcess
from tests.admin import browser
from tests.admin.browser import shot
from tests.conftest import wait_for

pytestmark = browser.MARKS


def run_worker_burst(spawn) -> str:
    """Run ``runworker --burst`` until no due job is left; return its output."""
    worker = spawn("runworker", "--burst", "--concurrency", "2", "--no-notify",
                   env={"LEASEQUEUE_POLL_INTERVAL": "0.2", "LEASEQUEUE_BACKOFF_BASE": "0.1"})
    assert worker.wait(60) == 0, worker.output()
    return worker.output()


def test_find_fix_replay_and_run_a_dead_letter(page, live_server, spawn):
    User.objects.create_superuser("ops", "ops@example.com", "pw")
    # One attempt each: a retry's backoff could outlast ``--burst``, which stops once nothing is due.
    order = import_order.using(max_attempts=1).enqueue(
        payload={"order": 7, "lines": [{"sku": "A-1", "qty": 2}], "note": "Grüße"})
    sync = flaky_sync.using(max_attempts=1).enqueue("browser-sync", failures=1)
    run_worker_burst(spawn)
    order.refresh_from_db()
    sync.refresh_from_db()
    assert (order.status, sync.status) == ("dead", "dead")
    assert order.errors[-1]["type"].endswith("ValueError") and "Traceback" in order.errors[-1]["traceback"]

    # Log in and open Dead letters from the admin index.
    page.goto(f"{live_server.url}/admin/")
    page.fill("#id_username", "ops")
    page.fill("#id_password", "pw")
    page.click("input[type=submit]")
    page.get_by_role("link", name="Dead letters").first.click()
    page.wait_for_selector("#result_list")
    assert "Dead letters by task and error" in page.inner_text("#lq-groups")
    assert "ValueError" in page.inner_text("#result_list") and "ConnectionError" in page.inner_text("#result_list")
    shot(page, "dead-letters.png")

    # Read why the order failed: the job page shows the error with its traceback.
    page.click(f"#result_list a[href$='/deadletter/{order.id}/change/']")
    page.wait_for_selector("#lq-operate")
    assert "has no customer" in page.inner_text(".lq-errors")
    assert "Traceback" in page.inner_text(".lq-errors")
    shot(page, "dead-letter-job.png")

    # Fix the payload and replay.
    page.click("#lq-edit-replay")
    fixed = {"payload": {"order": 7, "lines": [{"sku": "A-1", "qty": 2}], "note": "Grüße", "customer": "ACME"}}
    page.fill("#id_kwargs", json.dumps(fixed, indent=2, ensure_ascii=False))
    page.click("#lq-replay-edited")
    page.wait_for_selector("#lq-operate")
    assert page.inner_text("#lq-operate .lq-status") == "ready"
    assert "Replayed job" in page.inner_text(".messagelist")

    # The flaky sync: the Replay button on its row in the dead-letter list.
    page.get_by_role("link", name="Dead letters").first.click()
    page.click(f"button.lq-replay[data-job='{sync.id}']")
    page.wait_for_selector(".messagelist")
    assert "Replayed job" in page.inner_text(".messagelist")
    page.click(f".messagelist a[href$='/job/{sync.id}/change/']")
    assert page.inner_text("#lq-operate .lq-status") == "ready"

    # A worker runs both to done; the pages say so.
    run_worker_burst(spawn)
    order.refresh_from_db()
    sync.refresh_from_db()
    assert (order.status, order.result) == ("done", {"order": 7, "customer": "ACME"})
    assert sync.status == "done" and sync.attempts == 1 and sync.lease_version == 3
    assert [h["event"] for h in order.history] == ["edited", "replayed"]
    assert Job.objects.filter(status="dead").count() == 0
    page.goto(f"{live_server.url}/admin/django_leasequeue/job/{order.id}/change/")
    assert page.inner_text("#lq-operate .lq-status") == "done"
    shot(page, "job-done.png")

    # The dashboard: the finished jobs, a live worker, and a queue paused with its button.
    noop.using(queue="mail", run_at=timedelta(hours=1)).enqueue()
    noop.using(queue="mail", run_at=timedelta(hours=1)).enqueue()
    spawn("runworker", "--queues", "default", "--concurrency", "1", "--worker-id", "browser",
          env={"LEASEQUEUE_POLL_INTERVAL": "0.5"})
    wait_for(lambda: WorkerProcess.objects.filter(kind="worker").exists(), timeout=30, what="worker registered")
    page.goto(f"{live_server.url}/admin/django_leasequeue/dashboard/")
    page.click("#lq-queues tr[data-queue='mail'] button")
    page.wait_for_selector(".messagelist")
    assert "paused" in page.inner_text("#lq-queues tr[data-queue='mail']")
    assert QueueState.objects.get(name="mail").paused_by == "ops"
    default_row = page.inner_text("#lq-queues tr[data-queue='default']")
    assert "no worker" not in default_row
    assert ":browser" in page.inner_text("#lq-processes") and "alive" in page.inner_text("#lq-processes")
    shot(page, "dashboard.png")
