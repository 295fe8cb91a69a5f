"""Lease advice: exact runtime percentiles, lease losses, fence rejections, recommendations, flags."""

from __future__ import annotations

from datetime import timedelta

import pytest
from invoices.tasks import flaky_sync

from django_leasequeue import health, store, task
from django_leasequeue.models import Job

from .helpers import ago, claim, make_job, queuehealth, run_jobs

pytestmark = pytest.mark.django_db


@task(name="monitoring_tests.slow", timeout=90)
def slow() -> None:
    """Registered with a 90 s timeout; its seeded p99 runtime is 99.01 s."""


@task(name="monitoring_tests.fast", timeout=60)
def fast() -> None:
    """Registered with a 60 s timeout; every seeded run takes 2 s."""


@task(name="monitoring_tests.lossy", lease=20)
def lossy() -> None:
    """Registered with a 20 s lease; it loses leases while its worker is healthy."""


@task(name="monitoring_tests.manual", manual_heartbeat=True, lease=10)
def manual() -> None:
    """Renews only when the handler calls ctx.heartbeat()."""


def done_job(task_name: str, runtime: float, *, finished, **fields):
    return make_job(task=task_name, status="done", attempted_at=finished - timedelta(seconds=runtime),
                    finished_at=finished, run_at=finished - timedelta(hours=1), at=finished - timedelta(hours=1),
                    **fields)


def note(token: int, at, *, timed_out: bool, write: str = "complete") -> dict:
    return {"event": "lease_lost", "token": token, "worker": "h:1:w", "write": write, "timed_out": timed_out,
            "at": at.isoformat()}


def test_exact_percentiles_and_flags_for_the_task_whose_p99_exceeds_its_timeout(now):
    for seconds in range(1, 101):  # runtimes 1 s .. 100 s
        done_job(slow.name, seconds, finished=ago(now, seconds * 10))
    for i in range(10):
        done_job(fast.name, 2, finished=ago(now, 60 + i))
    # Outside the window or not done: no runtime sample.
    done_job(fast.name, 500, finished=ago(now, 2 * 86400))
    make_job(task=fast.name, status="dead", attempted_at=ago(now, 100), finished_at=ago(now, 50))
    make_job(task=fast.name, status="cancelled", attempted_at=ago(now, 100), finished_at=ago(now, 50))

    report = {t.task: t for t in health.lease_report(now, window=86400)}
    s = report[slow.name]
    assert (s.done, s.dead) == (100, 0)
    assert s.p50 == pytest.approx(50.5, abs=1e-9)
    assert s.p95 == pytest.approx(95.05, abs=1e-9)
    assert s.p99 == pytest.approx(99.01, abs=1e-9)
    assert s.max == 100.0
    assert (s.timeout, s.lease, s.registered) == (90.0, 30.0, True)
    assert s.flags == (health.FLAG_P99_OVER_TIMEOUT,)
    assert (s.recommended_timeout, s.recommended_lease) == (199.0, 30.0)  # ceil(2 x 99.01); lease kept
    assert s.recommended_renewal_interval == 10.0

    f = report[fast.name]
    assert (f.done, f.dead, f.p50, f.p99, f.max, f.flags) == (10, 1, 2.0, 2.0, 2.0, ())
    assert (f.recommended_timeout, f.recommended_lease) == (4.0, 30.0)

    run = queuehealth("--lease-report", "--json")
    assert run.code == 1  # a flagged task warns
    checks = run.json["checks"]
    assert [(c["check"], c["scope"], c["level"]) for c in checks] == [("lease", slow.name, "WARNING")]
    assert "p99 runtime 99.0 s exceeds its timeout 90 s" in checks[0]["message"]
    text = queuehealth("--lease-report").output
    assert "p99>timeout" in text and "199.0s" in text


