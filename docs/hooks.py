"""MkDocs hook: quote django-leasequeue's real SQL into the pages, so the docs never drift from it.

A line that holds only a directive is replaced by a fenced ``sql`` block:

* ``[[sql store.claim.JOB_CLAIM]]``: a statement constant of a module of the
  :mod:`django_leasequeue.store` package, exactly as the module builds it (table names filled in,
  parameters as ``%(name)s``). The module is named so that a reader knows where the statement lives.
* ``[[sql migrations.0002_flow_control.CONC_COUNT_INDEX]]``: a SQL constant of a migration.
* ``[[ddl Job]]``: the ``CREATE INDEX`` and constraint DDL Django generates for a model's
  ``Meta.indexes`` and ``Meta.constraints`` (rendered without a database connection).

An unknown name fails the build (``mkdocs build --strict`` in scripts/test). The hook sets Django
up with the test project's settings (``testproject.settings``); no database is contacted.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parent.parent
_DIRECTIVE = re.compile(r"^\[\[(sql|ddl) ([\w.]+)\]\]$", re.MULTILINE)
_ready = False


def _setup() -> None:
    global _ready
    if _ready:
        return
    for path in (ROOT, ROOT / "testproject"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    import django

    django.setup()
    _ready = True


def _sql(name: str) -> str:
    module_name, _, attr = name.rpartition(".")
    if module_name.count(".") != 1 or not module_name.startswith(("store.", "migrations.")):
        raise PluginError(f"[[sql {name}]]: expected store.<module>.NAME or migrations.<migration>.NAME")
    try:
        module = importlib.import_module(f"django_leasequeue.{module_name}")
    except ImportError as exc:
        raise PluginError(f"[[sql {name}]]: no module django_leasequeue.{module_name}") from exc
    if attr not in vars(module):  # defined there, not imported: the block names its real home
        raise PluginError(f"[[sql {name}]]: {module.__name__} defines no SQL constant {attr!r}")
    value = vars(module)[attr]
    if not isinstance(value, str):
        raise PluginError(f"[[sql {name}]]: {module.__name__}.{attr} is not SQL text")
    path = module.__name__.replace(".", "/")
    return f"-- {path}.py: {attr}\n" + value.strip("\n")


def _ddl(model_name: str) -> str:
    from django.db import connection

    from django_leasequeue import models

    model = getattr(models, model_name, None)
    if model is None:
        raise PluginError(f"[[ddl {model_name}]]: django_leasequeue.models has no model {model_name!r}")
    editor = connection.SchemaEditorClass(connection, collect_sql=True, atomic=False)
    lines = [f"{index.create_sql(model, editor)};" for index in model._meta.indexes]
    lines += [f"{constraint.create_sql(model, editor)};" for constraint in model._meta.constraints]
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if "[[sql " not in markdown and "[[ddl " not in markdown:
        return markdown
    _setup()

    def render(match: re.Match[str]) -> str:
        kind, name = match.groups()
        body = _sql(name) if kind == "sql" else _ddl(name)
        return f"```sql\n{body}\n```"

    return _DIRECTIVE.sub(render, markdown)
