"""LISTEN/NOTIFY wake-ups: a dedicated connection that wakes the worker when jobs are enqueued.

``enqueue`` sends ``pg_notify(<channel>, <queue name>)`` in the enqueuing transaction, so the
notification is delivered at commit, never before the job is visible. The payload is only the queue
name (far below PostgreSQL's 8000-byte limit) and PostgreSQL folds identical notifications of one
transaction, so a bulk enqueue wakes a worker once per queue. Notifications are a latency
optimisation only: the worker also polls, so a lost notification (connection drop, PgBouncer in
transaction mode) delays a job by at most the poll interval.

A job that becomes ready for later (an enqueue with a delay or a ``run_at``, a retry after its
backoff, a snooze) notifies ``"<queue name> <run_at>"``, the run time as POSIX seconds of the
database clock (``"emails 1767225600.25"``): one per queue and statement, with the earliest run
time. A worker that already sleeps until an earlier time ignores it; otherwise it re-reads the
earliest run time of its queues and sleeps until then (:func:`parse_payload`). A space cannot occur
in a queue name, so a worker of an older version, which compares the whole payload with its queue
names, ignores these notifications (one serving every queue wakes, claims nothing and sleeps again).
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


def parse_payload(payload: str) -> tuple[str, float | None]:
    """Split a notification payload into the queue name and the run time it announces.

    Args:
        payload: ``"<queue>"`` (a job is due now) or ``"<queue> <POSIX seconds>"`` (a job is due then).

    Returns:
        ``(queue, None)`` or ``(queue, run_at as POSIX seconds)``. A time that does not parse is
        treated as "due now" (``None``), so a malformed notification costs a claim, never a missed job.
    """
    queue, sep, when = payload.partition(" ")
    if not sep:
        return queue, None
    try:
        return queue, float(when)
    except ValueError:
        return queue, None


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

    def wake_for_due(self) -> None:
        """A job of a served queue was enqueued, due now: cut the wait short (and claim for every
        kind of task the service runs)."""

    def wake_for_run_at(self, at: float) -> None:
        """A job of a served queue becomes due at ``at`` (POSIX seconds, database clock): cut the
        wait short unless it already ends by then."""


class Listener(Service):
    """Wakes a :class:`~django_leasequeue.worker.WorkerService` when a notification names one of
    its queues: at once for a due job, through ``wake_for_run_at`` for one due later."""

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
            self.worker.wake_for_due()  # anything enqueued while we were not listening
        queues = self.worker.queues
        try:
            for note in self._conn.notifies(timeout=0.5):
                self.received += 1
                queue, at = parse_payload(note.payload)
                if queues is None or queue in queues:
                    if at is None:
                        self.worker.wake_for_due()
                    else:
                        self.worker.wake_for_run_at(at)
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
