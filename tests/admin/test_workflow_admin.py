"""The workflow admin through the test client: the list (progress, state, filters, search, bounded
statements), a workflow's page (steps, "blocked by job N", callbacks, the cap on a 2,000-member
batch), its Replay and "Cancel the rest" buttons with their permissions, and the workflow parts of
the job and dead-letter pages. Jobs are moved with store calls (claim, fail, complete), never a
worker."""

from __future__ import annotations

import json
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_leasequeue import Batch, Workflow, chain, chord, enqueue, group, store
from django_leasequeue.admin import STATUS_COLOURS, STEPS_SHOWN
from django_leasequeue.enqueueing import task
from django_leasequeue.models import Job

from .conftest import client_for, make_user

pytestmark = pytest.mark.django_db

WORKFLOWS = reverse("admin:django_leasequeue_workflow_changelist")
JOBS = reverse("admin:django_leasequeue_job_changelist")
DEAD = reverse("admin:django_leasequeue_deadletter_changelist")


@task(name="tests.wfadmin.step")
def step(x: int = 0) -> int:
    return x


@task(name="tests.wfadmin.total")
def total(results: list[int]) -> int:
    return sum(results)


def workflow_url(workflow_id: int) -> str:
    return reverse("admin:django_leasequeue_workflow_change", args=[workflow_id])


def replay_url(workflow_id: int) -> str:
    return reverse("admin:django_leasequeue_workflow_replay", args=[workflow_id])


def cancel_url(workflow_id: int) -> str:
    return reverse("admin:django_leasequeue_workflow_cancel", args=[workflow_id])


def job_url(job_id: int) -> str:
    return reverse("admin:django_leasequeue_job_change", args=[job_id])


def claim(job_id: int) -> int:
    """Lease one ready job; its fencing token."""
    (claimed,) = store.job_claim_ids([job_id], worker_id="test:1:w", lease=30)
    return claimed.lease_version


def complete(job_id: int, result: object = None) -> None:
    """Claim a ready job and write its completion, as a worker's completer would."""
    done = store.job_complete([(job_id, claim(job_id), json.dumps(result))])
    assert job_id in done


def kill(job_id: int) -> None:
    """Claim a ready job and dead-letter it (a non-retryable failure)."""
    outcome = store.job_fail(job_id, claim(job_id), {"attempt": 1, "type": "ValueError", "message": "boom",
                                                     "traceback": "", "worker": "test:1:w"}, retry_delay=None)
    assert outcome is not None and outcome[0] == "dead"


def statuses(ids: list[int]) -> list[str]:
    by_id = dict(Job.objects.filter(pk__in=ids).values_list("pk", "status"))
    return [by_id[i] for i in ids]


def steps_of(handle) -> list[int]:
    return list(handle.members().values_list("pk", flat=True))


def blocked_chain():
    """A chain a -> b -> c whose first step is dead: b and c wait, held by a."""
    handle = chain(step.step(1), step.step(), step.step(), name="blocked chain").enqueue()
    a, b, c = steps_of(handle)
    kill(a)
    assert statuses([a, b, c]) == ["dead", "waiting", "waiting"]
    return handle, (a, b, c)


def result_ids(response) -> list[int]:
    return [obj.pk for obj in response.context["cl"].result_list]


def statements_of(client, url: str, data: dict | None = None) -> int:
    """The statements one GET of ``url`` runs (it must answer 200)."""
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url, data).status_code == 200
    return len(ctx.captured_queries)


# ---- the list -------------------------------------------------------------------------------------


