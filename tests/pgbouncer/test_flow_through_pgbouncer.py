"""Concurrency and rate limits with workers connected through PgBouncer in transaction mode.

Both admissions serialise the claimers of a key with ``pg_try_advisory_xact_lock`` and pass what
one claim found full to its later rows with ``set_config(..., true)``: transaction-scoped state,
released at the claim's commit on whichever server connection ran it. Nothing of it outlives a
transaction, so a pooler that hands each transaction another server connection cannot break a
limit. These tests measure that: the handlers' own ledger for concurrency (database-clock start
and end of every execution), the claim times for rates."""

import json
import signal
from datetime import timedelta

import pytest
from flowlab.tasks import keyed_rate, rated_noop

from django_leasequeue import enqueue_many
from django_leasequeue.models import Job
from tests.support import wait_for
from tests.support.chaos.harness import Fleet, execution_books

pytestmark = pytest.mark.process


def busiest_window(stamps: list, seconds: float = 1.0) -> int:
    """The most claim times (``attempted_at``) in any window of ``seconds`` that starts at one."""
    stamps = sorted(stamps)
    width = timedelta(seconds=seconds)
    return max(sum(1 for t in stamps[i:] if t < start + width) for i, start in enumerate(stamps))


def test_concurrency_limit_2_holds_across_2_workers_of_4_threads(spawn, pgbouncer):
    bouncer = pgbouncer("transaction")
    keys, per_key = 3, 16
    # Not --burst: a worker whose claim finds every key full finds nothing to claim, and a burst
    # would end. Both are registered (claiming) before the jobs arrive, so both take part.
    fleet = Fleet(spawn, concurrency=4, prefix="lim", args=("--no-notify",),
                  env={**bouncer.env(), "LEASEQUEUE_POLL_INTERVAL": "0.05"})
    members = [fleet.start() for _ in range(2)]
    fleet.wait_registered()
    assert enqueue_many("qa.limited", [([], {"key": f"k{k}"}) for k in range(keys) for _ in range(per_key)]) \
        == keys * per_key
    wait_for(lambda: Job.objects.filter(status="done").count() == keys * per_key, timeout=30, interval=0.1,
             what=f"{keys * per_key} limited jobs done")
    exits = fleet.stop()
    assert all(code == 0 for code, _ in exits.values()), [m.proc.output() for m in members]
    ids = list(Job.objects.filter(task="qa.limited").values_list("id", flat=True))
    assert Job.objects.filter(task="qa.limited", status="done", attempts=1).count() == keys * per_key
    books = execution_books(ids)
    assert books.executions == keys * per_key
    assert books.returned == keys * per_key
    assert books.overlaps == 0
    assert books.max_per_key == {f"limited-k{k}": 2 for k in range(keys)}, books.max_per_key
    # Both workers took part: the limit held across processes, not only between one's threads.
    assert {w.rsplit(":", 1)[1] for w in Job.objects.filter(task="qa.limited").values_list("leased_by", flat=True)} \
        == {"lim1", "lim2"}
    print(f"\nconcurrency limit 2 through pgbouncer: {books.executions} executions, peak per key "
          f"{books.max_per_key}, peak per process {sorted(books.max_per_process.values())}")


def test_queue_and_key_rate_limits_hold(spawn, pgbouncer):
    """A queue limited to 20/s and a key limited to 5/s (``flowlab.keyed_rate``): no one-second
    window of claim times holds more than the limit, and no job fails."""
    bouncer = pgbouncer("transaction")
    env = {**bouncer.env(), "LEASEQUEUE_QUEUES": json.dumps({"rated": {"rate_limit": "20/s"}, "flow": {}}),
           "LEASEQUEUE_POLL_INTERVAL": "0.1"}
    assert enqueue_many(rated_noop, [[i] for i in range(60)]) == 60
    assert enqueue_many(keyed_rate, [["acme", i] for i in range(15)]) == 15
    # Not --burst: a worker whose claim is throttled finds nothing to claim, and a burst would end.
    workers = [spawn("runworker", "--queues", "rated,flow", "--concurrency", "4", "--no-notify",
                     "--worker-id", f"rate{i}", env=env) for i in range(2)]
    wait_for(lambda: Job.objects.filter(status="done").count() == 75, timeout=30, interval=0.1,
             what="75 rate-limited jobs done")
    for w in workers:
        w.signal(signal.SIGTERM)
    for w in workers:
        assert w.wait(30) == 0, w.output() + bouncer.output()
    rated = list(Job.objects.filter(task=rated_noop.name).values_list("status", "attempts", "attempted_at"))
    keyed = list(Job.objects.filter(task=keyed_rate.name).values_list("status", "attempts", "attempted_at"))
    assert {(s, a) for s, a, _ in rated} == {("done", 1)} and len(rated) == 60
    assert {(s, a) for s, a, _ in keyed} == {("done", 1)} and len(keyed) == 15
    queue_worst = busiest_window([t for _, _, t in rated])
    key_worst = busiest_window([t for _, _, t in keyed])
    assert queue_worst <= 20, queue_worst
    assert key_worst <= 5, key_worst
    # The limits were reached (the windows were full), not merely never approached.
    assert queue_worst == 20 and key_worst == 5
    span = (max(t for _, _, t in rated) - min(t for _, _, t in rated)).total_seconds()
    assert span >= 60 / 20 - 1 - 0.05  # 40 claims after the first window need at least 2 s
    print(f"\nrate limits through pgbouncer: 60 jobs at 20/s over {span:.2f} s (busiest 1 s window "
          f"{queue_worst}), 15 jobs of one key at 5/s (busiest window {key_worst})")
