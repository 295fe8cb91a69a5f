"""The tests under ``tests/docs`` carry the ``docs`` marker: they check what the documentation
says (the tutorial followed step by step, the reference pages against the code, behaviour a page
quotes), so a run can select or skip them as a group (``-m "not docs"``)."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test collected from this folder ``docs``."""
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.docs)
