"""Queue health: the read-only queries behind the admin dashboard, ``queuehealth`` and the metrics.

A scheduler's characteristic failure is omission: no job runs, no job fails, every error-rate
dashboard stays green. The figure that catches it is the **age of the oldest due job**, measured
from its ``run_at`` by the database clock: it grows while nothing drains a queue, whatever the
reason (no worker, a paused queue, a crashed scheduler's jobs piling up behind a stuck one, a
worker that serves the wrong queues). This package computes that figure with the others a
dashboard or an alert needs:

* :func:`snapshot` -> :class:`Snapshot`: per queue the due (``ready_due``), scheduled (ready with a
  future ``run_at``, retry backoffs included), leased and dead counts, the oldest due job's age,
  done and dead-lettered counts over a short and a long window (transitions, by ``finished_at``,
  not the size of the dead-letter table), leases past their expiry that no reaper has taken back
  yet, and whether the queue is paused; the registered processes with an ``alive`` flag (heartbeat
  within ``PROCESS_ALIVE_WITHIN``) and the age of the last scheduler tick; the unfinished
  workflows and batches, those stuck (no progress for ``WORKFLOW_STUCK_AFTER``) and the oldest
  stuck one with what holds it (:class:`StuckWorkflow`). Each queue also counts its ``waiting``
  jobs (dependencies not finished), which are never due and never in the oldest age.
* :func:`evaluate` turns a snapshot and :class:`Checks` (thresholds, see :func:`parse_threshold`)
  into OK / WARNING / CRITICAL results; ``manage.py queuehealth`` is a thin shell around it.
* :func:`lease_report` -> per task runtime percentiles of recent finished jobs, lease losses and
  fence rejections, with a recommended timeout and lease (:func:`recommend`).

Cost: :func:`snapshot` is three statements. The job statement reads only the partial indexes of
``models.Job``: ``leasequeue_job_ready`` for the ready rows (index-only when the visibility map
allows), ``leasequeue_job_leased`` for the leased rows, ``leasequeue_job_waiting`` for the waiting
rows, and ``leasequeue_job_finished`` for the dead rows and the finished-in-window ranges. Its cost
grows with the backlog (ready, leased, waiting and dead rows) and the jobs finished in the long
window, never with the millions of retained ``done`` rows (``bench/health_bench.py`` prints the
plans and timings on a 1,000,000-row table). The workflow statement reads the unfinished
workflows only (``leasequeue_workflow_active``), and the jobs of the oldest stuck one.

The statements themselves (plain ``SELECT``: no locks, no writes) are in
:mod:`django_leasequeue.store.read`, like every other statement of the package; this package turns
their rows into figures and verdicts. All times come from the database clock (``leasequeue_now()``)
unless an explicit aware ``now`` is passed (tests).

Modules, one job each (every public name is importable from ``django_leasequeue.health``):
``report`` (the snapshot's data classes), ``thresholds`` (levels, limits and their parsers),
``leases`` (the lease-advice figures and rule), ``charts`` (the console's outcome series and
latency percentiles, read from the outcome counters, never the job table), ``collect`` (:func:`snapshot` and
:func:`lease_report`, read from the store) and ``checks`` (the verdicts on a report).
"""

from .charts import (
    LATENCY_WINDOWS,
    RANGES,
    Latency,
    Point,
    Quantile,
    Series,
    Timing,
    histogram_quantile,
    latency,
    short_seconds,
    throughput,
)
from .checks import CheckResult, Checks, evaluate, lease_checks, overall, stuck_workflows_message, unknown_queue_checks
from .collect import SNAPSHOT_QUERIES, lease_report, process_infos, snapshot
from .leases import FLAG_LOST_WHILE_HEALTHY, FLAG_P99_OVER_TIMEOUT, FLAG_UNREGISTERED, TaskLeaseStats, recommend
from .report import QueueStats, Snapshot, StuckWorkflow, WorkerInfo
from .thresholds import Level, Threshold, parse_number, parse_rate, parse_threshold

__all__ = [
    "FLAG_LOST_WHILE_HEALTHY",
    "FLAG_P99_OVER_TIMEOUT",
    "FLAG_UNREGISTERED",
    "LATENCY_WINDOWS",
    "RANGES",
    "SNAPSHOT_QUERIES",
    "CheckResult",
    "Checks",
    "Latency",
    "Level",
    "Point",
    "Quantile",
    "QueueStats",
    "Series",
    "Snapshot",
    "StuckWorkflow",
    "TaskLeaseStats",
    "Threshold",
    "Timing",
    "WorkerInfo",
    "evaluate",
    "histogram_quantile",
    "latency",
    "lease_checks",
    "lease_report",
    "overall",
    "parse_number",
    "parse_rate",
    "parse_threshold",
    "process_infos",
    "recommend",
    "short_seconds",
    "snapshot",
    "stuck_workflows_message",
    "throughput",
    "unknown_queue_checks",
]
