"""What every statement module of the store shares: the clock, the table names, the database alias,
the one way to run a statement, JSON encoding and decoding, and the decoding of whole job rows."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Self, cast

from django.db import ProgrammingError, connections, router, transaction
from django.db.backends.utils import CursorWrapper
from psycopg import Cursor, errors
from psycopg.abc import Params, QueryNoTemplate

from ..exceptions import NotMigrated
from ..models import Job, JobStat, QueueState, ReaperSweep, Schedule, WorkerProcess
from ._prepared import may_prepare, run_prepared

logger = logging.getLogger("django_leasequeue.store")

JOB_TABLE = Job._meta.db_table
PROCESS_TABLE = WorkerProcess._meta.db_table
SWEEP_TABLE = ReaperSweep._meta.db_table
STAT_TABLE = JobStat._meta.db_table
# The sweep record's last_sweep_at while no sweep has run: a scheduler's tick creates the row before
# any sweep (last_sweep_at is NOT NULL). A finite time that no sweep can have, rather than
# -infinity, which the ORM cannot load; every statement that reads last_sweep_at treats it as
# "never swept".
NEVER_SWEPT = "'epoch'::timestamptz"
QUEUE_TABLE = QueueState._meta.db_table
SCHEDULE_TABLE = Schedule._meta.db_table

# The statement clock, optionally overridden by the caller (tests pass an aware datetime).
CLOCK = "SELECT coalesce(%(now)s::timestamptz, leasequeue_now()) AS now"

# The clock of a statement that may finish a workflow job: it also tells the settle trigger
# (migration 0011) which channel to NOTIFY for the jobs it releases, as a transaction-local setting
# (set_config(..., true): nothing outlives the transaction, so a pooled connection carries nothing
# to its next client). %(wake)s is the channel, or NULL when notifications are off.
CLOCK_WAKING = ("SELECT coalesce(%(now)s::timestamptz, leasequeue_now()) AS now, "
                "set_config('leasequeue.notify_channel', coalesce(%(wake)s::text, ''), true) AS wake")

def _notify_channel() -> str | None:
    """The channel a retry, a snooze or a released workflow job notifies on (``%(wake)s`` of
    :data:`CLOCK_WAKING`), or None when notifications are off."""
    from ..conf import get_settings

    settings = get_settings()
    return settings.notify_channel if settings.notify else None


# The largest fencing token (migration 0004's leasequeue_job_lease_version_range). Every claim,
# reap, release and replay adds 1, so a row written by hand with a token at (or next to) the bound
# would make that statement refused by the constraint, for every row it writes: the claim of every
# worker, every reaper sweep, a whole release. A claim therefore takes only rows whose token can
# still take the claim and a reap or release (the others stay as they are, for an operator to read),
# and the reaper and the release never go past the bound: such a row is dead-lettered instead.
TOKEN_MAX = 4611686018427387904

# The flow rules of every claim's candidate scan, in one CASE so that they run in this order
# (PostgreSQL orders separate AND conditions by estimated cost, and would call the admission
# functions first): the sequence rule (only the head of a sequence, nothing behind it), then the
# per-key concurrency admission, then the per-key rate admission, so that a job that may not run
# takes no key's slot and spends no rate allowance. Keyless jobs stop at the three IS NULL tests.
# Statements interpolate it where their candidate rows ``j`` are filtered; each needs the
# parameter ``%(claim)s`` (a fresh id per claim call) and a ``clock`` CTE. See store/claim.py.
FLOW_RULES = f"""AND CASE WHEN (j.sequence_key IS NULL
     OR (NOT EXISTS (SELECT 1 FROM {JOB_TABLE} e WHERE e.sequence_key = j.sequence_key AND e.id < j.id
                     AND e.status IN ('ready', 'leased', 'dead') AND (e.status <> 'dead' OR e.sequence_halts))
         AND NOT EXISTS (SELECT 1 FROM {JOB_TABLE} e WHERE e.sequence_key = j.sequence_key
                         AND e.sequence_key IS NOT NULL AND (e.status COLLATE "C") = 'leased')))
THEN (j.concurrency_key IS NULL OR j.concurrency_limit IS NULL
     OR (NOT (starts_with(coalesce(current_setting('leasequeue.conc_closed', true), ''), %(claim)s)
              AND strpos(current_setting('leasequeue.conc_closed', true),
                         ';' || hashtext(j.concurrency_key)::text || ';') > 0)
         AND leasequeue_conc_admit(j.concurrency_key, j.concurrency_limit::int, %(claim)s)))
     AND (j.rate_key IS NULL
     OR (NOT (starts_with(coalesce(current_setting('leasequeue.rate_closed', true), ''), %(claim)s)
              AND strpos(current_setting('leasequeue.rate_closed', true),
                         ';' || hashtext(j.rate_key)::text || ';') > 0)
         AND leasequeue_rate_admit(j.rate_key, j.rate_limit_n::int, j.rate_limit_secs, clock.now,
                                   %(claim)s, j.id)))
