"""Queue rate limits in the claim (store level) and their configuration syntax."""

from __future__ import annotations

from datetime import timedelta

import pytest
from flowlab.tasks import rated_noop

from django_leasequeue import store
from django_leasequeue.conf import RateLimit, build, parse_rate
from django_leasequeue.enqueueing import build_job
from django_leasequeue.exceptions import ConfigurationError
from django_leasequeue.models import Job, QueueState

pytestmark = pytest.mark.django_db

RATE = {"rated": RateLimit(limit=5, per=1.0)}


def fill(n: int, queue: str = "rated") -> None:
    store.job_insert([build_job(rated_noop, [i], queue=queue) for i in range(n)], notify=False, channel="unused")


def claim(limit: int, now, queues=("rated",), rates=RATE):
    return store.job_claim(queues=list(queues) if queues is not None else None, limit=limit, worker_id="t",
                           lease=30, now=now, rate_limits=rates)


@pytest.mark.parametrize("text, expected", [("100/m", RateLimit(100, 60.0)), ("20/s", RateLimit(20, 1.0)),
                                            (" 5 / h ", RateLimit(5, 3600.0))])
def test_rate_syntax(text, expected):
    assert parse_rate(text) == expected
    assert build({"QUEUES": {"emails": {"rate_limit": text}}}).rate_limits == {"emails": expected}


@pytest.mark.parametrize("bad", ["100", "100/d", "0/s", "-1/s", "1.5/s", 100, "ten/m", "100/min"])
def test_rate_syntax_errors_are_clear(bad):
    with pytest.raises(ConfigurationError, match=r"QUEUES'\]\['emails'\]\['rate_limit'\] must be a string 'N/s'"):
        build({"QUEUES": {"emails": {"rate_limit": bad}}})


def test_unknown_queue_option_suggests_the_right_one():
    with pytest.raises(ConfigurationError, match="did you mean 'rate_limit'"):
        build({"QUEUES": {"emails": {"ratelimit": "1/s"}}})
    with pytest.raises(ConfigurationError, match="must be a dict of options"):
        build({"QUEUES": {"emails": "100/m"}})


def test_claims_stop_at_the_limit_and_resume_when_the_window_slides():
    fill(20)
    t0 = store.db_now()
    first = claim(3, t0)
    assert len(first) == 3 and first.throttled == {}
    second = claim(8, t0 + timedelta(seconds=0.4))
    assert len(second) == 2  # 5 per second
    assert second.throttled == {"rated": pytest.approx(0.6, abs=1e-6)}  # the first claim leaves at t0 + 1 s
    assert claim(8, t0 + timedelta(seconds=0.9)) == []
    # The window is closed: a claim exactly one second after t0 still counts t0's claims.
    assert claim(8, t0 + timedelta(seconds=1.0)) == []
    third = claim(8, t0 + timedelta(seconds=1.0001))
    assert len(third) == 3  # t0's 3 left the window; t0+0.4's 2 are still in it
    assert len(claim(8, t0 + timedelta(seconds=1.4001))) == 2
    # Nothing failed or was charged an attempt while waiting.
    assert Job.objects.filter(status="ready", attempts=0).count() == 10
    state = QueueState.objects.get(name="rated")
    assert sum(c for _, c in state.rate_log) <= 5
    assert state.throttled_total >= 3


def test_limit_holds_in_every_window_with_uneven_claims():
    fill(60)
    t0 = store.db_now()
    stamps = []
    for step in range(60):
        now = t0 + timedelta(seconds=step * 0.13)
        stamps += [now] * len(claim(3, now))
    stamps.sort()
    for i, start in enumerate(stamps):
        inside = [s for s in stamps[i:] if s <= start + timedelta(seconds=1)]
        assert len(inside) <= 5


def test_unlimited_queues_are_not_slowed_and_any_queue_claims_respect_the_limit():
    fill(10)
    fill(10, queue="plain")
    now = store.db_now()
    got = claim(20, now, queues=None)  # '*': the rated queue gives 5, the plain one all 10
    by_queue = {q: sum(1 for c in got if c.queue == q) for q in ("rated", "plain")}
    assert by_queue == {"rated": 5, "plain": 10}
    assert set(got.throttled) == {"rated"}
    assert claim(20, now, queues=("rated", "plain")) == []


def test_paused_rated_queue_is_not_claimed_and_logs_nothing():
    fill(3)
    store.queue_pause("rated")
    now = store.db_now()
    assert claim(5, now) == []
    store.queue_resume("rated")
    assert len(claim(5, now)) == 3
    assert QueueState.objects.get(name="rated").rate_log[0][1] == 3


def test_log_stays_small_and_merging_never_lets_an_extra_claim_through():
    """200 single-job claims 0.4 s apart under 50/m: the log keeps at most ~101 entries, and no
    60-second window of the real claim times holds more than 50."""
    fill(200)
    rates = {"rated": RateLimit(limit=50, per=60.0)}
    t0 = store.db_now()
    stamps = []
    for step in range(200):
        now = t0 + timedelta(seconds=step * 0.4)
        stamps += [now] * len(claim(1, now, rates=rates))
        assert len(QueueState.objects.get(name="rated").rate_log) <= 101
    assert 50 < len(stamps) <= 100  # 80 s of claims: the first minute's 50, then slots as they free
    for i, start in enumerate(stamps):
        assert sum(1 for s in stamps[i:] if s <= start + timedelta(seconds=60)) <= 50
