"""Workflows and batches: building a workflow (its row, its steps, its dependency edges) in one
statement, adding members to an open batch, closing it, and the reads of a workflow's page, its
handle and a step's dependencies.

Dependencies are never resolved here: the settle trigger of migration 0011
(``leasequeue_job_settled``) resolves them in the transaction that finishes a job, whatever
statement finishes it, and since migration 0012 counts the members a statement finishes into
their workflow row once, at the end of that statement (``leasequeue_job_settled_flush``). The
statements below only insert, and close.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from ..models import Dependency, Workflow
from ._db import CLOCK, CLOCK_WAKING, JOB_TABLE, _dumps, _load, _run, _schema_required, db_alias
from .enqueue import NewJob, TraceContext, _trace_json
from .sequences import sequence_locked

WORKFLOW_TABLE = Workflow._meta.db_table
DEPENDENCY_TABLE = Dependency._meta.db_table


@dataclass(frozen=True)
class NewStep:
    """One job of a workflow to insert: the validated job, and its place in the workflow.

    Attributes:
        job: the job, built by ``enqueueing.build_job`` (its unique key is None).
        role: ``"member"``, ``"on_success"`` or ``"on_complete"``.
        step: the step name (unique in the workflow), or None (group and batch members).
        depends_on: step names of this workflow it waits for.
        depends_on_ids: ids of existing jobs it waits for.
        pass_result: prepend the dependencies' results to its args when it is released.
        on_dependency_dead: ``"hold"``, ``"cancel"`` or ``"run"``.
    """

    job: NewJob
    role: str = "member"
    step: str | None = None
    depends_on: tuple[str, ...] = ()
    depends_on_ids: tuple[int, ...] = ()
    pass_result: bool = False
    on_dependency_dead: str = "hold"


# Create the workflow row. A unique key already taken returns nothing (ON CONFLICT DO NOTHING
# covers the partial unique index and never raises, so the caller's transaction survives); the
# caller then reads the holder. A batch is created open (closed_at NULL) and with no members.
WORKFLOW_INSERT = f"""
WITH clock AS MATERIALIZED ({CLOCK})
INSERT INTO {WORKFLOW_TABLE} (kind, name, unique_key, on_dependency_dead, created_at, closed_at, progressed_at,
                              finished_at, members, members_pending, members_done, members_dead, members_cancelled)
SELECT %(kind)s, %(name)s, %(unique_key)s, %(policy)s, clock.now, CASE WHEN %(closed)s THEN clock.now END,
       clock.now, NULL, %(members)s, %(members)s, 0, 0, 0
