"""Workers connected through PgBouncer: transaction mode with ``--no-notify``, session mode with
``LISTEN``. Ledger: jobs in = jobs done, one handler execution (``qa.Execution`` row) per job."""

import pytest
from django.db import connection
from qa.models import Execution

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
