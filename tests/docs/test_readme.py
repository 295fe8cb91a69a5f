"""The README's quick start, pasted into a fresh project as a newcomer would: its files written from
its code blocks, its commands run in order, its enqueue snippet run in ``manage.py shell``. Every
name the handler uses must be defined or imported by the snippets themselves.

Blocks of the "Quick start" section, in order: a ``python`` block whose first line is ``# PATH``
writes that file (``settings.py`` is appended to the project's settings); any other ``python``
block runs through ``manage.py shell -c``; ``sh`` lines are ``pip install`` (done here through
PYTHONPATH) or ``python manage.py ...`` (``runworker`` gets ``--burst``, so it exits when idle).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from django.conf import settings

from .test_tutorial import FENCE, Project, _server, settings_override

ROOT = Path(__file__).resolve().parent.parent.parent
README = ROOT / "README.md"

pytestmark = [pytest.mark.process]


def quick_start_blocks() -> list[tuple[str, str]]:
    """(language, body) of the fenced blocks of the README's "Quick start" section."""
    text = README.read_text()
    section = text[text.index("## Quick start\n"):]
    section = section[:section.index("\n## ", 1)]
    return [(m.group(1), m.group(3)) for m in FENCE.finditer(section)]


@pytest.fixture
def project(tmp_path):
    database = f"test_{settings.DATABASES['default']['NAME'].removeprefix('test_')}_readme"
    with psycopg.connect(dbname="postgres", autocommit=True, **_server()) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{database}"')
    path = tmp_path / "readme"
    path.mkdir()
    made = Project(path, database)
    for command in (["startproject", "mysite", "."], ["startapp", "myapp"]):
        subprocess.run([sys.executable, "-m", "django", *command], cwd=path, env=made.env, check=True)
    (path / "mysite" / "settings.py").open("a").write(
        '\nDATABASES = {"default": {"ENGINE": "django.db.backends.postgresql"}}\n' + settings_override(made))
    yield made
    with psycopg.connect(dbname="postgres", autocommit=True, **_server()) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def test_the_readme_quick_start_runs_as_written(project):
    blocks = quick_start_blocks()
    assert [language for language, _ in blocks] == ["sh", "python", "python", "python", "sh", "python", "sh"]
    ran_worker = False
    for language, body in blocks:
        first = body.splitlines()[0]
        path = re.fullmatch(r"# (\S+\.py)\b.*", first)
        if language == "python" and path:
            target = project.path / ("mysite/settings.py" if path.group(1) == "settings.py" else path.group(1))
            compile(body, str(target), "exec")
            with target.open("a" if path.group(1) == "settings.py" else "w") as f:
                f.write("\n" + body + (settings_override(project) if path.group(1) == "settings.py" else ""))
        elif language == "python":
            project.manage("shell", "-v", "0", "-c", body)
        else:
            for line in body.strip().splitlines():
                command = line.split("#")[0].strip()
                if command.startswith("pip install"):
                    continue
                assert command.startswith("python manage.py "), f"no test step for {command!r}"
                args = command.split()[2:]
                if args[0] == "runworker":
                    output = project.manage(*args, "--burst")
                    assert "1 task(s) registered (1 native, 0 django.tasks): myapp.tasks.send_invoice" in output
                    ran_worker = True
                else:
                    project.manage(*args)
    assert ran_worker
    assert project.query("SELECT status, count(*) FROM leasequeue_job GROUP BY status") == [("done", 2)]
    assert project.query("SELECT account_id, period, convert_from(pdf, 'UTF8') FROM myapp_invoice") == [
        (42, "2026-11", "Invoice for account 42, 2026-11")]
