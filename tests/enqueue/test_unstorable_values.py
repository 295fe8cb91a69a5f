"""Enqueue input the job table cannot store (or would store as something else) is refused by
validation with a :class:`LeaseQueueError` *before any SQL runs*, so the caller's transaction is
never aborted by a database error, and no poisoned row can stop a queue.

Refused: NUL and lone surrogates, an over-long queue name, a huge ``max_attempts`` or ``run_at``
delay (each would raise a raw ``DataError`` that aborts the caller's transaction); a 5,000-deep
list (``RecursionError``); ``using(lease=nan/inf/1e300)`` (a row on which every claim statement
fails, "interval out of range", stopping the whole queue); a negative lease (a job that expires
the instant it is claimed). Floats from 1e16 come back as floats.
"""

import functools
import math
import sys
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from qa.models import Effect
from qa.tasks import record

from django_leasequeue import (
    ConfigurationError,
    EnqueueError,
    LeaseQueueError,
    PayloadNotSerializable,
    Snooze,
    enqueue,
    payload,
    registry,
    store,
    task,
)
from django_leasequeue.conf import build
from django_leasequeue.models import Job
from django_leasequeue.worker import WorkerService
from tests.support import claim

pytestmark = pytest.mark.django_db


@task(name="adversarial.keyed", concurrency_key="{0}", concurrency_limit=1)
def keyed(customer: str) -> None:
    """A task whose concurrency key comes from its argument."""


DEEP = functools.reduce(lambda inner, _: [inner], range(5000), [])

# (name, enqueue call, expected exception class, words the message must contain)
HOSTILE = [
    ("nul_in_str_argument", lambda: enqueue(record, ["a\x00b"]), PayloadNotSerializable,
     "argument 'tag' contains a NUL"),
    ("nul_in_nested_dict_key", lambda: enqueue(record, [{"ok": {"k\x00": 1}}]), PayloadNotSerializable,
     "contains a NUL"),
    ("nul_in_kwarg_name", lambda: enqueue(record, [], {"t\x00g": "x"}), PayloadNotSerializable,
     "keyword argument name 't\\x00g' contains a NUL"),
    ("int_kwarg_name", lambda: enqueue(record, [], {1: "x"}), PayloadNotSerializable,
     "keyword argument name 1 is not a str"),
    ("lone_surrogate_argument", lambda: enqueue(record, ["\ud800"]), PayloadNotSerializable, "lone surrogate"),
    ("lone_surrogate_dict_key", lambda: enqueue(record, [{"\udfff": 1}]), PayloadNotSerializable, "lone surrogate"),
    ("list_5000_deep", lambda: enqueue(record, [DEEP]), PayloadNotSerializable, "nested more than 500 levels"),
    ("float_1e16", lambda: enqueue(record, [], {"sleep": 1e16}), PayloadNotSerializable, "come back"),
    ("float_1e20", lambda: enqueue(record, [1e20]), PayloadNotSerializable, "come back"),
    ("float_max", lambda: enqueue(record, [[1.7976931348623157e308]]), PayloadNotSerializable, "argument 'tag'[0]"),
    ("int_of_5000_digits", lambda: enqueue(record, [{"n": 10**5000}]), PayloadNotSerializable,
     "argument 'tag'['n'] is an int of more than"),
    ("queue_101_chars", lambda: enqueue(record, ["x"], queue="q" * 101), EnqueueError, "the limit is 100"),
    ("queue_with_nul", lambda: enqueue(record, ["x"], queue="q\x00"), EnqueueError, "NUL"),
    ("unique_key_with_nul", lambda: enqueue(record, ["x"], unique_key="k\x00"), EnqueueError, "NUL"),
    ("unique_key_surrogate", lambda: enqueue(record, ["x"], unique_key="k\ud800"), EnqueueError, "not valid UTF-8"),
    ("unique_key_256_chars", lambda: enqueue(record, ["x"], unique_key="k" * 256), EnqueueError, "the limit is 255"),
    ("concurrency_key_300_chars", lambda: enqueue(keyed, ["c" * 300]), EnqueueError,
     "concurrency_key is 300 characters long"),
    ("concurrency_key_with_nul", lambda: enqueue(keyed, ["c\x00"]), EnqueueError, "NUL"),
    ("max_attempts_2_pow_31", lambda: enqueue(record, ["x"], max_attempts=2**31), EnqueueError,
     "from 1 to 1000000"),
    ("run_at_timedelta_max", lambda: enqueue(record, ["x"], run_at=timedelta.max), EnqueueError,
     "more than 100 years"),
    ("run_at_timedelta_min", lambda: enqueue(record, ["x"], run_at=timedelta.min), EnqueueError,
     "more than 100 years"),
    ("lease_nan", lambda: record.using(lease=math.nan).enqueue("x"), EnqueueError, "got nan"),
    ("lease_inf", lambda: record.using(lease=math.inf).enqueue("x"), EnqueueError, "got inf"),
    ("lease_1e300", lambda: record.using(lease=1e300).enqueue("x"), EnqueueError, "got 1e+300"),
    ("lease_negative", lambda: record.using(lease=-60).enqueue("x"), EnqueueError, "got -60"),
    ("lease_zero", lambda: record.using(lease=0).enqueue("x"), EnqueueError, "got 0"),
    ("lease_over_7_days", lambda: record.using(lease=7 * 86400 + 1).enqueue("x"), EnqueueError, "(0, 604800]"),
    ("lease_bool", lambda: record.using(lease=True).enqueue("x"), EnqueueError, "got True"),
]