FROM clock
ON CONFLICT DO NOTHING
RETURNING id
"""

# Lock the existing jobs a new job depends on, and mark them has_dependents (so that the settle
# trigger runs when they finish). The UPDATE takes each row's lock until the caller commits: a
# dependency finishing meanwhile waits for that commit, and its trigger then sees the new edges
# (each statement of a trigger function takes a fresh snapshot). Returns each row's status, so
# that an edge to a job already done is inserted resolved, and one to a dead job follows the
# dependent's policy. Locked in id order, like the operator's bulk statements.
DEPENDENCY_LOCK = f"""
WITH target AS MATERIALIZED (
    SELECT j.id FROM {JOB_TABLE} j WHERE j.id = ANY(%(ids)s::bigint[]) ORDER BY j.id FOR UPDATE
)
UPDATE {JOB_TABLE} j SET has_dependents = true
FROM target WHERE j.id = target.id
RETURNING j.id, j.status
"""

# Insert the steps of a workflow (or members added to a batch) in one statement. Per-step values
# travel as three JSON arrays (the options, the args, the kwargs), one element per step in order:
# one parameter each, decoded by PostgreSQL, instead of one Python-quoted array per column. Steps
# with dependencies, and callbacks, start "waiting" (never claimable); the others "ready". Then
# the edges between new steps (by step name) and to existing jobs (by id) are inserted, resolved
# already when the existing job is done (or dead, for a dependent that runs anyway), and the
# NOTIFYs of due queues are sent at commit. The ids come back in step order.
WORKFLOW_STEPS_INSERT = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
s AS MATERIALIZED (
    SELECT nextval(pg_get_serial_sequence('{JOB_TABLE}', 'id')) AS id, x.*
    FROM (SELECT o.n, o.value AS o, a.value AS args, k.value AS kwargs
          FROM jsonb_array_elements(%(opts)s::jsonb) WITH ORDINALITY AS o(value, n)
          JOIN jsonb_array_elements(%(args)s::jsonb) WITH ORDINALITY AS a(value, n) ON a.n = o.n
          JOIN jsonb_array_elements(%(kwargs)s::jsonb) WITH ORDINALITY AS k(value, n) ON k.n = o.n
          ORDER BY o.n) AS x
),
ins AS (
    INSERT INTO {JOB_TABLE} (
        id, task, queue, priority, status, args, kwargs, run_at, attempts, max_attempts, lease_seconds, leased_by,
        lease_version, unique_scope, concurrency_key, concurrency_limit, cancel_requested, snoozes, errors,
        history, created_at, sequence_key, sequence_halts, rate_key, rate_limit_n, rate_limit_secs, fair_key,
        workflow_id, workflow_step, workflow_role, waiting_on, has_dependents, pass_result, on_dependency_dead,
        trace_context
    )
    SELECT s.id, s.o->>'task', s.o->>'queue', (s.o->>'priority')::smallint,
           CASE WHEN (s.o->>'waiting_on')::int > 0 OR s.o->>'role' <> 'member' THEN 'waiting' ELSE 'ready' END,
           -- A step that takes results and whose dependencies (existing jobs) are all finished
           -- already starts ready with their results, as the settle trigger would have given them.
           CASE WHEN (s.o->>'waiting_on')::int = 0 AND s.o->>'role' = 'member'
                     AND coalesce((s.o->>'pass_result')::bool, false) AND (s.o->>'edges')::int > 0 THEN
                jsonb_build_array((
                    SELECT CASE WHEN count(*) = 1
                                THEN (array_agg(CASE WHEN p.status = 'done' THEN p.result END))[1]
                                ELSE jsonb_object_agg(e.value->>'name', CASE WHEN p.status = 'done' THEN p.result END)
                           END
                    FROM jsonb_array_elements(%(edges)s::jsonb) AS e(value)
                    JOIN {JOB_TABLE} p ON p.id = (e.value->>'on_id')::bigint
                    WHERE (e.value->>'job')::bigint = s.n)) || s.args
                ELSE s.args END,
           s.kwargs,
           coalesce((s.o->>'run_at')::timestamptz, clock.now + make_interval(secs => (s.o->>'delay')::float8)),
           0, (s.o->>'max_attempts')::int, (s.o->>'lease_seconds')::float8, '', 0, 'retained',
           s.o->>'concurrency_key', (s.o->>'concurrency_limit')::int, false, 0, '[]'::jsonb, '[]'::jsonb,
           clock.now, s.o->>'sequence_key', coalesce((s.o->>'sequence_halts')::bool, false), s.o->>'rate_key',
           (s.o->>'rate_limit_n')::int, (s.o->>'rate_limit_secs')::float8, s.o->>'fair_key',
           %(workflow)s, s.o->>'step', s.o->>'role', (s.o->>'waiting_on')::int,
           coalesce((s.o->>'has_dependents')::bool, false), coalesce((s.o->>'pass_result')::bool, false),
           coalesce(s.o->>'policy', 'hold'), %(trace_context)s::jsonb
    FROM s, clock
    ORDER BY s.n
    RETURNING id, status, queue, run_at
),
edges AS (
    INSERT INTO {DEPENDENCY_TABLE} (job_id, depends_on_id, name, resolved)
    SELECT dj.id, coalesce(dn.id, (e.value->>'on_id')::bigint), e.value->>'name',
           coalesce((e.value->>'resolved')::bool, false)
    FROM jsonb_array_elements(%(edges)s::jsonb) WITH ORDINALITY AS e(value, n)
    JOIN s dj ON dj.n = (e.value->>'job')::bigint
    LEFT JOIN s dn ON dn.n = (e.value->>'on')::bigint
    ORDER BY e.n  -- edge ids in declaration order: job_dependencies() lists them so
    RETURNING 1
),
woken AS (
    SELECT leasequeue_wake(%(channel)s, q.queue, q.run_at, (SELECT now FROM clock))
    FROM (SELECT queue, min(run_at) AS run_at FROM ins WHERE status = 'ready' GROUP BY queue) AS q
    WHERE %(channel)s::text IS NOT NULL
)
SELECT string_agg(id::text, ',' ORDER BY id), (SELECT count(*) FROM edges), (SELECT count(*) FROM woken)
FROM ins
"""

