"""The executor's attempt hooks: told when an attempt starts and which event ended it, with the
handler's exception in ``sys.exc_info()`` for a failure; a failing hook breaks nothing."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from django_leasequeue import enqueue, signals, store
from django_leasequeue.attempt_hooks import install_attempt_hook, uninstall_attempt_hook
from django_leasequeue.context import JobContext
from django_leasequeue.testing import drain
from django_leasequeue.worker import WorkerService

pytestmark = pytest.mark.django_db


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def attempt_started(self, ctx: JobContext) -> None:
        ctx.attempt_data["recorder"] = ctx.attempt
        self.calls.append(("started", ctx.job_id))

    def attempt_ended(self, ctx: JobContext, outcome: str) -> None:
        exc = sys.exc_info()[1]
        self.calls.append(("ended", ctx.job_id, outcome, ctx.attempt_data.get("recorder"),
                           type(exc).__name__ if exc else None))


@pytest.fixture
def recorder():
    hook = Recorder()
    install_attempt_hook(hook)
    install_attempt_hook(hook)  # installing twice installs once
    yield hook
    uninstall_attempt_hook(hook)


def test_a_success_written_by_the_completer_ends_succeeded(recorder):
    job = enqueue("qa.record", ["hooks"])
    drain()
    assert recorder.calls == [("started", job.id), ("ended", job.id, "succeeded", 1, None)]


def test_a_failure_ends_inside_the_except_block(recorder):
    job = enqueue("qa.fail_once")
    drain(raise_failures=False)
    assert recorder.calls == [("started", job.id), ("ended", job.id, "dead_lettered", 1, "ValueError")]


def test_a_failing_hook_is_logged_and_the_job_still_completes(recorder, caplog):
    class Broken:
        def attempt_started(self, ctx: JobContext) -> None:
            raise ValueError("broken hook")

        def attempt_ended(self, ctx: JobContext, outcome: str) -> None:
            raise ValueError("broken hook")

    broken = Broken()
    install_attempt_hook(broken)
    try:
        job = enqueue("qa.record", ["broken"])
        result = drain()
    finally:
        uninstall_attempt_hook(broken)
    assert [run.outcome for run in result.runs] == ["done"]
    assert recorder.calls[-1] == ("ended", job.id, "succeeded", 1, None)
    assert caplog.text.count("attempt hook") == 2


def test_a_cancelled_held_job_that_never_started_ends_cancelled(recorder):
    job = enqueue("qa.record", ["never"])
    worker = WorkerService(concurrency=1, notify=False, reap=False)
    (claimed,) = store.job_claim(queues=None, limit=1, worker_id=worker.worker_id, lease=30)
    item = worker.pool.track(claimed)
    assert worker.executor.cancel_unstarted(claimed, item.ctx) == "cancelled"
    job.refresh_from_db()
    assert job.status == "cancelled"
    assert recorder.calls == [("ended", job.id, "cancelled", None, None)]


def test_the_tasks_backend_connects_no_receiver_to_our_attempt_signals():
    import django_leasequeue.backends  # noqa: F401 - importing it must connect nothing here

    for event in ("succeeded", "retried", "snoozed", "dead_lettered", "cancelled", "lease_lost"):
        keys = [str(lookup) for lookup, *_ in signals.SIGNALS[event].receivers]
        assert not any("leasequeue-tasks" in key for key in keys), event
