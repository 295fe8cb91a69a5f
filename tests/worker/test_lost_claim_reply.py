"""A claim whose reply was lost with the connection (a PgBouncer or PostgreSQL restarted at that
instant) committed on the server: its jobs are leased to the worker, which never learned of them.
Before the fix they waited a whole lease, then the reaper took them back with a ``LeaseExpired``
error that counted an attempt no handler made (a ``max_attempts=1`` job ended dead without having
run). Now the worker gives them back before its next claim, as a prefetched job that never ran:
due at once, the attempt not counted, the token bumped.

The hazard: a job leased to the worker but not running is not necessarily the lost claim's. One
whose handler returned, with its completion still queued in the batched completer, must not be
given back (it would run again). The lost claim's rows are told apart by the claim clock.

The connection goes through a relay (``tests/support/lost_reply.py``) that lets the server run the
claim to its end (committed: an implicit transaction), then drops the connection without passing
the reply on. The worker's threads are never started: ``pool.run_job`` is called where a thread
would take the job, and the completer is flushed by hand, so nothing depends on timing.
"""

from collections.abc import Iterator

import pytest
from django.db import DatabaseError
from qa.models import Execution

from django_leasequeue import enqueue, signals
from django_leasequeue.models import Job
from django_leasequeue.runtime import ERROR_BACKOFF_MAX, close_broken_connections
from django_leasequeue.worker import WorkerService
from django_leasequeue.worker.producer import AFTER_SHORT_CLAIM, LOST_CLAIM_REASON
from tests.support.lost_reply import ReplyLosingRelay, default_connection_through_relay

pytestmark = pytest.mark.django_db(transaction=True)  # the relay's connection must see committed rows

# The claim's message: JIT off for its own implicit transaction, then the claim (store._db._run_claim).
CLAIM = b"SET LOCAL jit = off"


@pytest.fixture
def relay() -> Iterator[ReplyLosingRelay]:
    """This test's ``default`` connection through a :class:`ReplyLosingRelay`."""
    with default_connection_through_relay() as relay:
        yield relay


@pytest.fixture
def released_events() -> Iterator[list[tuple[int, str]]]:
    seen: list[tuple[int, str]] = []

    def receiver(sender, job_id, reason="", **fields):
        seen.append((job_id, reason))

    signals.SIGNALS["released"].connect(receiver, dispatch_uid="lost-claim-released")
    try:
        yield seen
    finally:
        signals.SIGNALS["released"].disconnect(dispatch_uid="lost-claim-released")


def worker_without_threads(concurrency: int) -> WorkerService:
    return WorkerService(queues=["default"], concurrency=concurrency, reap=False, notify=False, prefetch_max=0)


def lose_a_claim(worker: WorkerService, relay: ReplyLosingRelay) -> None:
    """One round of ``worker`` whose claim commits while its reply is lost; then reconnect, as the
    worker's loop does after a failed round."""
    relay.lose_reply_to(CLAIM)
    with pytest.raises(DatabaseError):
        worker.run_once()
    assert relay.lost == 1  # the claim's reply really was lost
    close_broken_connections()


def rows(ids: list[int]) -> dict[int, tuple[str, int, int, str]]:
    return {j.id: (j.status, j.attempts, j.lease_version, j.leased_by)
            for j in Job.objects.filter(id__in=ids)}


def released_notes(job_id: int) -> list[str]:
    return [e["reason"] for e in Job.objects.get(pk=job_id).history if e.get("event") == "released"]


def run_held(worker: WorkerService) -> None:
    """Run every job the worker holds and has not run yet, as its threads would, and write every
    queued completion."""
    for item in worker.pool.inflight_snapshot():
        if not item.completing:
            worker.pool.run_job(item)
    worker.completer.flush()


def test_the_jobs_of_a_claim_whose_reply_was_lost_are_given_back_at_once_and_run_once(relay, released_events):
    jobs = [enqueue("qa.record", kwargs={"tag": "a"}), enqueue("qa.record", kwargs={"tag": "b"}),
            enqueue("qa.record", kwargs={"tag": "once"}, max_attempts=1)]
    ids = [j.id for j in jobs]
    worker = worker_without_threads(concurrency=3)
    lose_a_claim(worker, relay)
    # The fault itself: committed, leased to this worker, an attempt counted; the worker holds none.
    assert rows(ids) == {i: ("leased", 1, 1, worker.worker_id) for i in ids}
    assert worker.pool.inflight_snapshot() == []

    # The next round gives them back first (token 2, attempt refunded), then claims them (token 3).
    assert worker.run_once() == 0.0
    assert sorted(released_events) == [(i, LOST_CLAIM_REASON) for i in ids]
    assert all(released_notes(i) == [LOST_CLAIM_REASON] for i in ids)
    assert rows(ids) == {i: ("leased", 1, 3, worker.worker_id) for i in ids}
    held = {item.job.id: (item.job.attempts, item.job.lease_version) for item in worker.pool.inflight_snapshot()}
    assert held == {i: (1, 3) for i in ids}

    run_held(worker)
    assert {j.id: (j.status, j.attempts, j.errors) for j in Job.objects.filter(id__in=ids)} == \
        {i: ("done", 1, []) for i in ids}
    # Exactly one execution each, under the claim that ran it; the max_attempts=1 job is done, not dead.
    assert sorted(Execution.objects.filter(job_id__in=ids).values_list("job_id", "lease_version", "attempt")) == \
        [(i, 3, 1) for i in ids]
    counts = worker.counts()  # outcomes are counted by the attempt hook of a started worker: not here
    assert (counts.claimed, counts.released) == (6, 3)  # the lost claim's 3 count as claimed and released