@dataclass(frozen=True)
class NewMembers:
    """Members of a workflow that depend on nothing (a batch's, a group's, a chord's), to insert in
    one statement by :func:`workflow_insert_members`: the values members share travel once, in a
    template, and each member's arguments as one element of a JSON array.

    Attributes:
        templates: the distinct shared values, each a job built by ``enqueueing.build_job`` (its
            unique key None; its ``args_json`` and ``kwargs_json`` are ignored).
        policies: the ``on_dependency_dead`` of each template (``"hold"``, ``"cancel"``, ``"run"``).
        args_json: a JSON array with one array of positional arguments per member, in order.
        kwargs_json: a JSON array of keyword-argument objects parallel to ``args_json``, or None
            when no member has keyword arguments.
        shape: the index into ``templates`` of each member, or None when every member uses
            ``templates[0]``.
        steps: the step name of each member (None for an anonymous one), or None when all are
            anonymous.
        count: the number of members.
    """

    templates: tuple[NewJob, ...]
    policies: tuple[str, ...]
    args_json: str
    kwargs_json: str | None
    shape: tuple[int, ...] | None
    steps: tuple[str | None, ...] | None
    count: int


# Insert members that depend on nothing (a batch's, a group's, a chord's) in one statement, as
# JOB_INSERT_MANY does for enqueue_many(): the shared values come once per template (a handful of
# JSON objects, decoded once into the small table t), the arguments as one JSON array per kind,
# expanded by jsonb_array_elements. Nothing here needs an edge or a waiting state: every member
# starts "ready". The ids come from the column default in the order of the SELECT (ORDER BY a.n),
# so they follow the members' order, which is the order of their results. The per-member template
# index and step names are joined by position (unnest WITH ORDINALITY), never subscripted: an
# array subscript walks a text array from its start on every row. Every member of a template has
# its queue and run_at, so the NOTIFYs are computed from the templates (the ones of this chunk),
# not from the inserted rows.
WORKFLOW_MEMBERS_INSERT = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
t AS MATERIALIZED (
    SELECT (x.n - 1)::int AS i, x.o->>'task' AS task, x.o->>'queue' AS queue, (x.o->>'priority')::smallint AS priority,
           (x.o->>'run_at')::timestamptz AS run_at, (x.o->>'delay')::float8 AS delay,
           (x.o->>'max_attempts')::int AS max_attempts, (x.o->>'lease_seconds')::float8 AS lease_seconds,
           x.o->>'concurrency_key' AS concurrency_key, (x.o->>'concurrency_limit')::int AS concurrency_limit,
           x.o->>'sequence_key' AS sequence_key, coalesce((x.o->>'sequence_halts')::bool, false) AS sequence_halts,
           x.o->>'rate_key' AS rate_key, (x.o->>'rate_limit_n')::int AS rate_limit_n,
           (x.o->>'rate_limit_secs')::float8 AS rate_limit_secs, x.o->>'fair_key' AS fair_key,
           x.o->>'policy' AS policy
    FROM jsonb_array_elements(%(templates)s::jsonb) WITH ORDINALITY AS x(o, n)
),
ins AS (
    INSERT INTO {JOB_TABLE} (
        task, queue, priority, status, args, kwargs, run_at, attempts, max_attempts, lease_seconds, leased_by,
        lease_version, unique_scope, concurrency_key, concurrency_limit, cancel_requested, snoozes, errors,
        history, created_at, sequence_key, sequence_halts, rate_key, rate_limit_n, rate_limit_secs, fair_key,
        workflow_id, workflow_step, workflow_role, waiting_on, has_dependents, pass_result, on_dependency_dead,
        trace_context
    )
    SELECT t.task, t.queue, t.priority, 'ready', a.value, coalesce(k.value, '{{}}'::jsonb),
           coalesce(t.run_at, clock.now + make_interval(secs => t.delay)), 0, t.max_attempts, t.lease_seconds,
           '', 0, 'retained', t.concurrency_key, t.concurrency_limit, false, 0, '[]'::jsonb, '[]'::jsonb,
           clock.now, t.sequence_key, t.sequence_halts, t.rate_key, t.rate_limit_n, t.rate_limit_secs, t.fair_key,
           %(workflow)s, s.name, 'member', 0, false, false, t.policy, %(trace_context)s::jsonb
    FROM clock,
         jsonb_array_elements(%(args)s::jsonb) WITH ORDINALITY AS a(value, n)
         LEFT JOIN jsonb_array_elements(%(kwargs)s::jsonb) WITH ORDINALITY AS k(value, n) ON k.n = a.n
         LEFT JOIN unnest(%(shape)s::int[]) WITH ORDINALITY AS sh(i, n) ON sh.n = a.n
         LEFT JOIN unnest(%(steps)s::text[]) WITH ORDINALITY AS s(name, n) ON s.n = a.n
         JOIN t ON t.i = coalesce(sh.i, 0)
    ORDER BY a.n
    RETURNING id
),
woken AS (
    SELECT leasequeue_wake(%(channel)s, q.queue, q.run_at, (SELECT now FROM clock))
    FROM (SELECT t.queue, min(coalesce(t.run_at, c.now + make_interval(secs => t.delay))) AS run_at
          FROM t, clock c WHERE EXISTS (SELECT 1 FROM ins) GROUP BY t.queue) AS q
    WHERE %(channel)s::text IS NOT NULL
)
SELECT string_agg(id::text, ',' ORDER BY id), (SELECT count(*) FROM woken) FROM ins
"""


def _template_options(job: NewJob, policy: str) -> dict[str, Any]:
    return {
        "task": job.task, "queue": job.queue, "priority": job.priority,
        "run_at": job.run_at.isoformat() if job.run_at is not None else None, "delay": float(job.delay),
        "max_attempts": job.max_attempts, "lease_seconds": job.lease_seconds,
        "concurrency_key": job.concurrency_key, "concurrency_limit": job.concurrency_limit,
        "sequence_key": job.sequence_key, "sequence_halts": job.sequence_halts, "rate_key": job.rate_key,
        "rate_limit_n": job.rate_limit_n, "rate_limit_secs": job.rate_limit_secs, "fair_key": job.fair_key,
        "policy": policy,
    }


def workflow_insert_members(workflow_id: int, members: NewMembers, *, channel: str | None,
                            alias: str | None = None, trace_context: TraceContext | None = None) -> list[int]:
    """Insert members that depend on nothing in one statement, in the caller's transaction
    (:data:`WORKFLOW_MEMBERS_INSERT`). The workflow's counters are the caller's: it created the
    workflow with them (:func:`workflow_create`) or counted them in (:func:`workflow_add_members`).

    Args:
        workflow_id: the workflow row.
        members: the validated members (at most a few tens of thousands per call: one statement).
        channel: the NOTIFY channel for due members, or None (notifications off).
        trace_context: the W3C trace context carrier written into every member's row, or None (NULL).

    Returns:
        The new job ids, in member order.
    """
    if not members.count:
        return []
    alias = alias or db_alias()
    params = {"now": None, "workflow": workflow_id, "channel": channel,
              "templates": _dumps([_template_options(t, p) for t, p in zip(members.templates, members.policies,
                                                                          strict=True)]),
              "args": members.args_json, "kwargs": members.kwargs_json,
              "shape": list(members.shape) if members.shape is not None else None,
              "steps": list(members.steps) if members.steps is not None else None,
              "trace_context": _trace_json(trace_context)}
    with _schema_required(alias), transaction.atomic(using=alias, savepoint=False), \
            sequence_locked([t.sequence_key for t in members.templates], alias=alias):
        ids_text, _woken = _run(WORKFLOW_MEMBERS_INSERT, params, alias=alias).one()
    return [int(i) for i in ids_text.split(",")] if ids_text else []


# Members added to an open batch: the counters move with the insert, under the workflow row's
# lock, which a member finishing meanwhile also takes (its trigger updates the same row), so the
# counts are never behind. A closed batch is refused (no row), and so are members past %(max)s
# when a callback takes the members' results (the row, but nothing added).
WORKFLOW_ADD_MEMBERS = f"""
WITH open AS MATERIALIZED (
    SELECT w.id, w.members,
           EXISTS (SELECT 1 FROM {JOB_TABLE} c WHERE c.id IN (w.on_success_id, w.on_complete_id) AND c.pass_result)
               AS passes
    FROM {WORKFLOW_TABLE} w
    WHERE w.id = %(workflow)s AND w.closed_at IS NULL
    FOR UPDATE OF w
),
added AS (
    UPDATE {WORKFLOW_TABLE} w
    SET members = w.members + %(n)s, members_pending = w.members_pending + %(n)s, progressed_at = leasequeue_now()
    FROM open
    WHERE w.id = open.id AND (NOT open.passes OR open.members + %(n)s <= %(max)s)
    RETURNING w.id
)
SELECT o.members, (SELECT count(*) FROM added) FROM open o
"""

# Close an open batch; when no member is pending the callbacks are released at once (the same
# function the trigger calls). Returns whether this call closed it.
WORKFLOW_CLOSE = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
closed AS (
    UPDATE {WORKFLOW_TABLE} w SET closed_at = clock.now, progressed_at = clock.now
    FROM clock
    WHERE w.id = %(workflow)s AND w.closed_at IS NULL
    RETURNING w.id, w.members_pending
)
SELECT c.id, c.members_pending FROM closed c
"""
WORKFLOW_SETTLE = "SELECT leasequeue_workflow_settle(%(workflow)s, leasequeue_now(), %(channel)s::text)"

