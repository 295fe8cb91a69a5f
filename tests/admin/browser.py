"""What the real-browser admin tests share: headless Chromium through Playwright, a logged-in page,
screenshots, and the check that a page's main table fits its viewport.

Needs Debian's ``chromium`` (``/usr/bin/chromium``, or ``LEASEQUEUE_CHROMIUM``) and the
``playwright`` Python package; ``scripts/test`` installs both. A test module that imports this one
is skipped, saying which is missing, when either is absent: put ``pytestmark = browser.MARKS``
in it. The ``page`` fixture (1400 x 1000) is in ``tests/admin/conftest.py``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from tests.conftest import ROOT

CHROMIUM = os.environ.get("LEASEQUEUE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCREENSHOTS = ROOT / "build" / "screenshots"

#: The widths every console page is checked at: a laptop and a phone (CSS pixels).
WIDTHS = {"desktop": 1280, "phone": 390}

playwright_api = pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed "
                                     "(pip install -e '.[dev]'; scripts/test does it)")

MARKS = [
    pytest.mark.browser,
    pytest.mark.skipif(not (os.access(CHROMIUM, os.X_OK) or shutil.which("chromium")),
                       reason=f"Chromium is not installed at {CHROMIUM} "
                              "(apt-get install chromium; scripts/test does it)"),
]


def executable() -> str | None:
    """The Chromium binary: ``LEASEQUEUE_CHROMIUM`` or ``/usr/bin/chromium``, else ``chromium`` on the PATH."""
    return CHROMIUM if os.access(CHROMIUM, os.X_OK) else shutil.which("chromium")


def open_browser(width: int = 1400, height: int = 1000) -> Iterator[Any]:
    """Yield a Playwright page in headless Chromium at ``width`` x ``height`` CSS pixels."""
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable(), args=CHROMIUM_ARGS, headless=True)
        try:
            context = browser.new_context(viewport={"width": width, "height": height})
            page = context.new_page()
            page.set_default_timeout(60_000)  # generous: CI shares 2 cores with PostgreSQL and workers
            yield page
        finally:
            browser.close()
            # Inside sync_playwright() an event loop runs in this thread, so asgiref gives this
            # context its own database connections; close them here, or they outlive the test and
            # the test database cannot be dropped.
            connections.close_all()


def log_in(page: Any, base_url: str, username: str = "ops", password: str = "pw") -> None:
    """Log in through the admin's login form."""
    page.goto(f"{base_url}/admin/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_selector("#content")


def shot(page: Any, name: str) -> Path:
    """Save a full-page screenshot as ``build/screenshots/<name>``; return its path."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    target = SCREENSHOTS / name
    page.screenshot(path=str(target), full_page=True)
    return target


# How far the page and the main table stick out to the right of the viewport, in CSS pixels. A
# table inside a scrolling wrapper (overflow-x: auto) may be wider than the viewport; then the
# wrapper is what must fit, and what the table cuts off stays reachable by scrolling it.
_OVERFLOW = """(selector) => {
    const table = document.querySelector(selector);
    if (!table) return {missing: true};
    const vw = document.documentElement.clientWidth;
    let box = table;
    for (let el = table.parentElement; el && el !== document.body; el = el.parentElement) {
        const style = getComputedStyle(el);
        if (style.overflowX === 'auto' || style.overflowX === 'scroll') { box = el; break; }
    }
    return {missing: false, page: document.documentElement.scrollWidth - vw,
            table: Math.ceil(box.getBoundingClientRect().right) - vw,
            clipped: table.scrollWidth - table.clientWidth};
}"""


def horizontal_overflow(page: Any, selector: str) -> dict[str, Any]:
    """Measure the page's and the main table's overflow past the viewport's right edge."""
    result: dict[str, Any] = page.evaluate(_OVERFLOW, selector)
    return result


def assert_fits(page: Any, selector: str) -> None:
    """Assert that neither the page nor the table ``selector`` overflows the viewport horizontally."""
    measured = horizontal_overflow(page, selector)
    assert not measured["missing"], f"no element matches {selector!r} on {page.url}"
    assert measured["page"] <= 0 and measured["table"] <= 0, f"{selector} overflows on {page.url}: {measured}"
