"""Invalid schedules are refused with the offending value in the message: model validation (hence
the admin form), save(), the LEASEQUEUE_SCHEDULES sync, the commands and the system check."""

from __future__ import annotations

from datetime import date

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError

from django_leasequeue.checks import check_schedule_settings
from django_leasequeue.exceptions import ConfigurationError
from django_leasequeue.models import Schedule
from django_leasequeue.scheduler import SchedulerService, load_settings_schedules, sync_schedules

from .conftest import NOOP

pytestmark = pytest.mark.django_db


def errors_of(**fields) -> dict[str, list[str]]:
    fields = {"name": "s", "task": NOOP, "cron": "* * * * *", **fields}
    with pytest.raises(ValidationError) as info:
        Schedule(**fields).full_clean()
    return info.value.message_dict


@pytest.mark.parametrize(("field", "value", "fragment"), [
    ("cron", "61 * * * *", "'61 * * * *'"),
    ("cron", "* * * *", "has 4 field(s)"),
    ("cron", "0 0 30 2 *", "never matches"),
    ("cron", "H * * * *", "hashed (H)"),
    ("cron", "* * * * * * 2027", "has 7 field(s)"),
    ("timezone", "Mars/Olympus_Mons", "unknown time zone 'Mars/Olympus_Mons'"),
    ("timezone", "europe/berlin", "'europe/berlin'"),
    ("task", "invoices.tasks.nope", "task 'invoices.tasks.nope' is not registered"),
    ("args", {"a": 1}, "args must be a JSON list"),
    ("args", [1.5, float("nan")], "args[1] is nan"),
    ("kwargs", [1], "kwargs must be a JSON object"),
    ("kwargs", {"when": date(2026, 1, 1)}, "datetime.date"),
    ("priority", 101, "got 101"),
    ("catch_up_limit", 0, "got 0"),
    ("catch_up", "some", "'some' is not a valid choice"),
])
def test_model_validation_names_the_offending_value(field, value, fragment):
    errors = errors_of(**{field: value})
    assert list(errors) == [field]
    assert fragment in " ".join(errors[field])


def test_save_refuses_an_invalid_schedule():
    with pytest.raises(ValidationError, match="Mars/Olympus_Mons"):
        Schedule.objects.create(name="s", task=NOOP, cron="* * * * *", timezone="Mars/Olympus_Mons")
    with pytest.raises(ValidationError, match="'99 \\* \\* \\* \\*'"):
        Schedule.objects.create(name="s", task=NOOP, cron="99 * * * *")
    assert not Schedule.objects.exists()


def test_project_time_zone_is_used_for_blank_timezone(settings):
    assert Schedule(name="s", task=NOOP, cron="* * * * *").zone_name == "UTC"
    settings.TIME_ZONE = "Europe/London"
    schedule = Schedule(name="s", task=NOOP, cron="* * * * *")
    schedule.full_clean()
    assert schedule.zone_name == "Europe/London"


def test_a_disabled_schedule_may_name_a_task_that_is_gone():
    """Disabling must stay possible after the task was removed from the code."""
    Schedule(name="s", task="gone.tasks.removed", cron="* * * * *", enabled=False).full_clean()


def test_modelform_excluding_a_field_gets_no_error_for_it():
    """The checks are per field (clean_fields), so a form without a field is not blamed for it."""
    from django import forms

    class CronOnly(forms.ModelForm):
        class Meta:
            model = Schedule
            fields = ["name", "cron"]

    instance = Schedule(task="invoices.tasks.nope", timezone="Nowhere/Else")
    form = CronOnly(data={"name": "s", "cron": "61 * * * *"}, instance=instance)
    assert not form.is_valid()
    assert list(form.errors) == ["cron"] and "'61 * * * *'" in form.errors["cron"][0]


# --------------------------------------------------------------------------------------------------
# LEASEQUEUE_SCHEDULES


