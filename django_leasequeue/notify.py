"""LISTEN/NOTIFY wake-ups: a dedicated connection that wakes the worker when jobs are enqueued.

``enqueue`` sends ``pg_notify(<channel>, <queue name>)`` in the enqueuing transaction, so the
notification is delivered at commit, never before the job is visible. The payload is only the queue
name (far below PostgreSQL's 8000-byte limit) and PostgreSQL folds identical notifications of one
transaction, so a bulk enqueue wakes a worker once per queue. Notifications are a latency
optimisation only: the worker also polls, so a lost notification (connection drop, PgBouncer in
transaction mode) delays a job by at most the poll interval.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

import psycopg
from django.db import connections

from .runtime import Service

logger = logging.getLogger("django_leasequeue.notify")

# Django's connection parameters that are not libpq keywords.
_NOT_LIBPQ = {"cursor_factory", "context", "prepare_threshold", "server_side_binding", "pool", "isolation_level",
              "assume_role", "autocommit", "row_factory"}


def listen_connection(alias: str, channel: str) -> psycopg.Connection[Any]:
    """Open an autocommit psycopg connection to ``alias`` that LISTENs on ``channel``."""
    params = {k: v for k, v in connections[alias].get_connection_params().items() if k not in _NOT_LIBPQ}
    conn = psycopg.connect(**params, autocommit=True)
    conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))
    return conn


class Wakeable(Protocol):
    """What the listener needs of the service it wakes (a
    :class:`~django_leasequeue.worker.WorkerService`)."""

    @property
    def alias(self) -> str:
        """The database alias."""

    @property
    def queues(self) -> Sequence[str] | None:
        """The queue names served, or None for every queue."""

    def wake(self) -> None:
        """Cut the service's current wait short."""


class Listener(Service):
    """Wakes a :class:`~django_leasequeue.worker.WorkerService` when a notification names one of
    its queues."""

    name = "listener"

    def __init__(self, worker: Wakeable, *, channel: str) -> None:
        super().__init__()
        self.worker = worker
        self.channel = channel
        self._conn: psycopg.Connection[Any] | None = None
        self.received = 0

    def run_once(self) -> float:
        if self._conn is None or self._conn.closed:
            self._conn = listen_connection(self.worker.alias, self.channel)
            self.worker.wake()  # anything enqueued while we were not listening
        queues = self.worker.queues
        try:
            for note in self._conn.notifies(timeout=0.5):
                self.received += 1
                if queues is None or note.payload in queues:
                    self.worker.wake()
                if self.stopping:
                    break
        except psycopg.Error:
            self._close()
            raise
        return 0.0

    def _close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass
            self._conn = None

    def on_stop(self) -> None:
        self._close()
