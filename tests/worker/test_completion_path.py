"""The default completion path: a handler returns a value and the worker's batched completer marks
the job done.

A job whose handler has returned stays in the heartbeat's set until its completion is written, so
its lease is renewed through a database outage and the reaper never takes back (and runs again) a
returned job; new submissions wake a completer backing off after failed flushes; a batch the
database refuses on its data with an ``OperationalError`` (``ProgramLimitExceeded``,
``StatementTooComplex``) is completed row by row rather than re-queued whole; a result's size is
bounded by ``MAX_RESULT_BYTES``.
"""

from __future__ import annotations

import os
import threading
import time

import psycopg
import pytest
from django.db import DatabaseError, connection, transaction
from django.test import override_settings
from qa.models import Execution

from django_leasequeue import enqueue, store
from django_leasequeue.conf import build, get_settings
from django_leasequeue.exceptions import ConfigurationError
from django_leasequeue.models import Job
from django_leasequeue.notify import _NOT_LIBPQ
from django_leasequeue.runtime import db_error_kind, run_services
from django_leasequeue.worker import WorkerService
from django_leasequeue.worker.completer import Completer
from tests.support import claim, context_for, wait_for
from tests.worker.test_connection_loss import database_refusing_connections

pytestmark = pytest.mark.django_db(transaction=True)

# JSON text under any size limit (200 kB) that jsonb still refuses, with an OperationalError
# (SQLSTATE 54001 "stack depth limit exceeded", of the program limit class 54 like the
# ProgramLimitExceeded of a 300 MiB value): nesting too deep to parse.
TOO_DEEP = "[" * 100_000 + "]" * 100_000


def executions(job_id: int) -> int:
    return Execution.objects.filter(job_id=job_id).count()


# -- classification ------------------------------------------------------------------------------


def test_database_errors_are_classified_by_sqlstate_not_by_the_wrapper_class():
    """Real errors from the server: the deep jsonb is a Django ``OperationalError`` whose cause
    is psycopg's ``StatementTooComplex`` (class 54), a data error; a NUL escape is a ``DataError``;
    a terminated session (57P01) and a refused connection are connection errors; a cancelled
    statement (57014) is transient."""
    errors = {}
    for name, statements in [("deep", [("SELECT %s::jsonb", [TOO_DEEP])]),
                             ("nul", [("SELECT '\"a\\u0000b\"'::jsonb", None)]),
                             ("cancelled", [("SET LOCAL statement_timeout = 1", None), ("SELECT pg_sleep(1)", None)])]:
        try:
            with transaction.atomic(), connection.cursor() as cur:
                for sql, params in statements:
                    cur.execute(sql, params)
        except DatabaseError as exc:
            errors[name] = exc
    assert type(errors["deep"]).__name__ == "OperationalError"
    assert isinstance(errors["deep"].__cause__, psycopg.OperationalError)
    assert errors["deep"].__cause__.sqlstate == "54001"  # statement too complex: program limit class
    params = {k: v for k, v in connection.get_connection_params().items() if k not in _NOT_LIBPQ}
    victim = psycopg.connect(**params, autocommit=True)
    with connection.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(%s)", [victim.info.backend_pid])
    with pytest.raises(psycopg.OperationalError) as terminated:
        victim.execute("SELECT 1")
    with pytest.raises(psycopg.OperationalError) as refused:
        psycopg.connect(**{**params, "port": 1}, connect_timeout=2)
    kinds = {name: db_error_kind(exc) for name, exc in errors.items()}
    assert kinds == {"deep": "data", "nul": "data", "cancelled": "transient"}
    assert (db_error_kind(terminated.value), db_error_kind(refused.value)) == ("connection", "connection")


# -- the completer --------------------------------------------------------------------------------


