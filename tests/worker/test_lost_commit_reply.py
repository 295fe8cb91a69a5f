"""A completion whose COMMIT reached the server while its reply was lost with the connection (a
PgBouncer or PostgreSQL restarted at that instant) is done, not a lost lease.

The connection goes through a relay (``tests/support/lost_reply.py``) that lets the server run
the armed message to its end, then drops the connection without passing the reply on: the write
is committed and the client sees "server closed the connection unexpectedly". Before the fix, the
worker repeated the fenced write on a new connection (the failure of a fenced_atomic() attempt,
the completer's batch), found the job done, took that for a lost lease, and wrote a false
``lease_lost`` note into the history of a job that had completed: the fenced handler's attempt
even counted as failed. Now the row is read under the attempt's token first.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
from qa.models import Effect, Probe

from django_leasequeue import enqueue, signals, store
from django_leasequeue.attempt_events import report_lease_lost
from django_leasequeue.models import Job
from django_leasequeue.worker.completer import Completer
from tests.support import claim, context_for, run_claimed
from tests.support.lost_reply import ReplyLosingRelay, default_connection_through_relay

pytestmark = pytest.mark.django_db(transaction=True)  # fenced_atomic() must be the outermost transaction

# A message of the completer's statement (store.JOB_COMPLETE), and psycopg's COMMIT.
COMPLETE = b"THEN 'cancelled' ELSE 'done' END"
COMMIT = b"COMMIT\x00"


@pytest.fixture
def relay() -> Iterator[ReplyLosingRelay]:
    """This test's ``default`` connection through a :class:`ReplyLosingRelay`."""
    with default_connection_through_relay() as relay:
        yield relay


@contextmanager
def events(*names: str) -> Iterator[list[tuple[str, int]]]:
    """Collect ``(event, job id)`` of the named events emitted meanwhile."""
    seen: list[tuple[str, int]] = []
    receivers = {}
    for name in names:
        def receiver(sender, job_id, _name=name, **fields):
            seen.append((_name, job_id))
        receivers[name] = receiver
        signals.SIGNALS[name].connect(receiver, dispatch_uid=f"lost-reply-{name}")
    try:
        yield seen
    finally:
        for name in names:
            signals.SIGNALS[name].disconnect(dispatch_uid=f"lost-reply-{name}")


def lease_lost_notes(job: Job) -> list[dict]:
    return [e for e in job.history if e.get("event") == "lease_lost"]


def test_a_fenced_commit_whose_reply_was_lost_is_done_and_no_lost_lease(relay):
    job = enqueue("qa.fenced_effect", kwargs={"key": "F"})
    (claimed,) = claim()
    relay.lose_reply_to(COMMIT)
    with events("succeeded", "lease_lost", "retried") as seen:
        outcome = run_claimed(claimed)
    assert relay.lost == 1  # the commit's reply really was lost
    assert outcome == "done"
    assert seen == [("succeeded", job.id)]
    job.refresh_from_db()
    assert (job.status, job.lease_version, job.attempts, job.errors) == ("done", claimed.lease_version, 1, [])
    assert lease_lost_notes(job) == []
    assert list(Effect.objects.filter(job_id=job.id).values_list("lease_version", flat=True)) == [claimed.lease_version]
    # The handler went on past its fenced block as if the reply had come: its probe says accepted.
    assert list(Probe.objects.filter(job_id=job.id, kind="fenced").values_list("ok", flat=True)) == [True]


def test_a_fenced_commit_cut_before_the_server_got_it_fails_the_attempt(relay):
    job = enqueue("qa.fenced_effect", kwargs={"key": "C"})
    (claimed,) = claim()
    relay.cut_before(COMMIT)
    with events("succeeded", "lease_lost", "retried") as seen:
        outcome = run_claimed(claimed)
    assert relay.cut == 1
    assert outcome == "ready"  # retried: the row, read under the token, was still leased
    assert seen == [("retried", job.id)]
    job.refresh_from_db()
    assert (job.status, job.lease_version, job.attempts) == ("ready", claimed.lease_version, 1)
    assert [e["type"] for e in job.errors] == ["django.db.utils.OperationalError"]
    assert lease_lost_notes(job) == []
    assert Effect.objects.filter(job_id=job.id).count() == 0


def test_a_batched_completion_whose_reply_was_lost_is_done_and_no_lost_lease(relay):
    job = enqueue("qa.record", kwargs={"tag": "R"})
    (claimed,) = claim()
    ctx = context_for(claimed)
    completer = Completer(alias=store.db_alias())
    relay.lose_reply_to(COMPLETE)
    with events("succeeded", "lease_lost") as seen:
        completer.submit(ctx, '"R"')
        completer.flush()  # the reply is lost; with_reconnect() writes again, and finds it done
    assert relay.lost == 1
    assert (completer.completed, completer.pending, ctx.lease_lost) == (1, False, False)
    assert seen == [("succeeded", job.id)]
    job.refresh_from_db()
    assert (job.status, job.lease_version, job.result) == ("done", claimed.lease_version, "R")
    assert lease_lost_notes(job) == []


def test_a_refused_write_is_a_lost_lease_only_when_the_token_moved_on():
    """``report_lease_lost`` reads the row under the token first: a job that this attempt's own
    write settled is not lost (a heartbeat renewal refused after a completion whose reply was
    lost); a job the reaper took back (token moved forward) is, and gets its note."""
    done, reaped = enqueue("qa.record"), enqueue("qa.record")
    claims = {c.id: c for c in claim()}
    assert store.job_complete([(done.id, claims[done.id].lease_version, None)]) == {done.id}
    assert [r.id for r in store.job_reap_expired(now=store.db_now() + timedelta(seconds=60))] == [reaped.id]
    done_ctx, reaped_ctx = context_for(claims[done.id]), context_for(claims[reaped.id])
    with events("lease_lost") as seen:
        assert report_lease_lost(done_ctx, write="renew") == "done"
        assert report_lease_lost(reaped_ctx, write="renew") is None
    assert seen == [("lease_lost", reaped.id)]
    assert (done_ctx.lease_lost, reaped_ctx.lease_lost) == (False, True)
    done.refresh_from_db()
    reaped.refresh_from_db()
    assert lease_lost_notes(done) == []
    assert [(n["token"], n["write"]) for n in lease_lost_notes(reaped)] == [(claims[reaped.id].lease_version, "renew")]
