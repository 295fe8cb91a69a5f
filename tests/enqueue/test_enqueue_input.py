"""Bad input at enqueue: a clear error naming the problem and no row; or, for a row that names an
unregistered task, a dead letter with the reason and nothing imported or run (invariant 9).
Cases C21 (naive datetimes, non-UTC TIME_ZONE) and C23 (non-JSON arguments)."""

import asyncio
import enum
import math
import sys
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
from django.test import override_settings
from qa.tasks import record

from django_leasequeue import (
    ArgumentsMismatch,
    EnqueueError,
    PayloadNotSerializable,
    UnknownTask,
    enqueue,
    enqueue_many,
    enqueue_on_commit,
    store,
    task,
)
from django_leasequeue.models import Job
from django_leasequeue.store import NewJob
from tests.support import claim, run_claimed

pytestmark = pytest.mark.django_db


class Thing:
    pass


class Status(enum.StrEnum):
    PAID = "paid"


class Level(enum.IntEnum):
    HIGH = 3


@pytest.mark.parametrize(
    ("args", "kwargs", "named", "why"),
    [
        ([Decimal("1.10")], {}, "argument 'tag'", "decimal.Decimal"),
        ([], {"when": datetime(2026, 1, 1, tzinfo=UTC)}, "keyword argument 'when'", "datetime.datetime"),
        ([], {"day": date(2026, 1, 1)}, "keyword argument 'day'", "datetime.date"),
        (["ok", uuid.uuid4()], {}, "argument 'sleep'", "uuid.UUID"),
        (["ok", 0.0, uuid.uuid4()], {}, "args[2]", "uuid.UUID"),  # beyond the named parameters
        ([(1, 2)], {}, "argument 'tag'", "JSON would turn it into a list"),
        ([], {"obj": Thing()}, "keyword argument 'obj'", "Thing"),
        ([math.nan], {}, "argument 'tag'", "NaN"),
        ([], {"x": [1, {"deep": math.inf}]}, "keyword argument 'x'[1]['deep']", "infinity"),
        ([{1: "a"}], {}, "argument 'tag'", "key 1 of type int"),
        ([{"ok": {None: 1}}], {}, "argument 'tag'['ok']", "key None"),
        ([b"bytes"], {}, "argument 'tag'", "bytes"),
        ([{1, 2}], {}, "argument 'tag'", "set"),
        ([], {"status": Status.PAID}, "keyword argument 'status'", "a subclass of str"),
        ([Level.HIGH], {}, "argument 'tag'", "a subclass of int"),
    ],
)
def test_c23_non_json_argument_names_it_and_writes_nothing(args, kwargs, named, why):
    with pytest.raises(PayloadNotSerializable) as err:
        enqueue(record, args, kwargs)
    assert named in str(err.value) and why in str(err.value)
    assert isinstance(err.value, TypeError)  # also catchable as the TypeError it is
    with pytest.raises(PayloadNotSerializable):
        record.enqueue(*args, **kwargs)
    assert Job.objects.count() == 0


@task(name="tests.echo")
def echo(value):
    return value


def test_json_values_round_trip_unchanged():
    payload = {"s": "é", "i": 2**62, "f": 1.5, "b": False, "n": None, "l": [1, [2, {"k": "v"}]]}
    job = echo.enqueue(payload)
    assert job.args == [payload]
    (claimed,) = claim(store.db_now() + timedelta(seconds=1))
    assert claimed.args == [payload]
    assert run_claimed(claimed) == "done"
    job.refresh_from_db()
    assert job.result == payload


def test_unknown_task_name_is_a_clear_error():
    with pytest.raises(UnknownTask, match="'qa.no_such_task'.*no task is registered"):
        enqueue("qa.no_such_task")
    with pytest.raises(UnknownTask, match=r"cannot enqueue 'qa\.recrod'.*Did you mean 'qa\.record'\?"):
        enqueue("qa.recrod")
    with pytest.raises(TypeError, match="needs a Task or a registered task name"):
        enqueue(print)
    assert Job.objects.count() == 0


