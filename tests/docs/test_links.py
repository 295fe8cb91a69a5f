"""Every relative link in the docs and the READMEs points at a file that exists. ``mkdocs build
--strict`` checks links between pages but not links to other files (an example config, a script)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    broken = []
    for target in LINK.findall(page.read_text()):
        path = target.split("#", 1)[0]
        if not path or re.match(r"^[a-z][a-z0-9+.-]*:", path):  # an anchor, or http:, mailto:, ...
            continue
        if not (page.parent / path).exists():
            broken.append(f"{page.relative_to(root)}: {target}")
    return broken


def test_relative_links_resolve():
    pages = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md", ROOT / "tests" / "README.md"]
    assert [b for page in pages for b in broken_links(page)] == []


def test_the_link_check_sees_a_missing_file(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("[ok](p.md) [web](https://example.org/x) [anchor](#top) [gone](examples/x.yml)")
    assert [b.split(": ", 1)[1] for b in broken_links(page, tmp_path)] == ["examples/x.yml"]

