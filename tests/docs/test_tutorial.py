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

import subprocess
import sys

import pytest

from .fresh_project import ROOT, Project, fenced_blocks, normalise

PAGE = ROOT / "docs" / "tutorials" / "tutorial.md"

pytestmark = [pytest.mark.process]

# Lines of the page's sh blocks that describe the reader's machine, done here by the test itself.
SETUP = ("mkdir shop-tutorial", "python3 -m venv", ". .venv/bin/activate", "pip install /path/to/django-leasequeue",
         "createdb ")


def blocks() -> list[tuple[str, str | None, str]]:
    """(language, title, body) of every fenced block of the page, in order."""
    return fenced_blocks(PAGE.read_text())


@pytest.fixture
def project(fresh_project) -> Project:
    return fresh_project("shop-tutorial", "tutorial")


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
                if "DATABASES = " in body:  # the page's database, renamed to this test's
                    f.write(project.settings_override("mysite"))
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
