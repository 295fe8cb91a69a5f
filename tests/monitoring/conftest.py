"""Fixtures of the monitoring tests (helpers live in ``helpers.py``)."""

from __future__ import annotations

from datetime import datetime

import pytest

from django_leasequeue import store


@pytest.fixture
def now(db) -> datetime:
    """The database clock at the start of the test (tests then pass it explicitly)."""
    return store.db_now()
