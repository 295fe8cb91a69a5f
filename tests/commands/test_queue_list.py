"""``manage.py leasequeue_queue list`` lists every queue that holds jobs, whatever their state, or
that is configured or has a state row, with its depth; "no queues" only when there is none."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from qa.tasks import record

from django_leasequeue import chain, store
from tests.support import claim

pytestmark = pytest.mark.django_db

HEADER = ("queue                    state    rate       throttled    depth    ready  waiting  leased    dead  paused")


def listed() -> list[str]:
    out = StringIO()
    call_command("leasequeue_queue", "list", stdout=out)
    return out.getvalue().splitlines()


def dead_letter(queue: str) -> None:
    job = record.using(queue=queue).enqueue("poison")
    (claimed,) = claim(queues=[queue])
    assert store.job_fail(job.id, claimed.lease_version, {"type": "ValueError", "message": "boom"},
                          retry_delay=None) is not None


def done(queue: str) -> None:
    record.using(queue=queue).enqueue("ok")
    (claimed,) = claim(queues=[queue])
    assert store.job_complete([(claimed.id, claimed.lease_version, None)]) == {claimed.id}


def test_no_queue_at_all():
    assert listed() == ["no queues: no job was ever enqueued, none is configured (LEASEQUEUE['QUEUES']) "
                        "and none was paused"]


def test_queues_holding_only_dead_waiting_or_done_jobs_are_listed_with_their_depth():
    dead_letter("default")                                      # default: a dead letter,
    chain(record.step("a"), record.step("b")).enqueue()         # a ready step and a waiting one
    chain(record.using(queue="flow").step("a"), record.using(queue="flow").step("b")).enqueue()
    claim(queues=["flow"])                                      # flow: its first step leased, second waiting
    done("finished")                                            # finished: one done job only
    record.using(queue="later").enqueue("x")                    # later: one ready
    assert listed() == [
        HEADER,
        "default                  running  -                  0        2        1        1       0       1",
        "finished                 running  -                  0        0        0        0       0       0",
        "flow                     running  -                  0        2        0        1       1       0",
        "later                    running  -                  0        1        1        0       0       0",
    ]


def test_a_paused_empty_queue_and_the_configured_ones(settings):
    settings.LEASEQUEUE = {"QUEUES": ["default", "emails"]}
    store.queue_pause("emails", by="ops", wait=False)
    (emails,) = [q for q in store.queue_list() if q.name == "emails"]
    empty = "-                  0        0        0        0       0       0"
    assert listed() == [
        HEADER,
        f"default                  running  {empty}",
        f"emails                   paused   {empty}  {emails.paused_at:%Y-%m-%d %H:%M:%S} by ops",
    ]