@pytest.mark.parametrize("name", ["os.system", "qa_never_imported_module.run", "subprocess.call"])
def test_row_naming_unregistered_task_is_dead_lettered_without_importing(name, tmp_path):
    marker = tmp_path / "pwned"
    # A row written by something other than enqueue() (another service, a manual INSERT).
    store.job_insert([NewJob(task=name, queue="default", priority=0, args_json=f'["touch {marker}"]',
                             kwargs_json="{}", max_attempts=5)], notify=False, channel="leasequeue")
    (claimed,) = claim(store.db_now() + timedelta(seconds=1))
    assert run_claimed(claimed) == "dead"
    job = Job.objects.get(pk=claimed.id)
    assert (job.status, job.attempts, len(job.errors)) == ("dead", 1, 1)
    assert job.errors[0]["type"] == "django_leasequeue.exceptions.UnknownTask"
    message = job.errors[0]["message"]
    assert f"no task is registered as {name!r}" in message
    # ... and says where workers look for tasks, what this process imported, and the fix.
    assert "importing the 'tasks' and 'jobs' modules of every installed app and the modules listed in " \
           "LEASEQUEUE['IMPORTS'] (this process imported " in message
    assert "qa.tasks" in message and "invoices.tasks" in message
    assert "decorate the function with @task in such a module" in message and "replay the job" in message
    assert not marker.exists()
    assert "qa_never_imported_module" not in sys.modules


@pytest.mark.parametrize("priority", [101, -101, 1000, True, "5", 1.5])
def test_priority_out_of_range(priority):
    with pytest.raises(EnqueueError, match="priority must be an int from -100 to 100"):
        enqueue(record, priority=priority)
    assert Job.objects.count() == 0


def test_priority_bounds_accepted():
    assert enqueue(record, priority=100).priority == 100
    assert enqueue(record, priority=-100).priority == -100


@override_settings(LEASEQUEUE={"QUEUES": ["default", "emails"]})
def test_unknown_queue_when_queues_restricted():
    with pytest.raises(EnqueueError, match=r"unknown queue 'emial'.*\['default', 'emails'\]"):
        enqueue(record, queue="emial")
    with pytest.raises(EnqueueError, match="unknown queue"):
        record.using(queue="reports").enqueue()
    assert enqueue(record, queue="emails").queue == "emails"
    assert Job.objects.count() == 1


def test_any_queue_when_queues_not_restricted():
    assert enqueue(record, queue="anything").queue == "anything"


@pytest.mark.parametrize("max_attempts", [0, -1, "3", 1.5, True])
def test_bad_max_attempts(max_attempts):
    with pytest.raises(EnqueueError, match="max_attempts"):
        enqueue(record, max_attempts=max_attempts)
    assert Job.objects.count() == 0


@override_settings(TIME_ZONE="Europe/London")
def test_c21_naive_run_at_refused_and_aware_local_time_stored_in_utc():
    with pytest.raises(EnqueueError, match="naive"):
        enqueue(record, run_at=datetime(2026, 7, 1, 9, 0))
    with pytest.raises(EnqueueError, match="naive"):
        record.using(run_at=datetime(2026, 7, 1, 9, 0)).enqueue()
    with pytest.raises(EnqueueError, match="aware datetime or a timedelta"):
        enqueue(record, run_at="2026-07-01T09:00:00Z")
    assert Job.objects.count() == 0
    # 09:00 in London in July (BST) is 08:00Z; it is due only once the database clock passes it.
    job = enqueue(record, run_at=datetime(2026, 7, 1, 9, 0, tzinfo=ZoneInfo("Europe/London")))
    job.refresh_from_db()
    assert job.run_at == datetime(2026, 7, 1, 8, 0, tzinfo=UTC)
    assert claim(datetime(2026, 7, 1, 7, 59, 59, tzinfo=UTC)) == []
    assert [c.id for c in claim(datetime(2026, 7, 1, 8, 0, tzinfo=UTC))] == [job.id]


def test_run_at_timedelta_is_from_database_clock():
    before = store.db_now()
    job = enqueue(record, run_at=timedelta(minutes=5))
    after = store.db_now()
    assert before + timedelta(minutes=5) <= job.run_at <= after + timedelta(minutes=5)


def test_bad_unique_key_and_scope():
    with pytest.raises(EnqueueError, match="unique_scope"):
        enqueue(record, unique_key="k", unique_scope="forever")
    with pytest.raises(EnqueueError, match="unique_key"):
        enqueue(record, unique_key="x" * 256)
    with pytest.raises(EnqueueError, match="unique_key"):
        enqueue(record, unique_key=42)