def test_a_batch_refused_with_an_operational_data_error_is_completed_one_by_one():
    """One result jsonb refuses with SQLSTATE 54001 (an OperationalError) among three good ones:
    the three are done, the bad job is dead with the database's real error, nothing is queued."""
    jobs = [enqueue("qa.record", [f"j{i}"]) for i in range(4)]
    claimed = {c.id: c for c in claim(limit=4)}
    contexts = [context_for(claimed[j.id]) for j in jobs]
    completer = Completer(alias=store.db_alias())
    completer.submit(contexts[0], '"one"')
    completer.submit(contexts[1], TOO_DEEP)
    completer.submit(contexts[2], None)
    completer.submit(contexts[3], '"four"')
    completer.flush()
    rows = {j.id: (j.status, j.attempts, j.result) for j in Job.objects.all()}
    assert rows == {jobs[0].id: ("done", 1, "one"), jobs[1].id: ("dead", 1, None), jobs[2].id: ("done", 1, None),
                    jobs[3].id: ("done", 1, "four")}
    (error,) = Job.objects.get(pk=jobs[1].id).errors
    assert error["type"] == "django.db.utils.OperationalError"
    assert error["message"].startswith("stack depth limit exceeded")
    assert completer.completed == 3 and not completer.pending


def test_the_completer_retries_within_the_shortest_lease_it_holds():
    worker = WorkerService(concurrency=2, lease=3, notify=False, reap=False)
    assert worker.completer.error_backoff_max == 1.0  # nothing held: a third of the worker's lease
    enqueue("qa.record")
    from qa.tasks import record

    record.using(lease=1.5).enqueue("short")
    for job in store.job_claim(queues=None, limit=2, worker_id=worker.worker_id, lease=3):
        worker.pool.dispatch(worker.pool.track(job))
    assert worker.completer.error_backoff_max == 0.5
    assert Completer(alias=store.db_alias()).error_backoff_max == 30.0  # standalone: the general cap


def test_a_submission_wakes_a_completer_backing_off_after_failed_flushes():
    """A real outage (connections refused): the completer's flushes fail and its waits double
    (0.1, 0.2, ... 3.2 s). Once the database is back, a new submission is written at once, with
    the one that was waiting, instead of after the rest of a 3.2 s backoff."""
    first, second = (enqueue("qa.record", [t]) for t in ("a", "b"))
    claimed = {c.id: c for c in claim(limit=2, lease=60)}
    completer = Completer(alias=store.db_alias())
    completer.start()
    try:
        with database_refusing_connections():
            completer.submit(context_for(claimed[first.id]), '"a"')
            wait_for(lambda: completer.errors >= 6, timeout=30, what="six failed flushes")  # now waiting 3.2 s
        start = time.monotonic()
        completer.submit(context_for(claimed[second.id]), '"b"')
        wait_for(lambda: Job.objects.filter(status="done").count() == 2, timeout=10, interval=0.01,
                 what="both completions")
        assert time.monotonic() - start < 1.5
    finally:
        completer.stop()
        completer.join(10)
    assert {j.id: (j.status, j.result) for j in Job.objects.all()} == {first.id: ("done", "a"),
                                                                        second.id: ("done", "b")}


# -- a returned job stays held -----------------------------------------------------------------------


def test_a_returned_job_is_renewed_until_its_completion_is_written_through_an_outage(tmp_path, monkeypatch):
    """One in-process worker, lease 3 s: the handler returns while the database refuses connections
    for 6 s. Its job stays held (renewed by the heartbeat, not counted against the concurrency)
    until the completion is written; no reaper takes it back, it ran once and is done on its
    first attempt with its original token."""
    monkeypatch.setenv("QA_LEDGER_DIR", str(tmp_path))
    job = enqueue("qa.returning", kwargs={"work": 1.0})
    stop = threading.Event()
    worker = WorkerService(concurrency=2, poll_interval=0.05, notify=False, reap=True,
                           settings=build({"LEASE": 3, "REAPER_INTERVAL": 0.2}))
    thread = threading.Thread(target=run_services, args=([worker],), kwargs={"install_signals": False,
                                                                            "stop_when": stop})
    thread.start()
    ledger = tmp_path / f"{os.getpid()}.log"
    try:
        wait_for(lambda: ledger.exists() and "start" in ledger.read_text(), timeout=20, what="the handler to start")
        token = Job.objects.get(pk=job.id).lease_version
        with database_refusing_connections():
            wait_for(lambda: "return" in ledger.read_text(), timeout=10, what="the handler to return")
            time.sleep(0.3)
            held = {item.job.id: item.completing for item in worker.pool.inflight_snapshot()}
            assert held == {job.id: True}
            assert worker.pool.free_slots() == 2
            time.sleep(6)  # past the 3 s lease by every clock
        wait_for(lambda: Job.objects.filter(pk=job.id, status="done").exists(), timeout=20,
                 what="the completion after the outage")
    finally:
        stop.set()
        thread.join(30)
    row = Job.objects.get(pk=job.id)
    assert (row.status, row.attempts, row.lease_version, row.errors, row.result) == ("done", 1, token, [], job.id)
    assert ledger.read_text().split() == ["start", str(job.id), str(token), "return", str(job.id), str(token)]
    assert worker.pool.inflight_snapshot() == [] and worker.pool.completing == 0