WORKFLOW_SET_CALLBACKS = f"""
UPDATE {WORKFLOW_TABLE} SET on_success_id = %(on_success)s, on_complete_id = %(on_complete)s WHERE id = %(workflow)s
"""


def _step_options(step: NewStep, waiting_on: int, has_dependents: bool) -> dict[str, Any]:
    return _template_options(step.job, step.on_dependency_dead) | {
        "step": step.step, "role": step.role, "waiting_on": waiting_on, "has_dependents": has_dependents,
        "pass_result": step.pass_result,
    }


def workflow_create(*, kind: str, name: str, unique_key: str | None, on_dependency_dead: str, closed: bool,
                    members: int, alias: str | None = None) -> int | None:
    """Insert a workflow row in the caller's transaction.

    Args:
        kind: a :class:`~django_leasequeue.models.WorkflowKind` value.
        members: the number of member steps about to be inserted (0 for a new batch).
        closed: False for a batch (open until :func:`workflow_close`).

    Returns:
        The new workflow's id, or None when ``unique_key`` is taken (nothing was written).
    """
    row = _run(WORKFLOW_INSERT, {"now": None, "kind": kind, "name": name, "unique_key": unique_key,
                                 "policy": on_dependency_dead, "closed": closed, "members": members},
               alias=alias).one()
    return row[0] if row else None


