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
# monitoring, the admin dashboard and the metrics, and store/search.py the console's previews: they only
# read, no locks and no writes (checked below).
STORE = "store"
READ_ONLY_QUERY_MODULES = {"store/read.py", "store/search.py"}
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
    # Monitoring's statements are in store/read.py; the health package turns their rows into figures.
    paths = sorted((PACKAGE / "health").glob("*.py"))
    assert paths
    for path in paths:
        text = path.read_text()
        assert not SQL_TEXT.search(text), (path.name, SQL_TEXT.search(text))
        assert not FORBIDDEN_TEXT.search(text), path.name


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


# ---- The layers ----------------------------------------------------------------------------------
# Imports flow one way, from a layer to the same or a lower one, imports inside functions
# included, and no two modules import each other, even lazily. A module is named by its dotted
# path inside the package ("store.read"); "name.*" places every module of a package; "" is the
# package's __init__ (the public facade).
LAYERS: dict[str, tuple[str, ...]] = {
    "leaves": ("exceptions", "conf", "cron", "cron.*", "retry", "runtime", "signals", "compat_tasks", "registry",
               "arguments", "payload", "failures", "steps", "logging"),
    "models": ("models", "stat_models"),
    "store": ("store", "store.*"),
    "services": ("context", "dependents", "enqueueing", "schedules", "executor", "attempt_hooks", "attempt_events",
                 "child", "child_attempts", "worker", "worker.*", "processes", "reaper", "scheduler", "health",
                 "health.*", "notify", "workflows", "workflows.*", "tracing"),
    "adapters": ("admin", "admin.*", "backends", "backends.*", "checks", "apps", "views", "urls", "metrics",
                 "worker_metrics", "testing", "testing.*", "pytest_plugin", "management", "management.*", ""),
}
LAYER_ORDER = list(LAYERS)


def layer_of(module: str, layers: dict[str, tuple[str, ...]] = LAYERS) -> str | None:
    """The layer ``module`` (a dotted name inside the package, ``""`` for its ``__init__``) is
    placed in, or None when the map does not place it. An exact entry wins over a ``name.*``."""
    for layer, entries in layers.items():
        if module in entries:
            return layer
    for layer, entries in layers.items():
        if any(e.endswith(".*") and module.startswith(e[:-1]) for e in entries):
            return layer
    return None


def package_modules(package: Path = PACKAGE) -> dict[str, str]:
    """``{dotted module name inside the package: source}`` for every module but the migrations."""
    modules = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if rel.parts[0] == "migrations":
            continue
        parts = rel.with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path.read_text()
    return modules