@pytest.mark.parametrize(("name", "call", "error", "words"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_enqueue_is_refused_before_any_sql_and_the_callers_transaction_survives(name, call, error, words):
    with transaction.atomic():
        Effect.objects.create(key="caller-before", job_id=0, lease_version=0)
        with CaptureQueriesContext(connection) as queries, pytest.raises(error) as raised:
            call()
        Effect.objects.create(key="caller-after", job_id=0, lease_version=0)  # the transaction is usable
    assert isinstance(raised.value, LeaseQueueError)
    assert words in str(raised.value)
    assert [q["sql"] for q in queries.captured_queries] == []
    assert Job.objects.count() == 0
    assert sorted(Effect.objects.values_list("key", flat=True)) == ["caller-after", "caller-before"]


@pytest.mark.parametrize("value", [1e15, 123456789.0, -0.0, 5e-324, 1.5e-7, 0.1, -2.5e15])
def test_floats_that_are_accepted_come_back_as_the_same_float(value):
    enqueue(record, [], {"tag": "t", "sleep": value})
    (claimed,) = claim()
    got = claimed.kwargs["sleep"]
    assert type(got) is float and got == value  # (jsonb keeps no sign on zero: -0.0 comes back as 0.0)


def test_limits_themselves_are_accepted():
    """The bounds are inclusive: a 100-character queue, a 255-character unique key, 1,000,000
    attempts, a lease of exactly 7 days and a run_at 99 years away are stored as given."""
    job = record.using(lease=7 * 86400).enqueue("x")
    assert Job.objects.get(pk=job.pk).lease_seconds == 7 * 86400
    job = enqueue(record, ["x"], queue="q" * 100, unique_key="k" * 255, max_attempts=1_000_000,
                  run_at=timedelta(days=99 * 365))
    row = Job.objects.get(pk=job.pk)
    assert (row.queue, row.unique_key, row.max_attempts) == ("q" * 100, "k" * 255, 1_000_000)
    assert timedelta(days=99 * 365 - 1) < row.run_at - store.db_now() <= timedelta(days=99 * 365)
    assert enqueue(keyed, ["c" * 255]).concurrency_key == "c" * 255


@pytest.mark.parametrize("seconds", [math.nan, math.inf, -math.inf, -1, 100 * 366 * 86400 + 1, True, "5"])
def test_snooze_refuses_seconds_that_are_not_a_finite_delay(seconds):
    with pytest.raises(ValueError, match="Snooze seconds must be a finite number from 0 to 100 years"):
        Snooze(seconds)


@pytest.mark.parametrize("lease", [math.nan, math.inf, -1.0, 0])
def test_task_declaration_refuses_a_lease_that_is_not_a_finite_positive_number(lease):
    with pytest.raises(ConfigurationError, match="lease must be > 0 seconds"):
        task(name="adversarial.bad_lease", lease=lease)(lambda: None)
    assert "adversarial.bad_lease" not in registry.registered_tasks()


def test_handler_result_int_too_long_for_text_is_a_clear_error():
    """An int Python cannot turn into text (more than ``sys.get_int_max_str_digits()`` digits)
    is a PayloadNotSerializable, not a raw ValueError escaping the executor."""
    with pytest.raises(PayloadNotSerializable, match=r"return value\['n'\] is an int of more than"):
        payload.json_dumps_result({"n": 10**5000})


def test_task_declaration_refuses_options_every_enqueue_would_refuse():
    with pytest.raises(ConfigurationError, match=r"lease must be at most 604800 seconds \(7 days\), got 604801"):
        task(name="adversarial.long_lease", lease=7 * 86400 + 1)(lambda: None)
    with pytest.raises(ConfigurationError, match="max_attempts must be an int from 1 to 1000000, got 2147483648"):
        task(name="adversarial.many_attempts", max_attempts=2**31)(lambda: None)
    spec = task(name="adversarial.at_the_limits", lease=7 * 86400, max_attempts=1_000_000)(lambda: None)
    assert (spec.lease, spec.max_attempts) == (7 * 86400, 1_000_000)


def test_int_of_4300_digits_is_accepted_and_one_more_digit_is_refused_whatever_this_process_allows():
    """The bound is Python's default ``int_max_str_digits`` (4300), not this process's: a process
    that raised its own limit would otherwise write JSON the worker (default limit) cannot read."""
    largest = 10**4300 - 1
    job = enqueue(record, [[largest]])
    assert Job.objects.get(pk=job.pk).args == [[largest]]
    previous = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)  # unlimited in this process: json.dumps would succeed
    try:
        for value in (10**4300, -(10**4300), 10**5000):
            with pytest.raises(PayloadNotSerializable,
                               match=r"argument 'tag'\[0\] is an int of more than 4300 digits.*pass it as a str"):
                enqueue(record, [[value]])
    finally:
        sys.set_int_max_str_digits(previous)
    assert Job.objects.count() == 1


@pytest.mark.parametrize("lease", [7 * 86400 + 1, timedelta(days=8), 1e300, math.inf, math.nan, 0, -1])
def test_lease_setting_outside_0_to_7_days_is_refused(lease):
    with pytest.raises(ConfigurationError, match=r"LEASEQUEUE\['LEASE'\] must be a number of seconds in "
                                                 r"\(0, 604800\] \(7 days at most\), got"):
        build({"LEASE": lease})


def test_lease_setting_of_7_days_and_max_attempts_of_a_million_are_accepted():
    settings = build({"LEASE": timedelta(days=7), "MAX_ATTEMPTS": 1_000_000})
    assert (settings.lease, settings.max_attempts) == (604800.0, 1_000_000)


@pytest.mark.parametrize("attempts", [0, 1_000_001, True, 2.0])
def test_max_attempts_setting_outside_1_to_a_million_is_refused(attempts):
    """Every enqueue would refuse a default of more than 1,000,000 attempts: say so at startup."""
    with pytest.raises(ConfigurationError, match=r"LEASEQUEUE\['MAX_ATTEMPTS'\] must be an int from 1 to 1000000"):
        build({"MAX_ATTEMPTS": attempts})


@pytest.mark.parametrize("lease", ["604801", "nan", "inf", "-inf", "0", "-1"])
def test_runworker_refuses_a_lease_outside_0_to_7_days(lease):
    with pytest.raises(CommandError, match=r"--lease must be a number of seconds in \(0, 604800\]"):
        call_command("runworker", f"--lease={lease}")


@pytest.mark.parametrize("lease", [0, -1.0, math.nan, math.inf, 604801])
def test_worker_service_refuses_a_lease_outside_0_to_7_days(lease):
    """``lease=0`` is refused, not replaced by the setting (``lease or setting``)."""
    with pytest.raises(ValueError, match=r"lease must be a number of seconds in \(0, 604800\]"):
        WorkerService(lease=lease)
    assert WorkerService(lease=604800).lease == 604800.0


def test_task_declaration_and_using_accept_a_timedelta_for_lease_and_timeout_as_seconds():
    """``@task(timeout=timedelta(seconds=5))`` was refused with "must be > 0 seconds, got
    datetime.timedelta(...)" while the settings and the Django tasks backend accept a timedelta."""
    spec = task(name="adversarial.timedelta_options", lease=timedelta(minutes=2),
                timeout=timedelta(seconds=5))(lambda: None)
    assert (spec.lease, spec.timeout) == (120.0, 5.0)
    job = spec.using(lease=timedelta(seconds=90)).enqueue()
    assert Job.objects.get(pk=job.pk).lease_seconds == 90.0
    assert spec.using(lease=timedelta(days=7)).lease == 604800.0


@pytest.mark.parametrize("option", ["lease", "timeout"])
def test_task_declaration_names_the_accepted_types_for_a_wrongly_typed_duration(option):
    with pytest.raises(ConfigurationError) as error:
        task(name="adversarial.str_duration", **{option: "5"})(lambda: None)
    assert str(error.value) == (f"task 'adversarial.str_duration': {option} must be a number of seconds "
                                "(int or float) or a timedelta, got '5'")
    assert "adversarial.str_duration" not in registry.registered_tasks()


def test_task_declaration_checks_the_range_of_a_timedelta_in_seconds():
    with pytest.raises(ConfigurationError) as error:
        task(name="adversarial.negative_timeout", timeout=timedelta(seconds=-5))(lambda: None)
    assert str(error.value) == "task 'adversarial.negative_timeout': timeout must be > 0 seconds, got -5.0"
    with pytest.raises(ConfigurationError) as error:
        task(name="adversarial.long_lease_td", lease=timedelta(days=8))(lambda: None)
    assert str(error.value) == ("task 'adversarial.long_lease_td': lease must be at most 604800 seconds "
                                "(7 days), got 691200.0")


def test_using_names_the_accepted_types_for_a_wrongly_typed_lease_and_checks_a_timedelta_range():
    with pytest.raises(EnqueueError) as error:
        record.using(lease="5")
    assert str(error.value) == (f"task {record.name!r}: lease must be a number of seconds (int or float) "
                                "or a timedelta, got '5'")
    with pytest.raises(EnqueueError, match=r"lease must be a number of seconds in \(0, 604800\] \(7 days at "
                                           r"most\), got 604801.0"):
        record.using(lease=timedelta(seconds=604801))
