"""The chart counters' ledger while they are folded as fast as they are written: two real worker
processes drain 600 jobs (a tenth of them failing twice first) while this process folds everything
in a tight loop (a far-future now: every row, the current minute's too, is rolled into day rows)
and sums the totals. No read ever exceeds the final totals, and the final totals equal the rows."""

import signal
import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connections
from django.db.models import Sum

from django_leasequeue import enqueue_many, store
from django_leasequeue.models import Job, JobStat
from tests.support import wait_for

pytestmark = [pytest.mark.process]

SUCCESS, FLAKY = 540, 60
SINCE = datetime(2000, 1, 1, tzinfo=UTC)


def sums() -> tuple[int, int, int]:
    rows = store.stat_totals(since=SINCE)
    return sum(r.started for r in rows), sum(r.done for r in rows), sum(r.failed for r in rows)


def test_counters_folded_while_real_workers_drain_equal_the_rows(spawn):
    assert enqueue_many("qa.record", [[f"ok-{i}"] for i in range(SUCCESS)]) == SUCCESS
    assert enqueue_many("qa.flaky", [([], {"failures": 2}) for _ in range(FLAKY)]) == FLAKY
    far = store.db_now() + timedelta(days=30)
    stop = threading.Event()
    reads: list[tuple[int, int, int]] = []
    folds: list[bool] = []
    errors: list[BaseException] = []

    def fold_and_read() -> None:
        try:
            while not stop.is_set():
                folds.append(store.stat_fold(retention=400 * 86400, now=far).locked)
                reads.append(sums())
        except BaseException as exc:  # reported after the join
            errors.append(exc)
        finally:
            connections.close_all()

    folder = threading.Thread(target=fold_and_read)
    folder.start()
    workers = [spawn("runworker", "--concurrency", "4", "--worker-id", f"f{i}",
                     env={"LEASEQUEUE_POLL_INTERVAL": "0.2", "LEASEQUEUE_BACKOFF_BASE": "0.05"}) for i in range(2)]
    try:
        wait_for(lambda: Job.objects.filter(status="done").count() == SUCCESS + FLAKY, timeout=180, interval=0.2,
                 what="the queue to drain")
    finally:
        stop.set()
        folder.join(60)
    for w in workers:
        w.signal(signal.SIGTERM)
    assert [w.wait(60) for w in workers] == [0, 0]
    assert errors == []

    attempts = Job.objects.aggregate(n=Sum("attempts"))["n"]
    assert attempts == SUCCESS + 3 * FLAKY
    final = sums()
    assert final == (attempts, SUCCESS + FLAKY, 2 * FLAKY)
    assert len(folds) > 20 and any(folds)
    assert all(all(a <= b for a, b in zip(read, final, strict=True)) for read in reads)
    store.stat_fold(retention=400 * 86400, now=far)
    assert set(JobStat.objects.values_list("span", "shard")) == {(86400, 0)}
    assert sums() == final
