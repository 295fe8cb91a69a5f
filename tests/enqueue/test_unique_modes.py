"""Unique-key modes, one enqueue at a time, with an injected database clock reading: the exact
outcome of keep, replace, debounce and throttle on a pending holder, and the checks that refuse a
bad mode or option before anything is written."""

from datetime import UTC, datetime, timedelta

import pytest

from django_leasequeue import EnqueueError, enqueue, enqueue_many, enqueue_on_commit, signals
from django_leasequeue.enqueueing import build_job, insert_job, insert_jobs
from django_leasequeue.models import Job
from django_leasequeue.registry import resolve_task

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 12, 2, 4, 0, 0, tzinfo=UTC)


def put(args, *, at, **options):
    """Enqueue qa.record with ``args`` at database time ``at``; return (job, created)."""
    new = build_job(resolve_task("qa.record"), args, **options)
    return insert_job(new, now=at)


def test_keep_returns_the_holder_unchanged():
    first, created = put(["a"], at=T0, unique_key="k")
    again, created_again = put(["b"], at=T0 + timedelta(seconds=5), unique_key="k", priority=7)
    assert (created, created_again) == (True, False)
    (row,) = Job.objects.filter(unique_key="k")
    assert (again.id, row.args, row.priority, row.run_at) == (first.id, ["a"], 0, T0)


@pytest.mark.parametrize("scope", ["retained", "active"])
def test_replace_updates_the_pending_holder(scope):
    first, created = put(["a"], at=T0, unique_key="k", unique_scope=scope, unique_mode="replace",
                         run_at=timedelta(seconds=60))
    assert created and first.run_at == T0 + timedelta(seconds=60)
    second, created2 = put(["b"], at=T0 + timedelta(seconds=10), unique_key="k", unique_scope=scope,
                           unique_mode="replace", run_at=T0 + timedelta(hours=1), priority=5, queue="other",
                           max_attempts=9)
    assert not created2
    (row,) = Job.objects.filter(unique_key="k")
    assert second.id == row.id == first.id
    assert (row.args, row.run_at, row.priority, row.queue, row.max_attempts) == (
        ["b"], T0 + timedelta(hours=1), 5, "other", 9)
    assert (second.args, second.run_at, second.priority) == (["b"], T0 + timedelta(hours=1), 5)
    # It keeps what is not the enqueue's: its id, created_at, status and fencing token.
    assert (row.created_at, row.status, row.lease_version, row.attempts) == (T0, "ready", 0, 0)


def test_replace_without_run_at_makes_the_holder_due_now():
    put(["a"], at=T0, unique_key="k", unique_mode="replace", run_at=timedelta(hours=1))
    put(["b"], at=T0 + timedelta(seconds=3), unique_key="k", unique_mode="replace")
    (row,) = Job.objects.filter(unique_key="k")
    assert (row.args, row.run_at) == (["b"], T0 + timedelta(seconds=3))


def test_replace_leaves_a_holder_of_another_task_alone():
    other = build_job(resolve_task("qa.busy"), [1.0], unique_key="k")
    held, _ = insert_job(other, now=T0)
    got, created = put(["b"], at=T0 + timedelta(seconds=1), unique_key="k", unique_mode="replace")
    assert (got.id, got.task, got.args, created) == (held.id, "qa.busy", [1.0], False)


def test_debounce_pushes_run_at_up_to_the_max_wait():
    opts = dict(unique_key="d", unique_mode="debounce", debounce=10, debounce_max_wait=25)
    first, created = put(["1"], at=T0, **opts)
    assert created and first.run_at == T0 + timedelta(seconds=10)
    expected = {4: T0 + timedelta(seconds=14), 9: T0 + timedelta(seconds=19), 14: T0 + timedelta(seconds=24),
                18: T0 + timedelta(seconds=25), 24: T0 + timedelta(seconds=25)}
    for offset, run_at in expected.items():
        job, created = put([str(offset)], at=T0 + timedelta(seconds=offset), **opts)
        assert (created, job.id, job.run_at, job.args) == (False, first.id, run_at, [str(offset)])
    (row,) = Job.objects.filter(unique_key="d")
    assert (row.args, row.run_at, row.created_at) == (["24"], T0 + timedelta(seconds=25), T0)


def test_debounce_without_max_wait_pushes_without_bound():
    opts = dict(unique_key="d", unique_mode="debounce", debounce=timedelta(seconds=10))
    put(["1"], at=T0, **opts)
    job, _ = put(["2"], at=T0 + timedelta(hours=5), **opts)
    assert job.run_at == T0 + timedelta(hours=5, seconds=10)


def test_throttle_keeps_the_first_job_of_each_window():
    opts = dict(unique_key="digest:7", unique_mode="throttle", throttle=60)
    first, c1 = put(["a"], at=T0 + timedelta(seconds=1), **opts)
    same, c2 = put(["b"], at=T0 + timedelta(seconds=59.9), **opts)
    later, c3 = put(["c"], at=T0 + timedelta(seconds=60), **opts)
    assert (c1, c2, c3) == (True, False, True)
    assert same.id == first.id and later.id != first.id
    rows = list(Job.objects.filter(unique_key__startswith="digest:7").order_by("id").values_list(
        "unique_key", "args", "created_at"))
    assert rows == [("digest:7@2026-12-02T04:00:00Z", ["a"], T0 + timedelta(seconds=1)),
                    ("digest:7@2026-12-02T04:01:00Z", ["c"], T0 + timedelta(seconds=60))]


