"""Several schedulers at once, in threads (case C14): one job per occurrence, and losing the race is
quiet. The unique key does the work, not the row lock: the second test bypasses the lock."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction

from django_leasequeue import store
from django_leasequeue.models import Job, Schedule
from django_leasequeue.scheduler import SchedulerService, TickResult, occurrence_key

from .conftest import make_schedule, z

pytestmark = pytest.mark.django_db(transaction=True)


def run_together(n: int, work) -> list:
    """Run ``work(i)`` in ``n`` threads released together by a barrier; return the results."""
    barrier = threading.Barrier(n)
    results: list = [None] * n
    failures: list[BaseException] = []

    def target(i: int) -> None:
        try:
            barrier.wait(10)
            results[i] = work(i)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if failures:
        raise failures[0]
    return results


def test_c14_two_schedulers_tick_the_same_occurrence(caplog):
    """C14: ``* * * * *`` ticked by two schedulers released together, for three minutes: three jobs,
    one per occurrence, keyed by the cron instant; no ERROR, no traceback."""
    start = z(2026, 7, 1, 9, 0, 0)
    schedule = make_schedule(cron="* * * * *", last_occurrence_at=start)
    services = [SchedulerService(sync=False, process_id=f"test:{i}") for i in range(2)]
    results: list[TickResult] = []
    with caplog.at_level(logging.DEBUG, logger="django_leasequeue"):
        for minute in (1, 2, 3):
            # Both notice the occurrence at different wall-clock moments within the minute.
            now = start + timedelta(minutes=minute, seconds=7)
            results += run_together(2, lambda i, now=now: services[i].tick(now=now + timedelta(milliseconds=300 * i)))
    expected = [start + timedelta(minutes=m) for m in (1, 2, 3)]
    jobs = list(Job.objects.filter(schedule=schedule).order_by("occurrence_at"))
    assert [j.occurrence_at for j in jobs] == expected
    assert [j.unique_key for j in jobs] == [occurrence_key(schedule.pk, o) for o in expected]
    assert sorted(o for r in results for _, o in r.emitted) == expected  # each emitted by exactly one
    assert all(r.errors == {} for r in results)
    assert [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info] == []
    schedule.refresh_from_db()
    assert (schedule.last_occurrence_at, schedule.next_occurrence_at, schedule.skipped_occurrences) == (
        expected[-1], start + timedelta(minutes=4), 0)


def test_unique_key_alone_keeps_one_job_per_occurrence(caplog):
    """Four schedulers that all read the schedule before any of them wrote (no row lock: the worst
    interleaving the lock would otherwise hide) insert each occurrence once, and the schedule's
    bookkeeping ends where one scheduler alone would leave it."""
    start = z(2026, 7, 1, 9, 0, 0)
    schedule = make_schedule(cron="*/5 * * * *", catch_up="all", catch_up_limit=10, last_occurrence_at=start)
    with transaction.atomic():
        (row,) = store.schedule_lock_due(now=start + timedelta(minutes=16))  # a snapshot; lock released
    now = start + timedelta(minutes=16)
    services = [SchedulerService(sync=False, process_id=f"test:{i}") for i in range(4)]

    def fire(i: int) -> TickResult:
        with transaction.atomic():
            return services[i].fire([row], now)

    with caplog.at_level(logging.DEBUG, logger="django_leasequeue"):
        results = run_together(4, fire)
    expected = [start + timedelta(minutes=m) for m in (5, 10, 15)]
    assert list(Job.objects.filter(schedule=schedule).order_by("occurrence_at")
                .values_list("occurrence_at", flat=True)) == expected
    assert sorted(o for r in results for _, o in r.emitted) == expected
    assert sum(len(r.duplicates) for r in results) == 3 * 3  # the three losers, three occurrences each
    assert [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info] == []
    assert any("already emitted" in r.getMessage() and r.levelno == logging.DEBUG for r in caplog.records)
    schedule = Schedule.objects.get(pk=schedule.pk)
    assert (schedule.last_occurrence_at, schedule.next_occurrence_at) == (expected[-1], start + timedelta(minutes=20))
    # A stale scheduler replaying the same read later changes nothing either.
    with transaction.atomic():
        late = services[0].fire([row], now + timedelta(seconds=5))
    assert late.emitted == [] and len(late.duplicates) == 3
    assert Job.objects.filter(schedule=schedule).count() == 3
    schedule.refresh_from_db()
    assert schedule.last_occurrence_at == expected[-1]


def test_save_racing_a_tick_never_rewinds_the_scheduler():
    """An admin save and a scheduler tick on another connection: the tick commits while save() runs
    (between its read of the row and its write). The save must not put the scheduler's bookkeeping
    back (last occurrence NULL, next occurrence 10:00, already emitted): once the finished 10:00 job
    has been pruned, that occurrence would be emitted a second time."""
    schedule = make_schedule(cron="0 * * * *")
    Schedule.objects.filter(pk=schedule.pk).update(next_occurrence_at=z(2026, 2, 1, 10))
    form = Schedule.objects.get(pk=schedule.pk)  # what the admin's change view loads
    emitted: list = []

    def prune_finished() -> None:
        # The retention sweep deleted the finished job: its unique key no longer stops a repeat.
        Job.objects.filter(schedule_id=schedule.pk).delete()

    def tick_on_another_connection(sender, instance, **kwargs) -> None:
        if instance.pk != schedule.pk:
            return
        service = SchedulerService(sync=False, process_id="test:racing")
        results = run_together(1, lambda i: service.tick(now=z(2026, 2, 1, 10, 0, 1)))
        emitted.extend(results[0].emitted)

    from django.db.models.signals import pre_save

    pre_save.connect(tick_on_another_connection, sender=Schedule, dispatch_uid="lq-test-racing-tick")
    try:
        form.priority = 5
        form.save()
    finally:
        pre_save.disconnect(dispatch_uid="lq-test-racing-tick")
    prune_finished()
    following = SchedulerService(sync=False, process_id="test:next")
    for second in (2, 3):
        emitted.extend(following.tick(now=z(2026, 2, 1, 10, 0, second)).emitted)
        prune_finished()
    row = Schedule.objects.get(pk=schedule.pk)
    # The racing tick skips the row the save holds locked (the save never writes the bookkeeping
    # back), and the next tick emits 10:00 once.
    assert emitted == [(schedule.pk, z(2026, 2, 1, 10))]
    assert (row.priority, row.last_occurrence_at, row.next_occurrence_at) == (
        5, z(2026, 2, 1, 10), z(2026, 2, 1, 11))
    assert (form.last_occurrence_at, form.next_occurrence_at) == (None, z(2026, 2, 1, 10))  # as locked
