"""Stuck workflows and waiting jobs in the health snapshot, its check, the metrics and queuehealth.

Workflows are built with the real API and run with ``drain()``; "no progress for a while" is an
UPDATE of ``progressed_at`` relative to the test's database clock reading, and the snapshot is
taken at that reading (explicit ``now``) so every age is exact.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings
from prometheus_client import generate_latest

from django_leasequeue import Batch, chain, chord, enqueue, health, metrics
from django_leasequeue.conf import build
from django_leasequeue.enqueueing import task
from django_leasequeue.exceptions import ConfigurationError
from django_leasequeue.models import Job, Workflow
from django_leasequeue.testing import drain

from .helpers import ago, queuehealth
from .test_metrics import samples

pytestmark = pytest.mark.django_db

WARN_ON_ANY = health.Threshold(warning=0)


@task(name="tests.wfmon.add")
def add(x: int, y: int = 0) -> int:
    return x + y


@task(name="tests.wfmon.total")
def total(results: list[int]) -> int:
    return sum(results)


@task(name="tests.wfmon.fail", max_attempts=1)
def fail(x: int = 0) -> None:
    raise ValueError(f"cannot handle {x}")


def idle_since(workflow_id: int, at) -> None:
    """Make the workflow's last progress ``at`` (as if nothing had settled since)."""
    assert Workflow.objects.filter(id=workflow_id).update(progressed_at=at) == 1


def check(snap: health.Snapshot) -> health.CheckResult:
    (result,) = health.evaluate(snap, health.Checks(max_stuck_workflows=WARN_ON_ANY))
    return result


def scrape(now) -> dict:
    registry = metrics.build_registry(metrics.HealthCollector(lambda: health.snapshot(now)))
    return samples(generate_latest(registry).decode())


def test_no_workflow_is_ok_everywhere(now):
    snap = health.snapshot(now)
    assert (snap.workflows_unfinished, snap.workflows_stuck, snap.oldest_stuck_workflow) == (0, 0, None)
    assert snap.workflow_stuck_after == 3600.0
    assert snap.queue("default").waiting == 0
    result = check(snap)
    assert (result.check, result.scope, result.value, result.level) == ("stuck_workflows", "*", 0.0, health.Level.OK)
    assert result.message == "0 of 0 unfinished workflow(s) stuck (no progress for more than 3600 s)"
    got = scrape(now)
    assert got[("leasequeue_workflows_unfinished", ())] == 0
    assert got[("leasequeue_workflows_stuck", ())] == 0
    assert got[("leasequeue_oldest_stuck_workflow_age_seconds", ())] == 0
    assert got[("leasequeue_jobs", (("queue", "default"), ("status", "waiting")))] == 0
    run = queuehealth("--max-stuck-workflows", "0:")
    assert run.code == 0
    assert run.output.splitlines()[0] == (
        "QUEUEHEALTH OK - 1 check(s) passed | 'stuck_workflows[*]'=0;0;")
    assert "\nworkflows: 0 of 0 unfinished workflow(s) stuck (no progress for more than 3600 s)\n" in run.output