def workflow_get_by_unique_key(unique_key: str, *, alias: str | None = None) -> Workflow | None:
    """The workflow holding ``unique_key``, or None."""
    return Workflow.objects.using(alias or db_alias()).filter(unique_key=unique_key).first()


# Cancel a just-inserted step whose dependency had died before it was built (policy "cancel"),
# recorded as the trigger records a cascade. Its own status change fires the settle trigger.
JOB_CANCEL_DOOMED = f"""
WITH clock AS MATERIALIZED ({CLOCK_WAKING})
UPDATE {JOB_TABLE} j
SET status = 'cancelled', finished_at = clock.now,
    history = j.history || jsonb_build_array(jsonb_build_object(
        'event', 'cancelled', 'by', 'dependency #' || %(dependency)s::bigint, 'at', clock.now,
        'from_status', j.status,
        'reason', 'dependency #' || %(dependency)s::bigint || ' had ended dead or cancelled when this job was built'))
FROM clock
WHERE j.id = %(id)s AND j.status = 'waiting'
"""


def workflow_insert_steps(workflow_id: int | None, steps: Sequence[NewStep], *, channel: str | None,
                          alias: str | None = None, trace_context: TraceContext | None = None) -> list[int]:
    """Insert the steps of a workflow, with their dependency edges, in the caller's transaction.

    Existing jobs named in ``depends_on_ids`` are locked and marked first (:data:`DEPENDENCY_LOCK`),
    so none of them can finish unseen before the caller commits.

    Args:
        workflow_id: the workflow row (:func:`workflow_create`).
        steps: the jobs in order; each ``depends_on`` names steps of this list (the caller checked
            that the names exist and form no cycle).
        channel: the NOTIFY channel for due steps, or None (notifications off).
        trace_context: the W3C trace context carrier written into every step's row, or None (NULL).

    Returns:
        The new job ids, in step order.

    Raises:
        LookupError: a job in ``depends_on_ids`` does not exist.
    """
    if not steps:
        return []
    alias = alias or db_alias()
    with _schema_required(alias), transaction.atomic(using=alias, savepoint=False), \
            sequence_locked([s.job.sequence_key for s in steps], alias=alias):
        existing_ids = sorted({i for s in steps for i in s.depends_on_ids})
        existing: dict[int, str] = {}
        if existing_ids:
            existing = dict(_run(DEPENDENCY_LOCK, {"ids": existing_ids}, alias=alias).rows)
            missing = [i for i in existing_ids if i not in existing]
            if missing:
                raise LookupError(f"depends_on names jobs that do not exist: {missing}")
        position = {s.step: n for n, s in enumerate(steps, 1) if s.step is not None}
        depended = {name for s in steps for name in s.depends_on}
        opts: list[dict[str, Any]] = []
        edges: list[dict[str, Any]] = []
        doomed: dict[int, int] = {}  # step position -> its first dead or cancelled dependency
        for n, step in enumerate(steps, 1):
            waiting = len(step.depends_on)
            for name in step.depends_on:
                edges.append({"job": n, "on": position[name], "name": name})
            for dep_id in step.depends_on_ids:
                status = existing[dep_id]
                resolved = status == "done" or (status in ("dead", "cancelled") and step.on_dependency_dead == "run")
                edges.append({"job": n, "on_id": dep_id, "name": str(dep_id), "resolved": resolved})
                waiting += 0 if resolved else 1
                if status in ("dead", "cancelled") and step.on_dependency_dead == "cancel":
                    doomed.setdefault(n, dep_id)
            opts.append(_step_options(step, waiting, step.step in depended)
                        | {"edges": len(step.depends_on) + len(step.depends_on_ids)})
        params = {"now": None, "workflow": workflow_id, "channel": channel, "opts": _dumps(opts),
                  "args": "[" + ",".join(s.job.args_json for s in steps) + "]",
                  "kwargs": "[" + ",".join(s.job.kwargs_json for s in steps) + "]",
                  "edges": _dumps(edges), "trace_context": _trace_json(trace_context)}
        ids_text, _edges, _woken = _run(WORKFLOW_STEPS_INSERT, params, alias=alias).one()
        ids = [int(i) for i in ids_text.split(",")] if ids_text else []
        # A step with the "cancel" policy whose dependency is dead (or cancelled) already is
        # cancelled now, as the settle trigger would have cancelled it when the dependency died:
        # through the trigger again, so its workflow's counters and its own dependents follow.
        for n, dep_id in doomed.items():
            _run(JOB_CANCEL_DOOMED, {"now": None, "id": ids[n - 1], "dependency": dep_id,
                                     "wake": channel}, alias=alias)
    return ids


