"""Support of the docs tests that follow a page as a newcomer would (the tutorial, the README's quick
start): a project directory and a throwaway database (the ``fresh_project`` fixture of
``conftest.py``), ``manage.py`` runs, the page's fenced blocks, and what is compared of a command's
output.

The page's database settings are used as written: the test appends a check that they name the
documented database on the documented server, then renames the database to a throwaway test
database (never the reader's ``mysite``), and points at this test run's server only where that is
another one.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent.parent

FENCE = re.compile(r"^```(\w*)(?:\s+title=\"([^\"]+)\")?\n(.*?)^```$", re.MULTILINE | re.DOTALL)
# The server the pages tell the reader to use.
DOCUMENTED_SERVER = {"HOST": "127.0.0.1", "PORT": "5432", "USER": "postgres"}


def fenced_blocks(text: str) -> list[tuple[str, str | None, str]]:
    """(language, title, body) of every fenced block of ``text``, in order."""
    return [(m.group(1), m.group(2), m.group(3)) for m in FENCE.finditer(text)]


def normalise(text: str) -> list[str]:
    """Log and output lines without what differs per run: times, worker ids, occurrence instants,
    the seconds a worker ran."""
    lines = []
    for line in text.strip().splitlines():
        line = re.sub(r"^\d\d:\d\d:\d\d ", "", line)
        line = re.sub(r"worker \S+:\d+:\w+", "worker <id>", line)
        line = re.sub(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d\+00:00", "<instant>", line)
        line = re.sub(r"stopped after \d+\.\d s", "stopped after <n> s", line)
        lines.append(line.rstrip())
    return lines


def server() -> dict[str, str]:
    """This test run's PostgreSQL server, as psycopg connection keywords."""
    db = settings.DATABASES["default"]
    return {"host": db["HOST"] or "127.0.0.1", "port": str(db["PORT"] or 5432), "user": db["USER"] or "postgres",
            "password": db["PASSWORD"] or ""}


class Project:
    """A project directory being built from a page, on its own throwaway database.

    Args:
        path (Path): the project's directory. database (str): its database (a test database's name).

    ``manage.py`` runs with ``python`` (this interpreter, importing django_leasequeue from this
    checkout through PYTHONPATH, until :meth:`activate` switches to a virtualenv of the project's
    own).
    """

    def __init__(self, path: Path, database: str) -> None:
        self.path = path
        self.database = database
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("LEASEQUEUE_", "DJANGO_")) and k not in ("VIRTUAL_ENV", "PYTHONPATH")}
        self.env["PYTHONPATH"] = str(ROOT)
        self.python = sys.executable

    def activate(self, venv: Path) -> None:
        """Run everything from now on in the virtualenv ``venv``, as ``. venv/bin/activate`` does
        (its ``bin`` first on PATH), and no longer with this checkout on PYTHONPATH."""
        self.env.pop("PYTHONPATH", None)
        self.env["VIRTUAL_ENV"] = str(venv)
        self.env["PATH"] = f"{venv / 'bin'}{os.pathsep}{self.env.get('PATH', '')}"
        self.python = str(venv / "bin" / "python")

    def run(self, args: list[str], *, expect: int = 0, timeout: float = 300) -> str:
        """Run ``args`` in the project directory; return its stdout (asserting the exit status)."""
        done = subprocess.run(args, cwd=self.path, env=self.env, text=True, capture_output=True, timeout=timeout)
        assert done.returncode == expect, (f"{' '.join(args)}: exit status {done.returncode}, not {expect}:\n"
                                           f"{done.stdout}\n{done.stderr}")
        return done.stdout

    def manage(self, *args: str, expect: int = 0, timeout: float = 120) -> str:
        """Run ``manage.py ARGS``; return its stdout (asserting the exit status ``expect``)."""
        return self.run([self.python, "manage.py", *args], expect=expect, timeout=timeout)

    def query(self, sql: str) -> list[tuple]:
        with psycopg.connect(dbname=self.database, **server()) as conn:
            return conn.execute(sql).fetchall()

    def run_worker(self, args: list[str], until: Callable[[], bool], what: str) -> str:
        """Start ``manage.py ARGS`` (a worker), wait until ``until()``, stop it with Ctrl+C (SIGINT);
        it must exit 0. Returns its output (stdout and stderr)."""
        proc = subprocess.Popen([self.python, "manage.py", *args], cwd=self.path, env=self.env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 90
            while not until():
                assert proc.poll() is None, f"the worker exited early:\n{proc.communicate()[0]}"
                assert time.monotonic() < deadline, f"timed out waiting for {what}"
                time.sleep(0.2)
            proc.send_signal(signal.SIGINT)  # Ctrl+C
            output, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 0, output
        return output

    def settings_override(self, documented_name: str) -> str:
        """Python to append to the project's settings after the page's DATABASES: check that it
        names ``documented_name`` on the documented server, then use this test's database (and
        this run's server where it is another)."""
        here = server()
        actual = {"HOST": here["host"], "PORT": here["port"], "USER": here["user"], "PASSWORD": here["password"]}
        return ("\n# Added by the test: the page's database, renamed to a throwaway test database.\n"
                f"assert DATABASES['default']['NAME'] == {documented_name!r}, DATABASES['default']\n"
                f"assert {{k: str(DATABASES['default'].get(k)) for k in {sorted(DOCUMENTED_SERVER)!r}}} == "
                f"{DOCUMENTED_SERVER!r}, DATABASES['default']\n"
                f"DATABASES['default'].update(NAME={self.database!r}, **{actual!r})\n")


def create_database(name: str) -> None:
    """Create the throwaway database ``name`` (dropped first if a failed run left it)."""
    assert name.startswith("test_"), name
    with psycopg.connect(dbname="postgres", autocommit=True, **server()) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(name: str) -> None:
    """Drop the throwaway database ``name``."""
    assert name.startswith("test_"), name
    with psycopg.connect(dbname="postgres", autocommit=True, **server()) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def throwaway_database_name(suffix: str) -> str:
    """A test database's name for this run's page test (``test_<run's database>_<suffix>``)."""
    return f"test_{settings.DATABASES['default']['NAME'].removeprefix('test_')}_{suffix}"
