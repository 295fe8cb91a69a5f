"""The README's quick start, followed from an empty directory as a newcomer would: a virtualenv of
the project's own, ``pip install`` of this checkout into it (a copy of its files, so the build
writes nothing here), ``django-admin startproject``, the database made by the page's ``createdb``,
its settings and files written from its code blocks, its commands run in order, its enqueue snippet
run in ``manage.py shell``, the burst worker's output compared with the page's, the long-running
worker stopped with Ctrl+C, and ``queuehealth`` with the exit statuses the page gives.

Blocks of the "Quick start" section, in order: a ``python`` block whose first line is ``# PATH``
writes that file, appended when the line says "add at the end"; any other ``python`` block runs
through ``manage.py shell -c``; a ``text`` block is the output of the command before it (each of
its lines must be in that output, times and worker ids aside); ``sh`` lines are commands, split at
``&&``, each one a step this test knows (a new kind of step on the page fails the test until it
gets one here).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from .fresh_project import ROOT, Project, fenced_blocks, normalise

README = ROOT / "README.md"
CHECKOUT = "/path/to/django-leasequeue"

pytestmark = [pytest.mark.process]


def quick_start_blocks() -> list[tuple[str, str]]:
    """(language, body) of the fenced blocks of the README's "Quick start" section."""
    text = README.read_text()
    section = text[text.index("## Quick start\n"):]
    section = section[:section.index("\n## ", 1)]
    return [(language, body) for language, _title, body in fenced_blocks(section)]


def copy_of_the_checkout(target: Path) -> Path:
    """The checkout's files as they are now (tracked and new, not ignored) copied to ``target``: pip
    builds in the source tree, and its build/ and egg-info must not land in this one."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            (target / name).write_bytes(source.read_bytes())
    return target


@pytest.fixture
def project(fresh_project) -> Project:
    return fresh_project("mysite", "readme", create=False)


class QuickStart:
    """Performs the quick start's steps on ``project``; remembers what the page named."""

    def __init__(self, project: Project, checkout: Path) -> None:
        self.project = project
        self.checkout = checkout
        self.database_name: str | None = None  # the createdb argument
        self.ran: list[str] = []  # the steps performed, by kind
        self.last_output: tuple[str, str] | None = None  # (command, output) for a text block after it

    def write(self, body: str, path: str, append: bool) -> None:
        target = self.project.path / path
        compile(body, str(target), "exec")
        settings = path.endswith("settings.py")
        if settings:
            assert append and self.database_name, "the settings come after createdb, added to startproject's"
        with target.open("a" if append else "w") as f:
            f.write("\n" + body + (self.project.settings_override(self.database_name) if settings else ""))
        self.ran.append(f"write {path}")

    def sh(self, command: str, comment: str) -> None:
        """Perform the page's ``command``; ``comment`` is the rest of its line after ``#``."""
        project = self.project
        words = shlex.split(command.replace(CHECKOUT, str(self.checkout)))
        kind = " ".join(words[:3]) if words[:2] == ["python", "manage.py"] else words[0]
        self.last_output = None
        if words[0] in ("mkdir", "cd"):
            assert words[1:] == [project.path.name], command  # the fixture made it, empty
        elif words[:3] == ["python3", "-m", "venv"]:
            # venv run from this test's own virtualenv makes one on the base interpreter, as python3 would.
            project.run([sys.executable, "-m", "venv", *words[3:]])
        elif words[0] == ".":
            assert words[1].endswith("/bin/activate"), command
            project.activate(project.path / words[1].removesuffix("/bin/activate"))
        elif words[0] == "pip":
            assert project.env.get("VIRTUAL_ENV"), "pip install before the virtualenv is active"
            project.run(words, timeout=600)
        elif words[0] == "django-admin":
            project.run(words)
        elif words[0] == "createdb":
            # The page's command, on this run's database name (the settings check names the page's).
            self.database_name = words[-1]
            project.run([*words[:-1], project.database])
        elif words[:3] == ["python", "manage.py", "runworker"] and "--burst" in words:
            self.last_output = (command, project.manage(*words[2:]))
        elif words[:3] == ["python", "manage.py", "runworker"]:
            output = project.run_worker(words[2:], lambda: bool(project.query(
                "SELECT 1 FROM leasequeue_process WHERE kind = 'worker'")), "the worker to register")
            self.last_output = (command, output)
            assert re.search(r"^worker \S+ stopped after [\d.]+ s: 0 claimed, 0 done, 0 retried, 0 dead-lettered, "
                             r"0 lease lost, 0 released$", output, re.MULTILINE), output
        elif words[:3] == ["python", "manage.py", "queuehealth"]:
            stated = re.search(r"\bexits (\d)\b", comment)
            assert stated, f"the page must say what {command!r} exits with"
            output = project.manage(*words[2:], expect=int(stated.group(1)))
            self.last_output = (command, output)
            if stated.group(1) == "2":
                assert "--min-workers 0" in output.splitlines()[0], output
        elif words[:2] == ["python", "manage.py"]:
            project.manage(*words[2:])
        else:
            pytest.fail(f"README quick start: no test step for the command {command!r}")
        self.ran.append(kind)

    def expect_output(self, body: str) -> None:
        assert self.last_output, "an output block follows a command that printed it"
        command, actual = self.last_output
        got = normalise(actual)
        missing = [line for line in normalise(body) if line not in got]
        assert not missing, f"{command}: lines not in its output: {missing}\n{actual}"
        self.ran.append("compare output")


def test_the_readme_quick_start_runs_as_written(project, tmp_path):
    blocks = quick_start_blocks()
    assert [language for language, _ in blocks] == [
        "sh", "python", "python", "python", "sh", "python", "sh", "text", "sh", "sh"]
    steps = QuickStart(project, copy_of_the_checkout(tmp_path / "django-leasequeue"))
    for language, body in blocks:
        first = body.splitlines()[0]
        path = re.fullmatch(r"# (\S+\.py)\b(.*)", first)
        if language == "python" and path:
            steps.write(body, path.group(1), append="add at the end" in path.group(2))
        elif language == "python":
            steps.ran.append("shell")
            project.manage("shell", "-v", "0", "-c", body)
        elif language == "text":
            steps.expect_output(body)
        else:
            assert language == "sh"
            for line in body.strip().splitlines():
                commands, _, comment = line.partition("#")
                for command in commands.split("&&"):
                    steps.sh(command.strip(), comment)
    # Every kind of step ran, in the page's order.
    assert steps.ran == [
        "mkdir", "cd", "python3", ".", "pip", "django-admin", "python manage.py startapp", "createdb",
        "write mysite/settings.py", "write myapp/models.py", "write myapp/tasks.py",
        "python manage.py makemigrations", "python manage.py migrate", "shell", "python manage.py runworker",
        "compare output", "python manage.py runworker", "python manage.py queuehealth",
        "python manage.py queuehealth"]
    # The package came from the virtualenv (the checkout's copy, installed), not from this checkout.
    origin = project.run([project.python, "-c", "import django_leasequeue; print(django_leasequeue.__file__)"])
    assert origin.startswith(str(project.path / ".venv")), origin
    assert project.query("SELECT status, count(*) FROM leasequeue_job GROUP BY status") == [("done", 2)]
    assert project.query("SELECT account_id, period, convert_from(pdf, 'UTF8') FROM myapp_invoice") == [
        (42, "2026-11", "Invoice for account 42, 2026-11")]
