"""The store: the only code that claims, leases or changes the state of jobs.

Every statement that locks a job row or moves it between states is a named module-level constant
in one of the modules below, with a comment saying why it is shaped the way it is; no ad-hoc SQL
lives outside this package (a test in ``tests/test_architecture.py`` enforces it). Everything is
re-exported here, so callers write ``from django_leasequeue import store; store.job_claim(...)``.

Where to look, and where a new statement goes:

==================  ===========================================================================
``_db``             the clock (``CLOCK``, :func:`db_now`), table names, the alias, ``TOKEN_MAX``,
                    the one helper that runs a statement, JSON and job-row decoding
``enqueue``         job inserts (``JOB_INSERT``, ``JOB_INSERT_ONE``, ``JOB_INSERT_MANY``),
                    :class:`NewJob`, the lookup by unique key
``claim``           the claim (``JOB_CLAIM``, ``JOB_CLAIM_ANY_QUEUE``, :func:`job_claim`), the
                    per-key concurrency admission, :class:`ClaimedJob`, corrupt-row handling
``keys``            the fair claim of fair queues (``JOB_CLAIM_FAIR``), a rate key's log
``flow``            the claims of rate-limited queues (``RATE_LOCK``, ``JOB_CLAIM_RATED``,
                    ``JOB_CLAIM_ANY_QUEUE_RATED``), pause and resume, flow-control figures
``lease``           a lease holder's fenced writes: renew, complete, fail, snooze, cancel, release,
                    the ``fenced_atomic()`` lock, timed-out and lease-lost notes, late results
``lost_claims``     the jobs of a claim whose reply was lost, given back before the next claim
``maintenance``     the reaper's sweep, pruning (finished jobs, rate-key logs), process rows,
                    dead-lettering unknown tasks
``operator``        the admin's bulk operations: request cancel, replay, retry now
``intervene``       the console's interventions: run now, release an expired lease, delete
                    finished jobs
``search``          the console's read-only previews of bulk actions and its filters' names
``stats``           the charts' outcome counters: the reaper's fold and roll-up, series and totals
``schedule``        the scheduler's statements and the lock of ``Schedule.save()``
``read``            monitoring's read-only queries (health snapshot, lease report, one job, the
                    workers page, the queue page)
``sequences``       the enqueue lock of a sequence key, skipping a dead job that halts its
                    sequence, the list of halted sequences
``workflows``       building workflows and batches (their rows, steps and dependency edges),
                    closing a batch, a workflow's counts and results, a job's dependencies
``history``         the time-partitioned history (opt-in): its partitions, moving done jobs
                    into it, dropping partitions past retention, reading a moved job
``testing``         statements only the testing helpers use (claim ids, expire a lease, make
                    due, the session clock offset)
==================  ===========================================================================

Rules every statement follows:

* **Database time only.** Each statement reads the clock once, as ``coalesce(<now>,
  leasequeue_now())``: callers may pass an explicit aware ``now`` (tests), otherwise the database's
  statement clock is used. ``leasequeue_now()`` is ``clock_timestamp()`` plus an optional
  per-session offset (``SET leasequeue.clock_offset = '1 hour'``), never ``now()``, which is frozen
  for a whole transaction.
* **Fenced writes.** After a claim, every write by a worker (renew, complete, fail, snooze,
  release) is ``... WHERE id = ? AND lease_version = ? AND status = 'leased'``; a row that does not
  come back means the lease was lost, and the caller discards its outcome.
* **Claims are one statement**: a ``MATERIALIZED`` CTE picks due ready rows with ``FOR UPDATE SKIP
  LOCKED`` and ``LIMIT``; the outer UPDATE leases them, increments ``attempts`` and the fencing token
  ``lease_version``. The CTE is an optimisation fence so that the planner cannot turn the LIMIT
  subquery into a nested loop that updates more rows than asked for.
* **Flow control is part of the claim** (docs/howto/flow-control.md): every eligibility rule (due,
  ``ready``, queue not paused, concurrency key below its limit, queue rate allowance) is applied
  inside the locked candidate scan, before ``SKIP LOCKED`` and ``LIMIT``, never by claiming and
  then releasing. A cancel request is honoured by every later write of the lease.

A new statement goes into the module of its purpose, as a named constant with its why-comment
above it, next to the function that runs it through ``_db._run`` (one cursor, one statement). A
function that must run several statements on one cursor or in one transaction opens
``_db._cursor`` itself and says why (the rate-limited claim, the claim's dead-lettering of corrupt
rows, monitoring's read-only snapshot). Then add the function (and the constant, if the docs quote
it) to the imports below.
"""

