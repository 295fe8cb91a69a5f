"""pytest plugin of django-leasequeue: fixtures for testing a project's tasks.

Registered through the ``pytest11`` entry point, so pytest loads it in every project where
django-leasequeue is installed. It therefore imports nothing from Django or from the package at
import time and defines only fixtures: a project that does not request them (or does not use
Django at all) is not affected. The fixtures need pytest-django and give the test database access
(through pytest-django's ``db`` fixture, which honours ``@pytest.mark.django_db(transaction=True)``
and ``transactional_db``).

Fixtures:
    leasequeue: a :class:`django_leasequeue.testing.LeaseQueue`: ``drain()``, ``eager()``,
        ``assert_enqueued()``, ``assert_not_enqueued()``, ``enqueued_jobs()``, ``advance_clock()``,
        ``tick_schedules()``, ``simulate_lost_lease()`` and ``clock``.
    leasequeue_clock: the :class:`django_leasequeue.testing.Clock` of the test's connection,
        reset to the real clock after the test.
    leasequeue_eager: runs every job the test enqueues as soon as it is committed (see
        :func:`django_leasequeue.testing.eager`) for the whole test; yields the running
        :class:`~django_leasequeue.testing.DrainResult`.

Without the entry point (running from a source checkout), load it with
``-p django_leasequeue.pytest_plugin``; with it, pass nothing (or ``-p leasequeue`` when plugin
autoloading is disabled): loading the module under a second name is an error in pytest.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

# Every fixture names pytest-django's ``db`` as a parameter, not through getfixturevalue():
# pytest-django sets up the test databases that the collected tests' fixture closures need, so a
# dependency it cannot see statically leaves the test on the REAL database.


@pytest.fixture
def leasequeue_clock(db: None) -> Iterator[Any]:
    """The database clock of the test's connection (``advance()``, ``set()``, ``now()``,
    ``offset``); reset to the real clock at the end of the test."""
    from django.db import DatabaseError

    from django_leasequeue.testing import Clock

    clock = Clock()
    yield clock
    try:
        clock.reset()
    except DatabaseError:
        pass  # the test left its transaction aborted; the rollback that follows undoes the offset


@pytest.fixture
def leasequeue(leasequeue_clock: Any) -> Any:
    """Testing helpers on one object; see :class:`django_leasequeue.testing.LeaseQueue`."""
    from django_leasequeue.testing import LeaseQueue

    return LeaseQueue(clock=leasequeue_clock)


@pytest.fixture
def leasequeue_eager(db: None) -> Iterator[Any]:
    """Run each job the test enqueues when it is committed, for the whole test. A failed attempt
    fails the test at teardown with its traceback (use ``leasequeue.eager(raise_failures=False)``
    in the test body to inspect failures instead)."""
    from django_leasequeue.testing import eager

    with eager() as result:
        yield result
