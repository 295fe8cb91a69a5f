"""Collection of the health report: :func:`snapshot` and :func:`lease_report` run the read-only
statements of :mod:`django_leasequeue.store.read` and turn their rows into :class:`Snapshot` and
:class:`TaskLeaseStats` values. All times come from the database clock (``leasequeue_now()``)
unless an explicit aware ``now`` is passed (tests).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from .. import store
from ..conf import Settings, get_settings
from ..store import read
from .leases import FLAG_LOST_WHILE_HEALTHY, FLAG_P99_OVER_TIMEOUT, FLAG_UNREGISTERED, TaskLeaseStats, recommend
from .report import QueueStats, Snapshot, StuckWorkflow, WorkerInfo

# Number of statements snapshot() runs that read tables (reported by the bench): the queue
# figures, the processes and the workflows.
SNAPSHOT_QUERIES = 3


def _alias() -> str:
    return store.db_alias()


def snapshot(now: datetime | None = None, *, window_short: float = 300, window_long: float = 3600,
             alive_within: float | None = None, queues: Sequence[str] | None = None,
             workflow_stuck_after: float | None = None, alias: str | None = None) -> Snapshot:
    """Read the health of every queue, process and workflow (three read-only statements).

    Args:
        now: aware datetime to evaluate at; None (the normal case) reads the database clock.
        window_short, window_long: seconds of the two "recently done / dead-lettered" windows.
        alive_within: seconds; a process whose heartbeat is older is not alive. None: the
            ``PROCESS_ALIVE_WITHIN`` setting.
        queues: restrict the queue figures to these names (each is reported, even with no jobs);
            None reports every queue that has jobs, a ``QueueState`` row, or is configured in
            ``LEASEQUEUE["QUEUES"]`` (or is the ``DEFAULT_QUEUE``). The workflow figures are the
            whole system's either way.
        workflow_stuck_after: seconds; an unfinished workflow whose last progress is older is
            stuck. None: the ``WORKFLOW_STUCK_AFTER`` setting.
        alias: database alias; default the job table's (through the routers).

    Returns:
        A :class:`Snapshot`.

    Raises:
        ValueError: a naive ``now``, or a window or ``workflow_stuck_after`` that is not > 0.
        django.db.DatabaseError: the database cannot be read.
    """
    if now is not None and (now.tzinfo is None or now.utcoffset() is None):
        raise ValueError("snapshot(now=...) needs an aware datetime")
    if window_short <= 0 or window_long <= 0:
        raise ValueError("windows must be > 0 seconds")
    if workflow_stuck_after is not None and not workflow_stuck_after > 0:
        raise ValueError(f"workflow_stuck_after must be > 0 seconds, got {workflow_stuck_after!r}")
    settings = get_settings()
    alive_within = float(settings.process_alive_within if alive_within is None else alive_within)
    stuck_after = float(settings.workflow_stuck_after if workflow_stuck_after is None else workflow_stuck_after)
    if queues is not None:
        queue_filter: list[str] | None = list(dict.fromkeys(queues))
        always = queue_filter
    else:
        queue_filter = None
        always = list(settings.queues) if settings.queues is not None else [settings.default_queue]
    params = {"now": now, "queues": queue_filter, "always": always, "short": float(window_short),
              "long": float(window_long), "widest": float(max(window_short, window_long)),
              "stuck_after": stuck_after}
    rows, process_rows, workflow_row, elapsed = read.snapshot_rows(params, alias=alias or _alias())
    db_now = rows[0][0]
    workers = process_infos(process_rows, db_now, alive_within)
    # The newest tick of a registered process, or of the sweep record, which keeps the last tick
    # after the scheduler's row is deleted (a clean stop) or pruned (a dead scheduler).
    ticks = [w.last_tick_at for w in workers if w.last_tick_at is not None]
    if rows[0][15] is not None:
        ticks.append(rows[0][15])
    last_tick = max(ticks) if ticks else None
    tick_age = max((db_now - last_tick).total_seconds(), 0.0) if last_tick is not None else None
    snap = Snapshot(now=db_now, workers=workers, scheduler_last_tick_age_seconds=tick_age,
                    scheduler_last_tick_at=last_tick,
                    reaper_last_sweep_age_seconds=rows[0][14],
                    workers_alive=sum(1 for w in workers if w.alive and w.kind == "worker"),
                    window_short=float(window_short), window_long=float(window_long),
                    alive_within=alive_within, query_seconds=elapsed,
                    workflows_unfinished=workflow_row[0], workflows_stuck=workflow_row[1],
                    oldest_stuck_workflow=_stuck_workflow(workflow_row), workflow_stuck_after=stuck_after)
    for row in rows:
        if row[1] is None:  # no queue at all: the clock row only
            continue
        snap.queues.append(QueueStats(
            queue=row[1], ready_due=row[2], scheduled=row[3], leased=row[4], dead=row[5],
            oldest_ready_age_seconds=float(row[6]), done_recent_short=row[7], dead_recent_short=row[8],
            done_recent_long=row[9], dead_recent_long=row[10], paused=row[11], leased_expired=row[12],
            workers_serving=snap.workers_serving(row[1]), waiting=row[13],
        ))
    return snap


def process_infos(process_rows: Sequence[Sequence[Any]], now: datetime, alive_within: float) -> list[WorkerInfo]:
    """Turn ``store.read.PROCESSES`` rows into :class:`WorkerInfo` values: monitoring's one rule of
    "alive" (a heartbeat at most ``alive_within`` seconds older than ``now``), shared by
    :func:`snapshot` and the admin's workers page.

    Args:
        process_rows: rows of ``PROCESSES`` (id, kind, host, pid, queues, concurrency, started_at,
            last_heartbeat_at, last_tick_at, stuck handlers, the oldest stuck handler's timeout time,
            reaps).
        now: the database clock reading to judge by (aware datetime).
        alive_within: seconds.

    Returns:
        One :class:`WorkerInfo` per row, in the rows' order.
    """
    workers = []
    for pid_, kind, host, pid, wq, concurrency, started_at, beat, tick, stuck, stuck_since, reaps in process_rows:
        age = (now - beat).total_seconds()
        if isinstance(wq, (str, bytes)):  # Django's psycopg backend hands jsonb over undecoded
            wq = json.loads(wq)
        workers.append(WorkerInfo(
            id=pid_, kind=kind, host=host, pid=pid, queues=[str(q) for q in wq or []], started_at=started_at,
            last_heartbeat_at=beat, alive=age <= alive_within, concurrency=concurrency,
            last_tick_at=tick, heartbeat_age_seconds=max(age, 0.0), stuck_handlers=stuck,
            stuck_seconds=max((now - stuck_since).total_seconds(), 0.0) if stuck_since is not None else 0.0,
            reaps=bool(reaps),
        ))
    return workers


def _stuck_workflow(row: Sequence[Any]) -> StuckWorkflow | None:
    """The oldest stuck workflow of a ``WORKFLOW_STATS`` row, or None when none is stuck."""
    (_, _, wf_id, kind, name, age, is_open, members, pending, held_by, held_status) = row
    if wf_id is None:
        return None
    return StuckWorkflow(id=wf_id, kind=kind, name=name or "", age_seconds=float(age), open=bool(is_open),
                         members=members, members_pending=pending, held_by=held_by, held_by_status=held_status)


def lease_report(now: datetime | None = None, *, window: float = 86400, tasks: Sequence[str] | None = None,
                 settings: Settings | None = None, alias: str | None = None) -> list[TaskLeaseStats]:
    """Runtime distribution, lease losses and advice per task over the last ``window`` seconds.

    Flags a task whose p99 runtime exceeds its registered timeout (its normal runs are being cut
    off and retried) and a task that lost leases while healthy (see :func:`recommend` for the
    recommended timeout and lease, and :class:`TaskLeaseStats` for each figure).

    Args:
        now: aware datetime; None reads the database clock.
        window: seconds of history (by ``finished_at``; leases and rejections by their own time).
        tasks: restrict to these task names.
        settings: for the default lease; default the validated ``LEASEQUEUE`` setting.
        alias: database alias; default the job table's.

    Returns:
        One :class:`TaskLeaseStats` per task with jobs finished in the window, by name.

    Raises:
        ValueError: ``window`` not > 0 or a naive ``now``.
        django.db.DatabaseError: the database cannot be read.
    """
    from .. import registry

    if window <= 0:
        raise ValueError("window must be > 0 seconds")
    if now is not None and (now.tzinfo is None or now.utcoffset() is None):
        raise ValueError("lease_report(now=...) needs an aware datetime")
    settings = settings or get_settings()
    registry.autodiscover()
    params = {"now": now, "window": float(window), "tasks": list(tasks) if tasks is not None else None}
    rows = read.lease_report_rows(params, alias=alias or _alias())
    report = []
    for task_name, done, dead, pcts, max_secs, expired, rejected, healthy in rows:
        try:
            spec = registry.get_task(task_name)
            registered = True
        except Exception:  # UnknownTask, or a resolver that cannot import it
            spec, registered = None, False
        timeout = getattr(spec, "timeout", None)
        lease = float(getattr(spec, "lease", None) or settings.lease)
        manual = bool(getattr(spec, "manual_heartbeat", False))
        p50, p95, p99 = (float(x) for x in pcts) if pcts else (None, None, None)
        max_runtime = float(max_secs) if max_secs is not None else None
        rec_timeout, rec_lease = recommend(p99=p99, max_runtime=max_runtime, lease=lease,
                                           manual_heartbeat=manual, lost_while_healthy=healthy)
        flags = []
        if timeout is not None and p99 is not None and p99 > timeout:
            flags.append(FLAG_P99_OVER_TIMEOUT)
        if healthy:
            flags.append(FLAG_LOST_WHILE_HEALTHY)
        if not registered:
            flags.append(FLAG_UNREGISTERED)
        report.append(TaskLeaseStats(
            task=task_name, done=done, dead=dead, p50=p50, p95=p95, p99=p99, max=max_runtime,
            lease_expired=expired, fence_rejected=rejected, lost_while_healthy=healthy, registered=registered,
            timeout=float(timeout) if timeout is not None else None, lease=lease, manual_heartbeat=manual,
            recommended_timeout=rec_timeout, recommended_lease=rec_lease if p99 is not None or healthy else None,
            flags=tuple(flags),
        ))
    return report
