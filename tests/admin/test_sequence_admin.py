"""The halted-sequence admin through the test client: the list of dead jobs that hold their
sequence with the count waiting behind each, and the Replay and Skip actions that un-halt it."""

from __future__ import annotations

import pytest
from django.urls import reverse

from django_leasequeue import store
from django_leasequeue.enqueueing import task
from django_leasequeue.models import Job

pytestmark = pytest.mark.django_db

HALTED = reverse("admin:django_leasequeue_haltedsequence_changelist")


@task(name="tests.admin.seq_step", queue="flow", sequence_key="acct-{account}", max_attempts=1)
def seq_step(account: str, n: int) -> None:
    """A job of an account's sequence; a dead one halts it."""


@task(name="tests.admin.seq_loose", queue="flow", sequence_key="acct-{account}", sequence_on_dead="continue",
      max_attempts=1)
def seq_loose(account: str, n: int) -> None:
    """A job whose death lets its sequence continue."""


def claim() -> store.ClaimResult:
    return store.job_claim(queues=["flow"], limit=50, worker_id="t", lease=30, rate_limits={})


def kill_heads() -> None:
    """Claim every claimable head and dead-letter it (max_attempts=1)."""
    for job in claim():
        assert store.job_fail(job.id, job.lease_version, {"attempt": 1, "type": "Boom", "message": "no",
                                                          "traceback": "", "worker": "t"},
                              retry_delay=None)[0] == "dead"


def halted_rows(client) -> list[tuple[str, int, int]]:
    response = client.get(HALTED)
    assert response.status_code == 200
    cl = response.context["cl"]
    return [(j.sequence_key, j.id, j.waiting) for j in cl.result_list]


@pytest.fixture
def halted() -> dict[str, list[Job]]:
    """acct-a: dead head and 2 jobs behind it; acct-b: dead head alone; acct-c: a dead job of the
    continue policy (not halting; its next job was then claimed and is leased)."""
    jobs = {"a": [seq_step.enqueue(account="a", n=n) for n in range(3)],
            "b": [seq_step.enqueue(account="b", n=0)],
            "c": [seq_loose.enqueue(account="c", n=0), seq_step.enqueue(account="c", n=1)]}
    kill_heads()
    assert [j.id for j in claim()] == [jobs["c"][1].id]  # acct-c went on
    return jobs


def test_the_list_shows_each_halted_sequence_with_its_dead_head_and_the_count_behind(replayer_client, halted):
    assert halted_rows(replayer_client) == [("acct-a", halted["a"][0].id, 2), ("acct-b", halted["b"][0].id, 0)]
    assert [(h.key, h.job_id, h.waiting) for h in store.sequence_halted()] == \
        [("acct-a", halted["a"][0].id, 2), ("acct-b", halted["b"][0].id, 0)]
    search = replayer_client.get(HALTED, {"q": "acct-b"}).context["cl"].result_list
    assert [j.id for j in search] == [halted["b"][0].id]


def test_the_replay_action_un_halts_and_the_dead_head_runs_first(replayer_client, halted):
    head = halted["a"][0]
    response = replayer_client.post(HALTED, {"action": "replay_selected", "_selected_action": [head.id],
                                                     "lq_confirm": "yes"},
                                    follow=True)
    assert response.status_code == 200
    assert "Replayed job" in response.content.decode()
    assert Job.objects.get(pk=head.id).status == "ready"
    assert halted_rows(replayer_client) == [("acct-b", halted["b"][0].id, 0)]
    assert [j.id for j in claim()] == [head.id]


def test_the_skip_action_keeps_the_job_dead_and_lets_the_next_one_start(replayer_client, halted):
    head = halted["a"][0]
    response = replayer_client.post(HALTED, {"action": "skip_selected", "_selected_action": [head.id]},
                                    follow=True)
    assert "Skipped 1 dead job" in response.content.decode()
    job = Job.objects.get(pk=head.id)
    assert (job.status, job.sequence_halts, job.history[-1]["event"], job.history[-1]["by"]) == \
        ("dead", False, "sequence_skipped", "replayer")
    assert halted_rows(replayer_client) == [("acct-b", halted["b"][0].id, 0)]
    assert [j.id for j in claim()] == [halted["a"][1].id]


def test_a_viewer_sees_the_list_but_gets_no_actions(viewer_client, halted):
    response = viewer_client.get(HALTED)
    assert response.status_code == 200
    assert "skip_selected" not in response.content.decode()
    viewer_client.post(HALTED, {"action": "skip_selected", "_selected_action": [halted["a"][0].id]})
    assert Job.objects.get(pk=halted["a"][0].id).sequence_halts is True
