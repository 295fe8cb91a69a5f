"""Every page of the operator console fits a laptop's and a phone's width (``browser.WIDTHS``: 1280
and 390 CSS pixels), on realistic content: the state ``manage.py seed_console`` builds (3,000 done
jobs, 50 dead letters of three error types, backlogs, running, snoozed and retrying jobs, six
schedules, two workflows, two workers, one with an expired lease), seeded once for the module.

"Fits" is :func:`browser.assert_fits`: neither the page nor the page's main table sticks out past
the viewport's right edge (a table inside a scrolling wrapper may be wider; the wrapper must fit).
The other browser tests check what the pages do; this module owns their widths, with the layout
checks of bugs 4 (a dead-letter page of ordinary height), 11 (the replay form's labels above their
fields) and 15 (link-buttons not underlined).

The state is seeded once (``module_console``), not per test: pytest-django's ``live_server`` would
flush it after every test (and seeding takes seconds). The fixture commits it, holds database
access open for the module, serves the test database with its own live server thread, and deletes
every row at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import connection, connections
from django.urls import NoReverseMatch, reverse
from invoices.management.commands.seed_console import Seeded, reset, seed

from django_leasequeue.admin import ReplayForm
from tests.admin import browser
from tests.admin.browser import WIDTHS, assert_fits

# The marker makes pytest-django create the test database (and run each test in a transaction that
# writes nothing); the state itself is committed once, by module_console.
pytestmark = [*browser.MARKS, pytest.mark.django_db]

APP = "admin:django_leasequeue"


def dead_letters_are_compact(page: Any, width: int) -> None:
    """Bug 4: 50 dead letters with long errors make a page of ordinary height (rows under 45 px and
    at most 600 px of heading, groups and filters above them), not 5,000 px."""
    assert page.locator("#result_list tbody tr").count() == 50
    if width == WIDTHS["desktop"]:
        row = page.evaluate("document.querySelector('#result_list tbody tr').getBoundingClientRect().height")
        assert row < 45, row
        height = page.evaluate("document.documentElement.scrollHeight")
        assert height < 50 * 45 + 600, height


def job_page_buttons(page: Any, width: int) -> None:
    """One heading; bug 15: link-buttons are not underlined."""
    assert page.locator("h1").count() == 1
    decoration = page.evaluate("getComputedStyle(document.querySelector('#lq-edit-replay')).textDecorationLine")
    assert decoration == "none"


def replay_form_labels(page: Any, width: int) -> None:
    """Bug 11: the replay form's labels sit above their fields, flush with them; each field is as
    tall as its text, within ``ReplayForm.MIN_ROWS`` .. ``MAX_ROWS``."""
    for name in ("args", "kwargs"):
        label = page.locator(f"label[for=id_{name}]").bounding_box()
        area = page.locator(f"#id_{name}").bounding_box()
        assert abs(label["x"] - area["x"]) <= 2 and label["y"] < area["y"], (name, label, area)
        lines = page.input_value(f"#id_{name}").count("\n") + 1
        rows = min(ReplayForm.MAX_ROWS, max(ReplayForm.MIN_ROWS, lines))
        assert page.get_attribute(f"#id_{name}", "rows") == str(rows), (name, lines)


def schedule_last_run_reachable(page: Any, width: int) -> None:
    """What the list's scrolling wrapper cuts off stays reachable: the last-run column is in it."""
    assert page.locator("#result_list td.field-last_run").first.is_visible()


@dataclass(frozen=True)
class ConsolePage:
    """One page of the console and what must fit on it.

    Attributes:
        name: the test id.
        url_name: the admin URL name.
        args: :class:`Seeded` attribute names, or literals prefixed with ``=``.
        query: query string without ``?``, or "".
        fits: selectors of the page's main tables (each is checked with ``assert_fits``).
        check: further layout checks, called with the page and the width, or None.
        pending: why the URL may not resolve on this checkout ("" when it must).
    """

    name: str
    url_name: str
    args: tuple[str, ...] = ()
    query: str = ""
    fits: tuple[str, ...] = ("#content-main",)
    check: Callable[[Any, int], None] | None = None
    pending: str = ""


