"""Per-key rate limits (task options rate_key/rate_limit) in the claim, at store level: the
allowance per key across claims and workers, the conservative accounting, pruning, and bad input."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connections
from flowlab.tasks import keyed_rate, rated_noop

from django_leasequeue import store, task
from django_leasequeue.conf import RateLimit
from django_leasequeue.enqueueing import build_job
from django_leasequeue.exceptions import ConfigurationError, EnqueueError
from django_leasequeue.models import Job, RateKeyState

pytestmark = pytest.mark.django_db


def fill(customer: str, n: int, start: int = 0) -> None:
    store.job_insert([build_job(keyed_rate, [customer, start + i]) for i in range(n)], notify=False,
                     channel="unused")


def claim(limit: int, now, queues=("flow",), **options):
    return store.job_claim(queues=list(queues), limit=limit, worker_id="t", lease=30, now=now, rate_limits={},
                           fair_queues=(), **options)


def by_customer(jobs) -> dict[str, int]:
    counts: dict[str, int] = {}
    for job in jobs:
        counts[job.args[0]] = counts.get(job.args[0], 0) + 1
    return counts


def test_the_job_row_carries_the_key_and_the_limit():
    job = store.job_insert_one(build_job(keyed_rate, ["acme", 1]), notify=False, channel="unused")
    row = Job.objects.get(pk=job.pk)
    assert (row.rate_key, row.rate_limit_n, row.rate_limit_secs) == ("customer-acme", 5, 1.0)
    plain = store.job_insert_one(build_job(rated_noop, [1]), notify=False, channel="unused")
    assert Job.objects.filter(pk=plain.pk).values_list("rate_key", "rate_limit_n", "rate_limit_secs").get() == (
        None, None, None)


def test_each_key_gets_its_own_allowance_and_it_slides_with_the_window():
    fill("a", 20)
    fill("b", 3, start=100)
    t0 = store.db_now()
    first = claim(50, t0)
    # 5 of a (its limit per second), all 3 of b; a's backlog does not cost b anything.
    assert sorted(j.args[1] for j in first) == [0, 1, 2, 3, 4, 100, 101, 102]
    assert claim(50, t0 + timedelta(seconds=0.5)) == []
    # The window is closed: exactly one second later t0's claims still count.
    assert claim(50, t0 + timedelta(seconds=1.0)) == []
    again = claim(50, t0 + timedelta(seconds=1.02))
    assert [j.args[1] for j in again] == [5, 6, 7, 8, 9]
    log = store.rate_key_log("customer-a")
    assert log is not None and sum(c for _, c in log) == 5  # t0's entry has left the window
    assert Job.objects.filter(status="ready", rate_key="customer-a").count() == 10


def test_admissions_within_one_claim_and_across_claims_add_up():
    fill("a", 12)
    t0 = store.db_now()
    assert len(claim(2, t0)) == 2
    assert len(claim(2, t0 + timedelta(seconds=0.1))) == 2
    assert len(claim(10, t0 + timedelta(seconds=0.2))) == 1  # 5 in the window: 2 + 2 + 1
    assert sum(c for _, c in store.rate_key_log("customer-a") or []) == 5


def test_a_used_up_key_is_not_probed_again_in_the_same_claim():
    """The closed-key list: after the key is used up, its remaining backlog is rejected inline; a
    keyless job behind the backlog is still found in the same claim."""
    fill("a", 300)
    store.job_insert([build_job(rated_noop, [1], queue="flow")], notify=False, channel="unused")
    cur = connections["default"].cursor()
    cur.execute("SET LOCAL track_functions = 'pl'")  # the test's transaction: counts calls below
    t0 = store.db_now()
    jobs = claim(10, t0)
    assert sorted((j.task, j.args[-1]) for j in jobs) == sorted(
        [("flowlab.keyed_rate", i) for i in range(5)] + [("flowlab.rated_noop", 1)])
    cur.execute("SELECT calls FROM pg_stat_xact_user_functions WHERE funcname = 'leasequeue_rate_admit'")
    assert cur.fetchone()[0] == 5  # five admissions, then the key is closed: no call for the other 295


@pytest.mark.django_db(transaction=True)
def test_a_row_locked_by_another_transaction_is_skipped_and_its_admission_counted():
    """SKIP LOCKED after admission: the locked row's admission stays counted (never over the limit)."""
    fill("a", 6)
    first_id = Job.objects.filter(rate_key="customer-a").order_by("id").values_list("id", flat=True)[0]
    from tests.flow.conftest import raw_connection

    with raw_connection() as other:
        other.autocommit = False
        other.execute("SELECT id FROM leasequeue_job WHERE id = %s FOR UPDATE", [first_id])
        t0 = store.db_now()
        jobs = claim(10, t0)
        other.rollback()
    assert len(jobs) == 4 and first_id not in {j.id for j in jobs}
    assert sum(c for _, c in store.rate_key_log("customer-a") or []) == 5


