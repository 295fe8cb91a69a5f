"""Prometheus counters and histograms of a worker's attempts, counted in the worker process.

The database gauges of :mod:`~django_leasequeue.metrics` (served by the web endpoint) say where
the jobs are; these say what one worker did with them since it started. They are ordinary
``prometheus_client`` objects on its default registry, fed by an executor attempt hook
(:func:`attempt_hooks.install_attempt_hook`) that :func:`install` adds. ``runworker --metrics-port``
installs it and serves the registry with ``prometheus_client.start_http_server``; a project that
serves the default registry itself can call :func:`install` in its worker instead.

=============================================================  ====================================
``leasequeue_jobs_completed_total{queue,task}``                 attempts that ended ``succeeded``
``leasequeue_jobs_failed_total{queue,task}``                    attempts that failed, retry scheduled
``leasequeue_jobs_dead_lettered_total{queue,task}``             attempts that ended with a dead letter
``leasequeue_jobs_retried_total{queue,task}``                   retry attempts started (attempt >= 2)
``leasequeue_jobs_fenced_out_total{queue,task}``                attempts whose write (completion,
                                                                 heartbeat, fenced_atomic, failure)
                                                                 was refused: the fencing token moved
``leasequeue_job_run_seconds{queue,task}``                      histogram: attempt start to its
                                                                 recorded outcome (not lease_lost)
``leasequeue_job_wait_seconds{queue,task}``                     histogram: the later of run_at and
                                                                 enqueue to the claim, database time
=============================================================  ====================================

Each attempt is counted once: a lost lease the heartbeat found and the refused write that
follows it are one fenced-out attempt. Dead letters the reaper writes (an expired lease on the last
attempt, an unknown task) happen outside any attempt and are not counted here; the web endpoint's
``leasequeue_dead_letters_recent`` counts every dead letter.

Process execution mode: the handler runs in a child process, but the worker process records every
outcome, so every series lives in the worker; no ``PROMETHEUS_MULTIPROC_DIR`` is needed. Each
worker process is its own scrape target (one port per worker on a host).
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import Counter, Histogram

from .attempt_hooks import install_attempt_hook
from .context import JobContext

# Run times span milliseconds (a webhook) to hours (an export); wait times the same range.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
_LABELS = ("queue", "task")

COMPLETED = Counter("leasequeue_jobs_completed", "Attempts that ended succeeded (the job is done)", _LABELS)
FAILED = Counter("leasequeue_jobs_failed", "Attempts that failed and were scheduled for a retry", _LABELS)
DEAD_LETTERED = Counter("leasequeue_jobs_dead_lettered", "Attempts that ended with the job dead-lettered", _LABELS)
RETRIED = Counter("leasequeue_jobs_retried", "Retry attempts started (attempt 2 and later)", _LABELS)
FENCED_OUT = Counter("leasequeue_jobs_fenced_out",
                     "Attempts whose fenced write (completion, heartbeat, fenced_atomic, failure) was refused "
                     "because the job's fencing token moved on", _LABELS)
RUN_SECONDS = Histogram("leasequeue_job_run_seconds", "Seconds from an attempt's start to its recorded outcome",
                        _LABELS, buckets=BUCKETS)
WAIT_SECONDS = Histogram("leasequeue_job_wait_seconds",
                         "Seconds from the later of run_at and enqueue to the attempt's claim (database time)",
                         _LABELS, buckets=BUCKETS)

_OUTCOME_COUNTERS = {"succeeded": COMPLETED, "retried": FAILED, "dead_lettered": DEAD_LETTERED}
_STARTED = "leasequeue.metrics.started"  # ctx.attempt_data key: time.monotonic() at the start
_FENCED = "leasequeue.metrics.fenced"  # ctx.attempt_data key: this attempt was counted fenced out


class MetricsHook:
    """The attempt hook that feeds the counters and histograms above (see :func:`install`)."""

    def attempt_started(self, ctx: JobContext) -> None:
        """Note the start (monotonic clock), observe the wait time, count a retry attempt."""
        ctx.attempt_data[_STARTED] = time.monotonic()
        if ctx.attempt > 1:
            RETRIED.labels(ctx.queue, ctx.task).inc()
        claim = ctx.claim
        if claim is not None and claim.created_at is not None:
            due = claim.created_at if claim.run_at is None else max(claim.run_at, claim.created_at)
            WAIT_SECONDS.labels(ctx.queue, ctx.task).observe(max(0.0, (claim.claimed_at - due).total_seconds()))

    def attempt_ended(self, ctx: JobContext, outcome: str) -> None:
        """Count the outcome once per attempt; observe the run time of an outcome that was written."""
        data: dict[str, Any] = ctx.attempt_data
        started = data.pop(_STARTED, None)
        if outcome == "lease_lost":
            if not data.get(_FENCED):
                data[_FENCED] = True
                FENCED_OUT.labels(ctx.queue, ctx.task).inc()
            return
        if data.get(_FENCED):
            return
        counter = _OUTCOME_COUNTERS.get(outcome)
        if counter is not None:
            counter.labels(ctx.queue, ctx.task).inc()
        if started is not None:
            RUN_SECONDS.labels(ctx.queue, ctx.task).observe(time.monotonic() - started)


HOOK = MetricsHook()


def install() -> None:
    """Install :data:`HOOK` in this process's executors (idempotent). Call it in the worker
    process, before it runs jobs; ``runworker --metrics-port`` does."""
    install_attempt_hook(HOOK)


def serve(port: int, addr: str = "127.0.0.1") -> Any:
    """Install the hook and serve the default registry on ``addr:port`` (a daemon thread).

    Args:
        port (int): TCP port, 1..65535 (0: any free port). addr (str): address to bind.

    Returns:
        The ``http.server`` instance (its ``server_address`` holds the bound port).

    Raises:
        OSError: the address cannot be bound (in use, not local).
    """
    from prometheus_client import start_http_server

    server, _thread = start_http_server(port, addr=addr)
    install()
    return server
