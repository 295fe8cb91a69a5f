"""Several schedulers at once with a paused target queue: still exactly one job per kept
occurrence, at most one pending job under ``when_paused="latest"``, and every skipped or coalesced
occurrence counted once."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction

from django_leasequeue import store
from django_leasequeue.models import Job, Schedule
from django_leasequeue.scheduler import SchedulerService, TickResult, occurrence_key

from .conftest import make_schedule, z
from .test_concurrency import run_together

pytestmark = pytest.mark.django_db(transaction=True)

START = z(2026, 7, 1, 9, 0, 0)
MIN = timedelta(minutes=1)
QUEUE = "reports"


def services(n: int) -> list[SchedulerService]:
    return [SchedulerService(sync=False, process_id=f"test:{i}") for i in range(n)]


def states(schedule: Schedule) -> list[tuple]:
    return list(Job.objects.filter(schedule=schedule).order_by("occurrence_at")
                .values_list("occurrence_at", "status", "unique_key"))


@pytest.mark.parametrize("policy", ["latest", "skip", "all"])
def test_four_schedulers_tick_a_paused_queue_together(policy):
    """Four schedulers released together on each of five minutes: latest leaves 4 cancelled and 1
    ready (one row per occurrence), skip none, all five ready; the counters match exactly."""
    schedule = make_schedule(cron="* * * * *", queue=QUEUE, last_occurrence_at=START, when_paused=policy)
    store.queue_pause(QUEUE)
    ticking = services(4)
    results: list[TickResult] = []
    for minute in range(1, 6):
        now = START + minute * MIN + timedelta(seconds=3)
        results += run_together(4, lambda i, now=now: ticking[i].tick(now=now + timedelta(milliseconds=100 * i)))
    assert all(r.errors == {} for r in results)
    expected = [START + m * MIN for m in range(1, 6)]
    status = {"latest": ["cancelled"] * 4 + ["ready"], "skip": [], "all": ["ready"] * 5}[policy]
    kept = expected if policy != "skip" else []
    assert states(schedule) == [(o, s, occurrence_key(schedule.pk, o)) for o, s in zip(kept, status, strict=True)]
    assert sorted(o for r in results for _, o in r.emitted) == kept  # each emitted by exactly one scheduler
    schedule.refresh_from_db()
    counts = {"latest": (0, 4), "skip": (5, 0), "all": (0, 0)}[policy]
    assert (schedule.paused_skipped, schedule.paused_coalesced) == counts
    assert len(schedule.paused_log) == sum(counts)
    assert sorted(o for r in results for _, o in r.coalesced + r.paused_skipped) == (
        expected[:-1] if policy == "latest" else expected if policy == "skip" else [])


def test_stale_schedulers_without_the_row_lock_keep_one_pending_job():
    """Four schedulers fire from the same stale read (no row lock, as test_concurrency does) with
    three occurrences due (catch_up="all"): the newest is inserted once, the two older ones are
    recorded as coalesced once (by the winner), and nothing else is inserted."""
    schedule = make_schedule(cron="*/5 * * * *", queue=QUEUE, catch_up="all", catch_up_limit=10,
                             last_occurrence_at=START)
    store.queue_pause(QUEUE)
    now = START + timedelta(minutes=16)
    with transaction.atomic():
        (row,) = store.schedule_lock_due(now=now)
    ticking = services(4)

    def fire(i: int) -> TickResult:
        with transaction.atomic():
            return ticking[i].fire([row], now)

    results = run_together(4, fire)
    newest = START + timedelta(minutes=15)
    assert states(schedule) == [(newest, "ready", occurrence_key(schedule.pk, newest))]
    assert [o for r in results for _, o in r.emitted] == [newest]
    schedule.refresh_from_db()
    assert schedule.paused_coalesced == 2
    assert [e["occurrence"] for e in schedule.paused_log] == [
        (START + timedelta(minutes=m)).isoformat() for m in (5, 10)]


def test_a_stale_scheduler_inserting_an_older_occurrence_cancels_its_own_job():
    """A scheduler that read the schedule before another one emitted a later occurrence inserts the
    older occurrence's job (its key is free) and then coalesces it: the newer job stays the one
    pending."""
    schedule = make_schedule(cron="* * * * *", queue=QUEUE, last_occurrence_at=START)
    store.queue_pause(QUEUE)
    with transaction.atomic():
        (stale,) = store.schedule_lock_due(now=START + MIN)
    a, b = services(2)
    a.tick(now=START + 2 * MIN + timedelta(seconds=1))  # catch_up latest: emits 09:02 only
    with transaction.atomic():
        late = b.fire([stale], START + MIN + timedelta(seconds=1))  # emits 09:01 from its stale read
    assert late.emitted == [(schedule.pk, START + MIN)]
    assert late.coalesced == [(schedule.pk, START + MIN)]
    assert [(o, s) for o, s, _ in states(schedule)] == [(START + MIN, "cancelled"), (START + 2 * MIN, "ready")]
    schedule.refresh_from_db()
    assert schedule.last_occurrence_at == START + 2 * MIN  # the advance stays monotonic
    assert schedule.paused_coalesced == 1