# -- the fencing token decides, not the clock ----------------------------------------------------------


def test_a_matching_token_completes_and_renews_after_leased_until_has_passed(db_clock):
    a, b = enqueue("qa.record", ["a"]), enqueue("qa.record", ["b"])
    claimed = {c.id: c for c in claim(limit=2, lease=3)}
    db_clock.advance(60)  # both leases ran out by the database clock; nobody reaped them
    renewals = store.job_renew([(a.id, claimed[a.id].lease_version, 3)])
    assert set(renewals) == {a.id}
    assert renewals[a.id].leased_until > store.db_now()
    assert store.job_complete([(b.id, claimed[b.id].lease_version, '"b"')]) == {b.id}
    assert Job.objects.get(pk=b.id).status == "done"


# -- MAX_RESULT_BYTES -------------------------------------------------------------------------------


def drain(concurrency: int = 2) -> WorkerService:
    worker = WorkerService(concurrency=concurrency, burst=True, poll_interval=0.05, notify=False, reap=False)
    assert run_services([worker], install_signals=False) == 0
    return worker


def test_max_result_bytes_default_and_validation():
    assert get_settings().max_result_bytes == 1024 * 1024
    assert build({"MAX_RESULT_BYTES": 0}).max_result_bytes == 0
    for bad in (-1, "1MB", True, 1.5):
        with pytest.raises(ConfigurationError, match=r"MAX_RESULT_BYTES'\] must be an int >= 0"):
            build({"MAX_RESULT_BYTES": bad})


def test_a_result_over_max_result_bytes_dead_letters_only_its_job():
    with override_settings(LEASEQUEUE={"MAX_RESULT_BYTES": 1000}):
        big = enqueue("qa.sized", [5000])
        small = [enqueue("qa.sized", [10]) for _ in range(5)]
        worker = drain()
    row = Job.objects.get(pk=big.id)
    assert (row.status, row.attempts, row.result, executions(big.id)) == ("dead", 1, None, 1)
    (error,) = row.errors
    assert error["type"] == "django_leasequeue.exceptions.ResultTooLarge"
    assert "5002 bytes" in error["message"] and "(1000 bytes)" in error["message"]
    assert {j.id: (j.status, j.attempts, j.result) for j in Job.objects.filter(pk__in=[s.id for s in small])} == {
        s.id: ("done", 1, "x" * 10) for s in small}
    assert [executions(s.id) for s in small] == [1] * 5
    assert worker.completer.completed == 5


def test_a_late_result_over_max_result_bytes_is_not_stored_and_the_fenced_completion_stands():
    with override_settings(LEASEQUEUE={"MAX_RESULT_BYTES": 1000}):
        big = enqueue("qa.sized", [5000], {"fenced": True})
        ok = enqueue("qa.sized", [10], {"fenced": True})
        drain()
    rows = {j.id: (j.status, j.attempts, j.result, j.errors) for j in Job.objects.all()}
    assert rows == {big.id: ("done", 1, None, []), ok.id: ("done", 1, "x" * 10, [])}
    # The row says why its result is empty (before, only the worker's log did).
    row = Job.objects.get(pk=big.id)
    dropped = [h for h in row.history if h.get("event") == "result_dropped"]
    assert len(dropped) == 1
    (entry,) = dropped
    assert (entry["size"], entry["limit"], entry["token"]) == (5002, 1000, row.lease_version)
    assert entry["reason"].startswith("ResultTooLarge: the return value is at least 5002 bytes of JSON, over "
                                      "LEASEQUEUE['MAX_RESULT_BYTES'] (1000 bytes)")
    assert entry["at"]
    assert not [h for h in Job.objects.get(pk=ok.id).history if h.get("event") == "result_dropped"]