ELSE false END"""

_JOB_COLUMNS = [cast(str, f.column) for f in Job._meta.concrete_fields]
_JOB_ATTNAMES = [f.attname for f in Job._meta.concrete_fields]
# Every column of the job table, in model order (the order :func:`_jobs_from_rows` reads).
_JOB_COLUMN_LIST = ", ".join(_JOB_COLUMNS)


def db_alias() -> str:
    """Return the database alias that holds the job table (through the database routers)."""
    return router.db_for_write(Job)


def _cursor(alias: str | None = None) -> CursorWrapper:
    return connections[alias or db_alias()].cursor()


class _Result:
    """What :func:`_run` read: every row, the row count and the cursor's column description."""

    __slots__ = ("description", "rowcount", "rows")

    def __init__(self, rows: list[Any], rowcount: int, description: Sequence[Any] | None) -> None:
        self.rows = rows
        self.rowcount = rowcount
        self.description = description

    def one(self) -> Any:
        """The first row, or None when the statement returned none."""
        return self.rows[0] if self.rows else None


def _run(sql: str, params: Mapping[str, Any] | Sequence[Any] | None = None, *, alias: str | None = None,
         describe: bool = False) -> _Result:
    """Open a cursor on ``alias`` (default :func:`db_alias`), execute ``sql`` with ``params`` and
    fetch every row it returns (none for a statement without a result set). With ``describe``,
    the result also carries the cursor's column description (for decoding rows by column name)."""
    with _cursor(alias) as cur:
        cur.execute(sql, params)
        # rownumber is None without a result set; cursor.description would build a Column object
        # per column on every access, a cost the one-job statements (enqueue) would pay per call.
        rows = cur.fetchall() if cur.rownumber is not None else []
        return _Result(rows, cur.rowcount, cur.description if describe else None)


class _PreparingCursor(Cursor[Any]):
    """A server-side binding cursor that prepares every statement it runs at its first execution
    (psycopg's ``prepare=True``), instead of after ``prepare_threshold`` runs. psycopg keeps one
    prepared statement per distinct statement text and parameter types on the connection."""

    # Not the overloads of psycopg's execute (template strings too): Django's cursor wrapper passes
    # the SQL text and its parameters only.
    def execute(self, query: QueryNoTemplate, params: Params | None = None, *,  # type: ignore[override]
                prepare: bool | None = None, binary: bool | None = None) -> Self:
        return super().execute(query, params, prepare=True if prepare is None else prepare, binary=binary)


def _run_prepared(sql: str, params: Mapping[str, Any], *, alias: str) -> _Result:
    """:func:`_run` for a short statement run on every call (the one-job enqueue), prepared where
    the connection allows it: PostgreSQL's parsing and planning are then done once per connection
    instead of on every call, the larger part of the statement's time.

    - The connection allows psycopg's prepared statements (its ``prepare_threshold`` is not None:
      ``DATABASES[alias]["OPTIONS"]["prepare_threshold"]`` set; Django's backend sets None so that
      poolers work, and whoever set it has PgBouncer 1.21+ with ``max_prepared_statements`` or no
      pooler): prepared by psycopg from its first call, in a caller's transaction too. Only the
      psycopg cursor inside Django's cursor wrapper differs from Django's default.
    - Else, in autocommit outside a transaction with ``PREPARED_STATEMENTS`` on
      (:func:`._prepared.may_prepare`): SQL ``PREPARE``/``EXECUTE``, safe behind any pooler
      (:mod:`._prepared`).
    - Else exactly :func:`_run`.

    Args:
        sql: the statement (``%(name)s`` placeholders).
        params: its parameters.
        alias: the database alias.

    Returns:
        The statement's :class:`_Result` (rows and row count).
    """
    connection = connections[alias]
    connection.ensure_connection()
    if connection.connection.prepare_threshold is not None:
        with _cursor(alias) as cur:
            cur.cursor.close()  # Django's client-side binding cursor, unused (it holds nothing on the server)
            cur.cursor = _PreparingCursor(connection.connection)
            cur.execute(sql, params)
            rows = cur.fetchall() if cur.rownumber is not None else []
            return _Result(rows, cur.rowcount, None)
    if may_prepare(alias):
        ran = run_prepared(sql, params, alias=alias)
        if ran is not None:
            return _Result(ran[0], ran[1], None)
    return _run(sql, params, alias=alias)


# JIT compilation off for the claim statement alone. The claims run every few milliseconds and take
# about a millisecond, but their cost estimates grow with the backlog (a LIMIT read from a CTE, as
# in the fair claim, is planned as a tenth of the rows) and cross ``jit_above_cost``: compiling
# then costs about 100 ms per claim, a hundred times the claim itself (measured on a fair queue
# behind 100,000 jobs). SET LOCAL, never SET: behind PgBouncer in transaction mode a session
# setting would stay on whichever server connection ran it, for that connection's next clients.
JIT_OFF_LOCAL = "SET LOCAL jit = off"


def _jit_off_here(alias: str) -> bool:
    """True when a claim on ``alias`` should turn JIT off for its own transaction: not inside a
    caller's transaction, whose settings are the caller's (a SET LOCAL there would last until the
    caller's commit)."""
    return not connections[alias].in_atomic_block


