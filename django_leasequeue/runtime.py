"""One loop and lifecycle for every long-running service (worker, heartbeat, reaper, scheduler).

A service implements ``run_once()``, which does one bounded unit of work and returns how many
seconds to wait before the next call (0: go again at once). The base class runs it in a thread
with an interruptible wait (``wake()`` cuts it short: a NOTIFY, a freed worker slot), catches and
logs errors with a capped backoff so the loop never dies silently, and closes broken database
connections so the next iteration reconnects. The shape follows River's ``startstop`` services
with ``runOnce`` and Solid Queue's ``Poller`` whose ``poll`` returns the next delay.

:func:`run_services` runs several services in one process: the first SIGTERM/SIGINT stops them
gracefully (each service's ``stop`` decides what graceful means; the worker finishes or releases
its jobs), a second signal exits at once.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Literal

import psycopg
from django.db import DatabaseError, InterfaceError, OperationalError, connections

logger = logging.getLogger("django_leasequeue.runtime")

ERROR_BACKOFF_MAX = 30.0

# SQLSTATEs that mean the server cannot be reached or is going away: class 08 (connection
# exception), 57P01-57P05 (admin/crash shutdown, cannot connect now, database dropped, idle
# session timeout) and 53300 (too many connections). A statement that failed so is retried as a
# whole later. Classes 22 (data exception) and 54 (program limit exceeded: a jsonb value over
# 255 MiB) are about the values sent: the same statement fails again, whatever the connection.
# Classes 25 (invalid transaction state: a read-only standby after a failover), 40 (serialization
# failure, deadlock), 53 (insufficient resources), 55 (object not in prerequisite state: a lock not
# available), 57 (operator intervention: query cancelled) and 58 (system error) are about the
# server's state, not the values: retried later as well.
_CONNECTION_STATES = ("08", "57P0", "53300")
_DATA_CLASSES = ("22", "54")
_TRANSIENT_CLASSES = ("25", "40", "53", "55", "57", "58")


# How many times a thread of this process found one of its connections dropped by the server. A
# restart or a failover drops every session at once, but a thread only learns of it when it next
# uses its own connection: a handler thread idle since then would fail its next attempt on the dead
# one. So a loss seen by any thread (the claim loop, the heartbeat: they run all the time) makes
# every thread check its connections before its next attempt (check_connections_after_loss()).
_losses = 0
_losses_lock = threading.Lock()
_seen = threading.local()


def close_broken_connections() -> None:
    """Close this thread's database connections that errored and are no longer usable.

    Unlike ``close_old_connections()`` this ignores ``CONN_MAX_AGE``: a worker keeps its
    connections for its whole life (reconnecting per job would halve throughput), but it must not
    keep reusing a connection that the server dropped (case C27). A connection closed so is
    counted as a loss, which :func:`check_connections_after_loss` acts on in the other threads.
    """
    global _losses
    for conn in connections.all(initialized_only=True):
        if conn.connection is None:
            continue
        if conn.errors_occurred:
            if not conn.is_usable():
                conn.close()
                with _losses_lock:
                    _losses += 1
            else:
                conn.errors_occurred = False


def check_connections_after_loss() -> int:
    """Before this thread uses its connections again: if a thread of this process found a
    connection dropped since this one last looked, test this thread's open connections (one
    ``SELECT 1`` each) and close those that no longer work, so that the next statement connects
    anew (after a failover, through libpq's host list to the new primary) instead of failing on
    a session of the old server. Costs nothing while no connection was lost.

    Returns:
        The number of this thread's connections closed (0 when none was lost, or all still work).
    """
    losses = _losses
    if getattr(_seen, "losses", 0) == losses:
        return 0
    _seen.losses = losses
    closed = 0
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and not conn.in_atomic_block and not conn.is_usable():
            conn.close()
            closed += 1
    return closed


def db_error_kind(exc: BaseException) -> Literal["connection", "data", "transient"]:
    """Classify a database error by what retrying it can achieve.

    Django wraps the driver's exception in its own class (``OperationalError`` for both a refused
    connection and psycopg's ``ProgramLimitExceeded``), so the SQLSTATE of the psycopg exception
    (Django keeps it as ``exc.__cause__``) decides, and the class only when there is none.

    Args:
        exc: an exception raised by a database call (a Django or psycopg error).

    Returns:
        ``"connection"``: the server is unreachable (refused or lost connection, shutdown, or an
        ``OperationalError``/``InterfaceError`` without SQLSTATE, raised by the client): retry
        the same statement once a connection works. ``"data"``: the values were refused
        (SQLSTATE class 22 or 54, or a non-operational error such as ``DataError``,
        ``IntegrityError`` or ``ProgrammingError``): the same values fail again, so split a batch
        and record the error of the row at fault. ``"transient"``: any other operational error,
        and the classes about the server's state (25 read-only transaction, 40 serialization
        failure or deadlock, 53 insufficient resources, 55, 57014 query cancelled, 58): the
        server answered, retry later.
    """
    driver = exc.__cause__ if isinstance(exc, DatabaseError) and exc.__cause__ is not None else exc
    operational = isinstance(exc, OperationalError) or isinstance(driver, psycopg.OperationalError)
    sqlstate = getattr(driver, "sqlstate", None)
    if isinstance(sqlstate, str) and sqlstate:
        if sqlstate.startswith(_CONNECTION_STATES):
            return "connection"
        if sqlstate.startswith(_DATA_CLASSES):
            return "data"
        return "transient" if operational or sqlstate.startswith(_TRANSIENT_CLASSES) else "data"
    if operational or isinstance(exc, InterfaceError) or isinstance(driver, psycopg.InterfaceError):
        return "connection"
    return "data"


def is_connection_error(exc: BaseException) -> bool:
    """True when ``exc`` (a database error) means the server is unreachable: see :func:`db_error_kind`."""
    return db_error_kind(exc) == "connection"


class Service:
    """Base class of a long-running service. Subclasses implement :meth:`run_once`.

    Attributes:
        name (str): for logs and thread names.
        stagger (float): maximum random delay in seconds before the first iteration (avoids a
            thundering herd when many processes start together); tests set 0.
        error_backoff_max (float): the longest wait in seconds after failed iterations (the wait
            doubles from 0.1 s per consecutive failure). A service whose work has a deadline (the
            heartbeat: a lease expires) lowers it, or overrides it with a property.
    """

    name = "service"
    stagger = 0.0
    # True for a service that produces new work (the scheduler): on a graceful stop it is stopped
    # at once, so it emits nothing more while the worker finishes its running jobs.
    stops_first = False

    @property
    def error_backoff_max(self) -> float:
        """The longest wait in seconds after failed iterations (overridden by the heartbeat)."""
        return ERROR_BACKOFF_MAX

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.iterations = 0
        self.errors = 0
        self.crashed: BaseException | None = None

    # -- to implement -----------------------------------------------------------------------
    def run_once(self) -> float:
        """Do one bounded unit of work; return seconds to wait before the next call."""
        raise NotImplementedError

    def on_start(self) -> None:
        """Hook run in the service thread before the first iteration."""

    def on_stop(self) -> None:
        """Hook run in the service thread after the last iteration (also after a crash)."""

    # -- lifecycle --------------------------------------------------------------------------
    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._stop.is_set()

    def start(self) -> None:
        """Start the service thread. Idempotent."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name=f"leasequeue-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ask the loop to stop after the current iteration. Idempotent; safe before start()."""
        self._stop.set()
        self._wake.set()

    def wake(self) -> None:
        """Cut the current wait short so :meth:`run_once` runs again now."""
        self._wake.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread to end; return True if it did (or never started)."""
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def wait(self, seconds: float) -> None:
        """Sleep up to ``seconds``, returning early on :meth:`wake` or :meth:`stop`."""
        if seconds > 0 and not self._stop.is_set():
            self._wake.wait(seconds)
        self._wake.clear()

    def _run(self) -> None:
        try:
            if self.stagger > 0:
                self.wait(random.uniform(0, self.stagger))
            self.on_start()
            backoff = 0.0
            while not self._stop.is_set():
                try:
                    delay = self.run_once()
                    backoff = 0.0
                except Exception:
                    self.errors += 1
                    backoff = min(self.error_backoff_max, backoff * 2 or 0.1)
                    logger.exception("%s: iteration failed; retrying in %.1f s", self.name, backoff)
                    close_broken_connections()
                    delay = backoff
                self.iterations += 1
                self.wait(delay)
        except BaseException as exc:  # noqa: BLE001 - a crashed service must be visible to run_services
            self.crashed = exc
            logger.exception("%s: crashed", self.name)
        finally:
            try:
                self.on_stop()
            except Exception:
                logger.exception("%s: on_stop failed", self.name)
            for conn in connections.all(initialized_only=True):
                conn.close()


