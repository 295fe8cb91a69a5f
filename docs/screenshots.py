"""The operator console's screenshots in ``docs/img/admin/`` (``scripts/screenshots`` runs this).

Seeds the database named by ``LEASEQUEUE_DB_NAME`` (already created and migrated, and emptied
first: ``seed_console --reset``), creates the superuser ``ops`` (password ``pw``), starts
``manage.py runserver`` on a free port, and saves one PNG per row of :data:`PAGES` with headless
Chromium (Debian's ``/usr/bin/chromium`` or ``LEASEQUEUE_CHROMIUM``, driven by Playwright): the
visible viewport only (``full_page=False``, :data:`HEIGHT` CSS pixels tall), which keeps each file
small. A page whose URL does not resolve on this checkout (the queue page, built on another branch)
is skipped with a printed note, so that the script can be run again once it exists.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "img" / "admin"
#: Viewport heights (CSS pixels) of the screenshots, by width.
HEIGHT = {1280: 860, 390: 844}


@dataclass(frozen=True)
class Page:
    """One screenshot.

    Attributes:
        name: the PNG's name without ``.png`` (a width other than 1280 adds ``-<width>``).
        url_name: the admin URL name, reversed with ``args``.
        args: names of :class:`~invoices.management.commands.seed_console.Seeded` attributes, or
            literal strings prefixed with ``=``.
        query: the query string (without ``?``), or "".
        widths: CSS widths to shoot at.
        anchor: a selector scrolled to the top of the viewport before the shot, or "".
        height: the viewport's height at 1280 px, when the page needs more than :data:`HEIGHT`.
    """

    name: str
    url_name: str
    args: tuple[str, ...] = ()
    query: str = ""
    widths: tuple[int, ...] = (1280,)
    anchor: str = ""
    height: int = 0


APP = "admin:django_leasequeue"
PAGES = [
    Page("dashboard", f"{APP}_dashboard_changelist", widths=(1280, 390)),
    Page("jobs", f"{APP}_job_changelist", widths=(1280, 390)),
    Page("job", f"{APP}_job_change", ("dead_job",), height=1700),
    Page("dead-letters", f"{APP}_deadletter_changelist"),
    Page("incident-search", f"{APP}_deadletter_changelist", query="error_type=KeyError&failed=1h"),
    Page("bulk-confirm", f"{APP}_deadletter_bulk", ("=replay",),
         query="task=invoices.tasks.import_order&error_type=builtins.KeyError"),
    Page("replay-form", f"{APP}_job_replay", ("dead_job",)),
    Page("schedules", f"{APP}_schedule_changelist"),
    Page("schedule-history", f"{APP}_schedule_change", ("schedule",), anchor=".lq-schedule-history"),
    Page("workers", f"{APP}_workerprocess_changelist"),
    Page("workflows", f"{APP}_workflow_changelist"),
    Page("workflow", f"{APP}_workflow_change", ("batch",), height=1300),
    # The queue page (its URL name is the lead's, from another branch): skipped until it resolves.
    Page("queue", f"{APP}_queue", ("=invoices",)),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_for(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)  # polling a starting server, not timing a test


def resolve(page: Page, seeded: Any) -> str | None:
    """The path of ``page`` (with its query), or None when its URL name does not resolve here."""
    from django.urls import NoReverseMatch, reverse

    args = [a[1:] if a.startswith("=") else str(getattr(seeded, a)) for a in page.args]
    try:
        path = reverse(page.url_name, args=args)
    except NoReverseMatch:
        return None
    return f"{path}?{page.query}" if page.query else path


def main() -> int:
    """Seed, serve and shoot every page; return the exit status (0, or 1 when a page failed)."""
    sys.path[:0] = [str(ROOT), str(ROOT / "testproject")]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    import django

    # The ORM calls between shots run in the thread where Playwright's sync API runs its event loop.
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    django.setup()
    from django.contrib.auth.models import User
    from invoices.management.commands.seed_console import keep_alive, reset, seed
    from playwright.sync_api import sync_playwright

    reset()
    seeded = seed()
    User.objects.filter(username="ops").delete()
    User.objects.create_superuser("ops", "ops@example.com", "pw")
    print(f"seeded: {seeded}")
    OUT.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, str(ROOT / "testproject" / "manage.py"), "runserver", "--noreload",
                               "--insecure", f"127.0.0.1:{port}"], env=os.environ.copy(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    failed = 0
    try:
        _wait_for(f"{base}/admin/login/")
        chromium = os.environ.get("LEASEQUEUE_CHROMIUM", "/usr/bin/chromium")
        executable = chromium if os.access(chromium, os.X_OK) else shutil.which("chromium")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=executable, headless=True,
                                        args=["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"])
            for width in sorted({w for page in PAGES for w in page.widths}, reverse=True):
                context = browser.new_context(viewport={"width": width, "height": HEIGHT[width]})
                tab = context.new_page()
                tab.goto(f"{base}/admin/login/")
                tab.fill("#id_username", "ops")
                tab.fill("#id_password", "pw")
                tab.click("input[type=submit]")
                tab.wait_for_selector("#content")
                # The admin's navigation sidebar collapsed (the admin's own toggle, kept in
                # localStorage), so that the page's content fills the picture.
                tab.evaluate("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")
                for page in PAGES:
                    if width not in page.widths:
                        continue
                    path = resolve(page, seeded)
                    name = page.name if width == 1280 else f"{page.name}-{width}"
                    if path is None:
                        print(f"skipped {name}: {page.url_name} does not resolve on this checkout")
                        continue
                    keep_alive()  # web-1 and the scheduler stay alive however long the shots take
                    tab.set_viewport_size({"width": width, "height": page.height or HEIGHT[width]})
                    response = tab.goto(f"{base}{path}")
                    if response is None or response.status != 200:
                        print(f"FAILED {name}: {path} answered {response.status if response else 'nothing'}")
                        failed += 1
                        continue
                    if page.anchor:
                        # Its section's heading too: scroll to the enclosing fieldset, a little above.
                        tab.eval_on_selector(page.anchor, "el => { (el.closest('fieldset') || el).scrollIntoView("
                                                          "{block: 'start'}); window.scrollBy(0, -12); }")
                    target = OUT / f"{name}.png"
                    tab.screenshot(path=str(target), full_page=False)
                    print(f"saved {target.relative_to(ROOT)} ({target.stat().st_size // 1024} KiB) from {path}")
                context.close()
            browser.close()
    finally:
        server.terminate()
        server.wait(30)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