def test_list_shows_progress_dead_cancelled_and_state_of_each_kind(admin_client):
    held, _ = blocked_chain()
    running = group([step.step(i) for i in range(3)], name="running group").enqueue()
    complete(steps_of(running)[0], 0)
    finished = chord([step.step(i) for i in range(2)], total.step(), name="done chord").enqueue()
    for job_id in steps_of(finished):
        complete(job_id, 1)
    complete(finished.callbacks()["on_success"].pk, 2)
    batch = Batch.open("open batch")
    batch.add_many(step, [[1], [2]])
    cancelled_one = group([step.step(1), step.step(2)], name="half cancelled").enqueue()
    store.job_request_cancel([steps_of(cancelled_one)[0]], by="test")

    response = admin_client.get(WORKFLOWS)

    assert response.status_code == 200
    rows = {obj.pk: obj for obj in response.context["cl"].result_list}
    assert list(rows) == [cancelled_one.id, batch.id, finished.id, running.id, held.id]  # newest first
    assert {pk: obj.lq_state for pk, obj in rows.items()} == {
        held.id: "blocked", running.id: "running", finished.id: "finished", batch.id: "open",
        cancelled_one.id: "running"}
    html = response.content.decode()
    row_of = {pk: re.search(rf'<tr>.*?/workflow/{pk}/change/.*?</tr>', html, re.S).group(0) for pk in rows}
    assert ">0/3<" in row_of[held.id] and "held by a dead member" in row_of[held.id]
    assert (f'<td class="field-dead"><span class="lq-dead" data-live="wf:{held.id}:dead" '
            'data-live-nonzero="lq-dead">1</span></td>') in row_of[held.id]
    assert ">1/3<" in row_of[running.id] and ">running<" in row_of[running.id]
    assert ">2/2<" in row_of[finished.id] and ">finished<" in row_of[finished.id]
    assert ">0/2<" in row_of[batch.id] and "open batch, not closed" in row_of[batch.id]
    assert f'<td class="field-cancelled"><span data-live="wf:{cancelled_one.id}:cancelled">1</span></td>' \
        in row_of[cancelled_one.id]

    assert result_ids(admin_client.get(WORKFLOWS, {"state": "blocked"})) == [held.id]
    assert result_ids(admin_client.get(WORKFLOWS, {"state": "open"})) == [batch.id]
    assert result_ids(admin_client.get(WORKFLOWS, {"state": "finished"})) == [finished.id]
    assert result_ids(admin_client.get(WORKFLOWS, {"state": "running"})) == [cancelled_one.id, running.id]
    assert result_ids(admin_client.get(WORKFLOWS, {"kind__exact": "chord"})) == [finished.id]
    assert result_ids(admin_client.get(WORKFLOWS, {"kind__exact": "batch"})) == [batch.id]


def test_a_dead_member_that_holds_nobody_leaves_the_workflow_running_and_its_fan_in_blocked(admin_client):
    # A graph: x -> y, and z alone. z dead holds nothing while x runs; once x and y are done and
    # nothing else is pending, the workflow finishes (no callback waits).
    wf = Workflow("graph")
    wf.add("x", step.step(1))
    wf.add("y", step.step(2), depends_on=["x"])
    wf.add("z", step.step(3))
    handle = wf.enqueue()
    x, y, z = (handle.steps()[name].pk for name in ("x", "y", "z"))
    kill(z)
    assert result_ids(admin_client.get(WORKFLOWS, {"state": "running"})) == [handle.id]
    complete(x)
    complete(y)
    assert result_ids(admin_client.get(WORKFLOWS, {"state": "finished"})) == [handle.id]
    # A chord whose dead member holds the callback: no member pending, not finished -> held.
    held = chord([step.step(1), step.step(2)], total.step()).enqueue()
    m1, m2 = steps_of(held)
    complete(m1)
    kill(m2)
    assert result_ids(admin_client.get(WORKFLOWS, {"state": "blocked"})) == [held.id]
    # A batch with only on_complete: a dead member holds nothing; the released callback is running.
    batch = Batch.open(on_complete=step.step(0))
    batch.add_many(step, [[1], [2]])
    batch.close()
    b1, b2 = steps_of(batch)
    complete(b1)
    kill(b2)
    assert batch.callbacks()["on_complete"].status == "ready"
    assert result_ids(admin_client.get(WORKFLOWS, {"state": "running"})) == [batch.id]


