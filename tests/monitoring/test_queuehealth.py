"""``manage.py queuehealth``: omission, scheduler lag, thresholds and the plugin exit codes."""

from __future__ import annotations

import pytest
from invoices.tasks import flaky_sync

from django_leasequeue import health, store
from django_leasequeue.health import Level, Threshold, parse_rate, parse_threshold
from django_leasequeue.models import Job, QueueState, WorkerProcess

from .helpers import ago, make_job, queuehealth


@pytest.mark.process
def test_omission_no_worker_goes_critical_by_database_time_and_a_worker_clears_it(spawn, db_clock):
    """The characteristic scheduler failure: nothing runs, nothing fails, error rates stay green.
    Only the oldest due job's age (database time) catches it."""
    jobs = [flaky_sync.enqueue(f"omission-{i}", failures=0) for i in range(3)]
    fresh = queuehealth("--max-oldest-age", "5", "--json")
    assert fresh.code == 0, fresh.output
    assert fresh.json["snapshot"]["queues"][0]["ready_due"] == 3

    db_clock.advance(6)  # the database clock moves on; no worker runs
    stalled = queuehealth("--max-oldest-age", "5", "--json")
    assert stalled.code == 2, stalled.output
    (check,) = stalled.json["checks"]
    assert (check["check"], check["level"]) == ("oldest_ready_age", "CRITICAL")
    assert check["value"] >= 6.0
    # The error figures an error-rate dashboard watches stay at zero all along.
    default = health.snapshot().queue("default")
    assert (default.dead, default.dead_recent_short, default.dead_recent_long, default.leased) == (0, 0, 0, 0)
    assert Job.objects.exclude(errors=[]).count() == 0

    worker = spawn("runworker", "--burst", "--concurrency", "2", "--no-notify", env=db_clock.env())
    assert worker.wait(60) == 0, worker.output()
    assert set(Job.objects.filter(id__in=[j.id for j in jobs]).values_list("status", flat=True)) == {"done"}
    recovered = queuehealth("--max-oldest-age", "5")
    assert recovered.code == 0, recovered.output
    assert recovered.output.startswith("QUEUEHEALTH OK - 1 check(s) passed")


@pytest.mark.process
def test_real_process_exit_code_is_critical(spawn, transactional_db):
    make_job(run_at=ago(store.db_now(), 3600))
    critical = spawn("queuehealth", "--max-oldest-age", "60")
    assert critical.wait(60) == 2
    assert critical.output().startswith("QUEUEHEALTH CRITICAL - oldest due job in any queue waits 36")


def test_usage_errors_exit_unknown_not_critical():
    from django_leasequeue.management.commands.queuehealth import Command

    parser = Command().create_parser("manage.py", "queuehealth")
    parser.called_from_command_line = True  # as when run from a shell: argparse exits
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["--max-oldest-age", "soon"])
    assert info.value.code == 3


@pytest.mark.django_db
def test_scheduler_that_stops_ticking_makes_scheduler_lag_critical(now):
    none = queuehealth("--max-scheduler-lag", "60")
    assert none.code == 2
    assert "no scheduler tick recorded" in none.output
    # A scheduler that ticked 10 minutes ago and then stopped (its row is not pruned yet).
    WorkerProcess.objects.create(id="host:7:scheduler", kind="scheduler", host="host", pid=7,
                                 started_at=ago(now, 3600), last_heartbeat_at=ago(now, 600),
                                 last_tick_at=ago(now, 600))
    assert health.snapshot(now).scheduler_last_tick_age_seconds == 600.0
    assert queuehealth("--max-scheduler-lag", "60").code == 2
    assert queuehealth("--max-scheduler-lag", "1m:15m").code == 1
    assert queuehealth("--max-scheduler-lag", "15m").code == 0
    # A live scheduler ticks: the newest tick of any row counts.
    store.process_register(process_id="host:8:scheduler", kind="scheduler", host="host", pid=8, queues=None,
                           concurrency=0)
    assert store.process_heartbeat("host:8:scheduler", tick=True)
    assert queuehealth("--max-scheduler-lag", "60").code == 0
    assert health.snapshot().scheduler_last_tick_age_seconds < 60


