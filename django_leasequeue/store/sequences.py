"""Sequences: the enqueue-side lock that makes id order the commit order of one sequence key, the
operator's "skip" of a dead job that halts its sequence, and the list of halted sequences.

The rule itself (only the head of a sequence is claimable) is one predicate of every claim
statement (:mod:`.claim`, :mod:`.flow`); see docs/howto/flow-control.md, "Sequences".
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction

from ._db import CLOCK, JOB_TABLE, _run, db_alias

#: The first key of the two-int advisory locks taken on sequence keys (the second is
#: ``hashtext(key)``); the concurrency admission uses 1279395153, application locks use neither.
SEQUENCE_LOCK_NAMESPACE = 1279395154

# Serialise the enqueuers of one sequence key until their transactions end. The claim runs a
# sequence in id order, so ids must be handed out in commit order: without the lock, a transaction
# that took id 10 and commits after another that took id 11 would let a worker start job 11 while
# job 10 is still invisible to it. The id comes from the sequence after this lock is granted (the
# insert runs after it, in the same transaction). Keys are locked in hash order, one lock per
# distinct hash, so two bulk enqueues of the same keys cannot deadlock each other.
SEQUENCE_LOCK = f"""
SELECT count(pg_advisory_xact_lock({SEQUENCE_LOCK_NAMESPACE}, d.h))
FROM (SELECT DISTINCT hashtext(u.k) AS h FROM unnest(%(keys)s::text[]) AS u(k) ORDER BY h) AS d
"""


@contextlib.contextmanager
def sequence_locked(keys: Iterable[str | None], *, alias: str | None = None) -> Iterator[None]:
    """Hold the enqueue lock of every sequence key in ``keys`` for the rest of the transaction.

    Without a key (None only) this does nothing and costs nothing. With keys it takes
    ``pg_advisory_xact_lock`` on each, inside ``transaction.atomic(savepoint=False)``: in the
    caller's transaction the lock lasts until its commit or rollback, so a second enqueuer of the
    same key waits for that commit; in autocommit mode the block is its own short transaction.

    Args:
        keys: the sequence keys of the jobs about to be inserted (None entries are ignored).
        alias: the database alias; None: the job table's.
    """
    wanted = sorted({k for k in keys if k is not None})
    if not wanted:
        yield
        return
    alias = alias or db_alias()
    with transaction.atomic(using=alias, savepoint=False):
        _run(SEQUENCE_LOCK, {"keys": wanted}, alias=alias)
        yield


# Let the sequence of a dead job go on without replaying it: sequence_halts is cleared (the job
# stays dead, with its errors) and a history entry records who did it. Locks in id order like the
# other bulk operator statements; the queues of the jobs now at the head get a NOTIFY at commit.
SEQUENCE_SKIP = f"""
WITH clock AS MATERIALIZED ({CLOCK}),
target AS MATERIALIZED (
    SELECT j.id FROM {JOB_TABLE} j
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.status = 'dead' AND j.sequence_key IS NOT NULL AND j.sequence_halts
    ORDER BY j.id
    FOR UPDATE
),
skipped AS (
    UPDATE {JOB_TABLE} j
    SET sequence_halts = false,
        history = j.history || jsonb_build_array(jsonb_build_object(
            'event', 'sequence_skipped', 'by', %(by)s::text, 'at', clock.now))
    FROM target t, clock
    WHERE j.id = t.id AND j.status = 'dead' AND j.sequence_halts
    RETURNING j.id, j.sequence_key
),
woken AS (
    SELECT pg_notify(%(channel)s, q.queue)
    FROM (SELECT DISTINCT n.queue FROM skipped s JOIN {JOB_TABLE} n
          ON n.sequence_key = s.sequence_key AND n.id > s.id AND n.status = 'ready') AS q
    WHERE %(notify)s
)
SELECT s.id, (SELECT count(*) FROM woken) FROM skipped s ORDER BY s.id
"""


def sequence_skip(ids: Iterable[int], *, by: str = "", now: datetime | None = None,
                  alias: str | None = None) -> list[int]:
    """Release the sequences halted by these dead jobs, leaving the jobs dead (one statement).

    The next job of each sequence may start at the next claim. Ids that are not dead jobs halting a
    sequence are left alone. To run the dead job again instead, replay it (:func:`job_replay`): it
    keeps its id, so it stays the head of its sequence.

    Args:
        ids: job ids (duplicates are ignored).
        by: who skipped (recorded in each job's ``history`` as ``"sequence_skipped"``).
        now: aware datetime instead of the database clock (tests).
        alias: the database alias; None: the job table's.

    Returns:
        The ids whose sequence was released, in id order.
    """
    from ..conf import get_settings

    wanted = sorted({int(i) for i in ids})
    if not wanted:
        return []
    settings = get_settings()
    rows = _run(SEQUENCE_SKIP, {"now": now, "ids": wanted, "by": by, "notify": settings.notify,
                                "channel": settings.notify_channel}, alias=alias or db_alias()).rows
    return [r[0] for r in rows]


@dataclass(frozen=True)
class HaltedSequenceInfo:
    """A sequence held by a dead job (see :func:`sequence_halted`).

    Attributes:
        key (str): the sequence key.
        job_id (int): the dead job that holds it (the head of the sequence).
        task (str), queue (str): that job's task and queue.
        finished_at (datetime): when it died (database clock).
        waiting (int): ready or leased jobs of the key enqueued after it.
    """

    key: str
    job_id: int
    task: str
    queue: str
    finished_at: datetime | None
    waiting: int


# Every dead job that halts its sequence, oldest death first, with the count of jobs behind it.
# Both lookups walk leasequeue_job_seq_order (sequence_key, id), which holds only keyed rows.
SEQUENCE_HALTED = f"""
SELECT d.sequence_key, d.id, d.task, d.queue, d.finished_at,
       (SELECT count(*) FROM {JOB_TABLE} w
        WHERE w.sequence_key = d.sequence_key AND w.id > d.id AND w.status IN ('ready', 'leased')) AS waiting
FROM {JOB_TABLE} d
WHERE d.sequence_key IS NOT NULL AND d.status = 'dead' AND d.sequence_halts
ORDER BY d.finished_at, d.id
LIMIT %(limit)s
"""


def sequence_halted(*, limit: int = 1000, alias: str | None = None) -> list[HaltedSequenceInfo]:
    """The halted sequences: dead jobs with ``sequence_halts`` set, oldest death first.

    Args:
        limit: at most this many rows.
        alias: the database alias; None: the job table's.

    Returns:
        A list of :class:`HaltedSequenceInfo`.
    """
    rows = _run(SEQUENCE_HALTED, {"limit": limit}, alias=alias or db_alias()).rows
    return [HaltedSequenceInfo(*r) for r in rows]
