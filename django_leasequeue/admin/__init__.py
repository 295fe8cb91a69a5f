"""The operator's surface: jobs, dead letters, replay, workflows, schedules and a queue dashboard in the admin.

Pages (all under the app "Lease queue"):

* **Jobs** (:class:`JobAdmin`): every job, newest first, with its state judged by the database clock
  (ready, scheduled, retry wait, snoozed, waiting, leased, lease expired, done, dead, cancelled) and
  attempts, task, queue, ``run_at`` to the second and the last error (by class name,
  :func:`~.common.error_name`); filters by state, queue, task, "has errors", workflow
  (``?workflow__id__exact=<id>``) and the **incident search** (:mod:`.search`: error type, error
  message, arguments by jsonb containment, time of the last failure); search by id, task or unique
  key. The change page is read-only: the state with its detail ("lease expired 42 s ago"), times to
  the second with wait and run time, arguments pretty-printed, every failed attempt with its
  traceback (collapsible), the operator history, for a job in a workflow or with dependencies a
  "Workflow" section, and buttons for Replay, "Edit arguments and replay", Cancel, Retry now, Run now
  (snoozed, scheduled) and Release now (an expired lease; ``admin:django_leasequeue_job_release``).
* **Dead letters** (:class:`DeadLetterAdmin`, the ``DeadLetter`` proxy): only ``dead`` jobs,
  newest death first, with counts grouped by task and error type at the top (each group links to
  the search that selects exactly it, and to its confirmed Replay and Delete), a Replay button per
  row, and "N jobs wait on this job" for a dead job that holds dependents (one statement per page).
* **Halted sequences** (:class:`HaltedSequenceAdmin`, the ``HaltedSequence`` proxy): dead jobs that
  hold their sequence, with the sequence key and the count of jobs waiting behind, and the actions
  Replay and Skip (the job stays dead; its sequence goes on).
* **Workflows** (:class:`WorkflowAdmin`): every chain, group, chord, batch and dependency graph,
  newest first, with kind, name, progress (done/members), dead and cancelled counts, state (open
  batch, running, held by a dead member, finished) and times, read from the workflow rows' own
  counters (one statement per page); filters by kind and state; search by id, name or exact unique
  key. The page of one workflow lists its steps in member order (at most :data:`STEPS_SHOWN`, then a
  link to its jobs in the job list) with status, attempts, dependencies and "blocked by job N", its
  dead jobs and its callbacks, with Replay on each dead job (the code path of the job pages'
  Replay), "Replay every dead job" and "Cancel the rest" (``WorkflowHandle.cancel``).
* **Schedules** (:class:`ScheduleAdmin`): cron in words (cron-descriptor), the next five occurrences
  in the schedule's zone, enable/disable, "run now", validation on the form.
* **Worker processes** (:class:`WorkerProcessAdmin`, :mod:`.workers`): every registered process
  (alive or stopped heartbeating, by monitoring's rule) and the jobs each is running, with lease
  expiry, handlers past their timeout and expired leases with "Release now".
* **Queue dashboard** (:class:`DashboardAdmin`, ``admin/django_leasequeue/dashboard/``): per queue
  due, scheduled, leased and dead counts, the oldest due job's age, done and dead-lettered jobs in
  the last 5 minutes and hour, paused state with pause/resume, live processes and the last
  scheduler tick, all read through :func:`django_leasequeue.health.snapshot` (the same query layer
  as monitoring); the throughput chart and the wait / run time table (:mod:`.charts`, read from the
  outcome counters by :mod:`django_leasequeue.health.charts`).
* **A queue's page** (:mod:`.queues`, ``admin:django_leasequeue_queue``): its depth, charts,
  workers, limits with pause (confirmed) and resume, top errors and schedules.

Writes: every change of a job's state goes through :mod:`django_leasequeue.store` (``job_replay``,
``job_request_cancel``, ``job_retry_now``, ``job_run_now``, ``job_release_expired``,
``job_delete_finished``, ``queue_pause``/``queue_resume``): one statement per action however many
rows are selected (10,000 selected rows, or "select all" across a filter, cost a handful of
queries, never a ``save()`` per row). Replay, Cancel and Delete over a selection are confirmed first
(:mod:`.bulk`: exact counts per skip reason and a sample), report exactly what was done and skipped,
and write one summary admin log entry; a page's button writes one entry on its job. Detail-page
buttons and bulk actions share one code path per operation (C32: a replay button that silently did
nothing while the list action worked). Every write is a POST through the admin's CSRF protection;
replay needs the ``replay_job`` permission, cancel, retry-now, run-now, release and a workflow's
"Cancel the rest" need ``change_job``, the bulk delete ``delete_job``, pause/resume needs
``change_queuestate``.

Large tables (C24): the job list never loads ``args``, ``kwargs``, ``errors``, ``history`` or
``result`` (deferred; the last error is a short annotation), never counts the whole table (an
estimated count beyond :data:`EXACT_COUNT_LIMIT` rows), and offers filter choices without a
``SELECT DISTINCT`` over the job table.
"""

from __future__ import annotations

from .actions import (
    BULK_CHUNK,
    ReplayForm,
    cancel_jobs,
    delete_jobs,
    log_job_action,
    log_queue_action,
    release_jobs,
    replay_jobs,
    retry_now_jobs,
    run_now_jobs,
)
from .bulk import ACTIONS as BULK_ACTIONS
from .bulk import BulkAction
from .common import APP, JSON_DISPLAY_LIMIT, duration, error_name
from .dashboard import DashboardAdmin
from .deadletters import DeadLetterAdmin
from .jobs import STATUS_COLOURS, JobAdmin
from .listing import (
    EXACT_COUNT_LIMIT,
    HEAVY_FIELDS,
    EstimatedCountPaginator,
    HasErrorsFilter,
    JobChangeList,
    QueueFilter,
    TaskFilter,
    WorkflowFilter,
    known_queues,
)
from .schedules import ScheduleAdmin, ScheduleForm, describe_cron, run_schedule_now
from .sequences import HaltedSequenceAdmin, skip_sequences
from .workers import JOBS_SHOWN, WorkerProcessAdmin, workers_page
from .workflows import (
    STEPS_SHOWN,
    WORKFLOW_STATES,
    WorkflowAdmin,
    WorkflowStateFilter,
    jobs_of_workflow_url,
    workflow_state,
)

__all__ = [
    "APP", "BULK_CHUNK", "EXACT_COUNT_LIMIT", "HEAVY_FIELDS", "JSON_DISPLAY_LIMIT", "STATUS_COLOURS",
    "DashboardAdmin", "DeadLetterAdmin", "EstimatedCountPaginator", "HasErrorsFilter", "JobAdmin", "JobChangeList",
    "QueueFilter", "ReplayForm", "ScheduleAdmin", "ScheduleForm", "TaskFilter", "cancel_jobs", "describe_cron",
    "duration", "known_queues", "replay_jobs", "retry_now_jobs", "run_schedule_now",
    "HaltedSequenceAdmin", "skip_sequences",
    "STEPS_SHOWN", "WORKFLOW_STATES", "WorkflowAdmin", "WorkflowFilter", "WorkflowStateFilter", "jobs_of_workflow_url",
    "workflow_state", "JOBS_SHOWN", "WorkerProcessAdmin", "workers_page",
    "BULK_ACTIONS", "BulkAction", "delete_jobs", "error_name", "log_job_action", "release_jobs", "run_now_jobs",
    "log_queue_action",
]