def test_list_search_by_id_name_and_exact_unique_key(admin_client):
    first = group([step.step(1)], name="nightly import", unique_key="import-2026-12-02").enqueue()
    second = group([step.step(2)], name="weekly report").enqueue()

    assert result_ids(admin_client.get(WORKFLOWS, {"q": str(second.id)})) == [second.id]
    assert result_ids(admin_client.get(WORKFLOWS, {"q": f"#{first.id}"})) == [first.id]
    assert result_ids(admin_client.get(WORKFLOWS, {"q": "nightly"})) == [first.id]
    assert result_ids(admin_client.get(WORKFLOWS, {"q": "import-2026-12-02"})) == [first.id]
    assert result_ids(admin_client.get(WORKFLOWS, {"q": "import-2026"})) == []  # the key is exact


def test_list_statements_do_not_grow_with_the_rows(admin_client):
    blocked_chain()
    # The session, the user, the bounded count, the page's rows.
    assert statements_of(admin_client, WORKFLOWS) == 4
    for i in range(40):
        handle = chain(step.step(i), step.step(), name=f"chain {i}").enqueue()
        if i % 4 == 0:
            kill(steps_of(handle)[0])  # held: the state's edge check runs for these rows
    batch = Batch.open("big")
    batch.add_many(step, [[i] for i in range(300)])
    assert statements_of(admin_client, WORKFLOWS) == 4
    assert statements_of(admin_client, WORKFLOWS, {"state": "blocked"}) == 4
    assert len(admin_client.get(WORKFLOWS, {"state": "blocked"}).context["cl"].result_list) == 11


def test_add_change_and_delete_are_refused(admin_client):
    handle = group([step.step(1)]).enqueue()
    assert admin_client.get(reverse("admin:django_leasequeue_workflow_add")).status_code == 403
    assert admin_client.post(workflow_url(handle.id), {"name": "renamed"}).status_code == 405
    assert admin_client.get(reverse("admin:django_leasequeue_workflow_delete", args=[handle.id])).status_code == 403
    assert handle.row().name == ""


# ---- a workflow's page ----------------------------------------------------------------------------


def test_change_page_lists_steps_in_order_with_dependencies_and_blocked_by(admin_client):
    handle, (a, b, c) = blocked_chain()

    response = admin_client.get(workflow_url(handle.id))

    assert response.status_code == 200
    html = response.content.decode()
    steps = response.context["lq_steps"]
    assert [s["job"].pk for s in steps] == [a, b, c]
    assert [s["job"].workflow_step for s in steps] == ["1", "2", "3"]
    assert [s["job"].status for s in steps] == ["dead", "waiting", "waiting"]
    assert [[d["name"] for d in s["depends_on"]] for s in steps] == [[], ["1"], ["2"]]
    assert [[x["id"] for x in s["blocked_by"]] for s in steps] == [[], [a], []]  # c waits on b, which is alive
    assert f'blocked by job <a href="{job_url(a)}" class="lq-dead">{a}</a>' in html
    assert '<span id="lq-progress" data-live="wf:done">0/3 done</span>' in html
    assert '<span id="lq-pending" data-live="wf:pending">2 pending</span>' in html
    assert ">1 dead</span>" in html
    assert response.context["lq_counts"] == {"waiting": 2, "ready": 0, "leased": 0, "done": 0, "dead": 1,
                                             "cancelled": 0}
    assert response.context["lq_state"] == "held by a dead member"
    assert html.count(f'name="job" value="{a}"') == 2  # in "held by" and on its step row
    assert 'id="lq-cancel-rest"' in html
    assert STATUS_COLOURS["waiting"] in html


def test_change_page_shows_the_callbacks_and_their_state(admin_client):
    batch = Batch.open("with callbacks", on_success=total.step().set(pass_result=True),
                       on_complete=step.step(9))
    batch.add_many(step, [[1], [2]])
    batch.close()
    callbacks = batch.callbacks()

    response = admin_client.get(workflow_url(batch.id))

    rows = response.context["lq_callbacks"]
    assert [(r["role"], r["job"].pk, r["job"].status) for r in rows] == [
        ("on_success", callbacks["on_success"].pk, "waiting"), ("on_complete", callbacks["on_complete"].pk, "waiting")]
    assert [s["job"].pk for s in response.context["lq_steps"]] == steps_of(batch)
    assert response.context["lq_state"] == "running"