@pytest.mark.django_db
def test_min_workers_counts_alive_workers_serving_each_queue(now):
    assert queuehealth("--min-workers", "1").code == 2
    store.process_register(process_id="h:1:a", kind="worker", host="h", pid=1, queues=["emails"], concurrency=4)
    store.process_register(process_id="h:2:b", kind="worker", host="h", pid=2, queues=None, concurrency=4)
    store.process_register(process_id="h:3:c", kind="worker", host="h", pid=3, queues=["emails"], concurrency=4,
                           now=ago(now, 120))  # silent for two minutes: not alive
    store.process_register(process_id="h:4:r", kind="reaper", host="h", pid=4, queues=None, concurrency=0)
    snap = health.snapshot()
    assert snap.workers_alive == 2
    assert snap.alive_by_kind == {"reaper": 1, "worker": 2}
    assert {w.id: w.alive for w in snap.workers} == {"h:1:a": True, "h:2:b": True, "h:3:c": False, "h:4:r": True}
    assert (snap.workers_serving("emails"), snap.workers_serving("billing")) == (2, 1)
    assert queuehealth("--min-workers", "2").code == 0
    assert queuehealth("--min-workers", "3:1").code == 1
    assert queuehealth("--queue", "emails", "--queue", "billing", "--min-workers", "2").code == 2
    run = queuehealth("--queue", "emails", "--queue", "billing", "--min-workers", "2", "--json")
    assert [(c["check"], c["scope"], c["value"], c["level"]) for c in run.json["checks"]] == [
        ("queue", "billing", None, "WARNING"),  # no job, nothing names it: see the unknown-queue test
        ("workers", "emails", 2.0, "OK"), ("workers", "billing", 1.0, "CRITICAL")]


@pytest.mark.django_db
def test_per_queue_age_checks_and_paused_queues(now):
    make_job(queue="emails", run_at=ago(now, 600))
    make_job(queue="billing", run_at=ago(now, 5))
    assert queuehealth("--queue", "billing", "--max-oldest-age", "60").code == 0
    assert queuehealth("--queue", "emails", "--max-oldest-age", "60").code == 2
    assert queuehealth("--max-oldest-age", "60").code == 2
    QueueState.objects.create(name="emails", paused=True)
    # A paused queue still ages (a forgotten pause is an outage too) unless told otherwise.
    assert queuehealth("--max-oldest-age", "60").code == 2
    assert queuehealth("--max-oldest-age", "60", "--ignore-paused").code == 0
    assert queuehealth("--queue", "emails", "--max-oldest-age", "60", "--ignore-paused").code == 0
    # Dead letters of a paused queue still count: --ignore-paused is about the age only.
    make_job(queue="emails", status="dead", finished_at=ago(now, 10))
    assert queuehealth("--max-dead", "0", "--ignore-paused").code == 2


@pytest.mark.django_db
def test_text_output_has_status_line_with_perfdata_and_a_table(now):
    make_job(queue="emails", run_at=ago(now, 30))
    run = queuehealth("--max-oldest-age", "10:20", "--min-workers", "1:0")
    assert run.code == 2
    first, *rest = run.output.splitlines()
    assert first.startswith("QUEUEHEALTH CRITICAL - oldest due job in any queue waits 3")
    assert "| 'oldest_ready_age[*]'=3" in first and "s;10;20 'workers[*]'=0;1:;0:" in first
    assert rest[1].split()[:4] == ["queue", "paused", "ready_due", "scheduled"]
    assert any(line.split()[:3] == ["emails", "no", "1"] for line in rest)
    assert any(line.startswith("WARNING   workers[*]: 0 alive worker(s)") for line in rest)


@pytest.mark.django_db
def test_no_thresholds_is_ok_and_json_carries_the_snapshot(now):
    make_job(run_at=ago(now, 30))
    run = queuehealth("--json")
    assert run.code == 0
    data = run.json
    assert (data["status"], data["exit_code"], data["checks"], data["lease_report"]) == ("OK", 0, [], None)
    assert data["snapshot"]["queues"][0]["queue"] == "default"
    assert data["snapshot"]["queues"][0]["ready_due"] == 1