def test_using_rejects_options_the_worker_would_ignore():
    with pytest.raises(TypeError, match="unknown option"):
        record.using(backoff=5)
    with pytest.raises(TypeError, match="unknown option"):
        record.using(timeout=5)
    with pytest.raises(TypeError, match="unknown option"):
        record.using(prority=5)


def test_task_declaration_errors():
    from django_leasequeue import ConfigurationError

    with pytest.raises(ConfigurationError, match="priority"):
        task(name="tests.bad_priority", priority=500)(lambda: None)
    with pytest.raises(ConfigurationError, match="already registered"):
        task(name="qa.record")(lambda: None)


def test_aenqueue_validates_the_same_way():
    # aenqueue is a thin sync_to_async wrapper; it must validate the same way.
    with pytest.raises(PayloadNotSerializable):
        asyncio.run(record.aenqueue(Decimal("1")))


@task(name="tests.varargs")
def varargs(first, *rest, **options):
    return first


@pytest.mark.parametrize(
    ("call", "problem"),
    [
        (lambda: enqueue(record, [], {"nope": 1}), "got an unexpected keyword argument 'nope'"),
        (lambda: record.enqueue("a", 0.0, 3), "too many positional arguments"),
        (lambda: enqueue(record, ["later"], {"tag": "t"}), "multiple values for argument 'tag'"),
        (lambda: enqueue_on_commit(record, [], {"tga": "t"}), "got an unexpected keyword argument 'tga'"),
        (lambda: enqueue_many(record, [["ok"], ([], {"slep": 1})]), "got an unexpected keyword argument 'slep'"),
    ],
)
def test_arguments_that_do_not_fit_the_handler_are_refused_at_enqueue(call, problem):
    """A job whose arguments cannot bind to the handler would fail with a TypeError on every
    attempt; enqueue refuses it, naming the task and its signature (without the context)."""
    with pytest.raises(ArgumentsMismatch) as err:
        call()
    assert str(err.value) == (f"task 'qa.record' cannot take these arguments: {problem}; it is enqueued as "
                              "qa.record(tag: str = '', sleep: float = 0.0) -> str")
    assert isinstance(err.value, TypeError) and isinstance(err.value, EnqueueError)
    assert Job.objects.count() == 0


def test_missing_required_argument_is_refused_and_keywords_and_defaults_bind():
    from invoices.tasks import send_invoice

    with pytest.raises(ArgumentsMismatch, match=r"missing a required argument: 'period'; it is enqueued as "
                                                r"invoices\.tasks\.send_invoice\(account_id: int, period: str, "
                                                r"work_seconds: float = 0\.0\) -> dict"):
        send_invoice.enqueue(7)
    send_invoice.enqueue(7, period="2026-11")
    enqueue(varargs, [1, 2, 3], {"any": "thing"})
    assert Job.objects.count() == 2


def test_bad_argument_is_named_by_parameter_and_by_index_past_the_named_ones():
    with pytest.raises(PayloadNotSerializable, match=r"^argument 'first' is a decimal\.Decimal"):
        enqueue(varargs, [Decimal(1)])
    with pytest.raises(PayloadNotSerializable, match=r"^args\[2\]\['k'\] is a decimal\.Decimal"):
        enqueue(varargs, [1, 2, {"k": Decimal(1)}])
    with pytest.raises(PayloadNotSerializable, match=r"^keyword argument 'options' is a decimal\.Decimal"):
        enqueue(varargs, [1], {"options": Decimal(1)})


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("missing", ["function", "table"])
def test_enqueue_before_migrate_says_to_run_migrate(missing):
    # A new project's first mistake: the message names migrate, not "function leasequeue_now() does
    # not exist". The schema is hidden inside a transaction that is rolled back afterwards.
    from django.db import connection, transaction

    from django_leasequeue import NotMigrated, enqueue_many

    hide = {"function": "ALTER FUNCTION leasequeue_now() RENAME TO leasequeue_now_hidden",
            "table": "ALTER TABLE leasequeue_job RENAME TO leasequeue_job_hidden"}[missing]
    for attempt in (lambda: record.enqueue("x"), lambda: enqueue_many(record, [["a"], ["b"]])):
        with pytest.raises(NotMigrated, match=r"tables are missing in database 'default' .*run `manage.py migrate`"):
            with transaction.atomic():
                with connection.cursor() as cur:
                    cur.execute(hide)
                attempt()
    assert Job.objects.count() == 0