from __future__ import annotations

from ._db import (
    CLOCK,
    CLOCK_WAKING,
    FLOW_RULES,
    JIT_OFF_LOCAL,
    JOB_TABLE,
    NEVER_SWEPT,
    PREPARED_CLAIM_SETTINGS,
    PROCESS_TABLE,
    QUEUE_TABLE,
    SCHEDULE_TABLE,
    STAT_TABLE,
    SWEEP_TABLE,
    TOKEN_MAX,
    db_alias,
    db_now,
    logger,
)
from ._prepared import MAX_PER_CONNECTION, MAX_SENDS, may_prepare, prepared_form, run_prepared
from .claim import (
    JOB_CLAIM,
    JOB_CLAIM_ANY_QUEUE,
    JOB_DEAD_CORRUPT,
    JOB_NEXT_RUN_AT,
    ClaimedJob,
    ClaimResult,
    NextRunAt,
    _decode_claims,
    job_claim,
    job_next_run_at,
)
from .enqueue import (
    JOB_INSERT,
    JOB_INSERT_MANY,
    JOB_INSERT_ONE,
    JOB_INSERT_REPLACING,
    NewJob,
    TraceContext,
    job_get_by_unique_key,
    job_insert,
    job_insert_many,
    job_insert_one,
    job_insert_replacing,
)
from .flow import (
    FLOW_KEYS_WAITING,
    JOB_CLAIM_ANY_QUEUE_RATED,
    JOB_CLAIM_RATED,
    PAUSE_GRACE,
    PAUSE_MARGIN,
    QUEUE_LIST,
    QUEUE_PAUSE,
    QUEUE_RESUME,
    RATE_LOCK,
    RATE_LOG_BUCKETS,
    RATE_ROWS_CREATE,
    FlowMetrics,
    KeyWait,
    QueueInfo,
    flow_keys_waiting,
    flow_metrics,
    flow_waiting_on_key,
    queue_list,
    queue_pause,
    queue_pause_wait,
    queue_paused_names,
    queue_resume,
    queue_throttled_totals,
)
from .history import (
    HISTORY_GET,
    HISTORY_MOVE,
    HISTORY_PERIODS,
    HISTORY_PLACE,
    HISTORY_PLACE_SAVE,
    HISTORY_SET_RESULT,
    HISTORY_TABLE,
    PARTITION_LOCK_TIMEOUT,
    PARTITIONS_AHEAD,
    HistoryPartition,
    HistoryRun,
    Moved,
    history_drop_partitions,
    history_ensure_partitions,
    history_get,
    history_maintain,
    history_move,
    history_partitions,
    history_set_result,
    history_window,
)
from .keys import JOB_CLAIM_FAIR, fair_order, rate_key_log
from .lease import (
    JOB_CANCEL_LEASED,
    JOB_COMPLETE,
    JOB_FAIL,
    JOB_LOCK_FENCED,
    JOB_NOTE_LEASE_LOST,
    JOB_NOTE_RESULT_DROPPED,
    JOB_NOTE_TIMED_OUT,
    JOB_RELEASE,
    JOB_RENEW,
    JOB_SET_RESULT,
    JOB_SETTLED_UNDER,
    JOB_SNOOZE,
    Completed,
    Released,
    Renewal,
    job_cancel_leased,
    job_complete,
    job_fail,
    job_lock_fenced,
    job_lock_for_commit,
    job_note_lease_lost,
    job_note_result_dropped,
    job_note_timed_out,
    job_release,
    job_renew,
    job_set_result,
    job_settled_under,
    job_snooze,
)
from .lost_claims import CLAIM_CLOCK_US, JOB_RELEASE_LOST_CLAIMS, claim_clock_us, job_release_lost_claims
from .maintenance import (
    JOB_DEAD_LETTER_UNKNOWN,
    JOB_PRUNE,
    JOB_PRUNE_SAVE,
    JOB_PRUNE_WORKFLOWS,
    JOB_REAP,
    PROCESS_HEARTBEAT,
    PROCESS_MAINTAINER,
    PROCESS_PRUNE,
    PROCESS_UPSERT,
    PRUNE_FULL_PASS_EVERY,
    RATE_KEY_PRUNE,
    DeadLettered,
    Reaped,
    job_dead_letter_unknown_tasks,
    job_prune,
    job_reap_expired,
    process_deregister,
    process_heartbeat,
    process_maintainer,
    process_prune,
    process_register,
    rate_key_prune,
)
from .operator import (
    JOB_REPLAY,
    JOB_REQUEST_CANCEL,
    JOB_RETRY_NOW,
    CancelCounts,
    ReplayResult,
    job_replay,
    job_request_cancel,
    job_retry_now,
)
from .read import (
    JOB_GET,
    LEASE_REPORT,
    PROCESSES,
    QUEUE_STATS,
    RUNNING_JOBS,
    TIMED_OUT_NOW,
    WORKFLOW_STATS,
    job_get,
    lease_report_rows,
    read_cursor,
    snapshot_rows,
    workers_page_rows,
)
from .schedule import (
    JOB_COALESCE,
    SCHEDULE_ADVANCE,
    SCHEDULE_DISABLE_UNDECLARED,
    SCHEDULE_LOCK_DUE,
    SCHEDULE_LOCK_FOR_SAVE,
    SCHEDULE_NEXT_DUE,
    SCHEDULE_RECORD_PAUSED,
    SCHEDULE_SOURCES,
    SCHEDULE_UPSERT_SETTINGS,
    CoalescedJob,
    PausedRecord,
    ScheduleAdvance,
    ScheduleDefinition,
    ScheduleRow,
    ScheduleSync,
    job_coalesce,
    schedule_advance,
    schedule_lock_due,
    schedule_lock_for_save,
    schedule_next_due,
    schedule_record_paused,
    schedule_sync_settings,
)
from .sequences import (
    SEQUENCE_HALTED,
    SEQUENCE_LOCK,
    SEQUENCE_LOCK_NAMESPACE,
    SEQUENCE_SKIP,
    HaltedSequenceInfo,
    sequence_halted,
    sequence_locked,
    sequence_skip,
)
from .testing import (
    CLOCK_OFFSET_GET,
    CLOCK_OFFSET_SET,
    CLOCK_RAW_NOW,
    JOB_CLAIM_IDS,
    JOB_EXPIRE_LEASE,
    JOB_MAKE_DUE,
    clock_offset_get,
    clock_offset_set,
    clock_real_now,
    job_claim_ids,
    job_expire_lease,
    job_make_due,
)
from .trace_values import CLAIMED_TRACE_CONTEXT, TRACE_CONTEXT_MAX_BYTES, trace_carrier, trace_json
from .workflows import (
    DEPENDENCY_LOCK,
    DEPENDENCY_TABLE,
    JOB_CANCEL_DOOMED,
    JOB_DEPENDENCIES,
    WORKFLOW_ADD_MEMBERS,
    WORKFLOW_CLOSE,
    WORKFLOW_COUNTS,
    WORKFLOW_INSERT,
    WORKFLOW_MEMBERS_INSERT,
    WORKFLOW_RESULTS,
    WORKFLOW_SET_CALLBACKS,
    WORKFLOW_SETTLE,
    WORKFLOW_STEPS_INSERT,
    WORKFLOW_TABLE,
    DependencyOutcome,
    NewMembers,
    NewStep,
    job_dependencies,
    workflow_add_members,
    workflow_close,
    workflow_counts,
    workflow_create,
    workflow_get_by_unique_key,
    workflow_insert_members,
    workflow_insert_steps,
    workflow_results,
    workflow_set_callbacks,
)