def test_throttle_through_enqueue_uses_the_database_clock():
    job = enqueue("qa.record", ["a"], unique_key="t", unique_mode="throttle", throttle=3600)
    again = enqueue("qa.record", ["b"], unique_key="t", unique_mode="throttle", throttle=3600)
    start = job.created_at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    assert job.unique_key == f"t@{start:%Y-%m-%dT%H:%M:%S}Z"
    assert again.id == job.id or again.unique_key != job.unique_key  # the hour may turn in between
    assert Job.objects.filter(unique_key__startswith="t@").count() == (1 if again.id == job.id else 2)


def test_using_carries_the_mode():
    spec = resolve_task("qa.record").using(unique_key="u", unique_mode="debounce", debounce=30)
    first = spec.enqueue("x")
    second = spec.enqueue("y")
    assert second.id == first.id and second.args == ["y"]
    assert second.run_at > first.run_at


@pytest.mark.parametrize(("options", "message"), [
    (dict(unique_key="k", unique_mode="merge"), "unique_mode must be one of 'keep', 'replace', 'debounce', "
                                                "'throttle', got 'merge'"),
    (dict(unique_mode="replace"), "unique_mode='replace' needs a unique_key"),
    (dict(unique_mode="debounce", debounce=5), "unique_mode='debounce' needs a unique_key"),
    (dict(unique_key="k", unique_mode="debounce"), "unique_mode='debounce' needs debounce=<seconds>"),
    (dict(unique_key="k", unique_mode="debounce", debounce=0), "debounce must be more than 0 seconds"),
    (dict(unique_key="k", unique_mode="debounce", debounce=-1), "debounce must be more than 0 seconds"),
    (dict(unique_key="k", unique_mode="debounce", debounce="5"), "debounce must be a number of seconds"),
    (dict(unique_key="k", unique_mode="debounce", debounce=10, debounce_max_wait=5),
     "debounce_max_wait (5 s) must be at least debounce (10 s)"),
    (dict(unique_key="k", unique_mode="debounce", debounce=10, run_at=timedelta(seconds=1)),
     "unique_mode='debounce' sets run_at itself"),
    (dict(unique_key="k", unique_mode="replace", debounce=10), "debounce is an option of unique_mode='debounce', "
                                                               "not of 'replace'"),
    (dict(unique_key="k", debounce_max_wait=10), "debounce_max_wait is an option of unique_mode='debounce'"),
    (dict(unique_key="k", unique_mode="debounce", debounce=1, throttle=10),
     "throttle is an option of unique_mode='throttle', not of 'debounce'"),
    (dict(unique_key="k", unique_mode="throttle"), "unique_mode='throttle' needs throttle=<seconds>"),
    (dict(unique_key="k", unique_mode="throttle", throttle=1.5), "throttle must be a whole number of seconds"),
    (dict(unique_key="k", unique_mode="throttle", throttle=0.5), "throttle must be a whole number of seconds"),
    (dict(unique_key="k", unique_mode="throttle", throttle=60, unique_scope="active"),
     "unique_mode='throttle' needs unique_scope='retained'"),
    (dict(unique_key="k" * 235, unique_mode="throttle", throttle=60), "can have at most 234 characters"),
])
def test_bad_mode_options_are_refused_before_anything_is_written(options, message):
    with pytest.raises(EnqueueError) as err:
        enqueue("qa.record", ["a"], **options)
    assert message in str(err.value)
    assert Job.objects.count() == 0


def test_using_refuses_bad_values_at_once():
    spec = resolve_task("qa.record")
    with pytest.raises(EnqueueError, match="unique_mode must be one of"):
        spec.using(unique_mode="later")
    with pytest.raises(EnqueueError, match="throttle must be more than 0 seconds"):
        spec.using(throttle=-3)


def test_bulk_paths_refuse_modes():
    with pytest.raises(EnqueueError, match=r"enqueue_many\(\) does not take unique_mode='replace'"):
        enqueue_many("qa.record", [["a"], ["b"]], unique_key="k", unique_mode="replace")
    new = build_job(resolve_task("qa.record"), ["a"], unique_key="k", unique_mode="replace")
    with pytest.raises(EnqueueError, match="unique_mode='replace' is for one job at a time"):
        insert_jobs([new])
    assert Job.objects.count() == 0


def test_enqueued_event_only_for_a_new_row():
    seen: list[dict] = []

    def receiver(sender, event, signal, **kwargs):
        seen.append(kwargs)

    signals.SIGNALS["enqueued"].connect(receiver, dispatch_uid="unique-modes-test")
    try:
        first, _ = put(["a"], at=T0, unique_key="k", unique_mode="replace")
        put(["b"], at=T0 + timedelta(seconds=1), unique_key="k", unique_mode="replace")
        put(["c"], at=T0 + timedelta(seconds=2), unique_key="k", unique_mode="debounce", debounce=5)
    finally:
        signals.SIGNALS["enqueued"].disconnect(dispatch_uid="unique-modes-test")
    assert [e["job_id"] for e in seen] == [first.id]


def test_enqueue_on_commit_debounces_at_the_commit(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        enqueue_on_commit("qa.record", ["a"], unique_key="d", unique_mode="debounce", debounce=10)
        enqueue_on_commit("qa.record", ["b"], unique_key="d", unique_mode="debounce", debounce=10)
        assert Job.objects.count() == 0  # nothing before the commit
    (row,) = Job.objects.all()
    assert row.args == ["b"]
    assert row.created_at + timedelta(seconds=10) <= row.run_at < row.created_at + timedelta(seconds=20)
