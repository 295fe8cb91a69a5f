"""Chaos: a rolling deploy, an old and a new worker side by side, and only the new one knows a
task. The "old" worker runs with ``QA_SKIP_TASKS=qa.chaos_new`` (``testproject/qa/tasks.py``
then leaves that task unregistered: the build before the task was added); the "new" one has it.
Jobs of the new task are enqueued with both workloads.

The old worker must not spend an attempt of a job it cannot run while a live worker that knows
the task serves the queue: every job of the new task ends done, run by the new worker, none is
dead-lettered as ``UnknownTask``. Nothing lost, no re-run of a returned job, no two attempts of
one job at once.
"""

import pytest

from django_leasequeue.models import Job
from tests.support.chaos.harness import (
    Fleet,
    assert_balanced,
    assert_no_overlaps,
    assert_no_reruns,
    enqueue_both,
    enqueue_plain,
    ledger,
    record,
    runs_note,
    scaled,
    statuses,
    wait_settled,
)

pytestmark = [pytest.mark.chaos, pytest.mark.process]

NEW_JOBS = scaled(40, workload=False)
JOBS = scaled(300)  # both workloads together


def test_old_and_new_workers_side_by_side(spawn):
    fleet = Fleet(spawn, concurrency=2)
    fleet.start_reaper()
    old = fleet.start(name="old", env={"QA_SKIP_TASKS": "qa.chaos_new"})
    new = fleet.start(name="new")
    fleet.wait_registered()
    fenced, plain = enqueue_both(JOBS // 2, seed=51)
    # The new task's jobs are mixed in after the workload, both workers claiming.
    news = enqueue_plain(NEW_JOBS, seed=52, task="qa.chaos_new")
    more_fenced, more_plain = enqueue_both(JOBS // 4, seed=53)
    ids = fenced + plain + news + more_fenced + more_plain
    drained = wait_settled(120)
    alive = [m.name for m in fleet.live()]
    exits = fleet.stop()
    books = ledger(ids, deaths=fleet.deaths)
    new_statuses = statuses(news)
    unknown = sum(1 for errors in Job.objects.filter(id__in=news).values_list("errors", flat=True)
                  for e in errors if str(e.get("type", "")).endswith("UnknownTask"))
    by_old = Job.objects.filter(id__in=news, leased_by__endswith=":old").count()
    record("rolling_deploy", fault=f"rolling deploy: an old worker without the task qa.chaos_new beside a new one, "
           f"{NEW_JOBS} jobs of it among both workloads", jobs=len(ids), faults=1, books=books, recovery=None,
           recovery_meaning="no recovery time: no job of the new task may be lost to the old worker",
           notes=f"new task's jobs {new_statuses}, {unknown} UnknownTask errors, {by_old} last held by the old "
                 f"worker; {runs_note(books)}", unknown_task_errors=unknown, new_task_statuses=new_statuses)

    assert drained is not None, f"not drained after 120 s: {statuses(ids)}"
    assert set(alive) == {old.name, new.name}
    assert new_statuses == {"done": NEW_JOBS}, (new_statuses, unknown)
    assert unknown == 0
    assert_balanced(books, done=len(ids))
    assert_no_reruns(books)
    assert_no_overlaps(books)
    assert all(code == 0 for code, _ in exits.values()), exits