PAGES = [
    ConsolePage("dashboard", f"{APP}_dashboard_changelist", fits=("#lq-queues table", "#lq-processes table")),
    ConsolePage("job-list", f"{APP}_job_changelist", fits=("#result_list",)),
    ConsolePage("job", f"{APP}_job_change", ("dead_job",), fits=("#job_form", ".lq-errors"), check=job_page_buttons),
    ConsolePage("dead-letters", f"{APP}_deadletter_changelist", fits=("#result_list", "#lq-groups table"),
                check=dead_letters_are_compact),
    ConsolePage("incident-search", f"{APP}_deadletter_changelist", query="error_type=KeyError&failed=24h",
                fits=("#result_list",)),
    ConsolePage("bulk-confirm", f"{APP}_deadletter_bulk", ("=replay",),
                query="task=invoices.tasks.import_order&error_type=builtins.KeyError",
                fits=("#lq-sample", "#lq-confirm-summary")),
    ConsolePage("replay-form", f"{APP}_job_replay", ("dead_job",), check=replay_form_labels),
    ConsolePage("schedules", f"{APP}_schedule_changelist", fits=("#result_list",), check=schedule_last_run_reachable),
    ConsolePage("schedule-history", f"{APP}_schedule_change", ("schedule",), fits=(".lq-schedule-history",)),
    ConsolePage("workers", f"{APP}_workerprocess_changelist", fits=(".lq-running", "#content-main")),
    ConsolePage("workflows", f"{APP}_workflow_changelist", fits=("#result_list",)),
    ConsolePage("workflow", f"{APP}_workflow_change", ("batch",), fits=("#lq-steps table",)),
    ConsolePage("halted-sequences", f"{APP}_haltedsequence_changelist"),
    # The page of one queue is built on another branch: skipped here until its URL resolves.
    ConsolePage("queue", f"{APP}_queue", ("=invoices",), pending="the queue page is not merged yet"),
]


@dataclass
class Console:
    """The seeded console: the live server's URL, what was seeded, one logged-in tab per width."""

    url: str
    seeded: Seeded
    tabs: dict[int, Any]


@pytest.fixture(scope="module")
def module_console(django_db_setup, django_db_blocker) -> Iterator[Console]:
    """Seed once, serve the test database, log in at each width; delete every row at the end."""
    from django.contrib.auth.models import User
    from pytest_django.live_server_helper import LiveServer

    mp = pytest.MonkeyPatch()
    # Playwright's sync API runs an event loop in this thread; the ORM calls here come before and after it.
    mp.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with django_db_blocker.unblock():
        # reset() deletes every queue row: only ever in the test database.
        assert str(connection.settings_dict["NAME"]).startswith("test_"), connection.settings_dict["NAME"]
        reset()
        User.objects.filter(username="ops").delete()
        seeded = seed()
        User.objects.create_superuser("ops", "ops@example.com", "pw")
        server = LiveServer("localhost")
        try:
            with browser.playwright_api.sync_playwright() as p:
                chromium = p.chromium.launch(executable_path=browser.executable(), args=browser.CHROMIUM_ARGS,
                                             headless=True)
                tabs = {}
                for width in WIDTHS.values():
                    tab = chromium.new_context(viewport={"width": width, "height": 1000}).new_page()
                    tab.set_default_timeout(60_000)
                    browser.log_in(tab, server.url)
                    tabs[width] = tab
                try:
                    yield Console(server.url, seeded, tabs)
                finally:
                    chromium.close()
                    # Inside sync_playwright() an event loop runs in this thread, so asgiref gave
                    # the tests' transactions connections of their own: closed here, or they
                    # outlive the module and the test database cannot be dropped.
                    connections.close_all()
        finally:
            server.stop()
            reset()
            User.objects.all().delete()
            connections.close_all()
            mp.undo()


def resolve(entry: ConsolePage, seeded: Seeded) -> str | None:
    """The page's path with its query, or None when its URL name does not resolve."""
    args = [a[1:] if a.startswith("=") else str(getattr(seeded, a)) for a in entry.args]
    try:
        path = reverse(entry.url_name, args=args)
    except NoReverseMatch:
        return None
    return f"{path}?{entry.query}" if entry.query else path


@pytest.mark.parametrize("width", sorted(WIDTHS.values()))
@pytest.mark.parametrize("entry", PAGES, ids=[p.name for p in PAGES])
def test_the_page_fits(module_console: Console, entry: ConsolePage, width: int) -> None:
    path = resolve(entry, module_console.seeded)
    if path is None:
        assert entry.pending, f"{entry.url_name} does not resolve"
        pytest.skip(f"{entry.url_name} does not resolve: {entry.pending}")
    page = module_console.tabs[width]
    response = page.goto(f"{module_console.url}{path}")
    assert response is not None and response.status == 200, path
    for selector in entry.fits:
        assert_fits(page, selector)
    if entry.check:
        entry.check(page, width)
    browser.shot(page, f"width-{entry.name}-{width}.png")


def test_the_table_lists_every_page_of_the_console() -> None:
    """Every changelist of the app's admin is in :data:`PAGES` (a new page gets its width test)."""
    from django.contrib import admin

    listed = {p.url_name for p in PAGES}
    models = {m._meta.model_name for m in admin.site._registry if m._meta.app_label == "django_leasequeue"}
    assert sorted({f"{APP}_{m}_changelist" for m in models} - listed) == []
