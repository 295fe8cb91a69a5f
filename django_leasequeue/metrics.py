"""Prometheus metrics, read from :func:`health.snapshot` at every scrape.

A custom collector (prometheus-client's ``Collector`` protocol) runs one snapshot per scrape
instead of keeping counters in the process: the figures are the database's, so every web process
answers the same, nothing is lost on a restart, and an idle worker fleet cannot hide behind
counters that simply stopped moving (the omission failure this monitoring exists to catch).

Exposed families (all gauges; the windowed ones are counts over a sliding window of database
time, so take them as they are rather than through ``rate()``):

======================================================  ==========================================
``leasequeue_oldest_ready_age_seconds{queue}``          age of the oldest due job (0: none due)
``leasequeue_jobs{queue,status}``                       status: ready_due, scheduled, waiting, leased,
                                                        dead
``leasequeue_leases_expired{queue}``                    leased jobs past their lease, not yet reaped
``leasequeue_dead_letters_recent{queue,window}``        jobs dead-lettered in the last ``window`` s
``leasequeue_jobs_done_recent{queue,window}``           jobs done in the last ``window`` s
``leasequeue_queue_paused{queue}``                      1 when the queue is paused
``leasequeue_workers_serving{queue}``                   alive workers that serve the queue
``leasequeue_workers_alive``                            worker processes with a fresh heartbeat
``leasequeue_processes_alive{kind}``                    alive registered processes per kind (kind
                                                        reaper: ``runreaper`` only; workers reap too)
``leasequeue_reapers_alive``                            alive processes that run the reaper's sweep
                                                        (runreaper, workers without --no-reaper)
``leasequeue_reaper_last_sweep_age_seconds``            seconds since any process (a worker or a
                                                        reaper) swept expired leases; absent: never
``leasequeue_scheduler_last_tick_age_seconds``          seconds since the last scheduler tick, kept
                                                        after the scheduler stopped; absent when no
                                                        tick was ever recorded
``leasequeue_stuck_handlers``                           handlers past their task's timeout, still
                                                        running (thread mode; from the job rows)
``leasequeue_workflows_unfinished``                     workflows and batches not finished (open
                                                        batches included)
``leasequeue_workflows_stuck``                          unfinished ones without progress for
                                                        ``WORKFLOW_STUCK_AFTER`` seconds
``leasequeue_oldest_stuck_workflow_age_seconds``        seconds since the oldest stuck one progressed
                                                        (0: none stuck)
``leasequeue_health_query_seconds``                     time the snapshot's statements took
======================================================  ==========================================
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from . import health

_STATUSES = ("ready_due", "scheduled", "waiting", "leased", "dead")
_KINDS = ("worker", "scheduler", "reaper")


def _window(seconds: float) -> str:
    return f"{seconds:g}"


class HealthCollector:
    """Collector that yields the queue health figures of one fresh :func:`health.snapshot`.

    Args:
        snapshot: the function called once per collection (default :func:`health.snapshot`).
    """

    def __init__(self, snapshot: Callable[[], health.Snapshot] | None = None) -> None:
        self._snapshot = snapshot or health.snapshot

    def describe(self) -> list[Metric]:
        """Nothing: registering the collector must not query the database."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Take one snapshot and yield every family (raises the snapshot's database errors)."""
        snap = self._snapshot()
        age = GaugeMetricFamily("leasequeue_oldest_ready_age_seconds",
                                "Seconds since run_at of the oldest due ready job (0 when none is due), "
                                "by database time", labels=["queue"])
        jobs = GaugeMetricFamily("leasequeue_jobs", "Jobs by queue and status (ready_due: due now; scheduled: "
                                 "ready with a future run_at; waiting: dependencies not finished; leased: running; "
                                 "dead: dead letters kept)", labels=["queue", "status"])
        expired = GaugeMetricFamily("leasequeue_leases_expired",
                                    "Leased jobs whose lease has passed but that no reaper has taken back yet",
                                    labels=["queue"])
        dead_recent = GaugeMetricFamily("leasequeue_dead_letters_recent",
                                        "Jobs dead-lettered in the last `window` seconds", labels=["queue", "window"])
        done_recent = GaugeMetricFamily("leasequeue_jobs_done_recent",
                                        "Jobs completed in the last `window` seconds", labels=["queue", "window"])
        paused = GaugeMetricFamily("leasequeue_queue_paused", "1 when the queue is paused", labels=["queue"])
        serving = GaugeMetricFamily("leasequeue_workers_serving", "Alive worker processes that serve the queue",
                                    labels=["queue"])
        short, long = _window(snap.window_short), _window(snap.window_long)
        for q in snap.queues:
            age.add_metric([q.queue], q.oldest_ready_age_seconds)
            for status in _STATUSES:
                jobs.add_metric([q.queue, status], getattr(q, status))
            expired.add_metric([q.queue], q.leased_expired)
            dead_recent.add_metric([q.queue, short], q.dead_recent_short)
            dead_recent.add_metric([q.queue, long], q.dead_recent_long)
            done_recent.add_metric([q.queue, short], q.done_recent_short)
            done_recent.add_metric([q.queue, long], q.done_recent_long)
            paused.add_metric([q.queue], 1.0 if q.paused else 0.0)
            serving.add_metric([q.queue], q.workers_serving)
        yield from (age, jobs, expired, dead_recent, done_recent, paused, serving)
        yield GaugeMetricFamily("leasequeue_workers_alive",
                                f"Worker processes whose heartbeat is at most {snap.alive_within:g} s old",
                                value=snap.workers_alive)
        # Bug 14: kind="reaper" is 0 while the workers do the reaping; the help says where to look.
        processes = GaugeMetricFamily("leasequeue_processes_alive",
                                      "Alive registered processes by kind (kind reaper counts runreaper processes "
                                      "only: workers sweep too, so alert on leasequeue_reaper_last_sweep_age_seconds)",
                                      labels=["kind"])
        # The standard kinds are always present, so "== 0" alerts fire when the last one is gone.
        alive = {kind: 0 for kind in _KINDS} | snap.alive_by_kind
        for kind, count in sorted(alive.items()):
            processes.add_metric([kind], count)
        yield processes
        # Bug 14: the processes that reap, whatever their kind (runreaper and the workers' own sweep).
        yield GaugeMetricFamily("leasequeue_reapers_alive",
                                "Alive processes that run the reaper's sweep (runreaper, and workers without "
                                "--no-reaper)", value=snap.reapers_alive)
        # Whoever reaps (runreaper, or the workers' own sweep), the sweep row says when it last ran:
        # alert on this, not on processes_alive{kind="reaper"}, which is 0 when workers do the reaping.
        if snap.reaper_last_sweep_age_seconds is not None:
            yield GaugeMetricFamily("leasequeue_reaper_last_sweep_age_seconds",
                                    "Seconds since expired leases were last swept (absent: never)",
                                    value=snap.reaper_last_sweep_age_seconds)
        if snap.scheduler_last_tick_age_seconds is not None:
            yield GaugeMetricFamily("leasequeue_scheduler_last_tick_age_seconds",
                                    "Seconds since the last scheduler tick, also after the scheduler stopped "
                                    "(absent: no tick ever recorded)",
                                    value=snap.scheduler_last_tick_age_seconds)
        yield GaugeMetricFamily("leasequeue_stuck_handlers",
                                "Handlers past their task's timeout and still running (thread mode cannot stop "
                                "them: each holds a worker thread and its job's lease until it returns)",
                                value=snap.stuck_handlers)
        yield GaugeMetricFamily("leasequeue_workflows_unfinished",
                                "Workflows and batches not finished (open batches included)",
                                value=snap.workflows_unfinished)
        yield GaugeMetricFamily("leasequeue_workflows_stuck",
                                f"Unfinished workflows and batches without progress for more than "
                                f"{snap.workflow_stuck_after:g} s (WORKFLOW_STUCK_AFTER)",
                                value=snap.workflows_stuck)
        oldest = snap.oldest_stuck_workflow
        yield GaugeMetricFamily("leasequeue_oldest_stuck_workflow_age_seconds",
                                "Seconds since the oldest stuck workflow last progressed (0 when none is stuck), "
                                "by database time", value=oldest.age_seconds if oldest is not None else 0.0)
        yield GaugeMetricFamily("leasequeue_health_query_seconds", "Seconds the health snapshot's statements took",
                                value=snap.query_seconds)


def build_registry(collector: HealthCollector | None = None) -> CollectorRegistry:
    """A private registry holding only the health collector (not the process-global one)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector or HealthCollector())
    return registry


REGISTRY = build_registry()


def render() -> bytes:
    """The current figures in the Prometheus text format (one snapshot)."""
    return generate_latest(REGISTRY)
