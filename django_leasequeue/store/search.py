"""Read-only statements of the console's incident search and bulk confirmation: what a set-based
operator write would do to a set of ids (counts by reason and a sample, before anything is written),
and the queue names that hold jobs, found without a ``SELECT DISTINCT`` over the job table."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from ._db import CLOCK, JOB_TABLE, QUEUE_TABLE, _run

# What a bulk write would do, judged by the same reason expression as the write itself (the write's
# *_SKIP_REASON constant in store/operator.py or store/intervene.py, NULL for a row it would act on), so that the
# confirmation page and the result message agree on the reasons. The reasons are counted over every
# id; the sample is the newest ten rows, each with its reason.
_PREVIEW = """
WITH clock AS MATERIALIZED ({clock}),
sel AS MATERIALIZED (
    SELECT r.id, {reason} AS reason
    FROM unnest(%(ids)s::bigint[]) AS r(id) LEFT JOIN {table} j ON j.id = r.id
)
SELECT (SELECT coalesce(jsonb_object_agg(coalesce(s.reason, ''), s.n), '{{}}'::jsonb)
        FROM (SELECT reason, count(*) AS n FROM sel GROUP BY reason) AS s),
       (SELECT coalesce(jsonb_agg(jsonb_build_array(j.id, j.task, j.queue, j.status,
                                                    j.errors -> -1 ->> 'type',
                                                    left(j.errors -> -1 ->> 'message', 200), sel.reason)
                                  ORDER BY j.id DESC), '[]'::jsonb)
        FROM (SELECT * FROM sel ORDER BY id DESC LIMIT %(sample)s) AS sel JOIN {table} j ON j.id = sel.id)
"""


@dataclass(frozen=True)
class SampleRow:
    """One row of a bulk action's sample: id, task, queue, status, last error's type and message
    (None without errors), and why it would be skipped (None: it would be acted on)."""

    id: int
    task: str
    queue: str
    status: str
    error_type: str | None
    error_message: str | None
    skip_reason: str | None


@dataclass(frozen=True)
class Preview:
    """What a bulk write would do to a set of ids.

    Attributes:
        acting (int): ids it would act on.
        skipped (dict[str, int]): the others counted by reason, largest first.
        sample (list[SampleRow]): up to ``sample`` rows, newest first.
    """

    acting: int
    skipped: dict[str, int]
    sample: list[SampleRow]


def bulk_preview(ids: Iterable[int], reason_sql: str, *, sample: int = 10, alias: str | None = None) -> Preview:
    """Count what a set-based operator write would do to ``ids``, in one read-only statement.

    Args:
        ids: job ids (duplicates are ignored).
        reason_sql: the write's skip-reason expression over ``j`` (e.g. ``store.CANCEL_SKIP_REASON``):
            text for a row it would leave alone, NULL for a row it would act on.
        sample: how many rows to return (the newest by id).

    Returns:
        :class:`Preview`.
    """
    ids = sorted({int(i) for i in ids})
    if not ids:
        return Preview(0, {}, [])
    sql = _PREVIEW.format(clock=CLOCK, reason=reason_sql, table=JOB_TABLE)
    counts, rows = _run(sql, {"ids": ids, "now": None, "tokens": None, "sample": sample}, alias=alias).one()
    counts = json.loads(counts) if isinstance(counts, str) else counts
    rows = json.loads(rows) if isinstance(rows, str) else rows
    acting = int(counts.pop("", 0))
    skipped = dict(sorted(((str(k), int(v)) for k, v in counts.items()), key=lambda kv: (-kv[1], kv[0])))
    return Preview(acting, skipped, [SampleRow(*r) for r in rows])


# The queues that hold ready or waiting jobs, without reading every row: a recursive "loose index
# scan" (skip scan) over an index whose first column is the queue, one index probe per distinct
# queue (the next queue name above the last one found). The ready rows are covered by
# leasequeue_job_ready (queue, priority, run_at, id) and the waiting rows by leasequeue_job_waiting
# (queue). Finished and leased rows have no index led by the queue; their queues come from the
# queue table (every queue that was ever paused or rate-limited) and the caller's known names.
_SKIP_SCAN = """
    SELECT q.queue FROM (
        WITH RECURSIVE names AS (
            (SELECT j.queue FROM {table} j WHERE j.status = '{status}' ORDER BY j.queue LIMIT 1)
            UNION ALL
            SELECT (SELECT j.queue FROM {table} j WHERE j.status = '{status}' AND j.queue > names.queue
                    ORDER BY j.queue LIMIT 1)
            FROM names WHERE names.queue IS NOT NULL
        )
        SELECT queue FROM names WHERE queue IS NOT NULL
    ) AS q"""

QUEUE_NAMES_HOLDING = f"""
SELECT name FROM (
    {_SKIP_SCAN.format(table=JOB_TABLE, status='ready')}
    UNION
    {_SKIP_SCAN.format(table=JOB_TABLE, status='waiting')}
    UNION
    SELECT unnest(%(known)s::text[])
    UNION
    SELECT name FROM {QUEUE_TABLE}
) AS all_names(name)
ORDER BY name
"""

# The queues of dead jobs (the Dead letters page): dead rows are few next to the retained done
# ones, and leasequeue_job_finished (status, finished_at) holds exactly them, so this reads the
# dead rows' index entries and heap tuples, never the rest of the table.
QUEUE_NAMES_DEAD = f"""
SELECT DISTINCT j.queue FROM {JOB_TABLE} j WHERE j.status = 'dead' ORDER BY j.queue
"""

# The tasks of dead jobs, likewise.
TASK_NAMES_DEAD = f"""
SELECT DISTINCT j.task FROM {JOB_TABLE} j WHERE j.status = 'dead' ORDER BY j.task
"""


def queue_names_holding(known: Iterable[str], *, alias: str | None = None) -> list[str]:
    """Queue names for the job list's filter, sorted, without a scan of the job table.

    Every queue with a ready or waiting job (found by a skip scan of the claim and waiting
    indexes, one probe per queue), plus ``known`` and the queue table's names.

    Args:
        known: queue names known without the job table (settings, task defaults, workers' queues).

    Returns:
        Sorted queue names.
    """
    rows = _run(QUEUE_NAMES_HOLDING, {"known": sorted(set(known))}, alias=alias).rows
    return [r[0] for r in rows]


def dead_queue_names(*, alias: str | None = None) -> list[str]:
    """The queues that hold dead jobs, sorted (one read of the dead rows only)."""
    return [r[0] for r in _run(QUEUE_NAMES_DEAD, alias=alias).rows]


def dead_task_names(*, alias: str | None = None) -> list[str]:
    """The tasks that have dead jobs, sorted (one read of the dead rows only)."""
    return [r[0] for r in _run(TASK_NAMES_DEAD, alias=alias).rows]
