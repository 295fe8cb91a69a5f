"""Retries decided by the error for framework tasks: ``retry_on``, ``discard_on``, a backoff that
receives the exception and ``raise Retry(...)`` map onto the native options (per task only)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from django_leasequeue import store
from django_leasequeue.backends import LeaseQueueBackend, registered_framework_tasks, task_options
from django_leasequeue.compat_tasks import InvalidTask, TaskResultStatus
from django_leasequeue.models import Job
from tests.support import claim, error_time, run_claimed

from . import fw_tasks
from .test_backend import TASK_KWARGS

pytestmark = pytest.mark.django_db


def run_one(job_id: int) -> Job:
    (claimed,) = claim()
    run_claimed(claimed)
    return Job.objects.get(pk=job_id)


def test_discard_on_as_a_task_keyword_dead_letters_after_one_attempt():
    if not TASK_KWARGS:
        pytest.skip("Django 6.0's @task does not pass extra keywords to task_class")
    result = fw_tasks.fw_discarded.enqueue(3)
    job = run_one(int(result.id))
    assert (job.status, job.attempts, job.max_attempts, len(job.errors)) == ("dead", 1, 5, 1)
    assert (job.errors[0]["decision"], job.errors[0]["reason"]) == (
        "discarded", "PermissionError matches discard_on (PermissionError)")
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == ["builtins.PermissionError"]


def test_retry_on_and_an_exception_backoff_through_task_options(db_clock):
    not_retryable = run_one(int(fw_tasks.fw_retry_on.enqueue("value").id))
    assert (not_retryable.status, not_retryable.attempts, not_retryable.errors[0]["decision"]) == \
        ("dead", 1, "not_retryable")
    Job.objects.all().delete()
    retried = fw_tasks.fw_retry_on.enqueue("conn")
    delays = []
    for _ in range(3):
        job = run_one(int(retried.id))
        assert job.status == "ready"
        delays.append(job.run_at - error_time(job.errors[-1]))
        db_clock.advance(delays[-1].total_seconds())
    assert delays == [timedelta(seconds=7), timedelta(seconds=14), timedelta(seconds=21)]
    assert run_one(int(retried.id)).status == "dead"  # max_attempts=4


def test_a_framework_task_may_raise_retry_at():
    at = store.db_now() + timedelta(hours=2, microseconds=5)
    result = fw_tasks.fw_retry_at.enqueue(at.isoformat(), "partner API window")
    job = run_one(int(result.id))
    assert (job.status, job.attempts, job.run_at) == ("ready", 1, at)
    assert (job.errors[0]["decision"], job.errors[0]["reason"]) == ("retry_requested", "partner API window")
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert [e.exception_class_path for e in result.errors] == ["django_leasequeue.exceptions.Retry"]


def _module_level(name: str):
    def bad(x):
        return x

    bad.__module__, bad.__qualname__ = fw_tasks.__name__, name  # looks module-level to the framework
    return bad


def test_bad_retry_options_are_refused_at_decoration():
    from django_leasequeue.compat_tasks import task

    with pytest.raises(InvalidTask, match="retry_on must be an exception class or a tuple of them, got 'oops'"):
        task(task_options(retry_on="oops")(_module_level("bad_retry_on")))
    with pytest.raises(InvalidTask, match=r"discard_on must be an exception class .* got \(<class 'int'>,\)"):
        task(task_options(discard_on=(int,))(_module_level("bad_discard_on")))
    with pytest.raises(InvalidTask, match=r"must take \(attempt\) or \(attempt, exc\)"):
        task(task_options(backoff=lambda a, b, c: 1)(_module_level("bad_backoff")))
    assert not {"bad_retry_on", "bad_discard_on", "bad_backoff"} & {
        name.rsplit(".", 1)[1] for name in registered_framework_tasks()}


def test_using_refuses_retry_on_and_discard_on():
    with pytest.raises(TypeError, match="retry_on and discard_on are per task"):
        fw_tasks.add.using(retry_on=ValueError)


def test_options_backoff_may_take_the_exception_and_a_wrong_arity_is_a_check_error():
    def per_error(attempt, exc):
        return 3

    good = LeaseQueueBackend("x", {"OPTIONS": {"BACKOFF": per_error}})
    assert good.check() == [] and good.defaults.backoff is per_error
    bad = LeaseQueueBackend("y", {"OPTIONS": {"BACKOFF": lambda: 3}})
    (message,) = bad.check()
    assert message.id == "leasequeue.E102" and "must take (attempt) or (attempt, exc)" in message.msg
    unknown = LeaseQueueBackend("z", {"OPTIONS": {"RETRY_ON": ValueError}})
    assert [m.id for m in unknown.check()] == ["leasequeue.E102"]  # per task only: no OPTIONS key
