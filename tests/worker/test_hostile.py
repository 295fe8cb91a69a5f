"""Poison and hostile input on real worker processes under a supervisor.

* Handlers raising ``SystemExit``, ``KeyboardInterrupt``, ``RecursionError`` (real recursion) and
  ``MemoryError`` (a real allocation failure): each attempt is a failed attempt with the exception's
  type recorded, retried, then dead-lettered; the worker thread and process live on.
* Handlers that take their process down (``os._exit(1)``, a segfault through ``ctypes``): only a
  lease expiry can tell; the reaper counts each as an attempt and dead-letters the job after
  ``max_attempts``; the supervisor's replacement worker keeps serving other jobs meanwhile.
* Job rows naming arbitrary import paths (``os.system``, ``subprocess.call``, the real module path
  of a registered task, a module that records being imported): never claimed, dead-lettered as
  unknown tasks by the reaper sweep, never imported, never run.

All of it runs beside a fenced workload whose ledger must balance.
"""

import pytest
from qa.models import Execution

from django_leasequeue import enqueue, store
from django_leasequeue.models import Job
from django_leasequeue.store import NewJob
from tests.support.chaos.harness import (
    Fleet,
    assert_balanced,
    assert_no_overlaps,
    enqueue_chaos,
    enqueue_plain,
    ledger,
    record,
    runs_note,
    scaled,
    wait_drained,
)

pytestmark = [pytest.mark.chaos, pytest.mark.process]

JOBS = scaled(300)
CRASH_QUEUE_JOBS = 50
RAISING = {
    "SystemExit": "builtins.SystemExit",
    "KeyboardInterrupt": "builtins.KeyboardInterrupt",
    "RecursionError": "builtins.RecursionError",
    "MemoryError": "builtins.MemoryError",
}
CRASHING = {"os._exit": 1, "segfault": -11}  # kind -> the worker's exit status
HOSTILE_PATHS = ["os.system", "subprocess.call", "builtins.exec", "qa.tasks.record", "qa.trap.run"]


def test_poison_handlers_end_dead_and_workers_keep_serving(spawn, tmp_path):
    trap = tmp_path / "trap"
    marker = tmp_path / "pwned"
    # Crashing handlers go to their own queue, served by a one-thread worker that also serves the
    # default queue: a crash then takes down exactly one attempt, and the replacement goes on with
    # the workload.
    crashers = {kind: enqueue("qa.hostile", [kind], queue="crash", priority=10) for kind in CRASHING}
    raisers = {kind: enqueue("qa.hostile", [kind], priority=10) for kind in RAISING}
    rows = store.job_insert([NewJob(task=path, queue="default", priority=10, args_json=f'["touch {marker}"]',
                                    kwargs_json="{}", max_attempts=5) for path in HOSTILE_PATHS],
                            notify=False, channel="leasequeue")
    ids = enqueue_chaos(JOBS, seed=7)
    plain = enqueue_plain(JOBS // 2, seed=71)  # the second workload: plain handlers returning a value
    # Work for the crash queue's worker once the crashing jobs are dead: its replacement must serve it.
    crash_queue_work = enqueue_chaos(CRASH_QUEUE_JOBS, seed=8, queue="crash")

    # UNKNOWN_TASK_GRACE 0: the rows naming paths are dead-lettered by the first sweep (never claimed).
    no_grace = {"QA_TRAP_FILE": str(trap), "LEASEQUEUE_UNKNOWN_TASK_GRACE": "0"}
    fleet = Fleet(spawn, env=no_grace, args=("--queues", "default"))
    fleet.start_reaper()
    normal = [fleet.start(name=f"n{i}") for i in (1, 2)]
    crash_fleet = Fleet(spawn, concurrency=1, env=no_grace, prefix="c",
                        args=("--queues", "crash,default"))
    crash_fleet.start()
    deaths: list[tuple[str, int]] = []
    buried: set[str] = set()

    def supervise() -> None:
        """A process supervisor: restart a crash-queue worker that died."""
        crash_fleet.note_exits()  # when each died, for the execution ledger
        for m in list(crash_fleet.members):
            if not m.running and m.name not in buried:
                buried.add(m.name)
                deaths.append((m.name, m.proc.proc.returncode))
                crash_fleet.start()

    drained = wait_drained(240, task=None, tick=supervise, interval=0.1)
    for m in normal:
        assert m.running, (m.proc.proc.returncode, m.proc.output())
    exits = {**fleet.stop(), **crash_fleet.stop()}
    assert all(code == 0 for code, _ in exits.values()), exits

    books = ledger([*ids, *crash_queue_work, *plain], deaths={**fleet.deaths, **crash_fleet.deaths})
    assert_balanced(books, done=JOBS + CRASH_QUEUE_JOBS + len(plain))
    for kind, expected_type in RAISING.items():
        job = Job.objects.get(pk=raisers[kind].id)
        assert (job.status, job.attempts) == ("dead", 2), (kind, job.errors)
        assert [e["type"] for e in job.errors] == [expected_type, expected_type], kind
        assert Execution.objects.filter(job_id=job.id).count() == 2
    for kind in CRASHING:
        job = Job.objects.get(pk=crashers[kind].id)
        assert (job.status, job.attempts) == ("dead", 2), (kind, job.errors)
        assert [e["type"] for e in job.errors] == ["LeaseExpired", "LeaseExpired"], kind
        assert Execution.objects.filter(job_id=job.id).count() == 2
    # Exactly one process death per crashing attempt, with the crash's own exit status.
    assert sorted(code for _, code in deaths) == sorted([*CRASHING.values()] * 2), deaths
    # Replacements served the crash queue's other jobs (the first worker died on a crashing job,
    # which it claimed first for its priority).
    served_by = {b.rsplit(":", 1)[1] for b in Job.objects.filter(id__in=crash_queue_work).values_list(
        "leased_by", flat=True)}
    assert served_by and all(name.startswith("c") and name != "c1" for name in served_by), served_by
    for row in rows:
        row = Job.objects.get(pk=row.id)
        assert (row.status, row.attempts) == ("dead", 0), row.task  # never claimed: no attempt spent
        assert row.errors[0]["type"] == "django_leasequeue.exceptions.UnknownTask"
    assert not marker.exists() and not trap.exists()
    assert not Execution.objects.filter(tag="touch").exists()  # qa.tasks.record never ran as a path
    record("hostile", fault="poison handlers: SystemExit, KeyboardInterrupt, RecursionError, MemoryError, "
           "os._exit, segfault; rows naming os.system & co.",
           jobs=JOBS + CRASH_QUEUE_JOBS + len(plain) + len(RAISING) + len(CRASHING) + len(rows),
           faults=len(RAISING) + len(CRASHING) + len(rows), books=books, recovery=None,
           also=[*(j.id for j in raisers.values()), *(j.id for j in crashers.values()), *(r.id for r in rows)],
           recovery_meaning="each poison job dead after 2 attempts; crashes restarted by the supervisor",
           notes=f"{len(deaths)} worker deaths (exit statuses {sorted(c for _, c in deaths)}), "
                 f"{len(HOSTILE_PATHS)} hostile task paths never imported; {runs_note(books)}",
           seconds=round(drained, 1))
    # A crash takes its handlers down with it: never two attempts of one job at once.
    assert_no_overlaps(books)

