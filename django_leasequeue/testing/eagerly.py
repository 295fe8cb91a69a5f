"""Eager mode: :func:`eager` runs each job enqueued inside its block as soon as a worker could see
it, when the enqueuing transaction commits."""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from django.db import connections, transaction

from .. import signals, store
from .inline import _depth, _inline_worker, _run
from .results import DrainResult


class _EagerRunner:
    """State of one :func:`eager` block (see there)."""

    def __init__(self, *, raise_failures: bool) -> None:
        self.raise_failures = raise_failures
        self.alias = store.db_alias()
        self.worker = _inline_worker(name="eager")
        self.result = DrainResult()
        self.pending: collections.deque[int] = collections.deque()
        self.running = False
        self.active = False
        self.thread = threading.get_ident()
        self.baseline = 0
        self.uid = f"leasequeue-eager-{id(self)}"
        self.errors: list[Exception] = []

    # -- signal and transaction hooks --------------------------------------------------------------
    def on_enqueued(self, sender: Any = None, *, job_id: int, **fields: Any) -> None:
        if not self.active or threading.get_ident() != self.thread:
            return  # another thread's enqueue (a live server thread): not ours to run
        if _depth(self.alias) <= self.baseline:
            self.pending.append(job_id)  # visible to workers now (autocommit)
            self.run_pending()
        else:
            # Visible when the enqueuing transaction commits. A rolled-back savepoint drops the
            # callback (Django removes it); see also release_hook for a test's own transaction.
            transaction.on_commit(_Committed(self, job_id), using=self.alias)

    def release_hook(self, execute: Callable[..., Any], sql: str, params: Any, many: bool,
                     context: Mapping[str, Any]) -> Any:
        """Execute wrapper: after a RELEASE SAVEPOINT that brings the connection back to the
        block's baseline depth, the enqueuing "transaction" committed as far as the test can tell
        (inside a pytest-django ``db`` test the real COMMIT never comes): run its jobs now."""
        result = execute(sql, params, many, context)
        if (self.active and isinstance(sql, str) and sql.startswith("RELEASE SAVEPOINT")
                and _depth(self.alias) <= self.baseline):
            self.collect_committed()
            self.run_pending()
        return result

    def collect_committed(self) -> None:
        """Move our callbacks that survived to the baseline out of Django's on-commit list."""
        conn = connections[self.alias]
        kept = []
        for entry in conn.run_on_commit:
            func = entry[1]
            if isinstance(func, _Committed) and func.runner is self:
                self.pending.append(func.job_id)
            else:
                kept.append(entry)
        conn.run_on_commit = kept

    def run_pending(self) -> None:
        """Run the pending jobs in order; jobs enqueued by those handlers join the end of the line
        (not nested inside the running handler).

        Never raises: it is called from a signal receiver (whose errors Django's ``send_robust``
        would swallow) and from inside ``Atomic.__exit__``; an error is kept and raised when the
        :func:`eager` block ends."""
        if self.running:
            return
        self.running = True
        try:
            while self.pending:
                job_id = self.pending.popleft()
                claimed = store.job_claim_ids([job_id], worker_id=self.worker.worker_id, lease=self.worker.lease,
                                              alias=self.alias)
                if not claimed:
                    self.result.not_due.append(job_id)
                    continue
                self.result.runs.append(_run(self.worker, claimed[0]))
        except Exception as exc:  # noqa: BLE001 - reported at the end of the block
            self.errors.append(exc)
        finally:
            self.running = False


class _Committed:
    """The on-commit callback of one eagerly-run job (recognisable in ``run_on_commit``)."""

    def __init__(self, runner: _EagerRunner, job_id: int) -> None:
        self.runner = runner
        self.job_id = job_id

    def __call__(self) -> None:
        if self.runner.active:
            self.runner.pending.append(self.job_id)
            self.runner.run_pending()


@contextlib.contextmanager
def eager(*, raise_failures: bool = True) -> Iterator[DrainResult]:
    """Run every job enqueued inside the block as soon as a worker could see it.

    "As soon as a worker could see it" means when the transaction that enqueued it commits, as in
    production: a job enqueued in autocommit mode runs before ``enqueue()`` returns; one enqueued
    inside ``transaction.atomic()`` runs when that block commits, and never if it rolls back, so
    the handler sees the rows the enqueuing code committed with it, not a half-done state. Inside a
    pytest-django ``db`` test the test's own transaction (and any atomic block already open when
    ``eager()`` was entered) counts as committed: a job runs when the outermost atomic block
    opened inside ``eager()`` ends.

    Each job runs once, through the real claim and executor, in this thread. A failed attempt is
    recorded as a worker would (retry after backoff, or dead letter) and is not retried by the
    block; use :func:`drain` with ``include_future=True`` for that. Jobs whose ``run_at`` is in the
    future are left ready (listed in ``result.not_due``). Jobs that handlers enqueue run after
    the current handler returns, in order. Only enqueues made by this thread are run.

    Args:
        raise_failures: at the end of the block, raise :class:`JobFailed` if an attempt failed
            (with the recorded traceback). Not raised when the block itself raises.

    Yields:
        A :class:`DrainResult` that fills up as jobs run.

    Raises:
        JobFailed: see ``raise_failures``.
    """
    runner = _EagerRunner(raise_failures=raise_failures)
    runner.baseline = _depth(runner.alias)
    runner.active = True
    signals.job_enqueued.connect(runner.on_enqueued, weak=False, dispatch_uid=runner.uid)
    try:
        with connections[runner.alias].execute_wrapper(runner.release_hook):
            yield runner.result
            # An atomic(savepoint=False) block ends without a RELEASE: pick its jobs up here.
            if _depth(runner.alias) <= runner.baseline:
                runner.collect_committed()
                runner.run_pending()
    finally:
        runner.active = False
        signals.job_enqueued.disconnect(dispatch_uid=runner.uid)
    if runner.errors:
        raise runner.errors[0]
    if raise_failures:
        runner.result.raise_failures()