__all__ = [
    "JOB_CLAIM_FAIR", "RATE_KEY_PRUNE", "fair_order", "rate_key_log", "rate_key_prune",
    "PREPARED_CLAIM_SETTINGS", "MAX_PER_CONNECTION", "MAX_SENDS", "may_prepare", "prepared_form", "run_prepared",
    "CLOCK", "CLOCK_OFFSET_GET", "CLOCK_OFFSET_SET", "CLOCK_RAW_NOW", "CancelCounts", "ClaimResult",
    "ClaimedJob", "Completed", "DeadLettered", "FLOW_KEYS_WAITING", "FlowMetrics", "JIT_OFF_LOCAL", "JOB_CANCEL_LEASED",
    "JOB_CLAIM", "JOB_CLAIM_ANY_QUEUE", "JOB_CLAIM_ANY_QUEUE_RATED", "JOB_CLAIM_IDS", "JOB_CLAIM_RATED",
    "JOB_COMPLETE", "JOB_DEAD_CORRUPT", "JOB_DEAD_LETTER_UNKNOWN", "JOB_EXPIRE_LEASE", "JOB_FAIL", "JOB_GET",
    "JOB_INSERT", "JOB_INSERT_MANY", "JOB_INSERT_ONE", "JOB_LOCK_FENCED", "JOB_MAKE_DUE", "JOB_NOTE_LEASE_LOST",
    "JOB_NOTE_RESULT_DROPPED", "JOB_NOTE_TIMED_OUT", "JOB_PRUNE", "JOB_PRUNE_SAVE", "JOB_PRUNE_WORKFLOWS",
    "JOB_REAP", "JOB_RELEASE", "JOB_RELEASE_LOST_CLAIMS", "JOB_RENEW", "CLAIM_CLOCK_US", "claim_clock_us",
    "job_release_lost_claims",
    "JOB_REPLAY", "JOB_REQUEST_CANCEL", "JOB_RETRY_NOW", "JOB_SET_RESULT", "JOB_SNOOZE", "JOB_TABLE", "KeyWait",
    "LEASE_REPORT", "NewJob", "PROCESSES", "PROCESS_HEARTBEAT", "PROCESS_MAINTAINER", "PROCESS_PRUNE", "PROCESS_TABLE",
    "TraceContext",
    "CLAIMED_TRACE_CONTEXT",
    "TRACE_CONTEXT_MAX_BYTES",
    "trace_carrier",
    "trace_json",
    "PROCESS_UPSERT", "PRUNE_FULL_PASS_EVERY", "QUEUE_LIST",
    "QUEUE_PAUSE", "QUEUE_RESUME", "QUEUE_STATS", "QUEUE_TABLE", "QueueInfo",
    "RATE_LOCK", "RATE_LOG_BUCKETS", "RATE_ROWS_CREATE", "Reaped", "Released", "Renewal", "ReplayResult",
    "SCHEDULE_ADVANCE", "SCHEDULE_DISABLE_UNDECLARED", "SCHEDULE_LOCK_DUE", "SCHEDULE_LOCK_FOR_SAVE",
    "SCHEDULE_NEXT_DUE", "SCHEDULE_SOURCES", "SCHEDULE_TABLE", "SCHEDULE_UPSERT_SETTINGS", "STAT_TABLE",
    "SWEEP_TABLE", "NEVER_SWEPT",
    "ScheduleAdvance", "ScheduleDefinition", "ScheduleRow", "ScheduleSync", "TOKEN_MAX", "_decode_claims",
    "clock_offset_get", "clock_offset_set", "clock_real_now", "db_alias", "db_now", "flow_keys_waiting",
    "flow_metrics", "flow_waiting_on_key", "job_cancel_leased", "job_claim", "job_claim_ids", "job_complete",
    "job_dead_letter_unknown_tasks", "job_expire_lease", "job_fail", "job_get", "job_get_by_unique_key",
    "job_insert", "job_insert_many", "job_insert_one", "job_lock_fenced", "job_lock_for_commit", "job_make_due",
    "job_note_lease_lost", "job_note_result_dropped", "job_note_timed_out", "job_prune", "job_reap_expired",
    "job_release", "job_renew", "job_replay", "job_request_cancel", "job_retry_now", "job_set_result",
    "job_snooze", "lease_report_rows", "logger", "process_deregister", "process_heartbeat",
    "process_maintainer", "process_prune",
    "process_register", "queue_list", "queue_pause", "queue_paused_names", "queue_resume",
    "queue_throttled_totals", "read_cursor", "schedule_advance", "schedule_lock_due", "schedule_lock_for_save",
    "schedule_next_due", "schedule_sync_settings", "snapshot_rows",
    "JOB_INSERT_REPLACING", "job_insert_replacing",
    "SEQUENCE_HALTED", "SEQUENCE_LOCK", "SEQUENCE_LOCK_NAMESPACE", "SEQUENCE_SKIP", "HaltedSequenceInfo",
    "sequence_halted", "sequence_locked", "sequence_skip",
    "JOB_NEXT_RUN_AT", "NextRunAt", "job_next_run_at",
]
__all__ += ["JOB_COALESCE", "SCHEDULE_RECORD_PAUSED", "CoalescedJob", "PausedRecord", "job_coalesce",
            "schedule_record_paused"]
