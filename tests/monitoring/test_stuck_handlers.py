"""Stuck handlers (past their task's timeout, still running) as monitoring sees them: read from the
job rows, so any process (queuehealth, the metrics, the dashboard) shows them."""

from __future__ import annotations

import io
import json

from django.core.management import call_command
from django.urls import reverse

from django_leasequeue import enqueue, health, metrics, store
from tests.support import claim

DASHBOARD = reverse("admin:django_leasequeue_dashboard_changelist")


def test_stuck_handlers_are_counted_per_worker_in_the_snapshot_metrics_and_dashboard(now, admin_client):
    store.process_register(process_id="h:1:w", kind="worker", host="h", pid=1, queues=None, concurrency=2)
    store.process_register(process_id="h:2:v", kind="worker", host="h", pid=2, queues=None, concurrency=2)
    stuck, running, stale = (enqueue("qa.record", [str(n)]) for n in range(3))
    first = claim(limit=2, worker_id="h:1:w")
    assert [j.id for j in first] == [stuck.id, running.id]
    assert store.job_note_timed_out(stuck.id, first[0].lease_version, worker="h:1:w", timeout=1)
    # A note for an earlier attempt (token 1) no longer counts once the job was claimed again.
    (old,) = claim(worker_id="h:2:v")
    assert store.job_note_timed_out(stale.id, old.lease_version, worker="h:2:v", timeout=1)
    assert store.job_release([(stale.id, old.lease_version)]) == {stale.id}
    (again,) = claim(worker_id="h:2:v")
    assert again.lease_version == old.lease_version + 2

    snap = health.snapshot()
    assert snap.stuck_handlers == 1
    by_id = {w.id: w for w in snap.workers}
    assert (by_id["h:1:w"].stuck_handlers, by_id["h:2:v"].stuck_handlers) == (1, 0)
    assert by_id["h:1:w"].stuck_seconds >= 0.0
    assert snap.to_dict()["stuck_handlers"] == 1
    assert "leasequeue_stuck_handlers 1.0" in metrics.render().decode()
    html = admin_client.get(DASHBOARD).content.decode()
    assert "1 stuck handler<" in html and "1 stuck</span>" in html


def test_no_stuck_handler_is_zero_everywhere(now, admin_client):
    store.process_register(process_id="h:1:w", kind="worker", host="h", pid=1, queues=None, concurrency=2)
    enqueue("qa.record", ["x"])
    assert len(claim(worker_id="h:1:w")) == 1
    assert health.snapshot().stuck_handlers == 0
    assert "leasequeue_stuck_handlers 0.0" in metrics.render().decode()
    assert "stuck" not in admin_client.get(DASHBOARD).content.decode().split('id="lq-processes"')[1]


def test_queuehealth_max_stuck_alerts_on_stuck_handlers(now):
    """``queuehealth --max-stuck``: the stuck-handler count is a threshold like the others (exit 2
    above the critical limit, 1 above the warning, 0 within)."""
    store.process_register(process_id="h:1:w", kind="worker", host="h", pid=1, queues=None, concurrency=1)
    job = enqueue("qa.record", ["stuck"])
    (claimed,) = claim(worker_id="h:1:w")
    assert store.job_note_timed_out(job.id, claimed.lease_version, worker="h:1:w", timeout=1)
    codes, values = {}, []
    for limit in ("0", "0:2", "1"):
        out = io.StringIO()
        try:
            call_command("queuehealth", "--max-stuck", limit, "--json", stdout=out)
            codes[limit] = 0
        except SystemExit as exc:
            codes[limit] = exc.code
        values += [c["value"] for c in json.loads(out.getvalue())["checks"] if c["check"] == "stuck_handlers"]
    assert codes == {"0": 2, "0:2": 1, "1": 0}
    assert values == [1.0, 1.0, 1.0]
