"""The tests under ``tests/docs`` carry the ``docs`` marker: they check what the documentation
says (the tutorial followed step by step, the reference pages against the code, behaviour a page
quotes), so a run can select or skip them as a group (``-m "not docs"``).

``fresh_project`` gives the tests that follow a page as a newcomer would an empty project directory
and a throwaway database (see ``fresh_project.py``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .fresh_project import Project, create_database, drop_database, throwaway_database_name

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test collected from this folder ``docs``."""
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.docs)


@pytest.fixture
def fresh_project(tmp_path: Path) -> Iterator[Callable[..., Project]]:
    """``fresh_project(directory, suffix, create=True)``: an empty directory ``directory`` (under
    the test's tmp_path) and the test database ``test_<run's database>_<suffix>``, created unless
    ``create`` is False (the page creates it); the database is dropped at the end."""
    made: list[str] = []

    def make(directory: str, suffix: str, *, create: bool = True) -> Project:
        database = throwaway_database_name(suffix)
        made.append(database)
        if create:
            create_database(database)
        else:
            drop_database(database)  # left by an interrupted run
        path = tmp_path / directory
        path.mkdir()
        return Project(path, database)

    yield make
    for database in made:
        drop_database(database)
