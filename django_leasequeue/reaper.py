"""The reaper: takes back expired leases, prunes old finished jobs, and dead-letters the jobs of
tasks that no live worker knows (rolling deploys, after ``UNKNOWN_TASK_GRACE``).

A job whose ``leased_until`` has passed by database time goes back to ``ready`` (its claim counted
as an attempt), or to ``dead`` when its attempts are exhausted, with "lease expired" recorded as
the attempt's error. Reaping depends only on the job row's lease, never on worker rows or names
(case C01), so a worker killed with SIGKILL loses nothing and needs no operator. One exception,
judged in the database: after a silence of every reaper (longer than twice the reaper interval:
the database was unreachable for everyone, or restarted), expired leases are left to their holders
for one lease period, so that an outage is not read as every worker dying (see ``store.JOB_REAP``).

Runs inside every worker (``WorkerService`` composes a :class:`ReaperService` and calls its
:meth:`~ReaperService.sweep` every ``REAPER_INTERVAL``) and as ``manage.py runreaper``. The periodic
maintenance (pruning, folding) runs in runreaper and in one worker at a time, the one elected by
:func:`store.process_maintainer` (see :meth:`ReaperService.maintain_if_elected`). Any
number may run at once: the statement uses ``SKIP LOCKED`` and a
compare-and-set on the expired lease, so two reapers never take back the same lease twice.

Events emitted: lease_expired, dead_lettered, cancelled.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime

from django.db import DatabaseError

from . import signals, store
from .conf import Settings, get_settings
from .processes import RegisteredService, make_process_id

logger = logging.getLogger("django_leasequeue.reaper")

REAP_BATCH = 500


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
            fields = signals.event_fields(row.id, row.task, row.queue, row.attempts, row.lease_version - 1)
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

    The per-key rate logs whose window has passed are pruned on the same beat (they hold back no
    claim any more; see :func:`store.rate_key_prune`); they are not counted in the result.
    """
    store.rate_key_prune(now=now, alias=alias)
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
                         **signals.event_fields(row.id, row.task, row.queue, row.attempts, row.lease_version))
        if len(rows) < REAP_BATCH:
            return dead


def prune_once(settings: Settings, *, now: datetime | None = None, alias: str | None = None) -> int:
    """Delete done/cancelled jobs older than ``RETENTION`` in small batches; return the count.

    With ``HISTORY`` set, first move the done jobs older than ``HISTORY_MOVE_AFTER`` into the
    time-partitioned history and drop its partitions past ``RETENTION``
    (:func:`move_to_history`); the pruner then deletes what stayed in the job table. What the
    move did is in :func:`prune_and_move`'s result, not in this count.
    """
    return prune_and_move(settings, now=now, alias=alias).pruned


@dataclass(frozen=True)
class PruneRun:
    """What one :func:`prune_and_move` did: ``pruned`` jobs deleted from the job table, and the
    history's maintenance (``history``: None when ``HISTORY`` is off or its step failed)."""

    pruned: int
    history: store.HistoryRun | None


def prune_and_move(settings: Settings, *, now: datetime | None = None, alias: str | None = None) -> PruneRun:
    """:func:`prune_once`, returning what the history's move did as well as the pruned count.

    Args:
        settings: validated settings (``RETENTION``, ``PRUNE_BATCH``, ``HISTORY``).
        now: aware datetime instead of the database clock (tests).
        alias: the database alias (None: the queue's).

    Returns:
        A :class:`PruneRun`.
    """
    history = move_to_history(settings, now=now, alias=alias) if settings.history is not None else None
    if settings.retention is None:
        return PruneRun(0, history)
    total = 0
    while True:
        deleted = store.job_prune(older_than=settings.retention, limit=settings.prune_batch, now=now, alias=alias)
        total += deleted
        if deleted < settings.prune_batch:
            return PruneRun(total, history)


def partitions_text(names: list[str]) -> str:
    """A list of partition names in a few words, however many: ``"none"``, the one name, or the
    count with the first and last (the first maintenance with ``"hour"`` and 7 days of
    ``RETENTION`` creates 171)."""
    if not names:
        return "none"
    if len(names) == 1:
        return names[0]
    return f"{len(names)} ({names[0]} .. {names[-1]})"


def move_to_history(settings: Settings, *, now: datetime | None = None,
                    alias: str | None = None) -> store.HistoryRun | None:
    """With ``HISTORY`` set: create the history's partitions ahead, move the done jobs finished
    more than ``HISTORY_MOVE_AFTER`` ago into them, drop the partitions past ``RETENTION``
    (:func:`~django_leasequeue.store.history_maintain`). Returns what it did, or None when
    ``HISTORY`` is off or the step failed (a database error, logged; nothing half-moved)."""
    if settings.history is None:
        return None
    # A failed step (the history table locked past the partition lock timeout, a partition attached
    # by hand where ours would go) must not stop the pruner that follows: the jobs that did not move
    # stay in the job table, and the next maintenance tries again.
    try:
        run = store.history_maintain(settings.history, move_after=settings.history_move_after,
                                     retention=settings.retention, batch=settings.prune_batch, now=now, alias=alias)
    except DatabaseError:
        logger.exception("history: the maintenance of the time-partitioned history failed; the jobs stay "
                         "in the job table until the next maintenance")
        return None
    if run.created or run.moved or run.dropped:
        logger.info("history: moved %d done job(s), created partitions: %s, dropped partitions: %s",
                    run.moved, partitions_text(run.created), partitions_text(run.dropped))
    return run


