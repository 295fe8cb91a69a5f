"""A job that has started (leased, or waiting for its retry) or finished is never modified by an
enqueue of its unique key, whatever the mode: its arguments, run_at and fencing token stay, and the
mode's rule for a holder that is not pending applies (the retained scope returns the holder; the
active scope returns a leased or retrying holder, and inserts a new job once the holder finished)."""

from datetime import UTC, datetime, timedelta

import pytest

from django_leasequeue import store
from django_leasequeue.enqueueing import build_job, insert_job
from django_leasequeue.models import Job
from django_leasequeue.registry import resolve_task
from tests.support import claim

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 12, 2, 4, 0, 0, tzinfo=UTC)
LATER = T0 + timedelta(seconds=30)

MODES = {
    "keep": {},
    "replace": dict(unique_mode="replace", run_at=timedelta(hours=1)),
    "debounce": dict(unique_mode="debounce", debounce=10, debounce_max_wait=20),
}
CASES = [(mode, scope) for mode in MODES for scope in ("retained", "active")]


def put(args, *, at, **options):
    return insert_job(build_job(resolve_task("qa.record"), args, **options), now=at)


def snapshot(job_id):
    return Job.objects.filter(id=job_id).values_list(
        "status", "args", "run_at", "lease_version", "attempts", "leased_until", "priority").get()


@pytest.mark.parametrize(("mode", "scope"), CASES)
def test_a_leased_job_is_returned_unchanged(mode, scope):
    first, _ = put(["old"], at=T0, unique_key="k", unique_scope=scope)
    (c,) = claim(now=T0 + timedelta(seconds=1))
    before = snapshot(first.id)
    got, created = put(["new"], at=LATER, unique_key="k", unique_scope=scope, priority=9, **MODES[mode])
    assert (got.id, created, got.status, got.args) == (first.id, False, "leased", ["old"])
    assert snapshot(first.id) == before
    assert before[3] == c.lease_version == 1
    assert Job.objects.count() == 1


@pytest.mark.parametrize(("mode", "scope"), CASES)
def test_a_job_waiting_for_its_retry_is_returned_unchanged(mode, scope):
    first, _ = put(["old"], at=T0, unique_key="k", unique_scope=scope)
    (c,) = claim(now=T0 + timedelta(seconds=1))
    store.job_fail(c.id, c.lease_version, error={"type": "Boom", "message": "boom"}, retry_delay=60,
                   now=T0 + timedelta(seconds=2))
    before = snapshot(first.id)
    assert before[:5] == ("ready", ["old"], T0 + timedelta(seconds=62), 1, 1)
    got, created = put(["new"], at=LATER, unique_key="k", unique_scope=scope, **MODES[mode])
    assert (got.id, created) == (first.id, False)
    assert snapshot(first.id) == before
    assert Job.objects.count() == 1


@pytest.mark.parametrize(("mode", "scope"), CASES)
def test_a_finished_job_is_never_modified(mode, scope):
    first, _ = put(["old"], at=T0, unique_key="k", unique_scope=scope)
    (c,) = claim(now=T0 + timedelta(seconds=1))
    store.job_complete([(c.id, c.lease_version, None)], now=T0 + timedelta(seconds=2))
    before = snapshot(first.id)
    got, created = put(["new"], at=LATER, unique_key="k", unique_scope=scope, **MODES[mode])
    assert snapshot(first.id) == before
    if scope == "retained":  # the key stays taken while the row exists
        assert (got.id, created, Job.objects.count()) == (first.id, False, 1)
    else:  # the key was freed when the job finished: a new job
        assert created and got.id != first.id and got.args == ["new"]
        assert Job.objects.filter(status="ready").count() == 1


def test_a_throttled_window_is_not_reopened_by_a_running_or_finished_job():
    opts = dict(unique_key="t", unique_mode="throttle", throttle=60)
    first, _ = put(["a"], at=T0, **opts)
    (c,) = claim(now=T0 + timedelta(seconds=1))
    got, created = put(["b"], at=T0 + timedelta(seconds=10), **opts)
    assert (got.id, created, got.status) == (first.id, False, "leased")
    store.job_complete([(c.id, c.lease_version, None)], now=T0 + timedelta(seconds=11))
    got, created = put(["c"], at=T0 + timedelta(seconds=20), **opts)
    assert (got.id, created, got.status, got.args) == (first.id, False, "done", ["a"])
    assert Job.objects.count() == 1
