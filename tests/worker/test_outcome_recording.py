"""Recording outcomes: whatever a handler returns or raises, its job ends in a definite state and
no other job's completion is held up.

A result holding NUL fails only its own job (the rest of the completion batch is written), and a
failure message holding NUL is recorded: no job stays ``leased`` until its lease expires for want
of a writable outcome.
"""

import threading

import psycopg
import pytest
from django.db import OperationalError, connection
from qa.models import Execution

from django_leasequeue import enqueue, signals, store
from django_leasequeue.models import Job
from django_leasequeue.runtime import close_broken_connections, run_services
from django_leasequeue.worker import WorkerService
from django_leasequeue.worker.completer import Completer
from tests.support import claim, context_for, run_claimed

pytestmark = pytest.mark.django_db(transaction=True)

EVENTS = ("succeeded", "dead_lettered", "lease_lost", "cancelled")


@pytest.fixture
def events():
    """Collect (event, job_id) pairs emitted in any thread while the test runs."""
    seen: list[tuple[str, int]] = []
    lock = threading.Lock()

    def receiver(sender, event, job_id, **fields):
        with lock:
            seen.append((event, job_id))

    for name in EVENTS:
        signals.SIGNALS[name].connect(receiver, dispatch_uid=f"adversarial-{name}")
    yield seen
    for name in EVENTS:
        signals.SIGNALS[name].disconnect(dispatch_uid=f"adversarial-{name}")


def drain(concurrency: int) -> WorkerService:
    """Run an in-process burst worker until no due job is left."""
    worker = WorkerService(concurrency=concurrency, burst=True, poll_interval=0.05, notify=False, reap=False)
    assert run_services([worker], install_signals=False) == 0
    return worker


def executions(job_id: int) -> int:
    return Execution.objects.filter(job_id=job_id).count()


@pytest.mark.parametrize(("kind", "why"), [("nul", "return value contains a NUL character"),
                                           ("surrogate", "return value contains a lone surrogate"),
                                           ("bigint", "return value['n'] is an int of more than")])
def test_result_that_cannot_be_stored_dead_letters_its_job_and_every_other_job_completes(kind, why, events):
    bad = enqueue("qa.adv_result", [kind])
    good = [enqueue("qa.adv_result", ["ok"], {"sleep": 0.05}) for _ in range(4)]
    worker = drain(concurrency=2)
    bad.refresh_from_db()
    assert (bad.status, bad.attempts, executions(bad.id)) == ("dead", 1, 1)  # not retried: same result again
    assert bad.errors[-1]["type"] == "django_leasequeue.exceptions.PayloadNotSerializable"
    assert why in bad.errors[-1]["message"]
    rows = {j.id: (j.status, j.attempts, j.result) for j in Job.objects.filter(pk__in=[g.id for g in good])}
    assert rows == {g.id: ("done", 1, "ok") for g in good}
    assert [executions(g.id) for g in good] == [1, 1, 1, 1]
    assert worker.completer.completed == 4
    assert sorted(events) == sorted([("dead_lettered", bad.id)] + [("succeeded", g.id) for g in good])


def test_failure_message_with_nul_and_lone_surrogate_is_recorded():
    job = enqueue("qa.adv_raise_nul")
    (claimed,) = claim()
    assert run_claimed(claimed) == "ready"
    job.refresh_from_db()
    assert (job.status, job.attempts, job.leased_until) == ("ready", 1, None)
    (error,) = job.errors
    # NUL becomes U+FFFD; a lone surrogate cannot be encoded and becomes "?".
    assert (error["type"], error["message"]) == ("builtins.ValueError", "cannot parse 'bad\ufffdinput?'")
    assert error["traceback"].rstrip().endswith("ValueError: cannot parse 'bad\ufffdinput?'")


# JSON text that passes Python's checks but that jsonb refuses ("unsupported Unicode escape
# sequence"): the completer's statement fails for the row, as for any result the database refuses.
REFUSED = '"a\\u0000b"'


def test_completer_writes_the_rest_of_a_batch_the_database_refuses_one_row_of(events):
    jobs = [enqueue("qa.record", [f"j{i}"]) for i in range(3)]
    claimed = {c.id: c for c in claim(limit=3)}
    first, refused, last = (context_for(claimed[j.id]) for j in jobs)
    completer = Completer(alias=store.db_alias())
    completer.submit(first, '"one"')
    completer.submit(refused, REFUSED)
    completer.submit(last, None)
    completer.flush()
    rows = {j.id: (j.status, j.attempts, j.result, j.lease_version) for j in Job.objects.all()}
    assert rows == {jobs[0].id: ("done", 1, "one", first.lease_version),
                    jobs[1].id: ("dead", 1, None, refused.lease_version),
                    jobs[2].id: ("done", 1, None, last.lease_version)}
    (error,) = Job.objects.get(pk=jobs[1].id).errors
    assert error["type"] == "django.db.utils.DataError"
    assert error["message"].startswith("unsupported Unicode escape sequence")
    assert completer.completed == 2 and completer._queue.empty()
    # The refused row is a dead letter, not a lost lease: no lease_lost event, no history note.
    assert sorted(events) == sorted([("succeeded", jobs[0].id), ("dead_lettered", jobs[1].id),
                                     ("succeeded", jobs[2].id)])
    assert Job.objects.get(pk=jobs[1].id).history == []


