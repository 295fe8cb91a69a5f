"""No test touches a database that is not a test database.

Each case makes a throwaway "project database" (migrated, holding one job), runs pytest in a
subprocess with LEASEQUEUE_DB_NAME pointing at it, as a developer would after ``scripts/test``,
and counts the project database's jobs afterwards. The databases are reached with psycopg, not
through Django (this session's own guard refuses connections to non-test databases).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.conf import settings

ROOT = Path(__file__).resolve().parents[2]
MANAGE = ROOT / "testproject" / "manage.py"


def _server() -> dict[str, str]:
    db = settings.DATABASES["default"]
    return {"host": db["HOST"] or "127.0.0.1", "port": str(db["PORT"] or 5432), "user": db["USER"] or "postgres",
            "password": db["PASSWORD"] or ""}


def _admin(sql: str) -> None:
    with psycopg.connect(dbname="postgres", autocommit=True, **_server()) as conn:
        conn.execute(sql)


def _jobs(database: str) -> int:
    with psycopg.connect(dbname=database, **_server()) as conn:
        row = conn.execute("SELECT count(*) FROM leasequeue_job").fetchone()
        assert row is not None
        return int(row[0])


@pytest.fixture
def project_db() -> Iterator[tuple[str, dict[str, str]]]:
    """A migrated non-test database with one ready job; yields (name, env for subprocesses)."""
    name = f"lqsafety_{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_", "LEASEQUEUE_"))}
    env.update(LEASEQUEUE_DB_NAME=name, LEASEQUEUE_TEST_DB_NAME=f"test_{name}")
    _admin(f'CREATE DATABASE "{name}"')
    try:
        done = subprocess.run([sys.executable, str(MANAGE), "migrate", "-v", "0"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        done = subprocess.run([sys.executable, str(MANAGE), "shell", "-c",
                               "from qa.tasks import record; record.enqueue()"],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert _jobs(name) == 1
        yield name, env
    finally:
        _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        _admin(f'DROP DATABASE IF EXISTS "test_{name}" WITH (FORCE)')


def _pytest(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)


def test_one_committed_db_test_alone_keeps_the_project_database(project_db):
    name, env = project_db
    proc = _pytest(env, "tests/backends/test_contract.py::test_priority_order")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout
    assert _jobs(name) == 1


def test_a_test_that_reaches_the_project_database_fails_and_writes_nothing(project_db):
    name, env = project_db
    proc = _pytest(env, "tests/testing/unguarded_probe.py")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 failed" in out and "NotATestDatabase" in out and f"{name!r}" in out, out
    assert _jobs(name) == 1
