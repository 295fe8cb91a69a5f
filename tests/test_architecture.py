"""Architecture rules: only the ``store/`` package locks or changes job state (its ``read`` module only
reads); importing the package does not import models."""

import ast
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "django_leasequeue"

# Source outside the store package that may run SQL, each with the reason.
ALLOWED = {
    ("notify.py", "LISTEN"): "LISTEN on the listener's own psycopg connection; no job state",
}

FORBIDDEN_TEXT = re.compile(r"select_for_update|\.cursor\(|\.execute(many)?\(|\.raw\(|\.extra\(|RawSQL")
JOB_MODELS = {"Job", "DeadLetter"}
WRITES = {"update", "bulk_update", "bulk_create", "create", "get_or_create", "update_or_create", "delete", "save"}
JOB_STATE_FIELDS = {"status", "lease_version", "leased_until", "leased_by", "attempts", "run_at", "finished_at",
                    "errors"}


# The store package owns every statement. Its read side, store/read.py, holds the queries of
# monitoring, the admin dashboard and the metrics: it only reads, no locks and no writes (checked below).
STORE = "store"
READ_ONLY_QUERY_MODULES = {"store/read.py"}
WRITE_SQL = re.compile(r"\b(FOR\s+UPDATE|FOR\s+SHARE|UPDATE\s+\{?\w+\}?\s+(\w+\s+)?SET|INSERT\s+INTO|DELETE\s+FROM)\b",
                       re.I)
# SQL text in a module outside the store: statement keywords in capitals, as every statement here spells them.
SQL_TEXT = re.compile(r"\b(SELECT\s+[\w*(]|WITH\s+\w+\s+AS|FROM\s+\{?\w+_TABLE|UPDATE\s+\w+\s+SET|"
                      r"INSERT\s+INTO|DELETE\s+FROM|FOR\s+UPDATE)")


def sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in ("migrations", STORE):
            continue
        yield rel, path.read_text()


def test_read_only_query_modules_never_lock_or_write():
    for name in READ_ONLY_QUERY_MODULES:
        text = (PACKAGE / name).read_text()
        assert not WRITE_SQL.search(text), f"{name} must only read"
        assert "select_for_update" not in text


def test_health_runs_no_sql_of_its_own():
    # Monitoring's statements are in store/read.py; health.py turns their rows into figures.
    text = (PACKAGE / "health.py").read_text()
    assert not SQL_TEXT.search(text), SQL_TEXT.search(text)
    assert not FORBIDDEN_TEXT.search(text)


def test_the_read_checks_catch_offences():
    assert WRITE_SQL.search("UPDATE {JOB_TABLE} j SET x = 1") and WRITE_SQL.search("SELECT 1 FOR UPDATE")
    assert SQL_TEXT.search("SELECT j.id FROM {JOB_TABLE} j") and SQL_TEXT.search("WITH clock AS (")
    assert not SQL_TEXT.search("Select the queues, then report them.")


def root_name(node: ast.AST) -> str | None:
    """The name a call chain starts from: ``Job`` for ``Job.objects.filter(...).update``."""
    while True:
        if isinstance(node, ast.Attribute):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Name):
            return node.id
        else:
            return None


def test_no_locks_raw_sql_or_job_writes_outside_store():
    offences = []
    for rel, text in sources():
        for lineno, line in enumerate(text.splitlines(), 1):
            if FORBIDDEN_TEXT.search(line) and not any(
                rel.as_posix() == f and marker in line for (f, marker) in ALLOWED
            ):
                offences.append(f"{rel}:{lineno}: {line.strip()}")
        for node in ast.walk(ast.parse(text)):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr not in WRITES:
                continue
            on_job = root_name(node.func.value) in JOB_MODELS
            sets_state = node.func.attr == "update" and any(k.arg in JOB_STATE_FIELDS for k in node.keywords)
            if on_job or sets_state:
                offences.append(f"{rel}:{node.lineno}: .{node.func.attr}() on job rows")
    assert offences == [], "job SQL belongs in the django_leasequeue/store/ package:\n" + "\n".join(offences)


def test_the_checker_catches_offences(tmp_path):
    # Guard against a checker that silently matches nothing.
    bad = 'Job.objects.filter(pk=1).update(status="done")\nJob.objects.select_for_update()\nx.update(attempts=0)\n'
    calls = [n for n in ast.walk(ast.parse(bad)) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
    assert [root_name(c.func.value) for c in calls if c.func.attr == "update"] == ["Job", "x"]
    assert FORBIDDEN_TEXT.search(bad.splitlines()[1])


def test_import_does_not_import_models():
    code = (
        "import sys\n"
        "import django_leasequeue\n"
        "from django_leasequeue import task, enqueue, JobContext, Backoff, LeaseLost\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('django_leasequeue'))\n"
        "assert 'django_leasequeue.models' not in sys.modules, loaded\n"
        "assert 'django.contrib.contenttypes.models' not in sys.modules\n"
        "@task(name='arch.probe')\n"
        "def probe():\n"
        "    pass\n"
        "assert 'django_leasequeue.models' not in sys.modules\n"
        "print('ok', *loaded)\n"
    )
    # No DJANGO_SETTINGS_MODULE: importing and declaring tasks must not need configured settings.
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(PACKAGE.parent)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok ")
