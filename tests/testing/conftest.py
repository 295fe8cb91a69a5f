"""Fixtures for the testing-helper tests: accounts of the test project's invoice app."""

import pytest
from invoices.models import Account

PERIOD = "2026-11"


@pytest.fixture
def accounts(db):
    """Three accounts, by primary key order."""
    return [Account.objects.create(name=f"account {i}", email=f"billing{i}@example.com") for i in range(3)]