def test_the_lost_claim_jobs_are_ready_again_before_any_other_claim(relay):
    """Given back, not merely re-claimed: ``ready``, attempts as before the lost claim, no start
    time, token bumped; the worker's own pending flag is cleared."""
    retried = enqueue("qa.record", kwargs={"tag": "r"})
    Job.objects.filter(pk=retried.id).update(attempts=1)  # one failed attempt already counted
    fresh = enqueue("qa.record", kwargs={"tag": "f"}, max_attempts=1)
    ids = [retried.id, fresh.id]
    worker = worker_without_threads(concurrency=2)
    lose_a_claim(worker, relay)
    assert rows(ids) == {retried.id: ("leased", 2, 1, worker.worker_id), fresh.id: ("leased", 1, 1, worker.worker_id)}
    assert worker.producer.claim_unsure
    assert worker.producer.release_lost_claims() == 2
    assert not worker.producer.claim_unsure
    assert rows(ids) == {retried.id: ("ready", 1, 2, worker.worker_id), fresh.id: ("ready", 0, 2, worker.worker_id)}
    assert Job.objects.get(pk=fresh.id).started_at is None
    assert Job.objects.filter(id__in=ids, leased_until__isnull=False).count() == 0
    assert worker.producer.release_lost_claims() == 0  # nothing of ours is left unknown


def test_a_returned_job_whose_completion_is_still_queued_is_not_given_back(relay, released_events):
    """The hazard: job R was claimed and its handler returned; its completion waits in the
    completer when a later claim's reply is lost. R is leased to the worker and not running, yet it
    is not the lost claim's: only the lost claim's job L is given back; R ends done, run once."""
    returned = enqueue("qa.record", kwargs={"tag": "R"})
    worker = worker_without_threads(concurrency=2)
    assert worker.run_once() == AFTER_SHORT_CLAIM  # 1 job, 2 threads
    (item,) = worker.pool.inflight_snapshot()
    worker.pool.run_job(item)  # the handler returns; the completer thread is not running
    assert worker.completer.pending
    lost = enqueue("qa.record", kwargs={"tag": "L"}, max_attempts=1)
    lose_a_claim(worker, relay)
    assert rows([returned.id, lost.id]) == {returned.id: ("leased", 1, 1, worker.worker_id),
                                            lost.id: ("leased", 1, 1, worker.worker_id)}

    # The next round gives back L alone (token 2) and claims it again (token 3) beside R, whose
    # completion is still queued (one job for two free threads: a short claim).
    assert worker.run_once() == AFTER_SHORT_CLAIM
    assert released_events == [(lost.id, LOST_CLAIM_REASON)]
    assert worker.completer.pending
    assert rows([returned.id, lost.id]) == {returned.id: ("leased", 1, 1, worker.worker_id),
                                            lost.id: ("leased", 1, 3, worker.worker_id)}
    assert sorted((i.job.id, i.job.lease_version) for i in worker.pool.inflight_snapshot()) == \
        [(returned.id, 1), (lost.id, 3)]
    run_held(worker)
    assert {j.id: (j.status, j.lease_version) for j in Job.objects.filter(id__in=[returned.id, lost.id])} == \
        {returned.id: ("done", 1), lost.id: ("done", 3)}
    assert released_notes(returned.id) == []
    assert sorted(Execution.objects.filter(job_id__in=[returned.id, lost.id]).values_list("job_id", "lease_version")) \
        == [(returned.id, 1), (lost.id, 3)]


def test_a_graceful_stop_right_after_a_lost_claim_gives_its_jobs_back(relay, released_events):
    """The worker stops before another round: its stop gives the lost claim's jobs back."""
    job = enqueue("qa.record", kwargs={"tag": "s"}, max_attempts=1)
    worker = worker_without_threads(concurrency=1)
    lose_a_claim(worker, relay)
    worker.on_stop()
    assert released_events == [(job.id, LOST_CLAIM_REASON)]
    assert rows([job.id]) == {job.id: ("ready", 0, 2, worker.worker_id)}


def test_while_a_claim_may_be_lost_the_loop_retries_within_the_lease(relay):
    """After failed rounds the claim loop waits up to the general cap (30 s), but while a lost
    claim's jobs wait to be given back it retries at least once per renewal interval, as the
    heartbeat does: a database that refused the give-back for a few rounds (a PgBouncer restarted
    again and again) must not push it past their lease, or they are reaped as attempts no handler
    made."""
    enqueue("qa.record", kwargs={"tag": "u"}, max_attempts=1)
    worker = worker_without_threads(concurrency=1)
    general = worker.error_backoff_max
    assert general == ERROR_BACKOFF_MAX
    lose_a_claim(worker, relay)
    assert worker.producer.claim_unsure
    assert worker.error_backoff_max == worker.heartbeat.error_backoff_max == \
        worker.pool.renewal_interval(worker.lease) < worker.lease
    assert worker.producer.release_lost_claims() == 1
    assert worker.error_backoff_max == general