def _is_type_checking_block(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:`` or ``if typing.TYPE_CHECKING:``, the test alone (a compound test such
    as ``TYPE_CHECKING or x`` runs at import time). Whether the name really is typing's is checked
    by :func:`test_type_checking_is_always_typings`."""
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, typing_only: bool = False):
    """``(node, typing_only)`` for every import statement in ``tree``, at any depth (functions,
    methods, ``try``, ``if``); ``typing_only`` marks those under ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, typing_only
        if _is_type_checking_block(child):
            assert isinstance(child, ast.If)
            for stmt in child.body:
                yield from _imports(ast.Module(body=[stmt], type_ignores=[]), True)
            for stmt in child.orelse:
                yield from _imports(ast.Module(body=[stmt], type_ignores=[]), typing_only)
        else:
            yield from _imports(child, typing_only)


def import_edges(modules: dict[str, str], root: str = "django_leasequeue") -> list[tuple[str, str, int, bool]]:
    """Every import from one package module to another: ``(importer, imported, line, typing_only)``,
    by dotted names inside the package (``""`` for the package's ``__init__``).

    ``import root.x.y``, ``from root.x import y``, ``from . import y``, ``from .x import y`` and
    ``from ..x import y`` are resolved against ``modules``: ``from P import y`` names the module
    ``P.y`` when there is one, else ``P`` itself; a dotted name that is no module resolves to its
    longest prefix that is one. Imports of other packages are left out, and so is a module's
    import of itself."""

    def known(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    def absolute(dotted: str) -> str | None:
        if dotted == root:
            return ""
        if dotted.startswith(root + "."):
            return dotted[len(root) + 1:]
        return None

    edges = []
    for importer, text in sorted(modules.items()):
        is_package = importer == "" or any(m.startswith(importer + ".") for m in modules)
        here = importer if is_package else importer.rpartition(".")[0]
        for node, typing_only in _imports(ast.parse(text)):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                for alias in node.names:
                    inside = absolute(alias.name)
                    if inside is not None:
                        targets.append(known(inside))
            else:
                if node.level:
                    base_parts = here.split(".") if here else []
                    if node.level - 1 > len(base_parts):
                        continue
                    base_parts = base_parts[:len(base_parts) - (node.level - 1)]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                else:
                    inside = absolute(node.module or "")
                    if inside is None:
                        continue
                    base = inside
                for alias in node.names:
                    sub = f"{base}.{alias.name}" if base else alias.name
                    targets.append(sub if sub in modules else known(base))
            for target in dict.fromkeys(targets):
                if target != importer:
                    edges.append((importer, target, node.lineno, typing_only))
    return edges


def _shown(module: str) -> str:
    return module or "__init__"


def import_cycles(edges: list[tuple[str, str, int, bool]]) -> list[list[str]]:
    """The import cycles among the modules: for each strongly connected group of two or more
    modules (typing-only imports left out: they never run), one cycle through it, as the list of
    modules from its first (in sorted order) back to it."""
    graph: dict[str, set[str]] = {}
    for source, target, _line, typing_only in edges:
        if not typing_only:
            graph.setdefault(source, set()).add(target)
            graph.setdefault(target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def connect(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                connect(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    cycles = []
    for group in sorted(groups, key=lambda g: sorted(g)):
        start = min(group)
        paths = {start: [start]}  # breadth-first inside the group: a shortest cycle through start
        queue = [start]
        cycle = None
        while queue and cycle is None:
            node = queue.pop(0)
            for succ in sorted(graph[node] & group):
                if succ == start:
                    cycle = paths[node] + [start]
                    break
                if succ not in paths:
                    paths[succ] = paths[node] + [succ]
                    queue.append(succ)
        assert cycle is not None
        cycles.append(cycle)
    return cycles


def layer_problems(modules: dict[str, str], layers: dict[str, tuple[str, ...]] = LAYERS) -> list[str]:
    """Every breach of the layering among ``modules``: a module the map does not place, an import
    of a higher layer (``if TYPE_CHECKING:`` imports included: a type is a dependency too), and
    each import cycle. Empty when the layers hold."""
    order = list(layers)
    problems = [f"{_shown(m)}: not placed in a layer (add it to LAYERS)"
                for m in sorted(modules) if layer_of(m, layers) is None]
    edges = import_edges(modules)
    for source, target, line, typing_only in edges:
        low, high = layer_of(source, layers), layer_of(target, layers)
        if low is not None and high is not None and order.index(high) > order.index(low):
            kind = " (under TYPE_CHECKING)" if typing_only else ""
            problems.append(f"{_shown(source)}:{line}: {low} module imports {_shown(target)} ({high}){kind}")
    for cycle in import_cycles(edges):
        problems.append("import cycle: " + " -> ".join(_shown(m) for m in cycle))
    return problems


def test_every_module_is_placed_in_a_layer():
    unplaced = [_shown(m) for m in package_modules() if layer_of(m) is None]
    assert unplaced == [], f"place these modules in LAYERS (tests/test_architecture.py): {unplaced}"


def test_imports_flow_down_the_layers_without_cycles():
    problems = layer_problems(package_modules())
    assert problems == [], "the layering is broken:\n" + "\n".join(problems)


def test_the_layer_checker_catches_upward_imports_and_cycles():
    # Guard against a checker that silently finds nothing: every import form, at any depth.
    layers = {"leaves": ("retry", "cron"), "models": ("models",), "store": ("store", "store.*"),
              "services": ("worker.*",), "adapters": ("",)}
    modules = {
        "": "from .retry import Backoff\n",
        "cron": "import datetime\n",
        "retry": "def delay():\n    from .store import job_claim\n    return job_claim\n",
        "models": "from django_leasequeue import cron\n",
        "store": "from . import read\n",
        "store.read": "from .. import models\nfrom django_leasequeue.store import write\n",
        "store.write": "import django_leasequeue.store.read\n",
        "worker.loop": ("class W:\n    def run(self):\n        from ..store.read import x\n"
                        "        import django_leasequeue\n"),
        "worker.extra": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..worker import loop\n",
        "stray": "",
    }
    edges = {(s, t) for s, t, _line, _typing in import_edges(modules)}
    assert edges == {("", "retry"), ("retry", "store"), ("models", "cron"), ("store", "store.read"),
                     ("store.read", "models"), ("store.read", "store.write"), ("store.write", "store.read"),
                     ("worker.loop", "store.read"), ("worker.loop", ""), ("worker.extra", "worker.loop")}
    assert layer_problems(modules, layers) == [
        "stray: not placed in a layer (add it to LAYERS)",
        "retry:2: leaves module imports store (store)",
        "worker.loop:4: services module imports __init__ (adapters)",
        "import cycle: store.read -> store.write -> store.read",
    ]
    # A lazy cycle (both imports inside functions) is a cycle too.
    lazy = {"a": "def f():\n    from . import b\n", "b": "def g():\n    from .a import f\n"}
    assert import_cycles(import_edges(lazy)) == [["a", "b", "a"]]


# Imports the AST walk above cannot follow: a module name computed at run time. Each one is
# declared here with its reason; any other call of these functions in the package fails the test,
# so a dynamic import cannot slip an upward edge or a cycle past the layer check.
DYNAMIC_IMPORT_CALLS = {"import_module", "__import__", "import_string", "get_model", "get_models"}
DYNAMIC_IMPORTS = {
    ("", "__getattr__"): "the public facade resolves its names from lower layers on first use",
    ("registry", "autodiscover"): "imports the project's own tasks modules (not the package's)",
    ("registry", "__getattr__"): "names that moved out of registry (registry.MOVED), resolved on first "
                                 "use with a DeprecationWarning: the one upward edge, kept for old imports",
}


def dynamic_imports(modules: dict[str, str]) -> list[tuple[str, str, int]]:
    """``(module, enclosing function or "", line)`` of every call of a dynamic import function."""
    found = []

    def visit(node: ast.AST, module: str, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function
            if isinstance(child, ast.Call):
                func = child.func
                name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
                if name in DYNAMIC_IMPORT_CALLS:
                    found.append((module, function, child.lineno))
            visit(child, module, inner)

    for module, text in sorted(modules.items()):
        visit(ast.parse(text), module, "")
    return found


def test_every_dynamic_import_is_declared():
    undeclared = [f"{_shown(m)}:{line} (in {f or 'module body'})" for m, f, line in dynamic_imports(package_modules())
                  if (m, f) not in DYNAMIC_IMPORTS]
    assert undeclared == [], ("a dynamic import hides its target from the layer check; import by name, or "
                              "declare it in DYNAMIC_IMPORTS with the reason:\n" + "\n".join(undeclared))


def test_type_checking_is_always_typings():
    # A module-level ``TYPE_CHECKING = True`` would make the layer check treat real imports as
    # typing-only, and so hide a cycle.
    offenders = []
    for module, text in package_modules().items():
        for node in ast.walk(ast.parse(text)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign | ast.AugAssign) else []
            if any(isinstance(t, ast.Name) and t.id == "TYPE_CHECKING" for t in targets):
                offenders.append(f"{_shown(module)}:{node.lineno}")
            if isinstance(node, ast.ImportFrom) and node.module != "typing" and any(
                    (a.asname or a.name) == "TYPE_CHECKING" for a in node.names):
                offenders.append(f"{_shown(module)}:{node.lineno}")
    assert offenders == [], f"TYPE_CHECKING must be typing's: {offenders}"


def test_the_dynamic_import_check_sees_every_form():
    text = ("import importlib\n"
            "def f():\n"
            "    importlib.import_module('django_leasequeue.store')\n"
            "    __import__('django_leasequeue.store')\n"
            "    from django.utils.module_loading import import_string\n"
            "    import_string('django_leasequeue.worker.WorkerService')\n"
            "    apps.get_model('django_leasequeue', 'Job')\n"
            "x = [__import__(n) for n in ('a',)]\n")
    assert dynamic_imports({"models": text}) == [("models", "f", 3), ("models", "f", 4), ("models", "f", 6),
                                                 ("models", "f", 7), ("models", "", 8)]