def run_services(services: Sequence[Service], *, install_signals: bool = True,
                 stop_when: threading.Event | None = None) -> int:
    """Run services until a signal (or ``stop_when``) stops them, or one crashes.

    The first SIGTERM/SIGINT stops every service gracefully and waits for them; a second one
    exits the process at once with status 1 (leases then expire and the reaper recovers the jobs).

    Returns:
        0 after a clean stop, 1 when a service crashed.
    """
    stop_event = stop_when or threading.Event()
    signals_seen = 0

    def handle(signum: int, frame: FrameType | None) -> None:  # noqa: ARG001
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen > 1:
            logger.warning("second signal: exiting now")
            os._exit(1)
        logger.info("signal %s: stopping gracefully (send again to exit at once)", signum)
        stop_event.set()

    if install_signals:
        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)
    for service in services:
        service.start()
    crashed = False
    while not stop_event.is_set():
        if any(s.crashed is not None for s in services):
            crashed = True
            break
        if all(s._thread is not None and not s._thread.is_alive() for s in services):
            break  # every service ended by itself (e.g. a burst worker)
        stop_event.wait(0.1)
    # Services that produce work stop at once. The rest stop one at a time, in the order given: the
    # worker comes first and its graceful stop (finish running jobs within the grace period, then
    # release the rest) needs the heartbeat service, which comes after it, to keep renewing leases.
    for service in services:
        if service.stops_first:
            service.stop()
    for service in services:
        service.stop()
        service.join()
    return 1 if crashed or any(s.crashed is not None for s in services) else 0
