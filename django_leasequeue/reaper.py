"""The reaper: takes back expired leases, prunes old finished jobs, and dead-letters the jobs of
tasks that no live worker knows (rolling deploys, after ``UNKNOWN_TASK_GRACE``).

A job whose ``leased_until`` has passed by database time goes back to ``ready`` (its claim counted
as an attempt), or to ``dead`` when its attempts are exhausted, with "lease expired" recorded as
the attempt's error. Reaping depends only on the job row's lease, never on worker rows or names
(case C01), so a worker killed with SIGKILL loses nothing and needs no operator. One exception,
judged in the database: after a silence of every reaper (longer than twice the reaper interval:
the database was unreachable for everyone, or restarted), expired leases are left to their holders
for one lease period, so that an outage is not read as every worker dying (see ``store.JOB_REAP``).

Runs inside every worker (``WorkerService`` calls :func:`reap_once` every ``REAPER_INTERVAL``) and
as ``manage.py runreaper``. Any number may run at once: the statement uses ``SKIP LOCKED`` and a
compare-and-set on the expired lease, so two reapers never take back the same lease twice.

Events emitted: lease_expired, dead_lettered, cancelled.
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import datetime

from . import signals, store
from .conf import Settings, get_settings
from .runtime import Service

logger = logging.getLogger("django_leasequeue.reaper")

REAP_BATCH = 500
# Seconds between two prunes of stale process rows (the workers' embedded sweep and runreaper).
PROCESS_PRUNE_EVERY = 60.0


def outage_silence(interval: float) -> float:
    """Seconds without any sweep that count as an outage for everyone: twice the reaper
    ``interval`` (seconds), at least 1 s, so that one late sweep is not mistaken for one."""
    return max(1.0, 2 * interval)


def reap_once(*, now: datetime | None = None, alias: str | None = None, batch: int = REAP_BATCH,
              settings: Settings | None = None, interval: float | None = None,
              once: bool = False) -> list[store.Reaped]:
    """Take back every expired lease (in batches of ``batch``); return what was reaped.

    Args:
        now: the database time to judge expiry by (aware datetime; None: the database clock).
        alias: the database alias (None: the queue's).
        batch: most jobs per statement.
        settings: the settings (None: the project's); their ``LEASE`` applies to jobs without a
            lease of their own.
        interval: seconds between this process's sweeps (None: ``REAPER_INTERVAL``), which sets
            the silence taken for an outage (:func:`outage_silence`).
        once: a one-off sweep (``runreaper --once``, from cron): it has no cadence to measure a
            silence by, so it never declares an outage itself; it honours the window that a
            periodic sweep (a worker's, runreaper's) recorded after one, else the clock decides.
    """
    settings = settings or get_settings()
    silence = None if once else outage_silence(settings.reaper_interval if interval is None else interval)
    reaped: list[store.Reaped] = []
    while True:
        rows = store.job_reap_expired(limit=batch, now=now, silence=silence, lease=settings.lease, alias=alias)
        reaped.extend(rows)
        for row in rows:
            # The event names the expired attempt's token (the statement bumped it by one), so it
            # matches the token of that attempt's "claimed" event.
            fields = {"job_id": row.id, "task": row.task, "queue": row.queue, "attempt": row.attempts,
                      "token": row.lease_version - 1}
            signals.emit("lease_expired", status=row.status, **fields)
            if row.status == "dead":
                signals.emit("dead_lettered", error="LeaseExpired", message="lease expired", **fields)
            elif row.status == "cancelled":  # a cancel was requested and the worker died first
                signals.emit("cancelled", **fields)
        if len(rows) < batch:
            return reaped


def prune_processes(settings: Settings, *, now: datetime | None = None, alias: str | None = None) -> int:
    """Delete process rows silent for longer than ``PROCESS_PRUNE_AFTER``; return the count.

    Monitoring counts a process alive by its heartbeat age alone (``PROCESS_ALIVE_WITHIN``), so
    pruning only keeps the registry short: a SIGKILLed worker never deregisters.
    """
    return store.process_prune(older_than=settings.process_prune_after, now=now, alias=alias)


def dead_letter_unknown_tasks(settings: Settings, *, now: datetime | None = None, alias: str | None = None,
                              by: str = "reaper") -> list[store.DeadLettered]:
    """Dead-letter, as ``UnknownTask``, due ready jobs whose task no live worker serving their queue
    has known for ``UNKNOWN_TASK_GRACE`` seconds (see :func:`store.job_dead_letter_unknown_tasks`);
    nothing when the setting is None. Emits ``dead_lettered`` for each.

    Args:
        settings: validated settings (``UNKNOWN_TASK_GRACE``, ``PROCESS_ALIVE_WITHIN``).
        now: aware datetime instead of the database clock (tests).
        by: the calling process id, recorded as the error's ``worker``.

    Returns:
        The jobs dead-lettered.
    """
    if settings.unknown_task_grace is None:
        return []
    dead: list[store.DeadLettered] = []
    while True:
        rows = store.job_dead_letter_unknown_tasks(grace=settings.unknown_task_grace,
                                                   alive_within=settings.process_alive_within, by=by,
                                                   limit=REAP_BATCH, now=now, alias=alias)
        dead.extend(rows)
        for row in rows:
            signals.emit("dead_lettered", error="UnknownTask",
                         message=f"no live worker serving queue {row.queue!r} knows the task",
                         job_id=row.id, task=row.task, queue=row.queue, attempt=row.attempts,
                         token=row.lease_version)
        if len(rows) < REAP_BATCH:
            return dead


def prune_once(settings: Settings, *, now: datetime | None = None, alias: str | None = None) -> int:
    """Delete done/cancelled jobs older than ``RETENTION`` in small batches; return the count."""
    if settings.retention is None:
        return 0
    total = 0
    while True:
        deleted = store.job_prune(older_than=settings.retention, limit=settings.prune_batch, now=now, alias=alias)
        total += deleted
        if deleted < settings.prune_batch:
            return total


class ReaperService(Service):
    """``runreaper``: reap every ``REAPER_INTERVAL`` seconds, prune finished jobs and stale
    process rows every minute."""

    name = "reaper"

    def __init__(self, *, interval: float | None = None, settings: Settings | None = None,
                 process_id: str | None = None) -> None:
        super().__init__()
        self.settings = settings or get_settings()
        self.interval = float(interval or self.settings.reaper_interval)
        self.alias = store.db_alias()
        self.process_id = process_id or f"{socket.gethostname()}:{os.getpid()}:reaper"
        self._runs = 0
        self.reaped = 0

    def on_start(self) -> None:
        store.process_register(process_id=self.process_id, kind="reaper", host=socket.gethostname(),
                               pid=os.getpid(), queues=None, concurrency=0, alias=self.alias)

    def run_once(self) -> float:
        self.reaped += len(reap_once(alias=self.alias, settings=self.settings, interval=self.interval))
        dead_letter_unknown_tasks(self.settings, alias=self.alias, by=self.process_id)
        if self._runs % max(1, int(60 / self.interval)) == 0:
            pruned = prune_once(self.settings, alias=self.alias)
            stale = prune_processes(self.settings, alias=self.alias)
            if pruned or stale:
                logger.info("pruned %d finished job(s) and %d stale process row(s)", pruned, stale)
        self._runs += 1
        if not store.process_heartbeat(self.process_id, alias=self.alias):
            self.on_start()  # our row was pruned (we were silent too long): register again
        return self.interval

    def on_stop(self) -> None:
        store.process_deregister(self.process_id, alias=self.alias)
