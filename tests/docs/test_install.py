"""The install instructions work without a release: no page tells a reader to install
django-leasequeue from the package index (it is not there), and each page a newcomer starts from
says how to install a checkout or a wheel built from one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
# A pip install of the project by its index name, with or without extras or quotes.
FROM_THE_INDEX = re.compile(r"""pip install +["']?django-leasequeue\b""")
STARTING_PAGES = ["README.md", "docs/tutorials/tutorial.md", "docs/tutorials/quickstart.md",
                  "docs/howto/django-tasks.md"]


def test_no_page_installs_from_the_package_index():
    found = [f"{page.relative_to(ROOT)}:{number}: {line.strip()}"
             for page in PAGES for number, line in enumerate(page.read_text().splitlines(), 1)
             if FROM_THE_INDEX.search(line)]
    assert found == []


@pytest.mark.parametrize("name", STARTING_PAGES)
def test_the_starting_pages_say_how_to_install_a_checkout_or_a_wheel(name):
    text = (ROOT / name).read_text()
    assert "not on PyPI yet" in text
    assert "pip install /path/to/django-leasequeue " in text or "pip install /path/to/django-leasequeue`" in text
    assert "pip install build && python -m build /path/to/django-leasequeue" in text
    assert "pip install /path/to/django-leasequeue/dist/django_leasequeue-*.whl" in text
