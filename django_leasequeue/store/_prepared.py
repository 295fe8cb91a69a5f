"""Prepared statements that a connection pooler cannot break: SQL ``PREPARE`` once per server
connection and ``EXECUTE`` on every call, for the statements that run once per job or per claim
(the worker's claim, the one-job enqueue), whose parsing and planning cost PostgreSQL more than
their execution (docs/howto/performance.md).

Why SQL ``PREPARE`` rather than psycopg's prepared statements: Django's psycopg backend turns
those off (``prepare_threshold=None``) so that poolers keep working, and its client-side binding
sends every statement as text. ``EXECUTE name(literals)`` is text too, so it goes through Django's
cursor (its error translation, execute wrappers and query log) like any other statement.

Why it is safe behind PgBouncer in transaction mode, whatever its version: a prepared statement
belongs to the server connection, and the pooler gives each transaction whichever server
connection is free. So every call here is one message, run as one implicit transaction (only in
autocommit, outside a caller's transaction: :func:`may_prepare`), and each refusal happens before
anything ran:

- ``EXECUTE`` on a server connection that does not have the statement fails with 26000
  (``invalid_sql_statement_name``): the call is sent again as ``PREPARE ...; EXECUTE ...``, one
  message, so both reach the same server connection;
- that ``PREPARE`` on a server connection that has it already (another client of the pool
  prepared it there) fails with 42P05 (``duplicate_prepared_statement``): sent again as
  ``EXECUTE`` alone;
- an ``EXECUTE`` whose statement's result columns changed type under it (a migration altered a
  column) fails with 0A000 (``feature_not_supported``: "cached plan must not change result type"):
  sent again as ``DEALLOCATE ...; PREPARE ...; EXECUTE ...``;
- after :data:`MAX_SENDS` refused messages in a row the caller runs its statement unprepared.

A statement's name is a hash of its text, so one name is always one statement, on every server
connection, for every client and every version of this code.
"""

from __future__ import annotations

import functools
import hashlib
import re
import weakref
from collections.abc import Mapping
from typing import Any

from django.db import DatabaseError, connections
from psycopg import errors

# How many messages one call sends before it gives up and runs its statement unprepared. Two
# cover a direct connection (a lost statement: EXECUTE refused, PREPARE with EXECUTE); the others
# are for a pool whose server connections disagree from one transaction to the next.
MAX_SENDS = 4
# The statements one connection keeps prepared at most (each holds a plan in the server's memory
# for the connection's life). The one-job INSERT has one text per set of optional columns; a
# project that enqueues with many different sets runs the rarer ones unprepared.
MAX_PER_CONNECTION = 32
_PARAM = re.compile(r"%\((\w+)\)s")
# psycopg connection -> the names this process believes prepared on it. Behind a pooler the belief
# can be wrong either way; each refusal corrects it (see the module's docstring).
_known: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


@functools.cache
def prepared_form(sql: str) -> tuple[str, str, tuple[str, ...]]:
    """Return ``(name, PREPARE statement, parameter names in $n order)`` for ``sql``.

    Args:
        sql: a statement with ``%(name)s`` placeholders (a literal ``%`` written ``%%``, as the
            message that carries the ``PREPARE`` is sent with parameters).
    """
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    body = _PARAM.sub(number, sql)
    name = "leasequeue_" + hashlib.sha1(sql.encode()).hexdigest()[:16]
    return name, f"PREPARE {name} AS {body}", tuple(names)


@functools.cache
def _messages(sql: str, settings: str) -> tuple[str, dict[str, str]]:
    """``(name, {form: message})`` of ``sql`` with ``settings`` before its ``EXECUTE``: the three
    forms :func:`run_prepared` sends, built once per statement (the claim and the enqueue run them
    on every call)."""
    name, prepare, names = prepared_form(sql)
    execute = f"{settings}; " if settings else ""
    execute += f"EXECUTE {name}({', '.join(f'%({n})s' for n in names)})"
    return name, {"execute": execute, "prepare": f"{prepare}; {execute}",
                  "replace": f"DEALLOCATE {name}; {prepare}; {execute}"}


def may_prepare(alias: str) -> bool:
    """True when a statement on ``alias`` may run as ``EXECUTE`` of a prepared statement here:
    ``PREPARED_STATEMENTS`` is on, the connection is in autocommit outside any ``atomic()`` block
    (a refused ``EXECUTE`` inside a caller's transaction would abort it), and Django binds
    parameters on the client (server-side binding sends one statement per message)."""
    from ..conf import get_settings

    if not get_settings().prepared_statements:
        return False
    connection = connections[alias]
    if connection.in_atomic_block or not connection.get_autocommit():
        return False
    return connection.settings_dict.get("OPTIONS", {}).get("server_side_binding") is not True


def _refusal(exc: DatabaseError) -> str | None:
    """Which refusal of a prepared-statement message ``exc`` is (the message's next form), or
    None for any other error."""
    cause = exc.__cause__
    if isinstance(cause, errors.InvalidSqlStatementName):
        return "prepare"
    if isinstance(cause, errors.DuplicatePreparedStatement):
        return "execute"
    if isinstance(cause, errors.FeatureNotSupported):
        # "cached plan must not change result type", by its SQLSTATE alone: the message is
        # translated with the server's lc_messages. A 0A000 of another cause fails again after the
        # new PREPARE, and after MAX_SENDS the caller's unprepared statement raises it as it would.
        return "replace"
    return None


def run_prepared(sql: str, params: Mapping[str, Any], *, alias: str,
                 settings: str = "") -> tuple[list[Any], int, Any] | None:
    """Run ``sql`` as ``EXECUTE`` of a statement prepared on the server connection, preparing it
    in the same message where it is missing (see the module's docstring). Call it only where
    :func:`may_prepare` says so.

    Args:
        sql: one statement with ``%(name)s`` placeholders.
        params: its parameters.
        alias: the database alias.
        settings: ``SET LOCAL`` statements (``;``-separated) to run before the ``EXECUTE`` in its
            implicit transaction (they then hold for its planning and execution only), or "".

    Returns:
        ``(rows, row count, column description)`` of the statement, or None when the server
        refused :data:`MAX_SENDS` messages in a row, or this connection holds
        :data:`MAX_PER_CONNECTION` statements already: the caller then runs ``sql`` unprepared.

    Raises:
        DatabaseError: the statement failed for any other reason (as the unprepared statement
            would).
    """
    name, messages = _messages(sql, settings)
    connection = connections[alias]
    with connection.cursor() as cur:
        known = _known.setdefault(connection.connection, set())
        if name not in known and len(known) >= MAX_PER_CONNECTION:
            return None
        form = "execute" if name in known else "prepare"
        for _ in range(MAX_SENDS):
            try:
                cur.execute(messages[form], params)
            except DatabaseError as exc:
                refusal = _refusal(exc)
                if refusal is None:
                    raise
                form = refusal
                continue
            known.add(name)
            while cur.nextset():
                pass  # past PREPARE's and the SETs' empty results, to the EXECUTE's rows
            rows = cur.fetchall() if cur.rownumber is not None else []
            return rows, cur.rowcount, cur.description
        known.discard(name)
        return None