@pytest.mark.parametrize(("entry", "fragment"), [
    ({"task": NOOP, "cron": "61 * * * *"}, "LEASEQUEUE_SCHEDULES['bad']: cron: cron expression '61 * * * *'"),
    ({"task": NOOP, "cron": "* * * * *", "timezone": "Berlin"},
     "LEASEQUEUE_SCHEDULES['bad']: timezone: unknown time zone 'Berlin'"),
    ({"task": "invoices.tasks.nope", "cron": "* * * * *"},
     "LEASEQUEUE_SCHEDULES['bad']: task: task 'invoices.tasks.nope' is not registered"),
    ({"task": NOOP, "cron": "* * * * *", "timezon": "UTC"}, "unknown option(s) 'timezon' (did you mean 'timezone'?)"),
    ({"task": NOOP}, "LEASEQUEUE_SCHEDULES['bad']: missing required option(s) 'cron'"),
    ({"task": NOOP, "cron": "* * * * *", "enabled": "yes"}, "enabled must be a bool, got 'yes'"),
    ({"task": NOOP, "cron": "* * * * *", "catch_up": "everything"}, "'everything' is not a valid choice"),
    ({"task": NOOP, "cron": "* * * * *", "args": [{1, 2}]}, "args[0] is a builtins.set"),
    ("0 * * * *", "LEASEQUEUE_SCHEDULES['bad'] must be a dict of options, got '0 * * * *'"),
])
def test_settings_sync_refuses_invalid_entries_naming_schedule_and_value(entry, fragment):
    raw = {"good": {"task": NOOP, "cron": "0 * * * *"}, "bad": entry}
    with pytest.raises(ConfigurationError) as info:
        sync_schedules(raw)
    assert fragment in str(info.value)
    assert not Schedule.objects.exists()  # nothing written, not even the valid entry


def test_settings_errors_are_all_listed():
    raw = {"a": {"task": NOOP, "cron": "61 * * * *"}, "b": {"task": NOOP, "cron": "* * * * *", "timezone": "X/Y"}}
    with pytest.raises(ConfigurationError) as info:
        load_settings_schedules(raw)
    assert "['a']" in str(info.value) and "['b']" in str(info.value) and "'X/Y'" in str(info.value)


def test_invalid_setting_stops_the_scheduler_before_it_starts(settings):
    settings.LEASEQUEUE_SCHEDULES = {"nightly": {"task": NOOP, "cron": "0 25 * * *"}}
    with pytest.raises(ConfigurationError, match="nightly.*'0 25 \\* \\* \\*'"):
        SchedulerService()
    with pytest.raises(CommandError, match="nightly.*'0 25 \\* \\* \\*'"):
        call_command("runscheduler", "--once")
    with pytest.raises(CommandError, match="nightly.*'0 25 \\* \\* \\*'"):
        call_command("runworker", "--with-scheduler", "--burst")
    with pytest.raises(CommandError, match="nightly"):
        call_command("syncschedules", "--check")
    (error,) = check_schedule_settings()
    assert error.id == "leasequeue.E003" and "'0 25 * * *'" in error.msg
    assert not Schedule.objects.exists()


def test_valid_setting_passes_the_check(settings):
    settings.LEASEQUEUE_SCHEDULES = {"nightly": {"task": NOOP, "cron": "0 2 * * *", "timezone": "Europe/Berlin"}}
    assert check_schedule_settings() == []


def test_demo_project_schedules_are_valid():
    import testproject.settings as demo
    from django.conf import settings as django_settings
    from django.test.utils import override_settings

    with override_settings(LEASEQUEUE_SCHEDULES=demo.LEASEQUEUE_SCHEDULES):
        names = [d.name for d in load_settings_schedules()]
    assert names == ["nightly-invoice-run", "heartbeat"]
    assert django_settings.LEASEQUEUE_SCHEDULES == {}  # restored


def test_unknown_task_suggests_the_registered_names_close_to_it():
    """A typo in a schedule's task (admin form or settings) names the registered task it resembles."""
    errors = errors_of(task="invoices.tasks.send_invoise")
    assert "; did you mean 'invoices.tasks.send_invoice'" in " ".join(errors["task"])
    with pytest.raises(ConfigurationError, match=r"task 'invoices\.tasks\.flaky_snyc' is not registered .*did you "
                                                 r"mean 'invoices\.tasks\.flaky_sync'"):
        load_settings_schedules({"bad": {"task": "invoices.tasks.flaky_snyc", "cron": "* * * * *"}})
    errors = errors_of(task="zzz.qqq")  # nothing close: no suggestion
    assert "did you mean" not in " ".join(errors["task"])
