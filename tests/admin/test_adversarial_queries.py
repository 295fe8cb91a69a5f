"""Every console page costs the same number of statements with 10 or 1,000 rows of each kind
(jobs of several tasks and errors in two queues, dead letters, leases held by workers)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_leasequeue import store

from .factories import ERROR, make_jobs

pytestmark = pytest.mark.django_db

APP = "admin:django_leasequeue"
PAGES = [
    reverse(f"{APP}_job_changelist"), reverse(f"{APP}_job_changelist") + "?error_type=ValueError&args=%7B%7D",
    reverse(f"{APP}_deadletter_changelist"), reverse(f"{APP}_dashboard_changelist"),
    reverse(f"{APP}_queue", args=["mail"]), reverse(f"{APP}_workerprocess_changelist"),
    reverse(f"{APP}_job_bulk", args=["replay"]), reverse(f"{APP}_deadletter_bulk", args=["replay"]),
    reverse(f"{APP}_schedule_changelist"),
]


def fill(n: int) -> None:
    now = store.db_now()
    store.process_register(process_id="h:1:w", kind="worker", host="h", pid=1, queues=["mail"], concurrency=4)
    make_jobs(n, "dead", queue="mail")
    make_jobs(n, "dead", queue="mail", task="invoices.tasks.noop",
              errors=[dict(ERROR, type="KeyError", message="other")])
    make_jobs(n, "ready", queue="default")
    make_jobs(n, "leased", queue="mail", leased_by="h:1:w", leased_until=now + timedelta(seconds=30),
              attempted_at=now - timedelta(seconds=5))


def counts(client) -> dict[str, int]:
    out = {}
    for url in PAGES:
        with CaptureQueriesContext(connection) as ctx:
            assert client.get(url).status_code == 200, url
        out[url] = len(ctx.captured_queries)
    return out


def test_every_page_costs_the_same_statements_for_10_and_1000_rows(admin_client):
    fill(10)
    small = counts(admin_client)
    fill(990)
    large = counts(admin_client)
    assert large == small
