"""``manage.py seed_console``: the operator console's demo state, for screenshots and the browser tests.

Built through the library's public API and the store's statements, with injected times, so that
every counter a page reads is what real traffic would have left (the chart counters in
``leasequeue_job_stat`` are filled by the job table's trigger as each job moves):

* 3,000 done jobs over the last six hours in the queues invoices, orders, partners and reports,
  some of them after a retried failure;
* 50 dead letters of three error types (``KeyError``, ``ConnectionError``, ``ValueError``), half of
  them in the last hour;
* backlogs in invoices, orders and reports, reports paused; jobs scheduled for later;
* running (leased) jobs, snoozed jobs and jobs waiting for a retry;
* six schedules in five time zones, each with occurrences (done, one dead, some skipped while
  reports was paused);
* a chain half done and a group with a dead member;
* two worker processes and a scheduler: ``web-1`` alive with its jobs, ``web-2`` stopped
  heartbeating with a job whose lease has expired.

Refuses a database whose name does not look like a demo or test database (``--force`` overrides);
does nothing when the state is already there (``--reset`` deletes every queue row and builds it
again). :func:`seed` is what the command runs; the browser tests call it from a fixture.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction

from django_leasequeue import chain, group, store
from django_leasequeue.cron import next_occurrence, occurrences
from django_leasequeue.enqueueing import build_job
from django_leasequeue.models import (
    Dependency,
    Job,
    JobStat,
    QueueState,
    ReaperSweep,
    Schedule,
    WorkerProcess,
    Workflow,
)
from invoices.tasks import flaky_sync, heartbeat, import_order, noop, poison, run_monthly_invoices, send_invoice

#: Words one of which a database name must contain for the command to run without ``--force``.
SAFE_NAME_WORDS = ("demo", "test", "lq_", "screens", "seed")

#: The schedule whose presence says "already seeded".
MARKER_SCHEDULE = "nightly invoice run"

WEB1 = "web-1:4242:w1"  # alive, holding running jobs
WEB2 = "web-2:3117:w2"  # stopped heartbeating; its job's lease has expired
SCHEDULER = "web-1:4243:scheduler"

TRACEBACKS = {
    "builtins.KeyError": ('Traceback (most recent call last):\n  File "invoices/tasks.py", line 64, in import_order\n'
                          '    customer = payload["customer"]\nKeyError: \'customer\'\n'),
    "builtins.ConnectionError": ('Traceback (most recent call last):\n'
                                 '  File "invoices/tasks.py", line 47, in flaky_sync\n'
                                 '    raise ConnectionError(...)\nConnectionError: partner API timed out\n'),
    "builtins.ValueError": ('Traceback (most recent call last):\n  File "invoices/tasks.py", line 53, in poison\n'
                            "    raise ValueError(...)\nValueError: malformed payload: missing 'customer'\n"),
}


@dataclass
class Seeded:
    """What :func:`seed` built: ids the tests and the screenshot script open pages of.

    Attributes:
        done, dead: counts of done and dead jobs.
        dead_job: a dead ``import_order`` job (KeyError), for the job page and the replay form.
        schedule: the schedule with the richest history (every 15 minutes, Berlin).
        workflow: the chain (half done).
        batch: the group with a dead member.
        queues: the queue names that hold jobs.
    """

    done: int = 0
    dead: int = 0
    dead_job: int = 0
    schedule: int = 0
    workflow: int = 0
    batch: int = 0
    queues: list[str] = field(default_factory=lambda: ["invoices", "orders", "partners", "reports"])


def _error(kind: str, message: str, attempt: int, worker: str) -> dict[str, Any]:
    return {"attempt": attempt, "type": kind, "message": message, "traceback": TRACEBACKS[kind], "worker": worker}


def _insert(specs: list[Any], at: datetime) -> list[int]:
    return [j.id for j in store.job_insert(specs, notify=False, channel="unused", now=at)]


def _claim(ids: list[int], at: datetime, worker: str = WEB1, lease: float = 60) -> list[store.ClaimedJob]:
    return list(store.job_claim_ids(ids, worker_id=worker, lease=lease, now=at))


def _complete(claimed: list[store.ClaimedJob], at: datetime) -> None:
    if claimed:
        store.job_complete([(c.id, c.lease_version, None) for c in claimed], now=at)


def _history(now: datetime, rnd: random.Random) -> int:
    """3,000 done jobs in 72 five-minute slots over the last six hours (busier in the last hours);
    every twentieth partner sync fails once and is retried 30 s later."""
    slots = 72
    weights = [1 + 0.6 * (i / slots) + 0.4 * rnd.random() for i in range(slots)]
    scale = 3000 / sum(weights)
    counts = [int(w * scale) for w in weights]
    counts[-1] += 3000 - sum(counts)
    done = 0
    for i, n in enumerate(counts):
        t = now - timedelta(minutes=5 * (slots - i)) + timedelta(seconds=rnd.randint(0, 60))
        specs = []
        for k in range(n):
            queue = ("invoices", "invoices", "orders", "partners", "reports")[k % 5]
            wait = rnd.choice((0.02, 0.3, 0.8, 1.5, 4, 12, 45)) if queue != "reports" else rnd.choice((20, 70, 200))
            if queue == "invoices":
                spec = build_job(send_invoice, [1000 + (i * 97 + k) % 4000, "2026-11"], queue=queue,
                                 run_at=t - timedelta(seconds=wait))
            elif queue == "orders":
                spec = build_job(import_order, [{"order": i * 100 + k, "customer": f"C-{k % 37:03d}"}], queue=queue,
                                 run_at=t - timedelta(seconds=wait))
            elif queue == "partners":
                spec = build_job(flaky_sync, [f"partner-{k % 12}"], {"failures": 0}, queue=queue,
                                 run_at=t - timedelta(seconds=wait))
            else:
                spec = build_job(noop, queue=queue, run_at=t - timedelta(seconds=wait))
            specs.append(spec)
        ids = _insert(specs, t - timedelta(seconds=60))
        claimed = _claim(ids, t)
        flaky = [c for j, c in enumerate(claimed) if c.queue == "partners" and j % 20 == 3]
        for c in flaky:
            store.job_fail(c.id, c.lease_version, _error("builtins.ConnectionError", "partner API timed out (try 1)",
                                                         1, WEB1), retry_delay=30, now=t + timedelta(seconds=2))
        rest = [c for c in claimed if c not in flaky]
        # Three run-time groups: quick, ordinary and slow handlers.
        for part, run in ((rest[0::3], 0.08), (rest[1::3], 0.6), (rest[2::3], 3.5)):
            _complete(part, t + timedelta(seconds=run))
        if flaky:
            retried = _claim([c.id for c in flaky], t + timedelta(seconds=33))
            _complete(retried, t + timedelta(seconds=34))
        done += len(claimed)
    return done


DEAD_KINDS = [
    # (task, queue, error type, message, how many)
    (import_order, "orders", "builtins.KeyError", "'customer'", 14),
    (import_order, "invoices", "builtins.KeyError", "'customer'", 8),
    (flaky_sync, "partners", "builtins.ConnectionError",
     "partner API timed out after 30 s: POST https://partners.example.com/v2/catalogue?since=2026-12-01T00:00:00Z"
     "&page=17 (read timeout; connection pool 10/10 in use; the partner's status page reports degraded service)", 15),
    (poison, "reports", "builtins.ValueError", "malformed payload: missing 'customer' in ['account', 'period']", 7),
    (poison, "invoices", "builtins.ValueError", "malformed payload: missing 'customer' in ['account', 'period']", 4),
]


def _dead_letters(now: datetime, rnd: random.Random) -> int:
    """48 dead letters (a schedule's occurrence and a workflow member make 50): two failed attempts
    each (40 s apart), half dying in the last hour."""
    first = 0
    n = 0
    for task, queue, kind, message, count in DEAD_KINDS:
        for k in range(count):
            died = now - timedelta(minutes=rnd.randint(2, 58) if n % 2 == 0 else rnd.randint(61, 300))
            start = died - timedelta(seconds=45)
            if task is flaky_sync:
                spec = build_job(task, [f"partner-{k % 5}"], {"failures": 9}, queue=queue, run_at=start, max_attempts=2)
            else:
                payload = {"order": 9000 + n, "lines": [{"sku": f"A-{k}", "qty": 1 + k % 3}]} if task is import_order \
                    else {"account": 2000 + n, "period": "2026-11"}
                spec = build_job(task, [payload], queue=queue, run_at=start, max_attempts=2)
            (job_id,) = _insert([spec], start)
            first = first or job_id
            for attempt in (1, 2):
                at = start + timedelta(seconds=40 * (attempt - 1))  # the retry is due 32 s after the failure
                (c,) = _claim([job_id], at)
                store.job_fail(c.id, c.lease_version, _error(kind, message, attempt, WEB1), retry_delay=30,
                               now=at + timedelta(seconds=1 + attempt))
            n += 1
    return first


def _backlogs(now: datetime, rnd: random.Random) -> None:
    """Due jobs in invoices (240), orders (80) and reports (45, paused later), and 20 for later."""
    specs = [build_job(send_invoice, [5000 + k, "2026-12"], queue="invoices",
                       run_at=now - timedelta(seconds=rnd.randint(1, 900))) for k in range(240)]
    specs += [build_job(import_order, [{"order": 20_000 + k, "customer": "ACME"}], queue="orders",
                        run_at=now - timedelta(seconds=rnd.randint(1, 300))) for k in range(80)]
    specs += [build_job(noop, queue="reports", run_at=now - timedelta(seconds=rnd.randint(600, 2400)))
              for _ in range(45)]
    specs += [build_job(send_invoice, [7000 + k, "2026-12"], queue="invoices",
                        run_at=now + timedelta(hours=1, minutes=k)) for k in range(20)]
    _insert(specs, now - timedelta(minutes=45))


def _in_flight(now: datetime) -> None:
    """Running, snoozed and retrying jobs; web-2's job has an expired lease."""
    # Tasks without a lease option of their own, so that the 15-minute lease given here holds while
    # the screenshots and the browser tests look at the pages.
    running = _insert([build_job(import_order, [{"order": 30_000 + k, "customer": "ACME"}], queue="orders")
                       for k in range(2)]
                      + [build_job(flaky_sync, [f"partner-{k}"], {"failures": 0}, queue="partners") for k in (8, 9)],
                      now - timedelta(minutes=2))
    for k, job_id in enumerate(running):
        _claim([job_id], now - timedelta(seconds=10 + 20 * k), WEB1, lease=900)
    stale = _insert([build_job(flaky_sync, ["partner-7"], {"failures": 0}, queue="partners")],
                    now - timedelta(minutes=12))
    _claim(stale, now - timedelta(minutes=9), WEB2, lease=30)
    snoozed = _insert([build_job(flaky_sync, [f"partner-{k}"], {"failures": 0}, queue="partners") for k in range(3)],
                      now - timedelta(minutes=20))
    for k, c in enumerate(_claim(snoozed, now - timedelta(minutes=5))):
        store.job_snooze(c.id, c.lease_version, 600 + 300 * k, max_snoozes=5, now=now - timedelta(minutes=5))
    retrying = _insert([build_job(flaky_sync, [f"partner-{k}"], {"failures": 2}, queue="partners") for k in range(5)],
                       now - timedelta(minutes=15))
    for k, c in enumerate(_claim(retrying, now - timedelta(minutes=4))):
        store.job_fail(c.id, c.lease_version, _error("builtins.ConnectionError", "partner API timed out (try 1)", 1,
                                                     WEB1), retry_delay=300 + 120 * k, now=now - timedelta(minutes=4))


SCHEDULES = [
    # (name, task, args, cron, zone, queue)
    (MARKER_SCHEDULE, run_monthly_invoices, [], "0 2 * * *", "Europe/Berlin", "invoices"),
    ("partner catalogue sync", flaky_sync, ["catalogue"], "*/15 * * * *", "Europe/Berlin", "partners"),
    ("orders import from the shop", noop, [], "*/30 * * * *", "America/New_York", "orders"),
    ("weekly partner report", noop, [], "0 7 * * 1", "Asia/Tokyo", "reports"),
    ("hourly reports refresh", noop, [], "0 * * * *", "Australia/Sydney", "reports"),
    ("pipeline heartbeat", heartbeat, [], "*/5 * * * *", "UTC", "default"),
]


def _schedules(now: datetime) -> int:
    """Six schedules in five zones, each with its occurrences of the last day (at most 12) run."""
    richest = 0
    for name, task, args, expr, zone, queue in SCHEDULES:
        schedule = Schedule(name=name, task=task.name, args=args, cron=expr, timezone=zone, queue=queue,
                            when_paused="skip" if queue == "reports" else "latest")
        schedule.save()
        richest = richest or (schedule.pk if expr == "*/15 * * * *" else 0)
        past = list(occurrences(expr, zone, now - timedelta(days=8), now))[-12:]
        entries = []
        for k, at in enumerate(past):
            if queue == "reports" and k >= len(past) - 2 and expr == "0 * * * *":
                entries.append({"occurrence": at.isoformat(), "action": "skipped", "queue": queue, "job": None,
                                "kept": None, "at": at.isoformat()})
                continue
            (job_id,) = _insert([build_job(task, args, queue=queue, run_at=at, schedule_id=schedule.pk,
                                           occurrence_at=at, max_attempts=1)], at)
            (c,) = _claim([job_id], at + timedelta(seconds=0.4 + k % 3))
            if task is flaky_sync and k == len(past) - 3:
                store.job_fail(c.id, c.lease_version, _error("builtins.ConnectionError", "partner API timed out", 1,
                                                             WEB1), retry_delay=None, now=at + timedelta(seconds=31))
            else:
                _complete([c], at + timedelta(seconds=1.2 + k % 4))
        if entries:
            store.schedule_record_paused([store.PausedRecord(schedule.pk, len(entries), 0, entries)])
        Schedule.objects.filter(pk=schedule.pk).update(
            last_occurrence_at=past[-1] if past else None, next_occurrence_at=next_occurrence(expr, zone, now))
    return richest


def _workflows(now: datetime) -> tuple[int, int]:
    """A month-end chain (first step done, second ready) and a partner group with a dead member."""
    # Steps due 40 minutes ago, so that the injected claim times below find them due.
    due = now - timedelta(minutes=40)
    steps = [send_invoice.using(run_at=due, queue="invoices").step(9100 + k, "2026-11") for k in range(4)]
    month_end = chain(*steps, name="month-end invoices for ACME").enqueue()
    members = list(Job.objects.filter(workflow_id=month_end.id).order_by("id").values_list("id", flat=True))
    _complete(_claim(members[:1], now - timedelta(minutes=30)), now - timedelta(minutes=29))
    importer = import_order.using(max_attempts=1, run_at=due, queue="orders")
    payloads = [{"order": 40_000 + k, "customer": "ACME"} if k != 2 else {"order": 40_002} for k in range(4)]
    batch = group(*(importer.step(p) for p in payloads), name="partner order import, batch 17").enqueue()
    members = list(Job.objects.filter(workflow_id=batch.id).order_by("id").values_list("id", flat=True))
    claimed = _claim(members, now - timedelta(minutes=20))
    for c in claimed:
        if c.id == members[2]:
            store.job_fail(c.id, c.lease_version, _error("builtins.KeyError", "'customer'", 1, WEB1),
                           retry_delay=None, now=now - timedelta(minutes=19))
        else:
            _complete([c], now - timedelta(minutes=19))
    return month_end.id, batch.id


def _processes(now: datetime) -> None:
    store.process_register(process_id=WEB1, kind="worker", host="web-1", pid=4242,
                           queues=["invoices", "orders", "partners"], concurrency=8,
                           now=now - timedelta(hours=3))
    store.process_heartbeat(WEB1, now=now - timedelta(seconds=3))
    store.process_register(process_id=WEB2, kind="worker", host="web-2", pid=3117, queues=["partners", "reports"],
                           concurrency=4, now=now - timedelta(hours=2))
    store.process_heartbeat(WEB2, now=now - timedelta(minutes=9))
    store.process_register(process_id=SCHEDULER, kind="scheduler", host="web-1", pid=4243, queues=[],
                           concurrency=0, now=now - timedelta(hours=3))
    store.process_heartbeat(SCHEDULER, tick=True, now=now - timedelta(seconds=4))


def keep_alive() -> None:
    """Heartbeat ``web-1`` and the scheduler (with a tick) by the database clock, as their running
    processes would: the seeded state has no real process, and a page opened more than the
    liveness window after seeding would show them stopped."""
    store.process_heartbeat(WEB1)
    store.process_heartbeat(SCHEDULER, tick=True)


def reset() -> None:
    """Delete every queue row: dependency edges, jobs, workflows, schedules, processes, queue
    states, chart counters."""
    with transaction.atomic():
        # The edges first: their foreign keys are DO_NOTHING, so deleting the jobs leaves them.
        Dependency.objects.all().delete()
        Job.objects.all().delete()
        Workflow.objects.all().delete()
        Schedule.objects.all().delete()
        WorkerProcess.objects.all().delete()
        QueueState.objects.all().delete()
        JobStat.objects.all().delete()
        ReaperSweep.objects.all().delete()


def seed(*, now: datetime | None = None, seed_value: int = 17) -> Seeded:
    """Build the console's demo state (see the module docstring) in one transaction.

    Args:
        now: aware datetime the state is built around; default the database clock.
        seed_value: the random generator's seed (the same seed gives the same state).

    Returns:
        A :class:`Seeded` with the ids worth opening.
    """
    rnd = random.Random(seed_value)
    with transaction.atomic():
        now = (now or store.db_now()).astimezone(UTC)
        result = Seeded()
        result.done = _history(now, rnd)
        result.dead_job = _dead_letters(now, rnd)
        _backlogs(now, rnd)
        _in_flight(now)
        result.schedule = _schedules(now)
        result.workflow, result.batch = _workflows(now)
        _processes(now)
        store.queue_pause("reports", by="ops", now=now - timedelta(minutes=40), wait=False)
        result.dead = Job.objects.filter(status="dead").count()
    return result


class Command(BaseCommand):
    help = "Fill the database with the operator console's demo state (done, dead, backlogs, schedules, workers)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--reset", action="store_true", help="delete every queue row first, then seed again")
        parser.add_argument("--force", action="store_true",
                            help="run even if the database name does not look like a demo or test database")

    def handle(self, *args: Any, **opts: Any) -> None:
        name = str(connection.settings_dict["NAME"])
        if not opts["force"] and not any(word in name.lower() for word in SAFE_NAME_WORDS):
            raise CommandError(f"database {name!r} does not look like a demo or test database (its name contains "
                               f"none of {', '.join(SAFE_NAME_WORDS)}); pass --force to seed it anyway")
        if Schedule.objects.filter(name=MARKER_SCHEDULE).exists() and not opts["reset"]:
            self.stdout.write("Already seeded (pass --reset to delete every queue row and seed again).")
            return
        if opts["reset"]:
            reset()
        result = seed()
        self.stdout.write(f"Seeded {result.done} done jobs, {result.dead} dead letters, backlogs in invoices, orders "
                          f"and reports (paused), 6 schedules, 2 workflows and 3 processes.")
