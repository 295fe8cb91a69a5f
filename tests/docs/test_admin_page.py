"""docs/admin.md, the operator console's tour, shows every screenshot in docs/img/admin/ and only
pictures that exist there (``scripts/screenshots`` writes them)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "admin.md"
IMAGES = ROOT / "docs" / "img" / "admin"
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


def shown(text: str) -> list[str]:
    """The targets of the Markdown images in ``text``, in order."""
    return IMAGE.findall(text)


def test_every_picture_the_tour_shows_exists_and_every_screenshot_is_shown():
    targets = shown(PAGE.read_text())
    assert targets, "docs/admin.md shows no picture"
    assert [t for t in targets if not (PAGE.parent / t).is_file()] == []
    on_disk = {f"img/admin/{p.name}" for p in IMAGES.glob("*.png")}
    assert sorted(on_disk - set(targets)) == []
    assert len(targets) == len(set(targets)), "a picture is shown twice"


def test_the_image_pattern_reads_attributes_and_skips_links():
    text = "![a](img/admin/a.png){ width=\"300\" } [b](img/admin/b.png) ![c](img/admin/c.png)"
    assert shown(text) == ["img/admin/a.png", "img/admin/c.png"]
