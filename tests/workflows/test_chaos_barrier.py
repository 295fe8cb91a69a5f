"""Chaos: the last two members of a chord finish at the same moment in two workers, 200 times.

Each chord has two ``qa.wf_barrier`` members, one on queue ``wfa`` (served only by worker ``a``)
and one on ``wfb`` (worker ``b``): both handlers wait at a filesystem barrier and return together,
so the two completions (two transactions, two processes) race for the chord's countdown. In every
other chord the ``wfb`` member completes inside ``fenced_atomic()`` (with ``fence.set_result``), so
the race is between both completion paths too. The
chords run in waves of one per worker thread, so every member of a wave is running at once. The
callback must run exactly once per chord: never 0 (both saw a pending sibling) nor 2 (both saw
none). The workflow row lock taken by the settle trigger serialises the two completions.
"""

import time
from pathlib import Path

import pytest
from qa.models import LedgerEntry
from qa.wf_chaos_tasks import wf_barrier, wf_callback

from django_leasequeue import chord
from django_leasequeue.models import Job
from tests.support.chaos.harness import Fleet, db_now, record, runs_note, scaled, seconds
from tests.workflows.chaos import assert_books, books, callback_executions, unexplained_reruns

pytestmark = [pytest.mark.chaos, pytest.mark.process]

CHORDS = scaled(200, workload=False)
WAVE = 8  # chords per wave: one per thread of each member worker


def test_last_two_members_finish_together_200_times(spawn, tmp_path: Path):
    fleet = Fleet(spawn, concurrency=WAVE)
    fleet.start(name="a", args=("--queues", "wfa"))
    fleet.start(name="b", args=("--queues", "wfb"))
    fleet.start(name="c", args=("--queues", "wfc"))
    fleet.wait_registered()
    started = db_now()
    handles = []
    for wave_start in range(0, CHORDS, WAVE):
        wave = [chord([wf_barrier.step(str(tmp_path), n).set(queue="wfa"),
                       wf_barrier.step(str(tmp_path), n, fenced=n % 2 == 1).set(queue="wfb")],
                      wf_callback.step().set(queue="wfc")).enqueue()
                for n in range(wave_start, min(wave_start + WAVE, CHORDS))]
        handles += wave
        callbacks = [h.callbacks()["on_success"].id for h in wave]
        deadline = time.monotonic() + 60
        while Job.objects.filter(id__in=callbacks, status="done").count() < len(callbacks):
            assert time.monotonic() < deadline, f"wave at chord {wave_start} not done after 60 s"
            time.sleep(0.02)
    took = seconds(started, db_now())
    callback_ids = [h.callbacks()["on_success"].id for h in handles]
    member_ids = [j.id for h in handles for j in h.members()]
    ids = member_ids + callback_ids
    missed = sorted(p.name for p in tmp_path.rglob("missed-*"))
    # How close the two returns of each chord were, and that two workers completed them.
    gaps = []
    pairs_apart = 0
    for h in handles:
        members = list(h.members().values_list("id", "leased_by"))
        pairs_apart += len({by.rsplit(":", 1)[-1] for _, by in members}) == 2
        ends = sorted(LedgerEntry.objects.filter(job_id__in=[m for m, _ in members], outcome="returned")
                      .values_list("returned_at", flat=True))
        gaps.append(seconds(ends[0], ends[-1]))
    gaps.sort()
    result = books(ids, deaths=fleet.deaths)
    executions = callback_executions(callback_ids)
    spread = {n: sum(1 for v in executions.values() if v == n) for n in sorted(set(executions.values()))}
    record("wf_chord_barrier", fault=f"the last two members of a 2-member chord return at once in two workers "
           f"(filesystem barrier), {CHORDS} chords in waves of {WAVE}", jobs=len(ids), faults=CHORDS, books=result,
           recovery=took, recovery_meaning="time to run every chord and its callback",
           notes=f"callback executions per chord: {spread}; members' returns apart by median "
                 f"{gaps[len(gaps) // 2] * 1000:.1f} ms, max {gaps[-1] * 1000:.1f} ms; {pairs_apart} of {CHORDS} "
                 f"pairs completed by two workers; {len(missed)} barriers missed; {runs_note(result)}",
           callback_executions=sum(executions.values()))
    fleet.stop()
    assert missed == []
    # Both members' results reached the callback, whichever path completed them.
    assert [h.callbacks()["on_success"].args[0] for h in handles] == [[n, n] for n in range(CHORDS)]
    assert pairs_apart == CHORDS
    assert_books(result)
    assert unexplained_reruns(ids, fleet.deaths) == []
    assert spread == {1: CHORDS}, executions
    for n, h in enumerate(handles):
        assert h.callbacks()["on_success"].result == {"members": 2, "sum": 2 * n}
        assert h.state == "succeeded"