def test_a_2000_member_batch_page_lists_the_first_500_and_links_the_rest(admin_client):
    small = Batch.open("small batch", on_complete=step.step(0))
    small.add_many(step, [[1], [2], [3]])
    small.close()
    kill(steps_of(small)[0])
    small_page = statements_of(admin_client, workflow_url(small.id))
    batch = Batch.open("big batch", on_complete=step.step(0))
    batch.add_many(step, [[i] for i in range(2000)])
    batch.close()
    members = steps_of(batch)
    kill(members[0])
    kill(members[1999])

    # The session, the user, the workflow row, its first 500 members, its callbacks, their
    # dependency edges, its dead jobs, its counts by status: the same for 3 members or 2,000.
    assert small_page == statements_of(admin_client, workflow_url(batch.id)) == 8
    response = admin_client.get(workflow_url(batch.id))

    assert response.status_code == 200
    assert [s["job"].pk for s in response.context["lq_steps"]] == members[:STEPS_SHOWN]
    assert response.context["lq_more"] == 1500
    assert [d["job"].pk for d in response.context["lq_dead"]] == [members[0], members[1999]]
    html = response.content.decode()
    assert f"… and 1500 more: <a href=\"{JOBS}?workflow__id__exact={batch.id}\">" in html
    assert '<span id="lq-progress" data-live="wf:done">0/2000 done</span>' in html
    assert ">2 dead</span>" in html
    # The link lists every job of the workflow: 2,000 members and the callback.
    listed = admin_client.get(JOBS, {"workflow__id__exact": batch.id})
    assert listed.status_code == 200
    assert listed.context["cl"].result_count == 2001
    assert f"workflow #{batch.id}" in listed.content.decode()


# ---- replay and cancel the rest ---------------------------------------------------------------------


def test_replay_button_replays_the_dead_step_and_its_completion_releases_the_held_one(admin_client):
    handle, (a, b, c) = blocked_chain()

    response = admin_client.post(replay_url(handle.id), {"job": str(a)})

    assert response.status_code == 302 and response.url == workflow_url(handle.id)
    assert statuses([a, b, c]) == ["ready", "waiting", "waiting"]
    assert Job.objects.get(pk=a).history[-1]["event"] == "replayed"
    assert Job.objects.get(pk=a).history[-1]["by"] == "admin"
    row = handle.row()
    assert (row.members_pending, row.members_dead) == (3, 0)
    complete(a, 5)
    assert statuses([a, b, c]) == ["done", "ready", "waiting"]
    assert Job.objects.get(pk=b).args == [5]  # the chain passes the result on
    page = admin_client.get(workflow_url(handle.id))
    assert page.context["lq_state"] == "running"
    assert [x["blocked_by"] for x in page.context["lq_steps"]] == [[], [], []]


def test_replay_every_dead_job_replays_them_all_in_one_call(admin_client):
    handle = group([step.step(i) for i in range(4)]).enqueue()
    members = steps_of(handle)
    kill(members[1])
    kill(members[3])
    complete(members[0])

    response = admin_client.post(replay_url(handle.id), {"job": "dead"}, follow=True)

    assert statuses(members) == ["done", "ready", "ready", "ready"]
    assert "Replayed 2 jobs: they are ready and due now." in [str(m) for m in response.context["messages"]]


def test_replay_refuses_a_job_of_another_workflow_and_a_ready_one(admin_client):
    handle, (a, b, _) = blocked_chain()
    other = group([step.step(1)]).enqueue()
    (stranger,) = steps_of(other)
    kill(stranger)

    assert admin_client.post(replay_url(handle.id), {"job": str(stranger)}).status_code == 404
    assert admin_client.post(replay_url(handle.id), {"job": "x"}).status_code == 404
    assert admin_client.get(replay_url(handle.id)).status_code == 405
    response = admin_client.post(replay_url(handle.id), {"job": str(b)}, follow=True)
    assert [str(m) for m in response.context["messages"]] == [
        f"Not replayed: 1 × job is waiting; only dead or cancelled jobs are replayed (#{b})."]
    assert statuses([a, b, stranger]) == ["dead", "waiting", "dead"]