@pytest.mark.django_db
def test_invalid_thresholds_raise_command_error_with_unknown_code():
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError) as info:
        call_command("queuehealth", "--max-dead", "3:1/300")
    assert info.value.returncode == 3
    assert "warning limit must not be above the critical one" in str(info.value)


def test_threshold_syntax():
    assert parse_threshold("300") == Threshold(None, 300.0, "max")
    assert parse_threshold("60:300") == Threshold(60.0, 300.0, "max")
    assert parse_threshold("60:") == Threshold(60.0, None, "max")
    assert parse_threshold(":300") == Threshold(None, 300.0, "max")
    assert parse_threshold("1m:2h", duration=True) == Threshold(60.0, 7200.0, "max")
    assert parse_threshold("2:1", direction="min") == Threshold(2.0, 1.0, "min")
    assert parse_rate("10/300") == (Threshold(None, 10.0), 300.0)
    assert parse_rate("3:10/5m") == (Threshold(3.0, 10.0), 300.0)
    assert parse_rate("10", default_window=120) == (Threshold(None, 10.0), 120.0)
    for bad, kwargs in [("", {}), (":", {}), ("5m", {}), ("-1", {}), ("300:60", {}), ("1:2", {"direction": "min"}),
                        ("1x", {"duration": True})]:
        with pytest.raises(ValueError):
            parse_threshold(bad, **kwargs)
    with pytest.raises(ValueError):
        parse_rate("10/0")


def test_threshold_levels_allow_the_limit_itself():
    t = Threshold(60.0, 300.0, "max")
    assert [t.level(v) for v in (0, 60, 60.1, 300, 300.1, None)] == [
        Level.OK, Level.OK, Level.WARNING, Level.WARNING, Level.CRITICAL, Level.CRITICAL]
    m = Threshold(2.0, 1.0, "min")
    assert [m.level(v) for v in (3, 2, 1, 0, None)] == [Level.OK, Level.OK, Level.WARNING, Level.CRITICAL,
                                                        Level.CRITICAL]
    assert m.describe() == "warn < 2, crit < 1"


@pytest.mark.process
def test_unreachable_database_is_unknown(spawn):
    proc = spawn("queuehealth", "--max-oldest-age", "5", env={"PGPORT": "1"})
    assert proc.wait(60) == 3
    assert proc.output().startswith("QUEUEHEALTH UNKNOWN - cannot read the queue: OperationalError")


@pytest.mark.django_db
def test_a_queue_that_has_no_job_and_that_nothing_names_is_a_warning_not_ok(now, settings):
    """``--queue emials`` (a typo) used to report OK on all-zero figures."""
    make_job(queue="emails", run_at=ago(now, 5))
    typo = queuehealth("--queue", "emials", "--max-oldest-age", "60")
    assert typo.code == 1
    assert typo.output.splitlines()[0] == (
        "QUEUEHEALTH WARNING - queue 'emials' is unknown: no job in it (waiting, running, dead or finished in "
        "the last 3600 s) and no task, schedule, worker, queue state or LEASEQUEUE['QUEUES'] names it; did you "
        "mean 'emails'? known queues: default, emails, flow, rated | 'oldest_ready_age[emials]'=0s;;60")
    assert queuehealth("--queue", "emials").code == 1  # even with no threshold given
    assert queuehealth("--queue", "emails", "--max-oldest-age", "60").code == 0  # has a job
    assert queuehealth("--queue", "default", "--max-oldest-age", "60").code == 0  # DEFAULT_QUEUE, no job
    # Declared without a job: by the queue-state table (a pause), a schedule, a worker, the setting.
    QueueState.objects.create(name="paused-once")
    store.process_register(process_id="h:1:w", kind="worker", host="h", pid=1, queues=["reports"], concurrency=1)
    settings.LEASEQUEUE = {"QUEUES": ["default", "emails", "bulk"]}
    for name in ("paused-once", "reports", "bulk"):
        assert queuehealth("--queue", name).code == 0, name
    assert queuehealth("--queue", "emials", "--json").json["checks"][0]["level"] == "WARNING"


