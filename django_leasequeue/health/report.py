"""The health report's data: :class:`Snapshot` of the whole system, with one :class:`QueueStats` per
queue, one :class:`WorkerInfo` per registered process and, when a workflow is stuck, the oldest
one as :class:`StuckWorkflow`. Plain frozen values, each with a JSON-ready ``to_dict()``;
:func:`django_leasequeue.health.snapshot` fills them from the database.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class QueueStats:
    """Health figures of one queue. Counts are jobs; ages and windows are seconds.

    Attributes:
        queue: the queue name.
        ready_due: ready jobs whose ``run_at`` has come (database time): the backlog.
        scheduled: ready jobs whose ``run_at`` is still in the future (delayed jobs, cron
            occurrences emitted early and retries waiting out their backoff).
        leased: jobs held by a worker right now (running).
        dead: dead letters currently kept for this queue (all of them, not a rate).
        oldest_ready_age_seconds: ``now - run_at`` of the oldest due ready job; 0.0 when nothing is
            due. Measured from ``run_at``, so a delayed job or a retry is not "old" before it is due.
        done_recent_short / done_recent_long: jobs that finished ``done`` in the short / long window.
        dead_recent_short / dead_recent_long: jobs dead-lettered in the short / long window
            (transitions by ``finished_at``; replayed jobs no longer count).
        paused: the queue is paused (``QueueState.paused``): workers claim nothing from it.
        leased_expired: leased jobs whose lease has passed but that no reaper has taken back yet
            (a few for one reaper interval is normal; a growing number means no reaper runs).
        workers_serving: alive worker processes that serve this queue (by name or ``*``).
        waiting: jobs whose dependencies are not finished (workflow steps and callbacks not
            released yet, jobs enqueued with ``depends_on``): never claimable, so not in
            ``ready_due`` nor in the oldest age.
    """

    queue: str
    ready_due: int = 0
    scheduled: int = 0
    leased: int = 0
    dead: int = 0
    oldest_ready_age_seconds: float = 0.0
    done_recent_short: int = 0
    dead_recent_short: int = 0
    done_recent_long: int = 0
    dead_recent_long: int = 0
    paused: bool = False
    leased_expired: int = 0
    workers_serving: int = 0
    waiting: int = 0

    @property
    def dead_ratio_short(self) -> float | None:
        """Dead letters / (done + dead) in the short window; None when nothing finished in it."""
        finished = self.done_recent_short + self.dead_recent_short
        return self.dead_recent_short / finished if finished else None

    @property
    def dead_ratio_long(self) -> float | None:
        """Dead letters / (done + dead) in the long window; None when nothing finished in it."""
        finished = self.done_recent_long + self.dead_recent_long
        return self.dead_recent_long / finished if finished else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of the fields and the two ratios."""
        return {**asdict(self), "dead_ratio_short": self.dead_ratio_short, "dead_ratio_long": self.dead_ratio_long}