def test_cancel_the_rest_cancels_exactly_the_unfinished_jobs(admin_client):
    wf = Workflow("mixed")
    for name in ("done", "dead", "ready1", "ready2", "leased"):
        wf.add(name, step.step())
    wf.add("waiting", step.step(), depends_on=["ready1"])
    wf.on_complete(step.step())
    handle = wf.enqueue()
    ids = {name: job.pk for name, job in handle.steps().items()}
    callback = handle.callbacks()["on_complete"].pk
    complete(ids["done"])
    kill(ids["dead"])
    claim(ids["leased"])

    response = admin_client.post(cancel_url(handle.id), follow=True)

    assert [str(m) for m in response.context["messages"]] == [
        f"Workflow #{handle.id}: cancelled 4 waiting or ready jobs; asked 1 running job to stop (each ends "
        "cancelled at its worker's next write)."]
    order = ["done", "dead", "ready1", "ready2", "leased", "waiting"]
    assert statuses([ids[n] for n in order] + [callback]) == [
        "done", "dead", "cancelled", "cancelled", "leased", "cancelled", "cancelled"]
    assert Job.objects.get(pk=ids["leased"]).cancel_requested is True
    assert Job.objects.get(pk=ids["ready1"]).history[-1]["by"] == "admin"
    row = handle.row()
    assert (row.members_done, row.members_dead, row.members_cancelled, row.members_pending) == (1, 1, 3, 1)
    # The leased step's worker writes its completion: the cancel wins and the workflow finishes.
    version = Job.objects.get(pk=ids["leased"]).lease_version
    done = store.job_complete([(ids["leased"], version, "null")])
    assert ids["leased"] in done.cancelled
    assert handle.row().finished_at is not None
    page = admin_client.get(workflow_url(handle.id))
    assert page.context["lq_state"] == "finished"
    assert 'id="lq-cancel-rest"' not in page.content.decode()


def test_cancel_the_rest_of_a_finished_workflow_changes_nothing(admin_client):
    handle = group([step.step(1)]).enqueue()
    complete(steps_of(handle)[0])
    response = admin_client.post(cancel_url(handle.id), follow=True)
    assert [str(m) for m in response.context["messages"]] == [f"Workflow #{handle.id} has no unfinished job to cancel."]
    assert statuses(steps_of(handle)) == ["done"]


# ---- permissions -------------------------------------------------------------------------------------


def test_permissions_of_the_buttons(operator_client, viewer_client, replayer_client):
    handle, (a, b, c) = blocked_chain()

    # A viewer sees the list and the page, without buttons, and is refused both writes.
    assert viewer_client.get(WORKFLOWS).status_code == 200
    page = viewer_client.get(workflow_url(handle.id))
    assert page.status_code == 200
    assert 'name="job"' not in page.content.decode() and "lq-cancel-rest" not in page.content.decode()
    assert viewer_client.post(replay_url(handle.id), {"job": str(a)}).status_code == 403
    assert viewer_client.post(cancel_url(handle.id)).status_code == 403
    # change_job without replay_job: cancel's button, no replay.
    page = operator_client.get(workflow_url(handle.id))
    assert 'name="job"' not in page.content.decode() and "lq-cancel-rest" in page.content.decode()
    assert operator_client.post(replay_url(handle.id), {"job": str(a)}).status_code == 403
    # replay_job without change_job: replay's buttons, no cancel.
    page = replayer_client.get(workflow_url(handle.id))
    assert 'name="job"' in page.content.decode() and "lq-cancel-rest" not in page.content.decode()
    assert replayer_client.post(cancel_url(handle.id)).status_code == 403
    assert statuses([a, b, c]) == ["dead", "waiting", "waiting"]
    # Each one's own permission works.
    assert replayer_client.post(replay_url(handle.id), {"job": str(a)}).status_code == 302
    assert operator_client.post(cancel_url(handle.id)).status_code == 302
    assert statuses([a, b, c]) == ["cancelled", "cancelled", "cancelled"]


