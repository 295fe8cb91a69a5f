"""System checks: vendor, unapplied migrations (and an unreachable database), settings, schedules."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.core import checks as django_checks
from django.db import connection, connections
from django.db.migrations.recorder import MigrationRecorder
from django.test import override_settings
from invoices.tasks import flaky_sync

from django_leasequeue import checks
from django_leasequeue.models import Schedule

pytestmark = pytest.mark.django_db


def ids(messages):
    return [m.id for m in messages]


def test_database_checks_need_the_database_to_be_asked_for():
    assert checks.check_migrations(databases=None) == []
    assert checks.check_schedules(databases=None) == []
    assert checks.check_database(databases=["default"]) == []


def test_unapplied_migration_is_a_warning():
    assert checks.check_migrations(databases=["default"]) == []
    MigrationRecorder(connection).migration_qs.filter(app="django_leasequeue", name="0001_initial").delete()
    (warning,) = checks.check_migrations(databases=["default"])
    assert warning.id == "leasequeue.W101" and warning.level == django_checks.WARNING
    assert "0001_initial" in warning.msg


def test_unreachable_database_reports_nothing_instead_of_crashing():
    wrapper = type(connections["default"])
    unreachable = wrapper({**connection.settings_dict, "PORT": "1"}, alias="unreachable")
    try:
        assert checks.pending_migrations(unreachable) is None
    finally:
        unreachable.close()


@pytest.mark.parametrize("raw, fragment", [
    ({"LEASE": -1}, "LEASE"),
    ({"LEASE": 10, "HEARTBEAT_INTERVAL": 10}, "HEARTBEAT_INTERVAL"),
    ({"METRICS_TOKEN": 12345}, "METRICS_TOKEN"),
    ({"METRICS_TOKEN": "has space in it, long enough"}, "METRICS_TOKEN"),
    ({"PROCESS_ALIVE_WITHIN": 5}, "PROCESS_ALIVE_WITHIN"),
    ({"PROCESS_ALIVE_WITHIN": 60, "PROCESS_PRUNE_AFTER": 30}, "PROCESS_PRUNE_AFTER"),
    ({"METRICS_TOKN": "x"}, "did you mean 'METRICS_TOKEN'"),
    ({"LEASE_SECONDS": 30}, "'LEASE_SECONDS' (did you mean 'LEASE'?)"),  # the example in reference/settings.md
])
def test_invalid_settings_are_errors(raw, fragment):
    with override_settings(LEASEQUEUE=raw):
        (error,) = checks.check_settings()
    assert error.id == "leasequeue.E001" and fragment in error.msg
    # Reset the cache for the next test (the check clears it before reading).
    checks.check_settings()


def test_short_metrics_token_is_a_warning():
    with override_settings(LEASEQUEUE={**settings.LEASEQUEUE, "METRICS_TOKEN": ["short", "x" * 16]}):
        assert ids(checks.check_metrics_token()) == ["leasequeue.W103"]
    assert checks.check_metrics_token() == []


def test_enabled_schedules_must_reference_registered_tasks():
    # save() refuses unregistered tasks, so these rows stand for tasks deleted from the code since
    # the schedules were saved: bulk_create writes them without validation.
    Schedule.objects.bulk_create([
        Schedule(name="nightly", task="no.such.task", cron="0 3 * * *"),
        Schedule(name="off", task="also.missing", cron="0 3 * * *", enabled=False),
        Schedule(name="fine", task=flaky_sync.name, cron="0 3 * * *"),
    ])
    (warning,) = checks.check_schedules(databases=["default"])
    assert (warning.id, warning.obj) == ("leasequeue.W102", "nightly")
    assert "'no.such.task', which is not registered" in warning.msg


def test_checks_are_registered_with_django():
    registered = {c.__name__ for c in django_checks.registry.registry.get_checks()}
    assert {"check_settings", "check_database", "check_migrations", "check_schedules",
            "check_metrics_token"} <= registered
    database_tagged = {c.__name__ for c in django_checks.registry.registry.get_checks()
                       if "database" in getattr(c, "tags", ())}
    assert {"check_migrations", "check_schedules"} <= database_tagged


@pytest.mark.django_db
def test_schedule_of_a_misspelt_task_suggests_the_registered_one():
    Schedule.objects.bulk_create([Schedule(name="typo", task="invoices.tasks.flaky_snyc", cron="* * * * *")])
    (warning,) = [m for m in checks.check_schedules(databases=["default"]) if m.id == "leasequeue.W102"]
    assert "(did you mean 'invoices.tasks.flaky_sync'" in warning.msg


def test_a_database_other_than_postgresql_is_reported_by_plain_check_and_by_the_commands(monkeypatch):
    # A newcomer on SQLite: `manage.py check` says so (no --database needed), and runworker says
    # PostgreSQL is needed rather than "run migrate" (which would fail with the same E002).
    from django.core.management.base import CommandError

    from django_leasequeue.checks import require_migrated

    monkeypatch.setattr(connection, "vendor", "sqlite")
    (error,) = checks.check_database()
    assert error.id == "leasequeue.E002" and "'sqlite'" in error.msg
    with pytest.raises(CommandError, match="needs PostgreSQL; database 'default' is 'sqlite'"):
        require_migrated()
