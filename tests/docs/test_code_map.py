"""docs/explanation/code-map.md names every module of the package, and every module it names exists,
so the map a newcomer reads cannot fall behind the code."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "django_leasequeue"
PAGE = ROOT / "docs" / "explanation" / "code-map.md"
MODULE_NAME = re.compile(r"`([a-z_][a-z0-9_.]*)`")


def package_modules() -> set[str]:
    """Dotted names inside the package (``""`` is not listed; ``__init__`` stands for it)."""
    names = {"__init__"}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).with_suffix("")
        if rel.parts[0] == "migrations" or rel.parts == ("__init__",):
            continue
        parts = rel.parts[:-1] if rel.parts[-1] == "__init__" else rel.parts
        if parts[-1:] == ("__init__",) or not parts:
            continue
        names.add(".".join(parts))
    return names


def listed_modules(text: str) -> set[str]:
    block = text.split("<!-- code-map:modules -->", 1)[1].split("<!-- /code-map:modules -->", 1)[0]
    names = set()
    for line in block.splitlines():
        names.update(MODULE_NAME.findall(line.split(":", 1)[0]))  # the entry's own name(s)
        names.update(n for n in MODULE_NAME.findall(line) if "." in n and not n.endswith("()"))
    # Names quoted in the descriptions that are not modules (`task`, `TaskSpec`, ...) are ignored
    # unless they look dotted; dotted ones must be modules.
    return names


def test_the_code_map_lists_every_module_and_only_modules():
    text = PAGE.read_text()
    listed = listed_modules(text)
    modules = package_modules()
    assert sorted(modules - listed) == [], "add these modules to docs/explanation/code-map.md"
    assert sorted(n for n in listed if n not in modules) == [], "the code map names modules that do not exist"


def test_the_checker_sees_a_missing_and_an_invented_module():
    text = "<!-- code-map:modules -->\n- `store`: `store.claim`, `store.nothing`\n<!-- /code-map:modules -->"
    assert listed_modules(text) == {"store", "store.claim", "store.nothing"}