def workflow_set_callbacks(workflow_id: int, *, on_success: int | None, on_complete: int | None,
                           alias: str | None = None) -> None:
    """Record the callback jobs of a workflow (inserted by :func:`workflow_insert_steps`)."""
    _run(WORKFLOW_SET_CALLBACKS, {"workflow": workflow_id, "on_success": on_success, "on_complete": on_complete},
         alias=alias)


def workflow_add_members(workflow_id: int, count: int, *, max_passed: int, alias: str | None = None) -> str:
    """Count ``count`` new members into an open batch (before inserting them, in one transaction).

    Args:
        max_passed: the most members a batch may have when a callback takes their results.

    Returns:
        ``"added"``; ``"closed"`` when the batch is closed or missing, ``"too_many"`` when a callback
        takes the results and the batch would have more than ``max_passed`` members (nothing was
        changed in either case).
    """
    row = _run(WORKFLOW_ADD_MEMBERS, {"workflow": workflow_id, "n": count, "max": max_passed}, alias=alias).one()
    if row is None:
        return "closed"
    return "added" if row[1] else "too_many"


def workflow_close(workflow_id: int, *, channel: str | None, settle: bool = True, alias: str | None = None) -> bool:
    """Close an open batch; release its callbacks at once when no member is pending.

    Args:
        channel: the NOTIFY channel for released callbacks, or None.
        settle: False: only close (a cancel that cancels the callbacks next).

    Returns:
        True when this call closed it; False when it was closed already or does not exist.
    """
    alias = alias or db_alias()
    with transaction.atomic(using=alias, savepoint=False):
        row = _run(WORKFLOW_CLOSE, {"now": None, "workflow": workflow_id}, alias=alias).one()
        if row is None:
            return False
        if row[1] == 0 and settle:
            _run(WORKFLOW_SETTLE, {"workflow": workflow_id, "channel": channel}, alias=alias)
    return True


