"""Every value is checked before it is written, and one bad row harms only itself.

* ``run_at`` past year 9999 in UTC: ``enqueue()`` with such an aware ``run_at`` raises
  ``EnqueueError`` before any SQL and writes 0 rows, on every enqueue path (a ``DataError`` while
  decoding ``RETURNING`` would come *after* the INSERT, with the row committed in autocommit).
* Task options: ``@task(backoff="2s")`` and ``backoff=-5`` are refused at declaration; the
  handler's own error is recorded whatever the retry policy does (a backoff that raises, an error
  whose ``__str__`` raises SystemExit); ``Backoff(factor=1e5).delay()`` is capped without overflow.
* Queue names: one grammar (``conf.queue_name_problem``) everywhere, so ``" default"``, ``"a,b"``
  and ``"*"``, which ``runworker --queues`` cannot name, are refused at enqueue.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from qa.tasks import record

from django_leasequeue import (
    ConfigurationError,
    EnqueueError,
    arguments,
    enqueue,
    enqueue_many,
    enqueue_on_commit,
    registry,
    task,
)
from django_leasequeue.conf import build, get_settings, parse_queue_list, queue_name_problem
from django_leasequeue.enqueueing import build_job
from django_leasequeue.failures import describe_error
from django_leasequeue.models import Job
from django_leasequeue.retry import MAX_BACKOFF_SECONDS, Backoff
from tests.support import claim, run_claimed

# The case of the issue: 9999-12-31 23:00 at UTC-12 is 10000-01-01 11:00 UTC.
PAST_9999 = datetime(9999, 12, 31, 23, tzinfo=ZoneInfo("Etc/GMT+12"))
BEFORE_YEAR_1 = datetime(1, 1, 1, 1, tzinfo=ZoneInfo("Etc/GMT-14"))


@task(name="adversarial.values.keyed", concurrency_key="{0}", concurrency_limit=2)
def keyed(customer: str) -> None:
    """A task with a per-key limit (enqueue_many takes its general path for it)."""


# ---- finding 3: run_at past year 9999 --------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_run_at_past_year_9999_in_utc_raises_before_the_insert_in_autocommit():
    assert connection.get_autocommit()
    with CaptureQueriesContext(connection) as queries, pytest.raises(EnqueueError, match="outside the range"):
        enqueue(record, ["x"], run_at=PAST_9999)
    assert queries.captured_queries == []
    assert Job.objects.count() == 0


ENQUEUE_PATHS = [
    ("enqueue", lambda at: enqueue(record, ["x"], run_at=at)),
    ("task_enqueue_using", lambda at: record.using(run_at=at).enqueue("x")),
    ("enqueue_many_fast_path", lambda at: enqueue_many(record, [["x"], ["y"]], run_at=at)),
    ("enqueue_many_general_path", lambda at: enqueue_many(keyed, [["a"], ["b"]], run_at=at)),
    ("enqueue_on_commit", lambda at: enqueue_on_commit(record, ["x"], run_at=at)),
]


@pytest.mark.django_db
@pytest.mark.parametrize("at", [PAST_9999, BEFORE_YEAR_1], ids=["past_9999", "before_year_1"])
@pytest.mark.parametrize(("name", "call"), ENQUEUE_PATHS, ids=[p[0] for p in ENQUEUE_PATHS])
def test_every_enqueue_path_refuses_a_run_at_python_cannot_read_back(name, call, at):
    with CaptureQueriesContext(connection) as queries, pytest.raises(EnqueueError, match="outside the range"):
        call(at)
    assert queries.captured_queries == []
    assert Job.objects.count() == 0


@pytest.mark.django_db
def test_run_at_at_the_edges_of_the_range_is_stored_and_read_back():
    early = datetime(1, 1, 2, tzinfo=UTC)
    late = datetime(9999, 12, 30, 23, 59, 59, tzinfo=UTC)
    for at in (early, late, late.astimezone(ZoneInfo("Etc/GMT+12"))):
        job = enqueue(record, ["x"], run_at=at)
        assert Job.objects.get(pk=job.pk).run_at == at
    with pytest.raises(EnqueueError, match="outside the range"):
        enqueue(record, ["x"], run_at=datetime(9999, 12, 31, tzinfo=UTC))
    assert Job.objects.count() == 3


@pytest.mark.django_db
def test_the_schedulers_emission_refuses_a_run_at_past_the_range():
    # Schedules emit through build_job(run_at=occurrence): the same check.
    task_spec = registry.get_task("qa.record")
    with pytest.raises(EnqueueError, match="outside the range"):
        build_job(task_spec, ["x"], run_at=PAST_9999, unique_key="schedule:1:x", check_signature=False)


# ---- finding 10: one grammar for queue names ---------------------------------------------------


BAD_QUEUES = [" default", "default ", "a,b", "*", " ", "q\x00", "tab\tq", "é", "a b"]


@pytest.mark.django_db
@pytest.mark.parametrize("queue", BAD_QUEUES)
def test_queue_names_runworker_cannot_name_are_refused_at_enqueue(queue):
    with CaptureQueriesContext(connection) as queries, pytest.raises(EnqueueError):
        enqueue(record, ["x"], queue=queue)
    with pytest.raises(EnqueueError):
        enqueue_many(record, [["x"]], queue=queue)
    with pytest.raises(EnqueueError):
        record.using(queue=queue)
    assert queries.captured_queries == []
    assert Job.objects.count() == 0


@pytest.mark.parametrize("queue", ["default", "emails", "unknown-queue", "a.b:c_d-1", "q" * 100])
def test_the_grammar_accepts_the_names_in_use(queue):
    assert queue_name_problem(queue) is None
    assert parse_queue_list(f" {queue} ,x") == [queue, "x"]


@pytest.mark.parametrize("queue", [" default", "a,b", "*", "q" * 101, "x y"])
def test_settings_refuse_a_queue_name_outside_the_grammar(queue):
    with pytest.raises(ConfigurationError, match="LEASEQUEUE\\['QUEUES'\\] key"):
        build({"QUEUES": [queue]})
    with pytest.raises(ConfigurationError, match="LEASEQUEUE\\['QUEUES'\\] key"):
        build({"QUEUES": {queue: {"rate_limit": "1/s"}}})
    with pytest.raises(ConfigurationError, match="DEFAULT_QUEUE"):
        build({"DEFAULT_QUEUE": queue})


def test_queues_option_parsing():
    assert parse_queue_list(None) is None and parse_queue_list("*") is None and parse_queue_list(" ") is None
    assert parse_queue_list("a, b,a") == ["a", "b"]
    for bad in ("a,,b", "a b", "a,b c", "a*"):
        with pytest.raises(ConfigurationError, match="--queues: queue"):
            parse_queue_list(bad)


@pytest.mark.parametrize("text", ["*,x", "a,*", " * , b", "*,*"])
def test_queues_option_says_that_star_must_stand_alone(text):
    """``--queues '*,x'`` said "queue '*' contains '*'"."""
    with pytest.raises(ConfigurationError) as error:
        parse_queue_list(text)
    assert str(error.value) == (f"--queues: '*' (every queue) must stand alone, not be listed with other queues; "
                                f"got {text!r}: pass '*' alone, or only queue names")


@pytest.mark.django_db
def test_runworker_says_that_star_must_stand_alone():
    with pytest.raises(CommandError, match=r"--queues: '\*' \(every queue\) must stand alone"):
        call_command("runworker", queues="*,x", burst=True)


@pytest.mark.django_db
def test_runworker_refuses_a_queue_name_outside_the_grammar():
    with pytest.raises(CommandError, match="--queues: queue 'a b' contains ' '"):
        call_command("runworker", queues="default,a b", burst=True)


@pytest.mark.django_db
def test_leasequeue_queue_pause_refuses_a_name_outside_the_grammar():
    with pytest.raises(CommandError, match="contains ','"):
        call_command("leasequeue_queue", "pause", "a,b")


# ---- finding 7: task options validated at declaration ------------------------------------------


def _handler() -> None:
    """A handler for declarations that must be refused."""


@pytest.mark.parametrize(("options", "words"), [
    ({"backoff": "2s"}, "backoff must be a Backoff, a number of seconds or a callable"),
    ({"backoff": -5}, "backoff must be a number of seconds from 0"),
    ({"backoff": math.nan}, "got nan"),
    ({"backoff": 1e300}, "got 1e+300"),
    ({"queue": "a,b"}, "contains ','"),
    ({"queue": " default"}, "contains ' '"),
    ({"concurrency_key": "{0}", "concurrency_limit": 0}, "concurrency_limit must be an int from 1"),
    ({"concurrency_key": "{0}", "concurrency_limit": 2**40}, "concurrency_limit must be an int from 1"),
    ({"concurrency_key": 5, "concurrency_limit": 1}, "concurrency_key must be a str.format template"),
    ({"manual_heartbeat": "yes"}, "manual_heartbeat must be True or False"),
    ({"name": "x" * 256}, "at most 255 characters"),
])
def test_bad_task_options_are_refused_at_declaration(options, words):
    name = options.pop("name", "adversarial.values.refused")
    with pytest.raises(ConfigurationError) as raised:
        task(name=name, **options)(_handler)
    assert words in str(raised.value)
    assert name not in registry.registered_tasks()


@pytest.mark.parametrize(("options", "words"), [
    ({"queue": "a,b"}, "contains ','"),
    ({"priority": 500}, "priority must be an int from -100 to 100"),
    ({"max_attempts": 0}, "max_attempts must be an int from 1"),
    ({"unique_scope": "forever"}, "unique_scope must be"),
    ({"run_at": PAST_9999}, "outside the range"),
    ({"run_at": datetime(2030, 1, 1)}, "is naive"),
])
def test_using_refuses_bad_options_when_called(options, words):
    with pytest.raises(EnqueueError) as raised:
        record.using(**options)
    assert words in str(raised.value)


@pytest.mark.parametrize("kwargs", [{"base": math.inf}, {"base": -1}, {"factor": math.nan}, {"max": 1e300},
                                    {"jitter": 2}, {"base": True}, {"base": "2"}])
def test_backoff_refuses_values_that_are_not_finite_delays(kwargs):
    with pytest.raises(ValueError, match="invalid backoff"):
        Backoff(**kwargs)


def test_backoff_with_a_huge_factor_is_capped_without_overflow():
    policy = Backoff(base=2, factor=1e5, max=600, jitter=0)
    assert [policy.delay(n) for n in (1, 2, 3, 30, 65, 66, 10**6)] == [2.0, 600.0, 600.0, 600.0, 600.0, 600.0, 600.0]
    assert Backoff(base=1, factor=1e300, max=MAX_BACKOFF_SECONDS, jitter=0).delay(40) == MAX_BACKOFF_SECONDS


class _StrRaisesSystemExit(Exception):
    def __str__(self) -> str:
        raise SystemExit("from __str__")


def test_describe_error_survives_a_str_that_raises_system_exit():
    entry = describe_error(_StrRaisesSystemExit(), attempt=1, worker="w")
    assert entry["type"] == f"{__name__}._StrRaisesSystemExit"
    assert entry["message"] == "<unprintable _StrRaisesSystemExit>"


def _fails_with_str_system_exit() -> None:
    raise _StrRaisesSystemExit()


def _fails() -> None:
    raise RuntimeError("the handler's own error")


def _raise_system_exit(attempt: int) -> float:
    raise SystemExit("from the backoff")


@pytest.mark.django_db
@pytest.mark.parametrize(("backoff", "delay_between"), [
    ("2s", None),  # a value declaration refuses, registered around it: the default policy's delay
    (-5, None),
    (_raise_system_exit, None),  # a BaseException from the policy
    (lambda attempt: math.nan, None),
    (lambda attempt: math.inf, (MAX_BACKOFF_SECONDS - 1, MAX_BACKOFF_SECONDS)),
    (lambda attempt: 1e300, (MAX_BACKOFF_SECONDS - 1, MAX_BACKOFF_SECONDS)),
], ids=["str", "negative", "system_exit", "nan", "inf", "1e300"])
def test_the_handlers_own_error_is_recorded_whatever_the_backoff_does(backoff, delay_between):
    name = "adversarial.values.failing"
    registry.register_task(registry.TaskSpec(func=_fails, name=name, max_attempts=3, backoff=backoff))
    job = enqueue(name)
    (claimed,) = claim()
    assert run_claimed(claimed) == "ready"
    row = Job.objects.get(pk=job.pk)
    assert row.status == "ready" and row.leased_until is None and len(row.errors) == 1
    assert (row.errors[0]["type"], row.errors[0]["message"]) == ("builtins.RuntimeError", "the handler's own error")
    settings = get_settings()
    low, high = delay_between or (settings.backoff_base * (1 - settings.backoff_jitter), settings.backoff_base)
    delay = (row.run_at - datetime.fromisoformat(row.errors[0]["at"])).total_seconds()
    assert low - 0.01 <= delay <= high + 0.01


@pytest.mark.django_db
def test_an_error_whose_str_raises_system_exit_is_recorded_as_itself():
    name = "adversarial.values.unprintable"
    registry.register_task(registry.TaskSpec(func=_fails_with_str_system_exit, name=name, max_attempts=1))
    job = enqueue(name)
    (claimed,) = claim()
    assert run_claimed(claimed) == "dead"
    (error,) = Job.objects.get(pk=job.pk).errors
    assert error["type"] == f"{__name__}._StrRaisesSystemExit"
    assert error["message"] == "<unprintable _StrRaisesSystemExit>"


def test_a_timedelta_run_at_message_names_the_delay():
    with pytest.raises(EnqueueError, match="run_at timedelta of .* seconds is more than 100 years away"):
        arguments.check_using("t", {"run_at": timedelta(days=100 * 367)})


@pytest.mark.django_db
@pytest.mark.parametrize("queues", [["default", "a,b"], ["*"], [" default"], "default"])
def test_a_worker_refuses_queue_names_outside_the_grammar(queues):
    from django_leasequeue.worker import WorkerService

    with pytest.raises(ValueError, match="queue"):
        WorkerService(queues=queues, reap=False, notify=False)