def fold_stats(settings: Settings, *, now: datetime | None = None, alias: str | None = None) -> store.StatFold:
    """Fold the writers' chart counters, roll them up (minutes to hours to days) and delete those
    older than ``STATS_RETENTION`` (:func:`~django_leasequeue.store.stat_fold`)."""
    return store.stat_fold(retention=settings.stats_retention, now=now, alias=alias)


class ReaperService(RegisteredService):
    """``runreaper``: reap every ``REAPER_INTERVAL`` seconds, run the maintenance (prune finished
    jobs, stale process rows and rate logs, fold the chart counters) every ``MAINTENANCE_INTERVAL``. A worker
    composes one too (never started as a thread of its own): its claim loop calls :meth:`sweep`
    every ``REAPER_INTERVAL`` and :meth:`maintain_if_elected`, so that one worker at a time
    maintains when no runreaper runs.

    Args:
        interval: seconds between sweeps (None: ``REAPER_INTERVAL``).
        settings: validated settings (None: the project's).
        process_id: the registry row's id, also recorded as the ``worker`` of the jobs it
            dead-letters as unknown (default ``host:pid:reaper``; a worker passes its own id).
        alias: the database alias (None: the queue's).
    """

    name = "reaper"
    kind = "reaper"

    def __init__(self, *, interval: float | None = None, settings: Settings | None = None,
                 process_id: str | None = None, alias: str | None = None) -> None:
        super().__init__()
        self.settings = settings or get_settings()
        self.interval = float(interval or self.settings.reaper_interval)
        self.alias = alias or store.db_alias()
        self.process_id = process_id or make_process_id("reaper")
        self._next_maintenance = 0.0
        self.reaped = 0
        #: Runs of :meth:`maintain` by this process, and the finished jobs they pruned.
        self.maintenance_runs = 0
        self.pruned = 0

    def sweep(self) -> int:
        """Take back expired leases and dead-letter the jobs of unknown tasks. Returns how many
        leases were taken back."""
        reaped = len(reap_once(alias=self.alias, settings=self.settings, interval=self.interval))
        self.reaped += reaped
        dead_letter_unknown_tasks(self.settings, alias=self.alias, by=self.process_id)
        return reaped

    def maintain(self) -> tuple[int, int]:
        """Run the periodic maintenance once: prune finished jobs past ``RETENTION``, stale
        process rows and rate logs, and fold the chart counters. Counts the run in
        :attr:`maintenance_runs` and the jobs pruned in :attr:`pruned`.

        Returns:
            (finished jobs deleted, stale process rows deleted).
        """
        pruned = prune_once(self.settings, alias=self.alias)
        stale = prune_processes(self.settings, alias=self.alias)
        fold_stats(self.settings, alias=self.alias)
        self.maintenance_runs += 1
        self.pruned += pruned
        if pruned or stale:
            logger.info("maintenance by %s: pruned %d finished job(s) and %d stale process row(s)",
                        self.process_id, pruned, stale)
        return pruned, stale

    def maintain_if_elected(self, now: float) -> bool:
        """In a worker: when ``MAINTENANCE_INTERVAL`` seconds have passed since the last look (``now``
        is ``time.monotonic()``), run :meth:`maintain` if this process is the one elected by
        :func:`store.process_maintainer` (its own live registry row is the lease; a runreaper, then
        the oldest reaping worker, wins). Nothing when ``WORKER_MAINTENANCE`` is False.

        Returns:
            True when this process ran the maintenance.
        """
        if not self.settings.worker_maintenance or now < self._next_maintenance:
            return False
        self._next_maintenance = now + self.settings.maintenance_interval
        elected = store.process_maintainer(alive_within=self.settings.process_alive_within, alias=self.alias)
        if elected != self.process_id:
            return False
        self.maintain()
        return True

    def reaps(self) -> bool:
        return True

    def on_start(self) -> None:
        self.register()

    def run_once(self) -> float:
        self.sweep()
        # runreaper always maintains (the election puts it first, so workers step aside).
        now = time.monotonic()
        if now >= self._next_maintenance:
            self._next_maintenance = now + self.settings.maintenance_interval
            self.maintain()
        self.beat()
        return self.interval

    def on_stop(self) -> None:
        self.deregister()
