"""The ledger of a bulk replay with a real ``runworker``: an error group's confirmed Replay,
double-submitted, makes each of its jobs run exactly once, and no job outside the group runs."""

from __future__ import annotations

import signal
from collections import Counter

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from flowlab.models import Probe

from django_leasequeue.models import Job
from tests.conftest import wait_for
from tests.flow.conftest import worker_env

from .factories import ERROR, make_jobs

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

DEAD = reverse("admin:django_leasequeue_deadletter_changelist")
GROUP, OTHER = 30, 5


def test_a_replayed_error_group_runs_each_job_exactly_once(spawn):
    User.objects.create_superuser("root", password="pw")
    client = Client()
    client.force_login(User.objects.get(username="root"))
    fields = {"task": "flowlab.seq_step", "queue": "flow", "args": [], "max_attempts": 1}
    group = make_jobs(GROUP, "dead", kwargs={"account": "a", "n": 1}, **fields)
    other = make_jobs(OTHER, "dead", kwargs={"account": "b", "n": 2},
                      errors=[dict(ERROR, type="KeyError", message="other")], **fields)
    page = client.get(DEAD + "bulk/replay/?task=flowlab.seq_step&error_type=ValueError")
    assert page.context["preview"].acting == GROUP
    form = {"action": "replay_selected", "_selected_action": group[:1], "select_across": "1", "index": "0",
            "lq_confirm": "yes", "lq_ids": page.context["ids"]}
    assert sorted(int(i) for i in form["lq_ids"].split(",")) == group
    client.post(page.context["post_url"], form)
    client.post(page.context["post_url"], form)  # the operator clicks twice
    worker = spawn("runworker", "--queues", "flow", "--concurrency", "4", "--worker-id", "ledger",
                   env=worker_env())
    wait_for(lambda: Job.objects.filter(pk__in=group, status="done").count() == GROUP, timeout=60, interval=0.1,
             what=f"{GROUP} replayed jobs done")
    worker.signal(signal.SIGTERM)
    worker.wait(timeout=30)
    starts = Counter(Probe.objects.filter(event="start").values_list("job_id", flat=True))
    assert starts == Counter({job_id: 1 for job_id in group})
    assert Counter(Job.objects.filter(pk__in=other).values_list("status", flat=True)) == {"dead": OTHER}
