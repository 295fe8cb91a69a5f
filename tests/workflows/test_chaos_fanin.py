"""Chaos: workers SIGKILLed at random while a fleet drains a 5,000-member batch whose
``on_success`` callback fans in every member's result.

Members alternate the two completion paths (a returned value completed by the batched completer,
and ``fenced_atomic()``). The ledger must balance (every member done, one effect per fenced
member), a member may run again after returning only when its worker was killed, and the callback
runs exactly once with the right result: the countdown and the release happen in the transaction
that finishes the last member, so no kill can lose or double it.
"""

import random
import time

import pytest
from qa.wf_chaos_tasks import wf_callback, wf_fenced, wf_plain

from django_leasequeue import Batch
from django_leasequeue.models import Job
from tests.support import wait_for
from tests.support.chaos.harness import Fleet, db_now, record, runs_note, scaled, seconds
from tests.workflows.chaos import assert_books, books, callback_executions, unexplained_reruns

pytestmark = [pytest.mark.chaos, pytest.mark.process]

MEMBERS = scaled(5000)
WORKERS = 3
KILL_EVERY = 1.5  # seconds between kills, while more than QUIET members are left
QUIET = 200  # the kills stop here, so that none can land on the callback itself


def test_sigkill_during_a_5000_member_fan_in(spawn):
    rng = random.Random(16)
    batch = Batch.open("chaos fan-in", on_success=wf_callback.step().set(pass_result=True))
    steps = []
    for i in range(MEMBERS):
        task = wf_fenced if i % 2 else wf_plain
        # About 2% sleep past a tick of the kill loop, so kills land mid-handler too.
        work = round(rng.uniform(0.3, 1.2), 3) if rng.random() < 0.02 else 0.0
        steps.append(task.step(i, work=work) if work else task.step(i))
    member_ids = batch.add(*steps)
    batch.close()
    callback_id = batch.callbacks()["on_success"].id
    fleet = Fleet(spawn)
    fleet.start_reaper()
    for _ in range(WORKERS):
        fleet.start()
    fleet.wait_registered()
    started = db_now()
    next_kill = time.monotonic() + KILL_EVERY
    pending = Job.objects.filter(id__in=member_ids).exclude(status="done")
    deadline = time.monotonic() + 150
    while (left := pending.count()) > 0:
        assert time.monotonic() < deadline, f"members left after 150 s: {left}"
        if left > QUIET and time.monotonic() >= next_kill:
            victim = rng.choice(fleet.live())
            fleet.sigkill(victim)
            fleet.start()
            next_kill = time.monotonic() + KILL_EVERY
        time.sleep(0.05)
    last_member = max(Job.objects.filter(id__in=member_ids).values_list("finished_at", flat=True))
    callback = wait_for(lambda: Job.objects.filter(id=callback_id, status="done").first(), timeout=60,
                        interval=0.05, what="the callback to be done")
    drained = seconds(started, callback.finished_at)
    ids = [*member_ids, callback_id]
    result = books(ids, deaths=fleet.deaths)
    executions = callback_executions([callback_id])[callback_id]
    bad_reruns = unexplained_reruns(ids, fleet.deaths)
    record("wf_fanin_sigkill", fault=f"SIGKILL of a random worker every {KILL_EVERY} s (of {WORKERS}) during a "
           f"{MEMBERS:,}-member batch fan-in (both completion paths)", jobs=len(ids), faults=fleet.kills,
           books=result, recovery=drained,
           recovery_meaning="time from the fleet starting until the batch's on_success callback was done",
           notes=f"{executions} callback execution(s), callback done "
                 f"{seconds(last_member, callback.finished_at):.3f} s after the last member; "
                 f"{len(bad_reruns)} re-runs not explained by a kill; {runs_note(result)}",
           callback_executions=executions)
    fleet.stop()
    assert_books(result)
    assert bad_reruns == [], bad_reruns
    assert executions == 1
    assert batch.state == "succeeded"
    counts = batch.row()
    assert (counts.members, counts.members_pending, counts.members_done) == (MEMBERS, 0, MEMBERS)
    # The results the callback got (its first argument), member by member. Member i returns i.
    passed = callback.args[0]
    assert len(passed) == MEMBERS
    wrong = [(i, value) for i, value in enumerate(passed) if value != i]
    assert wrong == [], wrong[:20]  # fenced members set their result inside the block
    assert callback.result == {"members": MEMBERS, "sum": MEMBERS * (MEMBERS - 1) // 2}
