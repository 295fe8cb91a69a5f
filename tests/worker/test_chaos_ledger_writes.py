"""Self-test of the execution ledger's writer (``testproject/qa/ledger.py``): an event must reach
the books exactly once whatever the connection does, or the chaos suite's counts measure the
ledger instead of the queue.

Found in the PgBouncer restart run (``tests/pgbouncer/test_chaos_pgbouncer.py``), where about one
run in three lost part of a worker's ledger: a start whose INSERT committed while its reply was
lost with the connection went to the pending queue like a write that never reached the server,
and its second INSERT hit the unique ``key`` forever, blocking every later event of that process
behind it until they were dropped at exit (done jobs without a returned execution). And beside
the background flusher, the flush at exit popped the events the other had just written.
"""

import threading
import uuid
from datetime import UTC, datetime

import pytest
from qa import ledger
from qa.models import LedgerEntry

from django_leasequeue.context import JobContext
from tests.support import wait_for
from tests.support.lost_reply import default_connection_through_relay

pytestmark = [pytest.mark.chaos, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _fresh_writer():
    """No events or connections of another test: the writer's state is per process."""
    ledger._pending.clear()
    yield
    ledger._pending.clear()
    for holder in (ledger._local, ledger._flusher_conn):
        if getattr(holder, "conn", None) is not None:
            holder.conn.close()
            holder.conn = None


def context(job_id: int) -> JobContext:
    return JobContext(job_id=job_id, task="qa.chaos", queue="default", attempt=1, max_attempts=3, lease_version=1,
                      worker_id="test:0:t", leased_until=datetime.now(UTC), lease_seconds=30.0)


def test_a_start_whose_reply_was_lost_is_written_once_and_blocks_no_later_event():
    with default_connection_through_relay() as relay:
        relay.lose_reply_to(b"INSERT INTO qa_ledgerentry")
        first = ledger.start(context(1), "qa.chaos")  # committed; the writer only saw the connection drop
        assert relay.lost == 1
        assert ledger._pending  # queued, to be written again
        ledger.finish(first, "returned")
        second = ledger.start(context(2), "qa.chaos")
        ledger.finish(second, "returned")
        wait_for(lambda: not ledger._pending, timeout=10, what="the pending events to be written")
    rows = dict(LedgerEntry.objects.values_list("job_id", "outcome"))
    assert rows == {1: "returned", 2: "returned"}


def test_the_flush_at_exit_beside_the_flusher_thread_writes_every_event(monkeypatch):
    """At exit the writer flushes what is pending while its background flusher thread may be in
    the middle of a write (waiting on a connection): both must not write and pop at once.

    The interleaving is forced: the flusher thread ("A") is held inside its write of the first
    event until the exit flush ("B") has written that event too, popped it and read the next.
    Then the first event was written twice, and each write pops one event: without one flush at a
    time, one of the six events is popped unwritten, or (when the flushes take turns so that each
    pops what it holds) a flush pops an empty queue and dies with IndexError (the flusher thread,
    for good). With one flush at a time, B waits for A's flush to end and finds nothing left (A
    waits 0.5 s for a B that cannot come)."""
    keys = [str(uuid.uuid4()) for _ in range(3)]
    for job_id, key in enumerate(keys, 1):
        head = (key, job_id, 1, 1, "qa.chaos", "test:0:t", 1, "")
        ledger._pending.append((ledger._START, (*head, None, "db")))
        ledger._pending.append((ledger._RETURN, (None, "db", "returned", key)))
    flush, write = ledger._flush_pending, ledger._execute
    monkeypatch.setattr(ledger, "_flush_pending", lambda: True)  # a flusher thread of an earlier test idles
    a_writing, a_go, a_next = threading.Event(), threading.Event(), threading.Event()
    calls: dict[str, int] = {"A": 0, "B": 0}

    def execute(holder, sql, params):
        name = threading.current_thread().name
        calls[name] += 1
        if name == "A" and calls["A"] == 1:
            a_writing.set()
            a_go.wait(0.5)  # held inside its first write
        elif name == "A" and calls["A"] == 2:
            a_next.set()
        elif name == "B" and calls["B"] == 2:
            a_go.set()  # B has popped the first event and read the second: let A finish its write
            a_next.wait(0.5)
        return write(holder, sql, params)

    monkeypatch.setattr(ledger, "_execute", execute)
    results: dict[str, object] = {}

    def run() -> None:
        try:
            results[threading.current_thread().name] = flush()
        except Exception as exc:  # noqa: BLE001 - the flush's failure is the finding
            results[threading.current_thread().name] = exc

    a = threading.Thread(target=run, name="A")
    a.start()
    assert a_writing.wait(10)
    b = threading.Thread(target=run, name="B")
    b.start()
    for t in (a, b):
        t.join(30)
    assert results == {"A": True, "B": True}
    assert not ledger._pending
    assert sorted(LedgerEntry.objects.values_list("job_id", "outcome")) == [(1, "returned"), (2, "returned"),
                                                                            (3, "returned")]


def test_the_writer_prepares_no_statement_on_the_server():
    """psycopg prepares a query run five times; behind PgBouncer in transaction mode the next run
    may get a server connection that lacks it ("prepared statement _pg3_0 does not exist")."""
    conn = ledger._connect()
    try:
        assert conn.prepare_threshold is None
    finally:
        conn.close()
