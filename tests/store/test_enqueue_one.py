"""The one-job enqueue INSERT lists only the columns its job sets (the others take their database
defaults, migration 0019), and is a prepared statement when the connection allows them: the job
``enqueue()`` returns is the row the database holds, field by field, for every set of options, with
and without prepared statements."""

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test import override_settings

from django_leasequeue import enqueue, store, task
from django_leasequeue.models import Job

pytestmark = pytest.mark.django_db


@task(name="tests.store.one_keyed", queue="flow", sequence_key="acct-{account}", sequence_on_dead="halt",
      concurrency_key="acct-{account}", concurrency_limit=2, rate_key="acct-{account}", rate_limit="5/m",
      fair_key="tenant-{account}", lease=12)
def one_keyed(account: str) -> None:
    """A task that sets every optional flow-control column."""


@task(name="tests.store.one_loose", queue="flow", sequence_key="loose-{account}", sequence_on_dead="continue")
def one_loose(account: str) -> None:
    """A sequence that continues past a dead job (sequence_halts false, the column's default)."""


# (name, enqueue call): each sets a different set of columns.
CALLS = [
    ("plain", lambda: enqueue("qa.record", ["a"])),
    ("kwargs_priority", lambda: enqueue("qa.record", ["a"], {"sleep": 0.5}, priority=7, max_attempts=9)),
    ("delayed", lambda: enqueue("qa.record", ["a"], run_at=timedelta(seconds=30))),
    ("at", lambda: enqueue("qa.record", ["a"], run_at=store.db_now() + timedelta(hours=1))),
    ("unique_retained", lambda: enqueue("qa.record", ["a"], unique_key="one-r")),
    ("unique_active", lambda: enqueue("qa.record", ["a"], unique_key="one-a", unique_scope="active")),
    ("every_key", lambda: one_keyed.enqueue(account="x")),
    ("sequence_continues", lambda: one_loose.enqueue(account="y")),
]


def _fields(job: Job) -> dict[str, object]:
    return {f.attname: getattr(job, f.attname) for f in Job._meta.concrete_fields}


@pytest.fixture(params=[None, 5], ids=["unprepared", "prepared"])
def prepare_threshold(request):
    """The connection's psycopg ``prepare_threshold`` for the test (restored after it)."""
    connection.ensure_connection()
    pg = connection.connection
    saved = pg.prepare_threshold
    pg.prepare_threshold = request.param
    yield request.param
    pg.prepare_threshold = saved


@pytest.mark.parametrize(("name", "call"), CALLS, ids=[c[0] for c in CALLS])
def test_the_returned_job_is_the_stored_row(name, call, prepare_threshold):
    job = call()
    assert _fields(job) == _fields(Job.objects.get(pk=job.pk))
    assert (job.status, job.attempts, job.snoozes, job.lease_version, job.leased_by, job.errors,
            job.history, job.cancel_requested) == ("ready", 0, 0, 0, "", [], [], False)


def test_a_taken_unique_key_returns_the_holder_with_prepared_statements(prepare_threshold):
    first = enqueue("qa.record", ["a"], unique_key="one-dup")
    again = enqueue("qa.record", ["b"], unique_key="one-dup")
    assert again.pk == first.pk
    assert Job.objects.filter(unique_key="one-dup").count() == 1


def test_the_insert_lists_only_the_columns_a_plain_job_sets():
    columns = store.JOB_INSERT_ONE.split("(", 1)[1].split(")", 1)[0]
    assert [c.strip() for c in columns.split(",")] == [
        "task", "queue", "priority", "max_attempts", "args", "kwargs", "run_at", "created_at"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("threshold", "sql_prepare"), [(None, False), (None, True), (5, True)],
                         ids=["unprepared", "sql-prepare", "psycopg-prepare"])
def test_the_insert_is_prepared_as_the_connection_and_settings_allow(threshold, sql_prepare):
    """psycopg prepares it (protocol level) where the connection allows it, in a transaction too;
    else ``PREPARED_STATEMENTS`` (on by default) prepares it with SQL ``PREPARE`` in autocommit
    only; with neither nothing is prepared."""
    connection.close()  # a new session: no statement prepared yet
    connection.ensure_connection()
    connection.connection.prepare_threshold = threshold
    try:
        with override_settings(LEASEQUEUE={"PREPARED_STATEMENTS": sql_prepare}):
            # psycopg prepares inside a transaction that rolls back too: the statement stays
            # prepared (a session object) and the next calls use it. SQL PREPARE is not used there.
            with pytest.raises(RuntimeError), transaction.atomic():
                enqueue("qa.record", ["rolled back"])
                raise RuntimeError
            for _ in range(3):
                enqueue("qa.record", ["a"])
            enqueue("qa.record", ["a"], unique_key="one-prepared")
        assert list(Job.objects.values_list("args", flat=True)) == [["a"]] * 4
        with connection.cursor() as cur:
            cur.execute("SELECT statement FROM pg_prepared_statements")
            prepared = [row[0] for row in cur.fetchall()]
    finally:
        connection.close()
    # One per statement text (a plain job, a job with a unique key); nothing else is prepared.
    plain = "INSERT INTO leasequeue_job (task, queue, priority, max_attempts, args, kwargs, run_at, created_at"
    if threshold is None and sql_prepare:
        firsts = sorted(statement.split("\n", 1)[0].split(" AS ", 1)[1] for statement in prepared)
        assert all(statement.startswith("PREPARE leasequeue_") for statement in prepared)
    else:
        firsts = sorted(statement.split("\n", 1)[0] for statement in prepared)
    assert firsts == ([] if not sql_prepare else [f"{plain})", f"{plain}, unique_key)"])


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("name", "call"), CALLS, ids=[c[0] for c in CALLS])
def test_the_returned_job_is_the_stored_row_when_prepared_in_autocommit(name, call):
    """Outside a transaction the INSERT of every set of options runs as ``EXECUTE`` of a
    statement prepared with SQL ``PREPARE`` (PostgreSQL infers each parameter's type from the
    statement): the job returned is still the stored row, field by field."""
    connection.close()
    job = call()
    assert _fields(job) == _fields(Job.objects.get(pk=job.pk))
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE 'PREPARE leasequeue_%%INSERT%%'")
        # A sequenced job's INSERT runs in the transaction of its sequence lock: not prepared.
        assert cur.fetchone()[0] == (0 if job.sequence_key else 1)