# Prepared claims (``PREPARED_STATEMENTS``, :mod:`._prepared`): the claim runs as ``EXECUTE`` of a
# statement prepared once per server connection, with a generic plan, which is planned once: the
# custom plans PostgreSQL would otherwise make cost 0.7-1.0 ms of planning per claim. The settings
# hold for the claim's own implicit transaction only (a generic plan made with JIT off keeps it off).
# They also reach the triggers the claim's UPDATE fires, so they are only these two: join switches
# here would reach the chart counters' trigger, whose plan PL/pgSQL keeps for the session
# (tests/monitoring/test_job_stats_cost.py). The generic plan does not know the LIMIT and expects a
# tenth of the due rows, so the claims take the picked rows by ``id = ANY(ARRAY(...))``: one
# primary-key probe per picked row whatever the estimate (a join let a plan made behind a large
# backlog walk the primary key from its lowest id, through every leased and finished row).
PREPARED_CLAIM_SETTINGS = "SET LOCAL jit = off; SET LOCAL plan_cache_mode = force_generic_plan"


def _run_claim(sql: str, params: Mapping[str, Any], *, alias: str) -> _Result:
    """:func:`_run` (with ``describe``) for a one-statement claim, with JIT compilation off for that
    statement only (:data:`JIT_OFF_LOCAL`), leaving no session state behind.

    - In autocommit outside a transaction, with ``PREPARED_STATEMENTS`` on and client-side binding
      (:func:`._prepared.may_prepare`): ``EXECUTE`` of the claim prepared once per server
      connection, with a generic plan (:data:`PREPARED_CLAIM_SETTINGS`), in one message.
    - Else, with Django's default client-side binding, ``SET LOCAL jit = off; <claim>`` in one
      message: PostgreSQL runs the statements of one simple query as one implicit transaction, so
      the setting holds for the claim's planning and ends with it, and the claim still costs one
      round trip.
    - Server-side binding sends parameters with the extended protocol, which takes one statement
      per message: there the two run in a transaction of their own.
    - Inside a caller's transaction the claim runs as it is (:func:`_jit_off_here`).

    Args:
        sql: the claim statement (``%(name)s`` placeholders).
        params: its parameters.
        alias: the database alias.

    Returns:
        The claim's :class:`_Result` (rows, row count, column description).
    """
    connection = connections[alias]
    if not _jit_off_here(alias):
        return _run(sql, params, alias=alias, describe=True)
    if may_prepare(alias):
        ran = run_prepared(sql, params, alias=alias, settings=PREPARED_CLAIM_SETTINGS)
        if ran is not None:
            return _Result(*ran)
    if connection.settings_dict.get("OPTIONS", {}).get("server_side_binding") is True:
        with transaction.atomic(using=alias):
            _run(JIT_OFF_LOCAL, alias=alias)
            return _run(sql, params, alias=alias, describe=True)
    with _cursor(alias) as cur:
        cur.execute(f"{JIT_OFF_LOCAL}; {sql}", params)
        cur.nextset()  # past the SET's empty result, to the claim's rows
        return _Result(cur.fetchall(), cur.rowcount, cur.description)


@contextmanager
def _schema_required(alias: str | None) -> Iterator[None]:
    """Turn "relation leasequeue_job / function leasequeue_now() does not exist" into
    :class:`NotMigrated`, which says to run ``migrate`` (the usual first mistake of a new project:
    enqueueing before migrating). Other errors pass unchanged."""
    try:
        yield
    except ProgrammingError as exc:
        if isinstance(exc.__cause__, (errors.UndefinedTable, errors.UndefinedFunction)) and "leasequeue" in str(exc):
            first_line = str(exc).strip().splitlines()[0]
            raise NotMigrated(f"django-leasequeue's tables are missing in database {alias or db_alias()!r} "
                              f"({first_line}): run `manage.py migrate`") from exc
        raise


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def _load(value: Any) -> Any:
    # Django loads jsonb as text; most jobs have no positional or no keyword arguments.
    if value == "[]":
        return []
    if value == "{}":
        return {}
    return json.loads(value) if isinstance(value, (str, bytes)) else value


def db_now(alias: str | None = None) -> datetime:
    """Return the database statement clock (``leasequeue_now()``) as an aware datetime."""
    now: datetime = _run("SELECT leasequeue_now()", alias=alias).rows[0][0]
    return now


def _jobs_from_rows(rows: Sequence[Sequence[Any]], alias: str) -> list[Job]:
    """Build Job instances from raw rows in ``_JOB_COLUMNS`` order, through the fields' own
    ``from_db_value`` converters (a raw cursor returns JSON columns as text, as Django's
    PostgreSQL backend leaves jsonb decoding to JSONField)."""
    fields = Job._meta.concrete_fields
    connection = connections[alias]
    converters = [(i, f.from_db_value) for i, f in enumerate(fields) if hasattr(f, "from_db_value")]
    jobs = []
    for row in rows:
        values = list(row[: len(_JOB_ATTNAMES)])
        for i, convert in converters:
            values[i] = convert(values[i], None, connection)
        jobs.append(Job.from_db(alias, _JOB_ATTNAMES, values))
    return jobs
