"""Shared fixtures: real PostgreSQL, real worker processes, and database-clock control.

Tests that need other connections (threads, worker processes) to see their rows use the
``transactional_db`` fixture (or ``@pytest.mark.django_db(transaction=True)``); the others run in
one transaction, where they must pass an explicit ``now=`` to store functions.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connection

from tests.support import wait_for  # noqa: F401  (re-exported for older tests)

ROOT = Path(__file__).resolve().parent.parent
MANAGE = ROOT / "testproject" / "manage.py"


def pytest_configure(config):
    """Load our pytest plugin (fixtures ``leasequeue``...) when its entry point did not: the suite
    runs from the checkout, where the package may not be installed."""
    import importlib

    plugin = importlib.import_module("django_leasequeue.pytest_plugin")
    if not config.pluginmanager.is_registered(plugin):
        config.pluginmanager.register(plugin, "leasequeue")


# Django opens this maintenance database to CREATE or DROP the test database (and nothing else).
MAINTENANCE_DATABASES = frozenset({"postgres"})


class NotATestDatabase(RuntimeError):
    """A test opened a connection to a database whose name does not start with ``test_``."""


def refuse_non_test_database(sender, connection, **kwargs):
    """``connection_created`` receiver: refuse any connection a test opens to a database that is
    not a test database (name starting with ``test_``), before a single statement runs on it.

    Raises:
        NotATestDatabase: naming the database and the likely cause.
    """
    name = str(connection.settings_dict.get("NAME") or "")
    if name.startswith("test_") or name in MAINTENANCE_DATABASES:
        return
    connection.close()
    raise NotATestDatabase(
        f"a test connected to the database {name!r} (alias {connection.alias!r}), which is not a test "
        "database: give the test database access through pytest-django's db or transactional_db "
        "fixture (or a django_db marker), so that pytest-django creates test_<name> for it"
    )


@pytest.fixture(autouse=True)
def _only_test_databases():
    """Fail every test that connects to a database other than a test database (the developer's
    project database above all). Session fixtures, which create the test databases, have run by
    the time this one starts; worker threads of the test are covered too (the signal is global)."""
    from django.db import connections
    from django.db.backends.signals import connection_created

    for conn in connections.all(initialized_only=True):
        if conn.connection is not None:
            refuse_non_test_database(None, conn)
    connection_created.connect(refuse_non_test_database, dispatch_uid="lq-test-only-test-databases")
    try:
        yield
    finally:
        connection_created.disconnect(dispatch_uid="lq-test-only-test-databases")


@pytest.fixture(scope="session", autouse=True)
def _flush_with_delete():
    """Make the flush after each ``transactional_db`` test DELETE rows instead of TRUNCATE tables.

    TRUNCATE creates new files for every table and index and fsyncs them: about a second per test
    on a busy machine, for tables that hold a few rows. Django's foreign keys are DEFERRABLE
    INITIALLY DEFERRED and flush runs in one transaction, so deleting in any order is safe.
    Sequences are not reset (no test relies on ids); a flush that asks for it still truncates.
    """
    from django.db.backends.postgresql.operations import DatabaseOperations

    original = DatabaseOperations.sql_flush

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if reset_sequences or not tables:
            return original(self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
        return [f"DELETE FROM {self.quote_name(table)};" for table in tables]

    DatabaseOperations.sql_flush = sql_flush
    yield
    DatabaseOperations.sql_flush = original


class WorkerProcess:
    """A ``manage.py <command>`` subprocess against the test database.

    Its stdout and stderr go to a file (a pipe would fill up and block a chatty worker); read them
    at any time with :meth:`output`.
    """

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.args = args
        self.log = tempfile.NamedTemporaryFile("w+", prefix="leasequeue-worker-", suffix=".log")
        self.proc = subprocess.Popen(
            [sys.executable, str(MANAGE), *args], env=env, cwd=str(ROOT),
            stdout=self.log, stderr=subprocess.STDOUT, text=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGKILL)
        self.proc.wait(10)

    def wait(self, timeout: float = 30) -> int:
        """Wait for the process to exit; return its exit code (fail the test on timeout)."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{' '.join(self.args)} (pid {self.pid}) still running after {timeout}s:\n{self.output()}")

    def output(self) -> str:
        """Everything the process wrote so far."""
        with open(self.log.name) as fh:
            return fh.read()


@pytest.fixture
def spawn(transactional_db, request) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``manage.py`` commands (runworker, runreaper, ...) as subprocesses on the test database.

    Usage: ``w = spawn("runworker", "--concurrency", "2", env={"LEASEQUEUE_LEASE": "2"})``.
    Every process still running at the end of the test is SIGKILLed (after SIGCONT, in case it
    was stopped); each one's output is attached to the test report (shown when the test fails).
    """
    started: list[WorkerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> WorkerProcess:
        full_env = {**os.environ, "LEASEQUEUE_DB_NAME": connection.settings_dict["NAME"],
                    "PYTHONUNBUFFERED": "1", **(env or {})}
        # The process would run (and its reaper prune) on that database: a test database only.
        if not full_env["LEASEQUEUE_DB_NAME"].startswith("test_"):
            raise NotATestDatabase(f"spawn: refusing to start {args!r} on the database "
                                   f"{full_env['LEASEQUEUE_DB_NAME']!r}, which is not a test database")
        proc = WorkerProcess(list(args), full_env)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.running:
            proc.kill()
        request.node.add_report_section("teardown", f"{' '.join(proc.args)} (pid {proc.pid})", proc.output())
        proc.log.close()


@pytest.fixture
def db_clock():
    """Move the database clock of this test's connection: ``db_clock.advance(seconds)``.

    Store statements read ``leasequeue_now()``, which adds the session setting
    ``leasequeue.clock_offset``; worker subprocesses get the same offset through the
    ``LEASEQUEUE_CLOCK_OFFSET`` environment variable (``db_clock.env()``).
    """

    class Clock:
        offset = 0.0

        def advance(self, seconds: float) -> None:
            self.offset += seconds
            with connection.cursor() as cur:
                cur.execute("SELECT set_config('leasequeue.clock_offset', %s, false)", [f"{self.offset} seconds"])

        def env(self) -> dict[str, str]:
            return {"LEASEQUEUE_CLOCK_OFFSET": f"{self.offset}s"}

    clock = Clock()
    yield clock
    with connection.cursor() as cur:
        cur.execute("RESET leasequeue.clock_offset")
