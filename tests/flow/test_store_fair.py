"""Fair claiming (queue option ``fair``) at store level: round-robin across fair keys, the cursor,
keyless jobs, every eligibility rule of the plain claim, configuration errors."""

from __future__ import annotations

from datetime import timedelta

import pytest
from flowlab.tasks import customer_job, keyed_rate, rated_noop, tenant_job

from django_leasequeue import store
from django_leasequeue.conf import build
from django_leasequeue.enqueueing import build_job
from django_leasequeue.exceptions import ConfigurationError
from django_leasequeue.models import Job, QueueState

pytestmark = pytest.mark.django_db


def fill(tenant: str, n: int, start: int = 0, queue: str = "fair") -> None:
    store.job_insert([build_job(tenant_job, [tenant, start + i], queue=queue) for i in range(n)], notify=False,
                     channel="unused")


def claim(limit: int, now=None, queues=("fair",), fair=("fair",), **options):
    return store.job_claim(queues=list(queues), limit=limit, worker_id="t", lease=30, now=now, rate_limits={},
                           fair_queues=fair, **options)


def test_a_small_tenant_enqueued_after_a_large_backlog_is_served_in_the_first_claim():
    fill("big", 500)
    fill("small", 10, start=1000)
    jobs = claim(10)
    assert [(j.args[0], j.args[1]) for j in jobs] == [
        ("big", 0), ("small", 1000), ("big", 1), ("small", 1001), ("big", 2), ("small", 1002),
        ("big", 3), ("small", 1003), ("big", 4), ("small", 1004)]
    # The plain claim of the same queue takes the big tenant's oldest jobs only.
    plain = claim(10, fair=())
    assert {j.args[0] for j in plain} == {"big"}


def test_with_more_keys_than_the_batch_each_claim_serves_the_next_keys_round_robin():
    for t in range(7):
        fill(f"t{t}", 3, start=10 * t)
    first = claim(3)
    assert [j.args[0] for j in first] == ["t0", "t1", "t2"]
    assert QueueState.objects.get(name="fair").fair_cursor == "t2"
    second = claim(3)
    assert [j.args[0] for j in second] == ["t3", "t4", "t5"]
    third = claim(3)  # wraps round after the last key
    assert [j.args[0] for j in third] == ["t6", "t0", "t1"]
    assert [j.args[1] for j in third] == [60, 1, 11]
    assert Job.objects.filter(status="leased").count() == 9


def test_keyless_jobs_are_one_more_group_and_priority_orders_within_a_key():
    fill("a", 3)
    store.job_insert([build_job(rated_noop, [i], queue="fair") for i in range(3)], notify=False, channel="unused")
    store.job_insert([build_job(tenant_job, ["a", 99], queue="fair", priority=5)], notify=False, channel="unused")
    jobs = claim(4)
    assert [(j.task, j.args) for j in jobs] == [
        ("flowlab.rated_noop", [0]), ("flowlab.tenant_job", ["a", 99]),
        ("flowlab.rated_noop", [1]), ("flowlab.tenant_job", ["a", 0])]


def test_the_fair_key_defaults_to_the_concurrency_key():
    job = store.job_insert_one(build_job(customer_job, [], {"customer": "x", "seq": 1}), notify=False,
                               channel="unused")
    assert Job.objects.get(pk=job.pk).fair_key == "customer-x"
    assert Job.objects.get(pk=store.job_insert_one(build_job(tenant_job, ["y", 1]), notify=False,
                                                   channel="unused").pk).fair_key == "y"


def test_the_fair_claim_applies_the_plain_claims_rules():
    fill("a", 2)
    store.job_insert([build_job(tenant_job, ["late", 1], queue="fair", run_at=timedelta(hours=1))], notify=False,
                     channel="unused")
    # Not due, unknown task for this worker, and a paused queue: nothing of those is leased.
    assert [j.args for j in claim(10, tasks=["other.task"])] == []
    assert sorted(j.args[1] for j in claim(10)) == [0, 1]
    fill("b", 1)
    store.queue_pause("fair")
    assert claim(10) == []
    store.queue_resume("fair")
    assert [j.args for j in claim(10)] == [["b", 0]]
    assert Job.objects.get(args=["late", 1]).status == "ready"


def test_per_key_rate_limits_hold_in_a_fair_queue():
    store.job_insert([build_job(keyed_rate, ["a", i], queue="fair") for i in range(10)], notify=False,
                     channel="unused")
    t0 = store.db_now()
    assert len(claim(10, t0)) == 5
    assert claim(10, t0 + timedelta(seconds=0.5)) == []


def test_fair_and_plain_queues_are_claimed_in_one_call():
    fill("a", 5)
    fill("b", 5, queue="plain")
    jobs = claim(6, queues=("fair", "plain"))
    assert len(jobs) == 6
    assert Job.objects.filter(status="leased").count() == 6
    # Both parts take turns going first: over two claims each queue gets served.
    more = claim(4, queues=("fair", "plain"))
    assert {j.queue for j in jobs} | {j.queue for j in more} == {"fair", "plain"}


def test_fair_option_errors():
    assert build({"QUEUES": {"tenants": {"fair": True}}}).fair_queues == frozenset({"tenants"})
    with pytest.raises(ConfigurationError, match=r"\['fair'\] must be True or False, got 'yes'"):
        build({"QUEUES": {"tenants": {"fair": "yes"}}})
    with pytest.raises(ConfigurationError, match="'fair' and 'rate_limit' cannot be combined"):
        build({"QUEUES": {"tenants": {"fair": True, "rate_limit": "5/s"}}})


def test_a_fair_queue_keeps_the_sequence_rule_in_both_of_its_scans():
    # Fair-keyed jobs (the per-key scan) and keyless ones (the keyless group's scan), each in a
    # sequence: only the head of a sequence is claimed, whatever the round-robin offers.
    from flowlab.tasks import seq_step

    store.job_insert([build_job(tenant_job.using(sequence_key="s-fair"), ["a", i], queue="fair") for i in range(3)]
                     + [build_job(tenant_job.using(sequence_key="s-fair"), ["b", 10 + i], queue="fair")
                        for i in range(3)]
                     + [build_job(seq_step, [], {"account": "x", "n": i}, queue="fair") for i in range(3)],
                     notify=False, channel="unused")
    jobs = claim(10)
    assert sorted((j.task, j.args, j.kwargs.get("n")) for j in jobs) == [
        ("flowlab.seq_step", [], 0), ("flowlab.tenant_job", ["a", 0], None)]
    assert Job.objects.filter(status="leased").count() == 2
    assert claim(10) == []  # both heads are leased: nothing behind them may start
