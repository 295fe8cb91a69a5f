"""Fixtures of the Django tasks backend tests: an in-process worker and a movable worker clock."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection
from django.db.backends.signals import connection_created

from django_leasequeue.runtime import run_services
from django_leasequeue.worker import WorkerService


def drain(concurrency: int = 1) -> WorkerService:
    """Run an in-process burst worker until no due job is left; return it (for its counters)."""
    worker = WorkerService(concurrency=concurrency, burst=True, poll_interval=0.05, notify=False, reap=False)
    assert run_services([worker], install_signals=False) == 0
    return worker


@pytest.fixture
def worker_clock(db_clock) -> Iterator[object]:
    """Move the database clock of this test's connection *and* of every connection opened later
    (the worker's threads): ``worker_clock.advance(seconds)``."""

    def set_offset(sender, connection, **kwargs):
        with connection.cursor() as cur:
            cur.execute("SELECT set_config('leasequeue.clock_offset', %s, false)", [f"{db_clock.offset} seconds"])

    connection_created.connect(set_offset, dispatch_uid="lq-test-worker-clock")
    try:
        yield db_clock
    finally:
        connection_created.disconnect(dispatch_uid="lq-test-worker-clock")
        assert connection is not None


# Tables the in-process worker tests write. Emptied after each test instead of pytest-django's
# full flush (which re-creates content types and permissions and costs about a second a test).
_TABLES = ("leasequeue_job", "leasequeue_process", "leasequeue_queue", "invoices_flakyattempt", "invoices_invoice",
           "invoices_account")


@pytest.fixture
def committed_db(transactional_db) -> Iterator[None]:
    """Database access in autocommit mode, so the worker's own connections see the test's rows;
    the queue and example tables are truncated afterwards.

    It names pytest-django's ``transactional_db`` as a parameter: pytest-django creates the test
    database only for the aliases that the selected tests' fixture closures ask for (``db``,
    ``transactional_db``, a ``django_db`` marker). With only ``django_db_setup`` and an unblocked
    ``django_db_blocker``, a run that selects nothing else creates no test database and this
    fixture's TRUNCATE empties the developer's own database.
    """
    try:
        yield
    finally:
        with connection.cursor() as cur:
            cur.execute(f"TRUNCATE {', '.join(_TABLES)} RESTART IDENTITY CASCADE")
