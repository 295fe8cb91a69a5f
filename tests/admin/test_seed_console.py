"""``manage.py seed_console`` (the test project's demo state for the console's screenshots and
width tests) builds exactly the state it promises, through the store's real moves: the chart
counters hold its history; it seeds once, rebuilds with ``--reset``, and refuses a database whose
name does not look like a demo or test database."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.models import Count
from invoices.management.commands.seed_console import WEB1, WEB2, seed

from django_leasequeue import store
from django_leasequeue.models import Job, QueueState, Schedule, WorkerProcess, Workflow

pytestmark = pytest.mark.django_db


def test_the_seed_builds_the_console_state_with_its_chart_counters():
    now = store.db_now()
    seeded = seed(now=now)
    assert seeded.done == 3000 and seeded.dead == 50
    dead = Job.objects.filter(status="dead")
    kinds = {}
    for errors in dead.values_list("errors", flat=True):
        kinds[errors[-1]["type"]] = kinds.get(errors[-1]["type"], 0) + 1
    assert kinds == {"builtins.KeyError": 23, "builtins.ConnectionError": 16, "builtins.ValueError": 11}
    assert set(dead.values_list("queue", flat=True)) == {"invoices", "orders", "partners", "reports"}
    assert dead.filter(finished_at__gte=now - timedelta(hours=1)).count() >= 20  # "what broke in the last hour"
    due = dict(Job.objects.filter(status="ready", run_at__lte=now).values_list("queue").annotate(n=Count("id")))
    assert due["invoices"] >= 240 and due["orders"] == 80 and due["reports"] == 45
    assert list(QueueState.objects.filter(paused=True).values_list("name", flat=True)) == ["reports"]
    # Running on web-1 (leases held), one job of web-2 with an expired lease, snoozed and retrying.
    assert Job.objects.filter(status="leased", leased_by=WEB1, leased_until__gt=now).count() == 4
    assert list(Job.objects.filter(status="leased", leased_by=WEB2).values_list("leased_until", flat=True))[0] < now
    assert Job.objects.filter(status="ready", snoozes=1, run_at__gt=now).count() == 3
    assert Job.objects.filter(status="ready", attempts=1, run_at__gt=now).exclude(errors=[]).count() == 5
    assert Schedule.objects.count() == 6 and len(set(Schedule.objects.values_list("timezone", flat=True))) == 5
    assert Job.objects.filter(schedule_id=seeded.schedule).count() == 12
    assert sorted(Workflow.objects.values_list("kind", flat=True)) == ["chain", "group"]
    assert sorted(WorkerProcess.objects.values_list("kind", flat=True)) == ["scheduler", "worker", "worker"]
    # The trigger counted every move at its injected time (the daily and weekly schedules' runs go
    # back 8 days); the history is six hours of five-minute slots.
    totals = store.stat_totals(since=now - timedelta(days=9))
    assert sum(t.done for t in totals) == Job.objects.filter(status="done").count()
    assert sum(t.dead for t in totals) == 50
    minutes = [p for p in store.stat_series(span=60, since=now - timedelta(hours=7)) if p.done]
    assert len(minutes) >= 72


def test_the_command_seeds_once_rebuilds_with_reset_and_refuses_other_databases(monkeypatch):
    out = StringIO()
    call_command("seed_console", stdout=out)
    assert "Seeded 3000 done jobs, 50 dead letters" in out.getvalue()
    jobs = Job.objects.count()
    call_command("seed_console", stdout=out)
    assert "Already seeded" in out.getvalue() and Job.objects.count() == jobs
    call_command("seed_console", "--reset", stdout=out)
    assert Job.objects.count() == jobs and Schedule.objects.count() == 6
    monkeypatch.setitem(connection.settings_dict, "NAME", "leasequeue_production")
    with pytest.raises(CommandError, match="does not look like a demo or test database"):
        call_command("seed_console", "--reset")
    monkeypatch.undo()
    assert Job.objects.count() == jobs


def test_reset_leaves_no_row_behind_dependency_edges_included():
    # The width tests commit the seed and reset() at the end: a dependency edge left behind would
    # leak into every later test of the run.
    from invoices.management.commands.seed_console import reset

    from django_leasequeue.models import Dependency, JobStat

    seed()
    assert Dependency.objects.exists()
    reset()
    assert (Dependency.objects.count(), Job.objects.count(), Workflow.objects.count(), JobStat.objects.count()) == (
        0, 0, 0, 0)