def test_a_user_without_job_or_workflow_permissions_cannot_see_workflows(db):
    handle = group([step.step(1)]).enqueue()
    stranger = client_for(make_user("stranger", "view_schedule"))
    assert stranger.get(WORKFLOWS).status_code == 403
    assert stranger.get(workflow_url(handle.id)).status_code == 403
    assert stranger.post(cancel_url(handle.id)).status_code == 403
    workflow_viewer = client_for(make_user("wfviewer", "view_workflow"))
    assert workflow_viewer.get(workflow_url(handle.id)).status_code == 200
    assert workflow_viewer.post(cancel_url(handle.id)).status_code == 403


# ---- the job pages -----------------------------------------------------------------------------------


def test_job_list_filters_waiting_jobs_and_the_jobs_of_one_workflow(admin_client):
    handle, (a, b, c) = blocked_chain()
    other = group([step.step(1), step.step(2)]).enqueue()

    waiting = admin_client.get(JOBS, {"status__exact": "waiting"})
    assert result_ids(waiting) == [c, b]
    assert f'color:{STATUS_COLOURS["waiting"]}">waiting<' in waiting.content.decode()
    assert result_ids(admin_client.get(JOBS, {"workflow__id__exact": handle.id})) == [c, b, a]
    assert result_ids(admin_client.get(JOBS, {"workflow__id__exact": other.id})) == steps_of(other)[::-1]
    assert admin_client.get(JOBS, {"workflow__id__exact": "x"}).url == f"{JOBS}?e=1"


def test_job_page_shows_its_workflow_dependencies_and_dependents(admin_client):
    handle, (a, b, c) = blocked_chain()

    page = admin_client.get(job_url(b))

    html = page.content.decode()
    assert page.status_code == 200
    assert f'<a href="{workflow_url(handle.id)}" id="lq-workflow-link">workflow #{handle.id}</a>' in html
    deps = re.search(r'<div class="readonly"><ul class="lq-edges">(.*?)</ul>', html, re.S).group(1)
    assert f'<a href="{job_url(a)}">#{a}</a> 1' in deps and f"blocked by job {a}: replay it to resume" in deps
    dependents = html.split("dependents", 1)[1]
    assert f'<a href="{job_url(c)}">#{c}</a> 3' in dependents and "waits on this job" in dependents
    assert "on 1 dependency not settled" in html
    assert 'id="lq-cancel"' in html  # a waiting job can be cancelled from its page
    # A job with no workflow and no edges has no Workflow section.
    lone = step.enqueue(1)
    assert ">Workflow</h2>" not in admin_client.get(job_url(lone.id)).content.decode()


def test_job_enqueued_with_depends_on_shows_the_section_without_a_workflow(admin_client):
    first = step.enqueue(1)
    later = enqueue(step, [2], depends_on=[first])
    html = admin_client.get(job_url(later.id)).content.decode()
    assert ">Workflow</h2>" in html
    assert f'<a href="{job_url(first.id)}">#{first.id}</a> {first.id}' in html  # named by its id
    assert "not done yet" in html
    # Whether a job has dependencies is read with the job's row, not by a statement of its own.
    lone = step.enqueue(1)
    assert statements_of(admin_client, job_url(lone.id)) == statements_of(admin_client, job_url(later.id)) - 1


def test_dead_letters_say_how_many_jobs_wait_on_each_in_one_statement(admin_client):
    def page() -> tuple[int, str]:
        with CaptureQueriesContext(connection) as ctx:
            response = admin_client.get(DEAD)
        assert response.status_code == 200
        return len(ctx.captured_queries), response.content.decode()

    wf = Workflow("fan-out")
    wf.add("root", step.step())
    for name in ("b", "c", "d"):
        wf.add(name, step.step(), depends_on=["root"])
    handle = wf.enqueue()
    root = handle.steps()["root"].pk
    kill(root)
    lone = step.enqueue(1)
    kill(lone.id)
    one_holder, html = page()
    assert "3 jobs wait on this job" in html
    assert html.count("wait on this job") + html.count("waits on this job") == 1
    for _ in range(5):
        blocked_chain()
    five_more, html = page()
    assert five_more == one_holder
    assert html.count("1 job waits on this job") == 5 and html.count("3 jobs wait on this job") == 1
