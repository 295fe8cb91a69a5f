"""Workers connected through PgBouncer: transaction mode with ``--no-notify``, session mode with
``LISTEN``. Ledger: jobs in = jobs done, one handler execution (``qa.Execution`` row) per job."""

import psycopg
import pytest
from django.db import connection
from qa.models import Effect, Execution, Probe

from django_leasequeue import enqueue_many
from django_leasequeue.models import Job

pytestmark = pytest.mark.process

JOBS = 200


@pytest.mark.parametrize(("mode", "flags"), [("transaction", ["--no-notify"]), ("session", [])])
def test_burst_worker_through_pgbouncer_runs_every_job_once(spawn, pgbouncer, mode, flags):
    bouncer = pgbouncer(mode)
    assert enqueue_many("qa.record", [([], {"tag": f"pgb-{mode}"}) for _ in range(JOBS)]) == JOBS
    worker = spawn("runworker", "--burst", "--concurrency", "4", *flags, env=bouncer.env())
    assert worker.wait(60) == 0, worker.output() + bouncer.output()
    assert Job.objects.filter(task="qa.record", status="done").count() == JOBS
    assert Job.objects.filter(task="qa.record").exclude(status="done").count() == 0
    assert Execution.objects.filter(tag=f"pgb-{mode}").count() == JOBS
    assert Execution.objects.filter(tag=f"pgb-{mode}").values("job_id").distinct().count() == JOBS
    # The worker really went through this pgbouncer (not straight to PostgreSQL).
    assert f"db={connection.settings_dict['NAME']}" in bouncer.output(), bouncer.output()


def test_fenced_atomic_through_transaction_pooling(spawn, pgbouncer):
    """``fenced_atomic()`` (row lock, the handler's write, the completion: one transaction) keeps
    its guarantees when each transaction may get another server connection."""
    bouncer = pgbouncer("transaction")
    n = 100
    assert enqueue_many("qa.fenced_effect", [([], {"key": f"pgb-{i}"}) for i in range(n)]) == n
    worker = spawn("runworker", "--burst", "--concurrency", "4", "--no-notify", env=bouncer.env())
    assert worker.wait(60) == 0, worker.output() + bouncer.output()
    assert Job.objects.filter(task="qa.fenced_effect", status="done").count() == n
    assert Effect.objects.count() == n
    assert Effect.objects.values("key").distinct().count() == n
    assert Probe.objects.filter(kind="fenced", ok=True).count() == n
    assert Probe.objects.filter(ok=False).count() == 0
    assert Execution.objects.filter(tag__startswith="pgb-").count() == n
    assert f"db={connection.settings_dict['NAME']}" in bouncer.output(), bouncer.output()


def test_a_worker_leaves_no_session_setting_on_the_pooled_server_connection(spawn, pgbouncer):
    """One server connection for every client (pool size 1): whatever a worker's session leaves
    behind, the next client of the pool gets. After a worker claimed and ran jobs through it,
    the next client finds the server's settings as they were (the claim's ``SET LOCAL jit = off``
    ended with its transaction)."""
    bouncer = pgbouncer("transaction", pool_size=1)
    with psycopg.connect(dbname=connection.settings_dict["NAME"], host="127.0.0.1", port=bouncer.port,
                         user=connection.settings_dict["USER"], autocommit=True) as before:
        jit_before = before.execute("SHOW jit").fetchone()[0]
    assert enqueue_many("qa.record", [([], {"tag": "pgb-state"}) for _ in range(20)]) == 20
    worker = spawn("runworker", "--burst", "--concurrency", "2", "--no-notify", env=bouncer.env())
    assert worker.wait(60) == 0, worker.output() + bouncer.output()
    assert Execution.objects.filter(tag="pgb-state").count() == 20
    assert [row[0] for row in bouncer.admin("SHOW SERVERS")] == ["S"]  # still the one server connection
    with psycopg.connect(dbname=connection.settings_dict["NAME"], host="127.0.0.1", port=bouncer.port,
                         user=connection.settings_dict["USER"], autocommit=True) as after:
        assert after.execute("SHOW jit").fetchone()[0] == jit_before == "on"


def test_prepared_statements_through_a_small_transaction_pool(spawn, pgbouncer):
    """``PREPARED_STATEMENTS`` (on by default) behind transaction pooling: three worker processes
    and the enqueuing test share two server connections, so a client's next transaction often gets
    a server connection that lacks its statement, or that another client prepared it on already.
    Each refusal is answered in the next message (store/_prepared.py): every job runs once, with one
    claim, and the server connections end up holding the claim statement."""
    bouncer = pgbouncer("transaction", pool_size=2)
    dsn = {"dbname": connection.settings_dict["NAME"], "host": "127.0.0.1", "port": bouncer.port,
           "user": connection.settings_dict["USER"], "autocommit": True}
    # Two processes enqueue one job per call, in autocommit (each INSERT prepared), then three
    # workers drain: every process shares the same two server connections.
    singles = 60
    script = f"from qa.tasks import record\nfor _ in range({singles}): record.enqueue(tag='pgb-prepared')"
    enqueuers = [spawn("shell", "-c", script, env=bouncer.env()) for _ in range(2)]
    for enqueuer in enqueuers:
        assert enqueuer.wait(60) == 0, enqueuer.output() + bouncer.output()
    n = 2 * singles + 100
    assert enqueue_many("qa.record", [([], {"tag": "pgb-prepared"}) for _ in range(100)]) == 100
    assert Job.objects.filter(task="qa.record").count() == n
    workers = [spawn("runworker", "--burst", "--concurrency", "2", "--no-notify", env=bouncer.env()) for _ in range(3)]
    for worker in workers:
        assert worker.wait(90) == 0, worker.output() + bouncer.output()
    assert Execution.objects.filter(tag="pgb-prepared").count() == n
    assert Execution.objects.filter(tag="pgb-prepared").values("job_id").distinct().count() == n
    assert sorted(set(Job.objects.filter(task="qa.record").values_list("status", "lease_version", "attempts"))) == \
        [("done", 1, 1)]
    assert len(bouncer.admin("SHOW SERVERS")) <= 2
    with psycopg.connect(**dsn) as pooled:
        held = pooled.execute("SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'leasequeue_%'")
        held = held.fetchone()[0]
    assert held >= 1
