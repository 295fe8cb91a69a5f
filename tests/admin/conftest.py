"""Fixtures of the admin tests: users with and without the operator permissions."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from django_leasequeue import health, store


def make_user(username: str, *codenames: str) -> User:
    """A staff user with the given ``django_leasequeue`` permission codenames."""
    user = User.objects.create_user(username, password="pw", is_staff=True)
    perms = Permission.objects.filter(content_type__app_label="django_leasequeue", codename__in=codenames)
    assert perms.count() == len(codenames), f"unknown permission among {codenames}"
    user.user_permissions.set(perms)
    return user


def client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def operator_client(db) -> Client:
    """Sees jobs and dead letters and may cancel / retry now, but has no ``replay_job``."""
    return client_for(make_user("operator", "view_job", "change_job", "view_deadletter"))


@pytest.fixture
def viewer_client(db) -> Client:
    """May only look at jobs."""
    return client_for(make_user("viewer", "view_job"))


@pytest.fixture
def replayer_client(db) -> Client:
    """May look at jobs and replay them, nothing else."""
    return client_for(make_user("replayer", "view_job", "view_deadletter", "replay_job"))


@pytest.fixture
def page(monkeypatch):
    """A headless Chromium page at 1400 x 1000 (see ``tests/admin/browser.py``)."""
    from tests.admin import browser  # here, not at the top: it skips the module without Playwright

    # Playwright's sync API runs an event loop in this thread; the test's own ORM calls are safe.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    yield from browser.open_browser()


@pytest.fixture
def frozen(monkeypatch):
    """Every snapshot of the pages at one database instant, so the page and a poll read the same ages."""
    at = store.db_now()
    snapshot = health.snapshot
    monkeypatch.setattr(health, "snapshot", lambda **kw: snapshot(**{"now": at, **kw}))
    return at


class FrozenNow:
    """The database clock as the admin's pages read it (``store.db_now()``), held at one instant
    until :meth:`advance` moves it: a page's relative times ("in 4 min", "5 min" of wait) then do
    not depend on how long the request took on a loaded machine."""

    def __init__(self, at: datetime) -> None:
        self.at = at

    def advance(self, seconds: float) -> None:
        self.at += timedelta(seconds=seconds)

    def __call__(self, alias: str | None = None) -> datetime:
        return self.at


@pytest.fixture
def frozen_now(monkeypatch) -> FrozenNow:
    """``store.db_now()`` held at the database's current instant (see :class:`FrozenNow`)."""
    clock = FrozenNow(store.db_now())
    monkeypatch.setattr(store, "db_now", clock)
    return clock
