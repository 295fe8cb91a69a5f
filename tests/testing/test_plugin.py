"""The pytest plugin: loads (by its entry point when the package's metadata is on the path, as in
CI's editable install, else with -p), stays inert in projects that do not use Django, and gives a
Django project's tests the fixtures. Each case runs pytest in a subprocess on a project written to
a temporary directory. scripts/wheel-smoke checks the entry point of the built wheel."""

import os
import subprocess
import sys
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def entry_point_installed() -> bool:
    """True when the package's metadata (an install, an editable install, or an egg-info left in
    the checkout by a build) declares the pytest11 entry point: pytest then loads the plugin by
    itself, and ``-p django_leasequeue.pytest_plugin`` would register it a second time."""
    return any(ep.name == "leasequeue" for ep in entry_points(group="pytest11"))


def run_pytest(project: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_"))}
    (project / "pytest.ini").write_text("[pytest]\n")  # the temp dir is the rootdir, not the checkout
    load = [] if entry_point_installed() else ["-p", "django_leasequeue.pytest_plugin"]
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *load, *args],
        cwd=project, env={**base, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "testproject")]),
                          **(env or {})},
        capture_output=True, text=True, timeout=240,
    )


def test_entry_point_names_the_plugin_module():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {"leasequeue": "django_leasequeue.pytest_plugin"}


def test_plugin_is_inert_in_a_project_without_django(tmp_path):
    (tmp_path / "test_plain.py").write_text(
        "import sys\n"
        "def test_nothing_heavy_was_imported():\n"
        "    assert 'django_leasequeue.pytest_plugin' in sys.modules\n"
        "    assert 'django.db' not in sys.modules and 'django_leasequeue.testing' not in sys.modules\n"
        "def test_fixture_without_pytest_django(leasequeue):\n"
        "    pass\n"
    )
    proc = run_pytest(tmp_path, "-p", "no:django")
    out = proc.stdout + proc.stderr
    assert "1 passed, 1 error" in out, out
    assert "fixture 'db' not found" in out  # pytest-django's fixture: the only requirement


def test_fixtures_in_a_django_project(tmp_path, db):
    (tmp_path / "test_invoices.py").write_text('''
from invoices.models import Account, Invoice
from invoices.tasks import send_invoice


def test_drain(leasequeue):
    from django.db import connection
    assert connection.settings_dict["NAME"].startswith("test_")  # never the real database
    account = Account.objects.create(name="a", email="a@example.com")
    send_invoice.enqueue(account.pk, "2026-11")
    leasequeue.assert_enqueued(send_invoice, args=[account.pk, "2026-11"], count=1)
    assert leasequeue.drain().outcomes == {"done": 1}
    assert Invoice.objects.get().account == account


def test_eager(leasequeue_eager):
    account = Account.objects.create(name="b", email="b@example.com")
    send_invoice.enqueue(account.pk, "2026-11")
    assert Invoice.objects.count() == 1


def test_lost_lease(leasequeue):
    account = Account.objects.create(name="c", email="c@example.com")
    lost = leasequeue.simulate_lost_lease(send_invoice.enqueue(account.pk, "2026-11"))
    assert lost.stale.outcome == "lease_lost" and Invoice.objects.get().lease_version == lost.takeover.token
''')
    # The inner run reuses this session's test database (already migrated; this test's open
    # transaction holds no lock the inner one needs): creating and migrating another one would take
    # longer than the rest of this file. Its tests roll back, as every db test does.
    proc = run_pytest(tmp_path, "--ds=testproject.settings", "--reuse-db", env={
        "LEASEQUEUE_DB_NAME": os.environ.get("LEASEQUEUE_DB_NAME", "leasequeue"),
        "LEASEQUEUE_TEST_DB_NAME": connection.settings_dict["NAME"],
    })
    assert "3 passed" in proc.stdout, proc.stdout + proc.stderr