__all__ += ["PAUSE_GRACE", "PAUSE_MARGIN", "queue_pause_wait"]
__all__ += ["FLOW_RULES"]
__all__ += ["HISTORY_GET", "HISTORY_MOVE", "HISTORY_PERIODS", "HISTORY_TABLE", "PARTITIONS_AHEAD", "HistoryPartition",
            "HistoryRun", "Moved", "history_drop_partitions", "history_ensure_partitions", "history_get",
            "history_maintain", "history_move", "history_partitions", "history_window",
            "HISTORY_SET_RESULT", "history_set_result", "HISTORY_PLACE", "HISTORY_PLACE_SAVE",
            "PARTITION_LOCK_TIMEOUT"]
__all__ += [
    "DEPENDENCY_LOCK",
    "DEPENDENCY_TABLE",
    "JOB_CANCEL_DOOMED",
    "JOB_DEPENDENCIES",
    "WORKFLOW_ADD_MEMBERS",
    "WORKFLOW_CLOSE",
    "WORKFLOW_COUNTS",
    "WORKFLOW_INSERT",
    "WORKFLOW_RESULTS",
    "WORKFLOW_SETTLE",
    "WORKFLOW_MEMBERS_INSERT",
    "WORKFLOW_STEPS_INSERT",
    "WORKFLOW_TABLE",
    "DependencyOutcome",
    "NewMembers",
    "NewStep",
    "job_dependencies",
    "workflow_add_members",
    "workflow_close",
    "workflow_counts",
    "workflow_create",
    "workflow_get_by_unique_key",
    "workflow_insert_members",
    "workflow_insert_steps",
    "workflow_results",
    "workflow_set_callbacks",
]
__all__ += ["CLOCK_WAKING"]
__all__ += ["WORKFLOW_SET_CALLBACKS"]
__all__ += ["WORKFLOW_STATS"]
__all__ += ["RUNNING_JOBS", "TIMED_OUT_NOW", "workers_page_rows"]