def test_recent_old_finished_and_open_batch(now):
    # Finished two hours ago: never stuck, whatever its progressed_at.
    finished = chain(add.step(1), add.step(2), name="finished").enqueue()
    drain()
    assert finished.state == "succeeded"
    idle_since(finished.id, ago(now, 7200))
    # An open batch whose members all ran, then nobody added to it or closed it for three hours.
    batch = Batch.open("nightly", on_complete=total.step().set(pass_result=True))
    batch.add_many(add, [[1], [2]])
    drain()
    assert batch.members().filter(status="done").count() == 2
    idle_since(batch.id, ago(now, 3 * 3600))
    # A chain that progressed just now (step 1 ready, steps 2 and 3 waiting in queue "wf").
    recent = chain(add.step(1).set(queue="wf"), add.step(2).set(queue="wf"), add.step(3).set(queue="wf"),
                   name="recent").enqueue()
    # A chain whose step 1 has not settled for two hours (step 2 waiting in "default").
    old = chain(add.step(1), add.step(2), name="old").enqueue()
    idle_since(old.id, ago(now, 7200))

    snap = health.snapshot(now)
    assert (snap.workflows_unfinished, snap.workflows_stuck) == (3, 2)
    assert snap.oldest_stuck_workflow == health.StuckWorkflow(
        id=batch.id, kind="batch", name="nightly", age_seconds=10800.0, open=True, members=2, members_pending=0)
    # Waiting: the batch's on_complete callback and old's step 2 in default, recent's 2 and 3 in wf.
    assert (snap.queue("default").waiting, snap.queue("wf").waiting, snap.total().waiting) == (2, 2, 4)
    # The first steps were enqueued after the snapshot's now, so at that instant they are scheduled.
    assert [(snap.queue(q).ready_due, snap.queue(q).scheduled) for q in ("wf", "default")] == [(0, 1), (0, 1)]
    result = check(snap)
    assert (result.value, result.level) == (2.0, health.Level.WARNING)
    assert result.message == (
        f"2 of 3 unfinished workflow(s) stuck (no progress for more than 3600 s); the oldest: batch #{batch.id} "
        "'nightly', no progress for 10800 s, an open batch that nobody has closed or added to "
        "(close() releases its callbacks)")
    got = scrape(now)
    assert got[("leasequeue_workflows_unfinished", ())] == 3
    assert got[("leasequeue_workflows_stuck", ())] == 2
    assert got[("leasequeue_oldest_stuck_workflow_age_seconds", ())] == 10800.0
    assert got[("leasequeue_jobs", (("queue", "wf"), ("status", "waiting")))] == 2
    assert got[("leasequeue_jobs", (("queue", "default"), ("status", "waiting")))] == 2

    # The threshold is strict: progress exactly 7200 s old is not stuck at 7200.
    at_7200 = health.snapshot(now, workflow_stuck_after=7200)
    assert (at_7200.workflows_stuck, at_7200.oldest_stuck_workflow.id) == (1, batch.id)
    assert health.snapshot(now, workflow_stuck_after=10800).workflows_stuck == 0
    with override_settings(LEASEQUEUE={**settings.LEASEQUEUE, "WORKFLOW_STUCK_AFTER": timedelta(hours=4)}):
        assert (health.snapshot(now).workflows_stuck, health.snapshot(now).workflow_stuck_after) == (0, 14400.0)

    # Closing the batch is progress: its callback runs and it finishes; the old chain is left.
    batch.close()
    drain(queues=["default"])
    assert batch.row().finished_at is not None
    assert old.state == "succeeded"
    after = health.snapshot(now)
    assert (after.workflows_unfinished, after.workflows_stuck, after.oldest_stuck_workflow) == (1, 0, None)
    assert recent.state == "running"


def test_a_job_waiting_on_a_dependency_outside_any_workflow_is_waiting_not_due(now):
    first = add.using(queue="deps").enqueue(1)
    later = enqueue(add, [2], queue="deps", depends_on=[first])
    assert Job.objects.get(id=later.id).status == "waiting"
    snap = health.snapshot(now, queues=["deps"])
    stats = snap.queue("deps")
    assert (stats.waiting, stats.ready_due + stats.scheduled, stats.oldest_ready_age_seconds) == (1, 1, 0.0)
    assert (snap.workflows_unfinished, snap.workflows_stuck) == (0, 0)
    drain()
    assert health.snapshot(queues=["deps"]).queue("deps").waiting == 0


def test_a_dead_step_is_named_as_what_holds_the_chain(now):
    held = chain(add.step(1), fail.step(), add.step(5), name="import").enqueue()
    assert drain(raise_failures=False).outcomes == {"done": 1, "dead": 1}
    dead = held.steps()["2"]
    assert (dead.status, held.steps()["3"].status) == ("dead", "waiting")
    idle_since(held.id, ago(now, 5400))
    snap = health.snapshot(now)
    assert snap.oldest_stuck_workflow == health.StuckWorkflow(
        id=held.id, kind="chain", name="import", age_seconds=5400.0, open=False, members=3, members_pending=1,
        held_by=dead.id, held_by_status="dead")
    assert check(snap).message == (
        f"1 of 1 unfinished workflow(s) stuck (no progress for more than 3600 s); the oldest: chain #{held.id} "
        f"'import', no progress for 5400 s, held by dead job {dead.id} (replay it to resume)")