def test_a_result_dropped_note_is_fenced_on_the_token_and_on_done():
    job = enqueue("qa.sized", [10])
    (claimed,) = claim()
    assert not store.job_note_result_dropped(job.id, claimed.lease_version, reason="r", size=1, limit=0)  # leased
    assert store.job_complete([(claimed.id, claimed.lease_version, None)]) == {job.id}
    assert not store.job_note_result_dropped(job.id, claimed.lease_version - 1, reason="r", size=1, limit=0)
    assert store.job_note_result_dropped(job.id, claimed.lease_version, reason="not JSON")
    (entry,) = [h for h in Job.objects.get(pk=job.id).history if h.get("event") == "result_dropped"]
    assert (entry["reason"], entry["size"], entry["limit"]) == ("not JSON", None, None)


@pytest.mark.skipif(not os.environ.get("LEASEQUEUE_HEAVY_TESTS"),
                    reason="sends 260 MiB to PostgreSQL; set LEASEQUEUE_HEAVY_TESTS=1 to run")
def test_a_result_jsonb_cannot_hold_fails_only_its_job_with_the_real_error():
    """The full-size case, under a raised MAX_RESULT_BYTES: a 260 MiB string is over jsonb's
    255 MiB limit, and PostgreSQL refuses it with ProgramLimitExceeded (an OperationalError). The
    batch is completed one by one: that job is dead with the database's error, the others of the
    batch are done once."""
    size = 260 * 1024 * 1024
    stop = threading.Event()
    with override_settings(LEASEQUEUE={"MAX_RESULT_BYTES": 2 * size}):
        small = [enqueue("qa.sized", [10]) for _ in range(10)]
        big = enqueue("qa.sized", [size])
        small += [enqueue("qa.sized", [10]) for _ in range(10)]
        worker = WorkerService(concurrency=4, poll_interval=0.05, notify=False, reap=False)
        thread = threading.Thread(target=run_services, args=([worker],),
                                  kwargs={"install_signals": False, "stop_when": stop})
        thread.start()
        try:
            wait_for(lambda: not Job.objects.filter(status__in=["ready", "leased"]).exists(), timeout=120,
                     interval=0.2, what="every job to finish")
        finally:
            stop.set()
            thread.join(60)
    row = Job.objects.values("status", "attempts", "errors").get(pk=big.id)
    assert (row["status"], row["attempts"], executions(big.id)) == ("dead", 1, 1)
    (error,) = row["errors"]
    assert error["type"] == "django.db.utils.OperationalError"
    assert "jsonb" in error["message"], error["message"]
    assert {j.id: (j.status, j.attempts) for j in Job.objects.filter(pk__in=[s.id for s in small])} == {
        s.id: ("done", 1) for s in small}
    assert [executions(s.id) for s in small] == [1] * 20


def test_a_huge_result_is_refused_before_it_is_encoded():
    """Encoding a 280 MB string and measuring it are single C calls that hold the GIL for seconds
    (the worker's heartbeat starved and three other jobs' leases expired in a --full chaos run);
    the size floor refuses it from its length alone, and never exceeds the real size."""
    import json

    from django_leasequeue.exceptions import ResultTooLarge
    from django_leasequeue.payload import encode_result, json_size_floor

    samples = ["", "héllo", [1, "ab", {"k": None, "é": [True, 2.5]}], {"a": {"b": {"c": "d" * 50}}}, 12345]
    for value in samples:
        real = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
        assert json_size_floor(value, 10**9) <= real, value
    huge = "x" * 50_000_000
    assert json_size_floor(huge, 1000) == 50_000_002
    assert json_size_floor([huge, huge], 1000) == 50_000_005  # stops once past the limit
    with pytest.raises(ResultTooLarge) as raised:
        encode_result({"report": huge}, 1 << 20)
    assert raised.value.at_least and raised.value.limit == 1 << 20
    assert str(raised.value).startswith("the return value is at least ")
    assert encode_result({"a": [1, 2]}, 1 << 20) == '{"a":[1,2]}'
    assert encode_result("x" * 100, 0) == '"' + "x" * 100 + '"'  # 0: no limit
