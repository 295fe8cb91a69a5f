"""``scripts/demo`` says what it is doing while it sets up (the first run builds a virtualenv for
about a minute before the demo prints anything): run for real, on a copy of the scripts whose
project is a stub, and ``make_venv`` on a fresh directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.process

STUB_MANAGE = """import sys
print("stub manage.py", *sys.argv[1:])
"""


def bash(script: str, *args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", script, "bash", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def test_make_venv_says_it_creates_the_virtualenv_and_how_long_it_takes(tmp_path):
    venv = tmp_path / "venv"
    script = 'source "$1/scripts/env.sh"; make_venv "$2" "$3" --no-index pip'
    first = bash(script, str(ROOT), str(venv), sys.executable, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    version = subprocess.run([sys.executable, "-V"], capture_output=True, text=True).stdout.strip()
    assert first.stderr.splitlines() == [
        f"creating the virtualenv {venv} ({version}); installing into it: --no-index pip "
        "(about a minute on a fresh machine)"]
    assert (venv / "bin" / "python").exists()
    again = bash(script, str(ROOT), str(venv), sys.executable, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stderr.splitlines() == [f"checking the virtualenv {venv} has: --no-index pip (seconds)"]


def test_scripts_demo_prints_each_step_before_the_demo_starts(tmp_path):
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    for name in ("demo", "env.sh"):
        shutil.copy2(ROOT / "scripts" / name, root / "scripts" / name)
    (root / "testproject").mkdir()
    (root / "testproject" / "manage.py").write_text(STUB_MANAGE)
    # An existing .venv without pip: make_venv only checks it (its pip call fails, as it may offline).
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / ".venv")], check=True)
    database = "test_leasequeue_demo_script"
    try:
        done = subprocess.run([str(root / "scripts" / "demo"), "--jobs", "10"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120, env={**os.environ, "LEASEQUEUE_DB_NAME": database})
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-2:] == ["stub manage.py migrate -v 0", "stub manage.py demo --jobs 10"]
        progress = [line for line in done.stderr.splitlines() if line.startswith(("demo:", "checking", "creating"))]
        assert progress == [
            f"demo: checking that PostgreSQL answers on {os.environ.get('PGHOST', '127.0.0.1')}:"
            f"{os.environ.get('PGPORT', '5432')}",
            f"checking the virtualenv {root}/.venv has: -e {root}[dev,otel] Django>=6.1,<6.2 (seconds)",
            f"demo: creating the database {database} (unless it exists) and applying the migrations",
            "demo: starting manage.py demo --jobs 10",
        ]
    finally:
        with psycopg.connect(dbname="postgres", host=os.environ.get("PGHOST", "127.0.0.1"),
                             port=os.environ.get("PGPORT", "5432"), user=os.environ.get("PGUSER", "postgres"),
                             autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}"')