def test_completer_loses_no_completion_when_the_connection_drops_while_writing_one_by_one(events):
    """The connection dies (server-side termination) while the completer is writing a refused
    batch row by row: the completions not yet written stay queued and the next flush writes them."""
    jobs = [enqueue("qa.record", [f"j{i}"]) for i in range(4)]
    claimed = {c.id: c for c in claim(limit=4)}
    contexts = [context_for(claimed[j.id]) for j in jobs]
    completer = Completer(alias=store.db_alias())
    completer.submit(contexts[0], REFUSED)
    for ctx in contexts[1:]:
        completer.submit(ctx, '"ok"')
    target = contexts[2].job_id
    dsn = {k: v for k, v in connection.get_connection_params().items() if k != "cursor_factory"}
    killed = []

    def terminate_before_the_third_row(execute, sql, params, many, context):
        # A real connection loss: another session terminates ours just before this statement.
        # The completion statement takes its ids as one comma-separated text (store.job_complete).
        if not killed and isinstance(params, dict) and params.get("ids") == str(target):
            killed.append(connection.connection.info.backend_pid)
            with psycopg.connect(**dsn, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", [killed[0]])
        return execute(sql, params, many, context)

    with connection.execute_wrapper(terminate_before_the_third_row):
        with pytest.raises(OperationalError, match="terminating connection due to administrator command"):
            completer.flush()
    close_broken_connections()
    # Written before the drop: the refused row (dead) and the second; the rest is still queued.
    assert {j.id: j.status for j in Job.objects.all()} == {
        jobs[0].id: "dead", jobs[1].id: "done", jobs[2].id: "leased", jobs[3].id: "leased"}
    assert completer._queue.qsize() == 2
    completer.flush()
    assert {j.id: j.status for j in Job.objects.all()} == {
        jobs[0].id: "dead", jobs[1].id: "done", jobs[2].id: "done", jobs[3].id: "done"}
    assert completer._queue.empty()
    assert ("lease_lost", jobs[0].id) not in events


def test_completer_keeps_the_rest_of_a_batch_when_even_the_failure_record_is_refused(events):
    """The database refuses a job's result and then its failure record too (here a trigger raises on
    that row: SQLSTATE P0001, not a connection error). That job stays leased, to be retried when its
    lease expires; the others of the batch complete, and nothing is reported as a lost lease."""
    jobs = [enqueue("qa.record", [f"j{i}"]) for i in range(3)]
    claimed = {c.id: c for c in claim(limit=3)}
    first, refused, last = (context_for(claimed[j.id]) for j in jobs)
    table = Job._meta.db_table
    with connection.cursor() as cur:
        cur.execute("CREATE FUNCTION lq_test_refuse() RETURNS trigger LANGUAGE plpgsql AS "
                    "$$ BEGIN RAISE EXCEPTION 'refused by the test trigger'; END $$")
        cur.execute(f"CREATE TRIGGER lq_test_refuse BEFORE UPDATE ON {table} FOR EACH ROW "
                    f"WHEN (NEW.id = {refused.job_id}) EXECUTE FUNCTION lq_test_refuse()")
    try:
        completer = Completer(alias=store.db_alias())
        completer.submit(first, '"one"')
        completer.submit(refused, REFUSED)
        completer.submit(last, None)
        completer.flush()
    finally:
        with connection.cursor() as cur:
            cur.execute(f"DROP TRIGGER lq_test_refuse ON {table}")
            cur.execute("DROP FUNCTION lq_test_refuse()")
    rows = {j.id: (j.status, j.attempts, j.lease_version, j.errors) for j in Job.objects.all()}
    assert rows == {jobs[0].id: ("done", 1, first.lease_version, []),
                    jobs[1].id: ("leased", 1, refused.lease_version, []),
                    jobs[2].id: ("done", 1, last.lease_version, [])}
    assert completer.completed == 2 and completer._queue.empty()
    assert sorted(events) == sorted([("succeeded", jobs[0].id), ("succeeded", jobs[2].id)])
    assert Job.objects.get(pk=jobs[1].id).history == []