# The operator's set-based writes of the console: run now, release expired leases,
# delete finished jobs, and the reasons each gives for the ids it leaves alone.
from .intervene import (  # noqa: E402
    DELETE_SKIP_REASON,
    JOB_DELETE_FINISHED,
    JOB_RELEASE_EXPIRED,
    JOB_RUN_NOW,
    RELEASE_SKIP_REASON,
    RUN_NOW_SKIP_REASON,
    BulkOutcome,
    job_delete_finished,
    job_release_expired,
    job_run_now,
)
from .operator import (  # noqa: E402
    CANCEL_SKIP_REASON,
    CHANGED_MEANWHILE,
    NO_SUCH_JOB,
    REPLAY_SKIP_REASON,
    skipped_by_reason,
)

__all__ += ["CANCEL_SKIP_REASON", "CHANGED_MEANWHILE", "DELETE_SKIP_REASON", "JOB_DELETE_FINISHED",
            "JOB_RELEASE_EXPIRED", "JOB_RUN_NOW", "NO_SUCH_JOB", "RELEASE_SKIP_REASON", "REPLAY_SKIP_REASON",
            "RUN_NOW_SKIP_REASON", "skipped_by_reason",
            "BulkOutcome", "job_delete_finished", "job_release_expired", "job_run_now"]

# The chart counters: the reaper's fold, and the charts' reads.
from .stats import (  # noqa: E402
    STAT_FOLD,
    STAT_FOLD_LOCK,
    STAT_LATENCY,
    STAT_SERIES,
    StatFold,
    StatPoint,
    StatTotals,
    stat_fold,
    stat_series,
    stat_totals,
)

__all__ += ["STAT_FOLD", "STAT_FOLD_LOCK", "STAT_LATENCY", "STAT_SERIES", "StatFold", "StatPoint",
            "StatTotals", "stat_fold", "stat_series", "stat_totals"]

# The console's read-only statements: bulk previews and the queue and task names of the filters.
from .search import (  # noqa: E402
    QUEUE_NAMES_DEAD,
    QUEUE_NAMES_HOLDING,
    TASK_NAMES_DEAD,
    Preview,
    SampleRow,
    bulk_preview,
    dead_queue_names,
    dead_task_names,
    queue_names_holding,
)

__all__ += ["QUEUE_NAMES_DEAD", "QUEUE_NAMES_HOLDING", "TASK_NAMES_DEAD", "Preview", "SampleRow", "bulk_preview",
            "dead_queue_names", "dead_task_names", "queue_names_holding"]

# The queue page's read-only statements (store/read.py): one queue's state and top errors, its schedules.
from .read import QUEUE_STATE_ONE, QUEUE_TOP_ERRORS, queue_page_rows, queue_schedules  # noqa: E402

__all__ += ["QUEUE_STATE_ONE", "QUEUE_TOP_ERRORS", "queue_page_rows", "queue_schedules"]
__all__ += ["JOB_SETTLED_UNDER", "job_settled_under"]