def test_lease_losses_fence_rejections_and_losses_while_healthy(now):
    expired = {"type": "LeaseExpired", "attempt": 1, "at": ago(now, 500).isoformat()}
    old = {"type": "LeaseExpired", "attempt": 1, "at": ago(now, 3 * 86400).isoformat()}
    for i in range(5):
        done_job(lossy.name, i + 1, finished=ago(now, 100 + i), errors=[expired] if i < 3 else [],
                 history=[note(1, ago(now, 400), timed_out=i == 0)] if i < 3 else [])
    done_job(lossy.name, 1, finished=ago(now, 90), errors=[old],
             history=[note(1, ago(now, 3 * 86400), timed_out=False)])
    # A leased job counts too (its losses so far), but gives no runtime.
    make_job(task=lossy.name, status="leased", attempted_at=ago(now, 5), leased_until=now + timedelta(seconds=15),
             errors=[expired], history=[note(2, ago(now, 300), timed_out=False, write="renew")])
    (t,) = health.lease_report(now, tasks=[lossy.name])
    assert (t.done, t.dead, t.lease_expired, t.fence_rejected, t.lost_while_healthy) == (6, 0, 4, 4, 3)
    assert t.p99 == pytest.approx(4.95, abs=1e-9)  # runtimes 1,1,2,3,4,5
    assert t.flags == (health.FLAG_LOST_WHILE_HEALTHY,)
    assert (t.lease, t.recommended_lease, t.recommended_timeout) == (20.0, 40.0, 10.0)


def test_fence_rejection_is_recorded_by_the_worker_and_counted(db_clock):
    job = flaky_sync.enqueue("stale", failures=0)
    (stale,) = claim(lease=30)
    # The worker stalls past its lease; a reaper takes the job back (token 1 -> 2).
    db_clock.advance(31)
    (reaped,) = store.job_reap_expired()
    assert (reaped.id, reaped.status, reaped.lease_version) == (job.id, "ready", 2)
    # The stale worker finishes the handler: its completion is refused and noted.
    assert run_jobs([stale]) == ["done"]  # handed to the completer, which the fence refused
    job.refresh_from_db()
    assert job.status == "ready"
    (entry,) = job.history
    assert {k: entry[k] for k in ("event", "token", "write", "timed_out", "worker")} == {
        "event": "lease_lost", "token": 1, "write": "complete", "timed_out": False, "worker": "host:1:test"}
    # Noting is idempotent per token.
    assert store.job_note_lease_lost(job.id, 1, worker="x", write="complete", timed_out=False) is False
    # Another worker runs it to completion; the report now shows the loss and the rejection.
    (fresh,) = claim()
    assert run_jobs([fresh], worker="host:2:other") == ["done"]
    (t,) = health.lease_report(tasks=[flaky_sync.name])
    assert (t.done, t.lease_expired, t.fence_rejected, t.lost_while_healthy) == (1, 1, 1, 1)
    assert t.flags == (health.FLAG_LOST_WHILE_HEALTHY,)
    assert 0 <= t.max < 5
    assert Job.objects.get(id=job.id).status == "done"


def test_manual_heartbeat_lease_covers_the_run_and_unregistered_tasks_are_shown(now):
    for seconds in (10, 20, 30, 40):
        done_job(manual.name, seconds, finished=ago(now, 100))
    done_job("gone.task", 1, finished=ago(now, 100))
    report = {t.task: t for t in health.lease_report(now)}
    m = report[manual.name]
    assert m.p99 == pytest.approx(39.7, abs=1e-9)
    assert (m.lease, m.recommended_lease, m.recommended_timeout, m.flags) == (10.0, 60.0, 80.0, ())
    g = report["gone.task"]
    assert (g.registered, g.flags, g.timeout) == (False, (health.FLAG_UNREGISTERED,), None)
    assert queuehealth("--lease-report").code == 0  # "unregistered" is shown, not warned about


def test_recommend_rule():
    assert health.recommend(p99=None, max_runtime=None, lease=30, manual_heartbeat=False,
                            lost_while_healthy=0) == (None, 30.0)
    assert health.recommend(p99=0.01, max_runtime=0.02, lease=30, manual_heartbeat=False,
                            lost_while_healthy=0) == (1.0, 30.0)
    assert health.recommend(p99=10, max_runtime=40, lease=30, manual_heartbeat=False,
                            lost_while_healthy=2) == (50.0, 60.0)
    assert health.recommend(p99=100, max_runtime=100, lease=30, manual_heartbeat=True,
                            lost_while_healthy=0) == (200.0, 150.0)


def test_report_validates_arguments(now):
    with pytest.raises(ValueError):
        health.lease_report(now, window=0)
    with pytest.raises(ValueError):
        health.lease_report(now.replace(tzinfo=None))
    assert health.lease_report(now) == []
