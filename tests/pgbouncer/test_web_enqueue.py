"""A web process enqueuing through PgBouncer in transaction mode, the way views do: inside the
request's transaction (``transaction.atomic()``), after its commit (``enqueue_on_commit``), and a
request whose transaction rolls back. A worker through the same pgbouncer drains the queue.

Ledger: jobs in = committed requests, nothing from a rolled-back one, every job done with exactly
one handler execution (``qa.Execution``), one business row (``qa.Probe``) per committed request."""

import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection
from qa.models import Execution, Probe

from django_leasequeue.models import Job

from .conftest import _free_port

pytestmark = pytest.mark.process

PER_MODE = 40
CLIENTS = 4  # concurrent requests: runserver serves each on a thread with its own connection


def post(port: int, mode: str, tag: str) -> int:
    """POST one request to the web producer (``qa.views.enqueue_view``); return the status code."""
    data = urllib.parse.urlencode({"tag": tag}).encode()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/qa/enqueue/{mode}/", data=data, timeout=20) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def wait_listening(port: int, server, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if not server.running:
                break
            time.sleep(0.05)
    pytest.fail(f"runserver did not listen on {port}:\n{server.output()}")


def test_views_enqueue_through_transaction_pooling_and_a_rollback_enqueues_nothing(spawn, pgbouncer):
    bouncer = pgbouncer("transaction")
    port = _free_port()
    web = spawn("runserver", "--noreload", "--skip-checks", f"127.0.0.1:{port}",
                env={**bouncer.env(), "PGAPPNAME": "lq-web"})
    wait_listening(port, web)
    requests = [(mode, f"web-{mode}-{i}") for mode in ("atomic", "on_commit", "rollback") for i in range(PER_MODE)]
    with ThreadPoolExecutor(CLIENTS) as pool:
        codes = list(pool.map(lambda r: (r[0], post(port, *r)), requests))
    assert sorted(set(codes)) == [("atomic", 201), ("on_commit", 201), ("rollback", 409)], codes
    # The web process's connections are clients of this pgbouncer, not of PostgreSQL directly.
    # (columns 2 and 17 of SHOW CLIENTS: database, application_name)
    web_clients = [c for c in bouncer.admin("SHOW CLIENTS") if c[17] == "lq-web"]
    assert web_clients and {c[2] for c in web_clients} == {connection.settings_dict["NAME"]}, web_clients

    # The rolled-back requests left nothing: no job (neither the inserted one nor the on_commit
    # one), no business row.
    assert Job.objects.filter(task="qa.record", kwargs__tag__startswith="web-rollback").count() == 0
    assert Probe.objects.filter(kind="web-rollback").count() == 0
    assert Probe.objects.filter(kind="web-atomic").count() == PER_MODE
    assert Probe.objects.filter(kind="web-on_commit").count() == PER_MODE
    assert Job.objects.filter(task="qa.record", status="ready").count() == 2 * PER_MODE

    worker = spawn("runworker", "--burst", "--concurrency", "4", "--no-notify", env=bouncer.env())
    assert worker.wait(60) == 0, worker.output() + bouncer.output()
    assert Job.objects.filter(task="qa.record").count() == 2 * PER_MODE
    assert Job.objects.filter(task="qa.record", status="done").count() == 2 * PER_MODE
    for mode in ("atomic", "on_commit"):
        assert Execution.objects.filter(tag__startswith=f"web-{mode}-").count() == PER_MODE
        assert Execution.objects.filter(tag__startswith=f"web-{mode}-").values("tag").distinct().count() == PER_MODE
    assert Execution.objects.filter(tag__startswith="web-rollback").count() == 0
    assert Execution.objects.values("job_id").distinct().count() == 2 * PER_MODE
