"""A handler thread's session that died with its server while the thread idled (a restart, a
failover) is replaced before the thread's next attempt, once another thread of the process has
found its own session dropped: the attempt does not fail on the dead one.

Real sessions of the test database, ended with ``pg_terminate_backend`` (as a server going away
ends them); each thread keeps its own Django connection, as a worker's threads do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import pytest
from django.db import DatabaseError, connection, connections

from django_leasequeue.runtime import check_connections_after_loss, close_broken_connections

T = TypeVar("T")


class Thread:
    """One dedicated thread (so one Django connection) that runs the calls given to it."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1)

    def __call__(self, fn: Callable[[], T]) -> T:
        return self.pool.submit(fn).result(timeout=30)

    def close(self) -> None:
        self.pool.submit(connections.close_all).result(timeout=30)
        self.pool.shutdown()


@pytest.fixture
def threads(transactional_db) -> Iterator[Callable[[], Thread]]:
    made: list[Thread] = []

    def make() -> Thread:
        made.append(Thread())
        return made[-1]

    yield make
    for t in made:
        t.close()


def backend_pid() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        return cur.fetchone()[0]


def terminate(pid: int) -> None:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(%s), pg_sleep(0.05)", [pid])


def found_dropped() -> str:
    """This thread's statement on its dead session fails; the loop closes it (counting a loss)."""
    try:
        backend_pid()
    except DatabaseError as exc:
        close_broken_connections()
        return type(exc).__name__
    return "no error"


def test_an_idle_threads_dead_session_is_replaced_after_another_thread_found_its_own_dropped(threads):
    idle, loop = threads(), threads()
    idle_pid, loop_pid = idle(backend_pid), loop(backend_pid)
    # Nothing lost yet: the check costs nothing and keeps the session.
    assert idle(check_connections_after_loss) == 0
    assert idle(backend_pid) == idle_pid
    terminate(idle_pid)
    terminate(loop_pid)
    # Until some thread finds a session dropped, the idle thread does not look.
    assert idle(check_connections_after_loss) == 0
    assert loop(found_dropped) == "OperationalError"
    # Then it tests its own session before its next attempt, closes the dead one, and the next
    # statement runs on a new session; one look per loss.
    assert idle(check_connections_after_loss) == 1
    new_pid = idle(backend_pid)
    assert new_pid != idle_pid
    assert idle(check_connections_after_loss) == 0
    assert idle(backend_pid) == new_pid


def test_a_live_session_passes_the_check_after_a_loss_and_is_kept(threads):
    idle, loop = threads(), threads()
    idle_pid, loop_pid = idle(backend_pid), loop(backend_pid)
    terminate(loop_pid)
    assert loop(found_dropped) == "OperationalError"
    assert idle(check_connections_after_loss) == 0
    assert idle(backend_pid) == idle_pid
