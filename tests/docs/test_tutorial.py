"""docs/tutorials/tutorial.md, followed as a newcomer would: a fresh project from ``startproject``, the page's
files written from its code blocks, its commands run in order, its printed outputs compared.

The page is the script. Its fenced blocks are read in order:

* a block titled with a file (``title="shop/tasks.py"``) writes that file; ``mysite/settings.py``
  blocks are appended, as the page says;
* a block titled ``python manage.py shell`` runs through ``manage.py shell -c``; the untitled
  block right after it is its expected output;
* ``sh`` blocks are commands. Each line must be one this test knows how to perform (creating the
  virtualenv and the database are done its own way); an unknown command fails the test, so a new
  step on the page needs a step here. ``runworker`` runs until the jobs it was started for are
  finished, then gets Ctrl+C (SIGINT) and must exit 0; the log block after it must appear in its
  output (times and worker ids aside).

The project imports django_leasequeue from this checkout (PYTHONPATH), not from an installed wheel.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent.parent
PAGE = ROOT / "docs" / "tutorials" / "tutorial.md"

pytestmark = [pytest.mark.process]

FENCE = re.compile(r"^```(\w*)(?:\s+title=\"([^\"]+)\")?\n(.*?)^```$", re.MULTILINE | re.DOTALL)
# Lines of the page's sh blocks that describe the reader's machine, done here by the test itself.
SETUP = ("mkdir shop-tutorial", "python3 -m venv", ". .venv/bin/activate", "pip install /path/to/django-leasequeue",
         "createdb ")


def blocks() -> list[tuple[str, str | None, str]]:
    """(language, title, body) of every fenced block of the page, in order."""
    return [(m.group(1), m.group(2), m.group(3)) for m in FENCE.finditer(PAGE.read_text())]


def normalise(text: str) -> list[str]:
    """Log and output lines without what differs per run: times, worker ids, occurrence instants."""
    lines = []
    for line in text.strip().splitlines():
        line = re.sub(r"^\d\d:\d\d:\d\d ", "", line)
        line = re.sub(r"worker \S+:\d+:\w+", "worker <id>", line)
        line = re.sub(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d\+00:00", "<instant>", line)
        lines.append(line.rstrip())
    return lines


class Project:
    def __init__(self, path: Path, database: str) -> None:
        self.path = path
        self.database = database
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("LEASEQUEUE_", "DJANGO_"))}
        self.env["PYTHONPATH"] = str(ROOT)

    def manage(self, *args: str, timeout: float = 120) -> str:
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=self.path, env=self.env, text=True,
                              capture_output=True, timeout=timeout)
        assert done.returncode == 0, f"manage.py {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def query(self, sql: str) -> list[tuple]:
        with psycopg.connect(dbname=self.database, **_server()) as conn:
            return conn.execute(sql).fetchall()

    def run_worker(self, args: list[str], until, what: str) -> str:
        proc = subprocess.Popen([sys.executable, "manage.py", *args], cwd=self.path, env=self.env, text=True,
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


def _server() -> dict[str, str]:
    db = settings.DATABASES["default"]
    return {"host": db["HOST"] or "127.0.0.1", "port": str(db["PORT"] or 5432), "user": db["USER"] or "postgres",
            "password": db["PASSWORD"] or ""}


@pytest.fixture
def project(tmp_path):
    # A throwaway database named as a test database (never the project's own).
    database = f"test_{settings.DATABASES['default']['NAME'].removeprefix('test_')}_tutorial"
    with psycopg.connect(dbname="postgres", autocommit=True, **_server()) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{database}"')
    path = tmp_path / "shop-tutorial"
    path.mkdir()
    yield Project(path, database)
    with psycopg.connect(dbname="postgres", autocommit=True, **_server()) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def settings_override(project: Project) -> str:
    """Point the page's DATABASES at this test's database (the page says NAME "mysite")."""
    server = _server()
    return (f'\nDATABASES["default"].update(NAME={project.database!r}, HOST={server["host"]!r}, '
            f'PORT={server["port"]!r}, USER={server["user"]!r}, PASSWORD={server["password"]!r})\n')


def jobs_finished(project: Project) -> bool:
    return not project.query("SELECT 1 FROM leasequeue_job WHERE status IN ('ready', 'leased')")


def schedule_jobs_done(project: Project, count: int) -> bool:
    rows = project.query("SELECT count(*) FROM leasequeue_job WHERE schedule_id IS NOT NULL AND status = 'done'")
    return rows[0][0] >= count


def test_the_tutorial_works_as_written(project):
    page = blocks()
    assert page, "no code blocks found in docs/tutorials/tutorial.md"
    pending_output: tuple[str, str] | None = None  # (what produced it, its output) awaiting the next block
    ran_schedule = False
    for index, (language, title, body) in enumerate(page):
        if pending_output is not None and not language and not title:
            source, actual = pending_output
            expected = normalise(body)
            got = normalise(actual)
            if source == "shell":
                assert got == expected, f"shell output differs:\n{actual}"
            else:
                missing = [line for line in expected if line not in got]
                assert not missing, f"{source}: lines not in the output: {missing}\n{actual}"
            pending_output = None
            continue
        pending_output = None
        if title == "mysite/settings.py":
            with open(project.path / title, "a") as f:
                f.write("\n" + body)
                f.write(settings_override(project))
        elif title == "python manage.py shell":
            pending_output = ("shell", project.manage("shell", "-v", "0", "-c", body))
        elif title is not None:
            (project.path / title).write_text(body)
        elif language == "sh":
            for line in body.strip().splitlines():
                command = line.split("#")[0].strip()
                if not command or command.startswith(SETUP):
                    continue
                if command == "django-admin startproject mysite .":
                    subprocess.run([sys.executable, "-m", "django", "startproject", "mysite", "."],
                                   cwd=project.path, env=project.env, check=True)
                elif command.startswith("python manage.py runworker"):
                    args = command.split()[2:]
                    if "--with-scheduler" in args:
                        output = project.run_worker(args, lambda: schedule_jobs_done(project, 2),
                                                    "two scheduled jobs to be done")
                        ran_schedule = True
                    else:
                        output = project.run_worker(args, lambda: jobs_finished(project), "the jobs to finish")
                    pending_output = ("runworker", output)
                elif command.startswith("python manage.py "):
                    project.manage(*command.split()[2:])
                else:
                    pytest.fail(f"docs/tutorials/tutorial.md block {index}: no test step for the command {command!r}")
    assert ran_schedule
    statuses = dict(project.query("SELECT status, count(*) FROM leasequeue_job WHERE schedule_id IS NULL "
                                  "GROUP BY status"))
    assert statuses == {"done": 1, "dead": 1}
