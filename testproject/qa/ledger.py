"""The chaos suite's execution ledger, written from inside the handlers of the workload tasks.

Every handler start writes one ``qa_ledgerentry`` row; its return (or exception) completes the
row. The writes go through a psycopg connection of this thread's own, in autocommit, with
application name ``lqledger-<pid>``: never the job's connection or transaction, so a job
transaction rolled back, fenced out or cut by a fault still leaves its execution on the books.

A write must never change the behaviour under test, so it never blocks or raises: when the
database cannot be reached (an outage, a restart), the event is kept in this process with the
worker's wall-clock time and a background thread writes it once the database is back, in order.
A write may also have landed although its reply was lost with the connection (a restart, a pooler
killed mid-statement): it is queued and written again all the same, so both writes are
idempotent (a start's INSERT does nothing when its row exists; an end's UPDATE sets the same row).
A process killed with events still pending loses them; in the suite no kill coincides with an
outage.
"""

from __future__ import annotations

import atexit
import collections
import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import psycopg
from django.db import connections

from django_leasequeue import JobContext
from django_leasequeue.notify import _NOT_LIBPQ

_local = threading.local()
_lock = threading.Lock()  # guards _pending
# One flush at a time: the flusher thread and the flush at exit (which runs while that daemon
# thread still does) would otherwise both write the head event and both pop: the event after it
# is dropped unwritten, or one of them pops an empty queue and dies.
_flush_lock = threading.Lock()
_pending: collections.deque[tuple[str, tuple[Any, ...]]] = collections.deque()
_flusher: threading.Thread | None = None

_START = ("INSERT INTO qa_ledgerentry (key, job_id, lease_version, attempt, task, worker, pid, concurrency_key, "
          "started_at, started_clock, returned_clock, outcome) "
          "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, coalesce(%s, clock_timestamp()), %s, '', '') "
          # A write whose commit reached the server while its reply was lost (a restart, a pooler
          # killed mid-statement) is queued and written again: the second INSERT must be a no-op,
          # not a unique violation that blocks every later event of the process behind it.
          "ON CONFLICT (key) DO NOTHING")
_RETURN = ("UPDATE qa_ledgerentry SET returned_at = coalesce(%s, clock_timestamp()), returned_clock = %s, "
           "outcome = %s WHERE key = %s")


def _connect() -> psycopg.Connection[Any]:
    params = {k: v for k, v in connections["default"].get_connection_params().items() if k not in _NOT_LIBPQ}
    params["application_name"] = f"lqledger-{os.getpid()}"
    params["connect_timeout"] = 2
    # No server-side prepared statements (psycopg prepares a query run 5 times): behind PgBouncer in
    # transaction mode the next statement may get another server connection, which lacks them
    # ("prepared statement _pg3_0 does not exist"). Django's own connections do the same.
    params["prepare_threshold"] = None
    return psycopg.connect(**params, autocommit=True)


def _execute(holder: Any, sql: str, params: tuple[Any, ...]) -> bool:
    """Run one statement on ``holder.conn`` (opened on demand); False if the database refused."""
    try:
        if getattr(holder, "conn", None) is None or holder.conn.closed:
            holder.conn = _connect()
        holder.conn.execute(sql, params)
        return True
    except psycopg.Error:
        try:
            if getattr(holder, "conn", None) is not None:
                holder.conn.close()
        except psycopg.Error:
            pass
        holder.conn = None
        return False


class _Holder:
    conn: psycopg.Connection[Any] | None = None


_flusher_conn = _Holder()


def _flush_pending() -> bool:
    """Write the pending events in order; True when none is left."""
    with _flush_lock:
        while True:
            with _lock:
                if not _pending:
                    return True
                sql, params = _pending[0]
            if not _execute(_flusher_conn, sql, params):
                return False
            with _lock:
                _pending.popleft()  # still the event just written: only this flush pops


def _flush_loop() -> None:
    while True:
        _flush_pending()
        time.sleep(0.2)


def _write(sql: str, params: tuple[Any, ...], local_params: tuple[Any, ...]) -> None:
    """Write now on this thread's connection, or (database unreachable, or earlier events still
    pending, which must be written first) queue ``local_params``, stamped with the wall clock."""
    global _flusher
    with _lock:
        queued = bool(_pending)
    if not queued and _execute(_local, sql, params):
        return
    with _lock:
        _pending.append((sql, local_params))
        if _flusher is None:
            _flusher = threading.Thread(target=_flush_loop, name="qa-ledger-flusher", daemon=True)
            _flusher.start()


def start(context: JobContext, task: str, concurrency_key: str = "") -> str:
    """Record the start of a handler execution; return the key that :func:`finish` completes."""
    key = str(uuid.uuid4())
    head = (key, context.job_id, context.lease_version, context.attempt, task, context.worker_id, os.getpid(),
            concurrency_key)
    _write(_START, (*head, None, "db"), (*head, datetime.now(UTC), "local"))
    return key


def finish(key: str, outcome: str) -> None:
    """Record that the execution ``key`` ended: ``outcome`` is "returned", "raised" or "timed_out"."""
    _write(_RETURN, (None, "db", outcome, key), (datetime.now(UTC), "local", outcome, key))


@contextmanager
def execution(context: JobContext, task: str, concurrency_key: str = "") -> Iterator[None]:
    """Wrap a handler's body: one ledger row per run, ended "returned", "raised", or "timed_out"
    when the body returned after the task's timeout had passed (the worker then records the attempt
    as a ``JobTimedOut`` failure and retries it: its return value is discarded, so the retry is not
    a re-run of a returned job)."""
    key = start(context, task, concurrency_key)
    outcome = "raised"
    try:
        yield
        outcome = "timed_out" if context.timed_out else "returned"
    finally:
        finish(key, outcome)


@atexit.register
def _flush_at_exit() -> None:
    # A graceful exit writes what an outage left pending (bounded: a few tries, then give up).
    for _ in range(10):
        if _flush_pending():
            return
        time.sleep(0.3)