@dataclass(frozen=True)
class WorkerInfo:
    """A registered process (``WorkerProcess`` row) as monitoring sees it.

    Attributes:
        id: ``host:pid:name``.
        kind: ``worker``, ``scheduler`` or ``reaper``.
        host, pid: where it runs.
        queues: queue names it serves; ``["*"]`` for every queue.
        started_at, last_heartbeat_at: aware datetimes, database time.
        alive: the last heartbeat is at most ``alive_within`` seconds old.
        concurrency: handler threads (workers).
        last_tick_at: the last scheduler tick recorded on this row, or None.
        heartbeat_age_seconds: ``now - last_heartbeat_at``.
        stuck_handlers: its handlers past their task's timeout and still running (thread mode:
            they hold a thread and their job's lease until they return).
        stuck_seconds: seconds since the oldest of them passed its timeout (0.0: none stuck).
        reaps: it runs the reaper's sweep (``runreaper``, or a worker without ``--no-reaper``).
    """

    id: str
    kind: str
    host: str
    pid: int
    queues: list[str]
    started_at: datetime
    last_heartbeat_at: datetime
    alive: bool
    concurrency: int = 0
    last_tick_at: datetime | None = None
    heartbeat_age_seconds: float = 0.0
    stuck_handlers: int = 0
    stuck_seconds: float = 0.0
    reaps: bool = False

    def serves(self, queue: str) -> bool:
        """True when this process claims jobs from ``queue``."""
        return "*" in self.queues or queue in self.queues

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (datetimes as ISO 8601)."""
        data = asdict(self)
        for key in ("started_at", "last_heartbeat_at", "last_tick_at"):
            data[key] = data[key].isoformat() if data[key] is not None else None
        return data


@dataclass(frozen=True)
class StuckWorkflow:
    """The unfinished workflow (or batch) that has gone longest without progress, past the threshold.

    Attributes:
        id: the workflow's id.
        kind: ``chain``, ``group``, ``chord``, ``batch`` or ``graph``.
        name: its name (may be empty).
        age_seconds: seconds since its last progress (a member or callback settled, members were
            added, the batch was closed), by database time.
        open: a batch not closed yet (its callbacks wait for ``close()``).
        members: its member steps.
        members_pending: members waiting, ready or running.
        held_by: the lowest-id dead or cancelled job that holds one of its waiting jobs (replay it to
            resume), or None when none does.
        held_by_status: ``dead`` or ``cancelled`` (None with ``held_by``).
    """

    id: int
    kind: str
    name: str
    age_seconds: float
    open: bool = False
    members: int = 0
    members_pending: int = 0
    held_by: int | None = None
    held_by_status: str | None = None

    @property
    def label(self) -> str:
        """``chain #12 'nightly import'``, or ``batch #7`` without a name."""
        return f"{self.kind} #{self.id}" + (f" {self.name!r}" if self.name else "")

    @property
    def cause(self) -> str:
        """The likely reason it does not progress, in a few words for a message."""
        if self.held_by is not None:
            return f"held by {self.held_by_status} job {self.held_by} (replay it to resume)"
        if self.open:
            return "an open batch that nobody has closed or added to (close() releases its callbacks)"
        if self.members_pending == 0:
            return "every member finished but its callback has not (see the oldest due job's age)"
        return (f"{self.members_pending} of {self.members} member(s) pending, none settled: a member that runs "
                "long or that no worker claims (see the oldest due job's age)")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of the fields, the label and the cause."""
        return {**asdict(self), "label": self.label, "cause": self.cause}


@dataclass(frozen=True)
class Snapshot:
    """The health of the whole queue system at one instant of database time.

    Attributes:
        now: the database clock reading every figure refers to (aware datetime).
        queues: one :class:`QueueStats` per known queue, by name.
        workers: every registered process (workers, schedulers, reapers), alive or not.
        workers_alive: alive processes of kind ``worker`` (those that run jobs).
        scheduler_last_tick_age_seconds: ``now`` minus :attr:`scheduler_last_tick_at`; None when
            no tick was ever recorded (no scheduler ever ran).
        scheduler_last_tick_at: the newest scheduler tick (aware datetime, database clock): of any
            registered process, or of the sweep record (``ReaperSweep.scheduler_tick_at``), which
            keeps it after the scheduler's row is deleted or pruned; None: never. Whether a
            scheduler runs now is ``alive_by_kind["scheduler"]``.
        reaper_last_sweep_age_seconds: seconds since any process last swept expired leases (a
            ``runreaper`` or a worker, which sweeps unless started with ``--no-reaper``), by the
            database's real clock; None when no sweep ever ran. The truth about reaping:
            ``alive_by_kind["reaper"]`` counts ``runreaper`` processes only.
        window_short, window_long, alive_within: the parameters used, in seconds.
        query_seconds: wall time of the snapshot's statements.
        workflows_unfinished: workflows and batches not finished (open batches included), over
            the whole system (a workflow's steps may be in several queues).
        workflows_stuck: those of them whose last progress is more than ``workflow_stuck_after``
            seconds old.
        oldest_stuck_workflow: the stuck one with the oldest progress, or None when none is stuck.
        workflow_stuck_after: the threshold used, in seconds (``WORKFLOW_STUCK_AFTER``).
    """

    now: datetime
    queues: list[QueueStats] = field(default_factory=list)
    workers: list[WorkerInfo] = field(default_factory=list)
    workers_alive: int = 0
    scheduler_last_tick_age_seconds: float | None = None
    scheduler_last_tick_at: datetime | None = None
    reaper_last_sweep_age_seconds: float | None = None
    window_short: float = 300.0
    window_long: float = 3600.0
    alive_within: float = 30.0
    query_seconds: float = 0.0
    workflows_unfinished: int = 0
    workflows_stuck: int = 0
    oldest_stuck_workflow: StuckWorkflow | None = None
    workflow_stuck_after: float = 3600.0

    def queue(self, name: str) -> QueueStats:
        """The stats of queue ``name`` (all zero when the queue has no jobs at all)."""
        for stats in self.queues:
            if stats.queue == name:
                return stats
        return QueueStats(queue=name, workers_serving=self.workers_serving(name))

    def workers_serving(self, queue: str) -> int:
        """Alive worker processes that serve ``queue``."""
        return sum(1 for w in self.workers if w.alive and w.kind == "worker" and w.serves(queue))

    @property
    def reapers_alive(self) -> int:
        """Alive processes that run the reaper's sweep: ``runreaper`` processes and workers
        without ``--no-reaper`` (``alive_by_kind["reaper"]`` counts only the former)."""
        return sum(1 for w in self.workers if w.alive and w.reaps)

    @property
    def alive_by_kind(self) -> dict[str, int]:
        """Alive processes per kind (``worker``, ``scheduler``, ``reaper``...)."""
        counts: dict[str, int] = {}
        for w in self.workers:
            counts.setdefault(w.kind, 0)
            if w.alive:
                counts[w.kind] += 1
        return counts

    def total(self, queues: Iterable[str] | None = None) -> QueueStats:
        """Sum the figures over ``queues`` (default all) into one :class:`QueueStats` named ``*``.

        Counts add up; ``oldest_ready_age_seconds`` is the maximum; ``paused`` is True only when
        every summed queue is paused; ``workers_serving`` is :attr:`workers_alive`.
        """
        wanted = None if queues is None else set(queues)
        rows = [q for q in self.queues if wanted is None or q.queue in wanted]
        return QueueStats(
            queue="*",
            ready_due=sum(q.ready_due for q in rows),
            scheduled=sum(q.scheduled for q in rows),
            leased=sum(q.leased for q in rows),
            dead=sum(q.dead for q in rows),
            oldest_ready_age_seconds=max((q.oldest_ready_age_seconds for q in rows), default=0.0),
            done_recent_short=sum(q.done_recent_short for q in rows),
            dead_recent_short=sum(q.dead_recent_short for q in rows),
            done_recent_long=sum(q.done_recent_long for q in rows),
            dead_recent_long=sum(q.dead_recent_long for q in rows),
            paused=bool(rows) and all(q.paused for q in rows),
            leased_expired=sum(q.leased_expired for q in rows),
            workers_serving=self.workers_alive,
            waiting=sum(q.waiting for q in rows),
        )

    @property
    def stuck_handlers(self) -> int:
        """Handlers past their task's timeout and still running, over every registered worker."""
        return sum(w.stuck_handlers for w in self.workers)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of the whole snapshot."""
        return {
            "now": self.now.isoformat(),
            "window_short": self.window_short,
            "window_long": self.window_long,
            "alive_within": self.alive_within,
            "queues": [q.to_dict() for q in self.queues],
            "workers": [w.to_dict() for w in self.workers],
            "workers_alive": self.workers_alive,
            "stuck_handlers": self.stuck_handlers,
            "alive_by_kind": self.alive_by_kind,
            "reapers_alive": self.reapers_alive,
            "scheduler_last_tick_age_seconds": self.scheduler_last_tick_age_seconds,
            "scheduler_last_tick_at": (self.scheduler_last_tick_at.isoformat()
                                       if self.scheduler_last_tick_at is not None else None),
            "reaper_last_sweep_age_seconds": self.reaper_last_sweep_age_seconds,
            "query_seconds": self.query_seconds,
            "workflows_unfinished": self.workflows_unfinished,
            "workflows_stuck": self.workflows_stuck,
            "oldest_stuck_workflow": (self.oldest_stuck_workflow.to_dict()
                                      if self.oldest_stuck_workflow is not None else None),
            "workflow_stuck_after": self.workflow_stuck_after,
        }