def test_a_dead_member_holding_a_chord_callback_is_named(now):
    held = chord([add.step(1), fail.step(2), fail.step(3)], total.step(), name="report").enqueue()
    assert drain(raise_failures=False).outcomes == {"done": 1, "dead": 2}
    first_dead = Job.objects.filter(workflow_id=held.id, status="dead").order_by("id").first()
    assert held.callbacks()["on_success"].status == "waiting"
    idle_since(held.id, ago(now, 4000))
    oldest = health.snapshot(now).oldest_stuck_workflow
    assert oldest is not None
    assert (oldest.id, oldest.kind, oldest.members, oldest.members_pending) == (held.id, "chord", 3, 0)
    assert (oldest.held_by, oldest.held_by_status, oldest.age_seconds) == (first_dead.id, "dead", 4000.0)


def test_queuehealth_warns_and_names_the_stuck_workflow(db):
    held = chain(add.step(1), fail.step(), add.step(5), name="import").enqueue()
    drain(raise_failures=False)
    dead = held.steps()["2"]
    # queuehealth reads the database clock: two hours before its reading now, so that the age
    # prints as 7200 s (the milliseconds until queuehealth reads the clock round away).
    with connection.cursor() as cur:
        cur.execute("UPDATE leasequeue_workflow SET progressed_at = leasequeue_now() - interval '7200 seconds' "
                    "WHERE id = %s", [held.id])
        assert cur.rowcount == 1
    run = queuehealth("--max-stuck-workflows", "0:")
    assert run.code == 1
    message = (f"1 of 1 unfinished workflow(s) stuck (no progress for more than 3600 s); the oldest: chain "
               f"#{held.id} 'import', no progress for 7200 s, held by dead job {dead.id} (replay it to resume)")
    assert run.output.splitlines()[0] == (
        f"QUEUEHEALTH WARNING - {message} (warn > 0) | 'stuck_workflows[*]'=1;0;")
    assert f"\nworkflows: {message}\n" in run.output
    assert f"\nWARNING   stuck_workflows[*]: {message} [warn > 0]\n" in run.output
    header = next(line for line in run.output.splitlines() if line.startswith("queue "))
    assert header.split()[:6] == ["queue", "paused", "ready_due", "scheduled", "waiting", "leased"]
    default = next(line for line in run.output.splitlines() if line.startswith("default "))
    assert default.split()[2:5] == ["0", "0", "1"]
    # A longer threshold, and the critical limit: exit codes as for every other check.
    assert queuehealth("--max-stuck-workflows", "0:", "--workflow-stuck-after", "3h").code == 0
    assert queuehealth("--max-stuck-workflows", "0").code == 2
    doc = queuehealth("--max-stuck-workflows", "0:", "--json").json
    assert doc["exit_code"] == 1
    assert doc["snapshot"]["workflows_stuck"] == 1
    assert doc["snapshot"]["oldest_stuck_workflow"]["held_by"] == dead.id
    assert doc["snapshot"]["oldest_stuck_workflow"]["label"] == f"chain #{held.id} 'import'"
    # Without the threshold the workflows are shown, not judged.
    plain = queuehealth()
    assert plain.code == 0
    assert f"\nworkflows: {message}\n" in plain.output


def test_bad_thresholds_are_refused():
    with pytest.raises(CommandError, match="argument --workflow-stuck-after: '0' must be > 0"):
        call_command("queuehealth", "--workflow-stuck-after", "0")
    with pytest.raises(CommandError, match="argument --max-stuck-workflows: 'x' is not a non-negative number"):
        call_command("queuehealth", "--max-stuck-workflows", "x")
    with pytest.raises(ValueError, match="workflow_stuck_after must be > 0 seconds, got 0"):
        health.snapshot(workflow_stuck_after=0)


@pytest.mark.parametrize("value", [0, -1, float("inf"), float("nan"), None, 367 * 86400, "1h", True])
def test_workflow_stuck_after_setting_is_validated(value):
    with pytest.raises(ConfigurationError, match="WORKFLOW_STUCK_AFTER"):
        build({"WORKFLOW_STUCK_AFTER": value})


def test_workflow_stuck_after_setting_takes_seconds_or_a_timedelta():
    assert build({}).workflow_stuck_after == 3600.0
    assert build({"WORKFLOW_STUCK_AFTER": 90}).workflow_stuck_after == 90.0
    assert build({"WORKFLOW_STUCK_AFTER": timedelta(hours=6)}).workflow_stuck_after == 21600.0