@pytest.mark.django_db(transaction=True)
def test_two_workers_claiming_at_once_never_exceed_a_keys_limit():
    fill("a", 40)
    t0 = store.db_now()
    barrier = threading.Barrier(8)
    got: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        try:
            barrier.wait()
            for _ in range(5):
                jobs = claim(3, t0)
                with lock:
                    got.extend(j.id for j in jobs)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == len(set(got)) == 5


def test_old_rate_key_rows_are_pruned():
    fill("a", 2)
    fill("b", 2)
    t0 = store.db_now()
    assert len(claim(10, t0)) == 4
    assert RateKeyState.objects.count() == 2
    assert store.rate_key_prune(now=t0 + timedelta(seconds=0.5)) == 0
    assert store.rate_key_prune(now=t0 + timedelta(seconds=1.5)) == 2
    assert RateKeyState.objects.count() == 0


def test_bad_rate_options_are_refused_at_declaration():
    with pytest.raises(ConfigurationError, match="rate_key and rate_limit go together"):
        task(name="t.bad1", rate_key="{x}")(lambda x: x)
    with pytest.raises(ConfigurationError, match=r"task 't.bad2': rate_limit must be a string 'N/s'"):
        task(name="t.bad2", rate_key="{x}", rate_limit="10/d")(lambda x: x)
    with pytest.raises(ConfigurationError, match="rate_key must be a str.format template or a callable"):
        task(name="t.bad3", rate_key=5, rate_limit="10/s")(lambda x: x)  # type: ignore[arg-type]


def test_a_key_that_fails_on_the_arguments_is_refused_at_enqueue():
    spec = task(name="t.keyed_rate_bad", queue="flow", rate_key="{customer}", rate_limit="1/s")(
        lambda **kwargs: 1)
    with pytest.raises(EnqueueError, match=r"rate_key failed on these arguments: KeyError\('customer'\)"):
        build_job(spec, [], {"other": 1})
    with pytest.raises(EnqueueError, match="rate_key must be a non-empty str"):
        build_job(spec, [], {"customer": ""})
    assert Job.objects.count() == 0


def test_the_queue_rate_limit_and_the_key_rate_limit_hold_together():
    fill("a", 10)
    fill("b", 10, start=100)
    t0 = store.db_now()
    jobs = store.job_claim(queues=["flow"], limit=50, worker_id="t", lease=30, now=t0,
                           rate_limits={"flow": RateLimit(limit=7, per=1.0)}, fair_queues=())
    assert len(jobs) == 7
    counts: dict[str, int] = {}
    for j in jobs:
        counts[j.args[0]] = counts.get(j.args[0], 0) + 1
    assert counts == {"a": 5, "b": 2}


def test_the_reapers_prune_beat_prunes_rate_key_rows():
    from django_leasequeue import reaper
    from django_leasequeue.conf import get_settings

    fill("a", 1)
    t0 = store.db_now()
    assert len(claim(10, t0)) == 1
    reaper.prune_processes(get_settings(), now=t0 + timedelta(seconds=2))
    assert RateKeyState.objects.count() == 0


def test_using_overrides_the_keys_and_the_limit_for_one_enqueue():
    job = keyed_rate.using(rate_key="vip-{x}", rate_limit="100/m", fair_key="tenant-1").enqueue("a", 1)
    row = Job.objects.get(pk=job.pk)
    assert (row.rate_key, row.rate_limit_n, row.rate_limit_secs, row.fair_key) == ("vip-{x}", 100, 60.0, "tenant-1")
    plain = keyed_rate.using(rate_key=None, rate_limit=None).enqueue("a", 2)
    assert Job.objects.filter(pk=plain.pk).values_list("rate_key", "rate_limit_n").get() == (None, None)
    with pytest.raises(EnqueueError, match="rate_key and rate_limit go together"):
        rated_noop.using(rate_key="k")
    with pytest.raises(EnqueueError, match=r"rate_limit must be a string 'N/s'"):
        keyed_rate.using(rate_limit="5/d")
    with pytest.raises(EnqueueError, match="fair_key must be a non-empty str"):
        keyed_rate.using(fair_key="")