# The member counts by state (the counters hold pending as one number; this splits it).
WORKFLOW_COUNTS = f"""
SELECT j.status, count(*) FROM {JOB_TABLE} j
WHERE j.workflow_id = %(workflow)s AND j.workflow_role = 'member'
GROUP BY j.status
"""


def workflow_counts(workflow_id: int, *, alias: str | None = None) -> dict[str, int]:
    """The workflow's members by job status (``waiting``, ``ready``, ``leased``, ``done``, ``dead``,
    ``cancelled``; every status present, 0 when none)."""
    counts = {s: 0 for s in ("waiting", "ready", "leased", "done", "dead", "cancelled")}
    counts.update(dict(_run(WORKFLOW_COUNTS, {"workflow": workflow_id}, alias=alias).rows))
    return counts


WORKFLOW_RESULTS = f"""
SELECT j.id, j.result FROM {JOB_TABLE} j
WHERE j.workflow_id = %(workflow)s AND j.workflow_role = 'member' AND j.id > %(after)s
ORDER BY j.id
LIMIT %(limit)s
"""


def workflow_results(workflow_id: int, *, after: int = 0, limit: int = 10_000,
                     alias: str | None = None) -> list[tuple[int, Any]]:
    """The members' results in member order (None for a member not done), after job id ``after``.

    Returns:
        Up to ``limit`` ``(job id, result)`` pairs.
    """
    rows = _run(WORKFLOW_RESULTS, {"workflow": workflow_id, "after": after, "limit": limit}, alias=alias).rows
    return [(r[0], None if r[1] is None else _load(r[1])) for r in rows]


# A job's dependencies with their outcome: what a step that runs anyway is told of its failed
# dependencies (JobContext.dependencies), and the admin's "blocked by".
JOB_DEPENDENCIES = f"""
SELECT d.name, d.depends_on_id, p.status, p.result, p.errors -> -1, d.resolved
FROM {DEPENDENCY_TABLE} d LEFT JOIN {JOB_TABLE} p ON p.id = d.depends_on_id
WHERE d.job_id = %(id)s
ORDER BY d.id
"""


@dataclass(frozen=True)
class DependencyOutcome:
    """One dependency of a job, as it stands.

    Attributes:
        name: its step name (its job id as text when it is not a step of the same workflow).
        job_id: the dependency's job id.
        status: its job status, or None when the row was deleted.
        result: its return value when done, else None.
        error: its last error entry (type, message, ...) or None.
        resolved: it no longer holds the dependent back.
    """

    name: str
    job_id: int
    status: str | None
    result: Any
    error: dict[str, Any] | None
    resolved: bool


def job_dependencies(job_id: int, *, alias: str | None = None) -> list[DependencyOutcome]:
    """The dependencies of a job in the order they were declared."""
    rows = _run(JOB_DEPENDENCIES, {"id": job_id}, alias=alias).rows
    return [DependencyOutcome(name, dep, status, None if result is None else _load(result),
                              None if error is None else _load(error), resolved)
            for name, dep, status, result, error, resolved in rows]