def live_worker(name: str = "w1") -> None:
    store.process_register(process_id=f"h:1:{name}", kind="worker", host="h", pid=1, queues=None, concurrency=1)


@pytest.mark.django_db
def test_default_thresholds_no_live_worker_is_critical_and_an_old_ready_job_warns(now):
    """A bare ``queuehealth`` used to exit 0 with no worker at all."""
    run = queuehealth("--json", defaults=True)
    assert (run.code, run.json["status"]) == (2, "CRITICAL")
    assert [(c["check"], c["scope"], c["level"], c["warning"], c["critical"]) for c in run.json["checks"]] == [
        ("oldest_ready_age", "*", "OK", 300.0, None), ("workers", "*", "CRITICAL", None, 1.0)]
    live_worker()
    make_job(run_at=ago(now, 299))
    assert queuehealth(defaults=True).code == 0  # 299 s (plus the test's own seconds) is within 300 s
    make_job(run_at=ago(now, 301))
    run = queuehealth(defaults=True)
    assert run.code == 1
    assert run.output.startswith("QUEUEHEALTH WARNING - oldest due job in any queue waits 30")
    # --no-default-thresholds: only the thresholds given, none here.
    WorkerProcess.objects.all().delete()
    assert queuehealth("--no-default-thresholds", defaults=True).code == 0


@pytest.mark.django_db
def test_an_explicit_flag_replaces_its_default_and_keeps_the_other(now):
    make_job(run_at=ago(now, 400))
    # The age default gives way to --max-oldest-age 600; the worker default still applies.
    run = queuehealth("--max-oldest-age", "600", defaults=True)
    assert run.code == 2 and "0 alive worker(s)" in run.output.splitlines()[0]
    live_worker()
    assert queuehealth("--max-oldest-age", "600", defaults=True).code == 0
    assert queuehealth(defaults=True).code == 1  # the default 300 s warning
    # --min-workers 2: (warn below 2) replaces "critical below 1": one live worker warns.
    run = queuehealth("--min-workers", "2:", "--max-oldest-age", "600", defaults=True)
    assert run.code == 1 and "1 alive worker(s)" in run.output.splitlines()[0]


@pytest.mark.process
def test_after_a_burst_run_the_default_worker_check_says_why_it_is_critical_and_what_to_pass(spawn):
    """A burst worker exits once the queue is empty, so the default "no live worker is CRITICAL"
    fires right after it, as it should; the message says so and names ``--min-workers 0``, which
    keeps the age check."""
    from django_leasequeue.management.commands.queuehealth import NO_LIVE_WORKER_HINT

    done = flaky_sync.enqueue("burst", failures=0)
    worker = spawn("runworker", "--burst", env={"LEASEQUEUE_POLL_INTERVAL": "0.2"})
    assert worker.wait(60) == 0, worker.output()
    assert Job.objects.get(pk=done.id).status == "done"
    assert "--min-workers 0" in NO_LIVE_WORKER_HINT
    run = queuehealth(defaults=True)
    assert run.code == 2
    assert run.output.splitlines()[0].startswith(
        f"QUEUEHEALTH CRITICAL - 0 alive worker(s) serve any queue; {NO_LIVE_WORKER_HINT} (crit < 1) | ")
    assert f"CRITICAL  workers[*]: 0 alive worker(s) serve any queue; {NO_LIVE_WORKER_HINT} [crit < 1]" in run.output
    # The flag the message names: no worker check, the default age check stays.
    burst_only = queuehealth("--min-workers", "0", "--json", defaults=True)
    assert burst_only.code == 0, burst_only.output
    assert [(c["check"], c["level"]) for c in burst_only.json["checks"]] == [("oldest_ready_age", "OK"),
                                                                               ("workers", "OK")]
    make_job(run_at=ago(store.db_now(), 400))
    assert queuehealth("--min-workers", "0", defaults=True).code == 1  # a job waiting 400 s still warns
    # An explicit --min-workers is the operator's choice: its message adds no advice.
    explicit = queuehealth("--min-workers", "1", defaults=True)
    assert explicit.code == 2 and NO_LIVE_WORKER_HINT not in explicit.output
