"""The job change page writes no job row: a POST from any user, ``change_job`` included, changes
nothing.

Every field of the page is read-only, so an empty form would be valid; saving it would write back
the whole row as read at the start of the request. A claim committed in between would then be
overwritten (status back to ready, old token), and a second worker could claim the job with the
*same* fencing token as the first: two holders whose fenced writes both pass.
"""

import pytest
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models.signals import pre_save
from django.forms.models import model_to_dict
from django.test import RequestFactory
from django.urls import reverse

from django_leasequeue import enqueue, store
from django_leasequeue.models import Job
from tests.admin.conftest import client_for, make_user
from tests.support import claim

pytestmark = pytest.mark.django_db


def row(job_id: int) -> dict:
    return model_to_dict(Job.objects.get(pk=job_id))


@pytest.mark.parametrize("page", ["job", "deadletter"])
def test_post_to_a_job_change_page_is_refused_and_writes_nothing(page):
    operator = client_for(make_user("op", "view_job", "change_job", "view_deadletter"))
    job = enqueue("qa.record", ["x"])
    if page == "deadletter":
        Job.objects.filter(pk=job.pk).update(status="dead")
    url = reverse(f"admin:django_leasequeue_{page}_change", args=[job.id])
    assert operator.get(url).status_code == 200  # the page itself still works
    before = row(job.id)
    saves = []

    def on_save(sender, instance, **kwargs):
        saves.append(instance.pk)

    pre_save.connect(on_save, sender=Job)
    try:
        response = operator.post(url, {"_save": "Save", "status": "ready"})
    finally:
        pre_save.disconnect(on_save, sender=Job)
    assert (response.status_code, response["Allow"]) == (405, "GET, HEAD")
    assert saves == []
    assert row(job.id) == before


def test_form_post_after_a_claim_cannot_hand_the_same_token_to_a_second_worker():
    """The race of the finding, in sequence: the operator's page was read while the job was ready,
    a worker claims it, then the form is posted. The claim stands and nobody else gets the job."""
    operator = client_for(make_user("op", "view_job", "change_job"))
    job = enqueue("qa.record", ["x"])
    url = reverse("admin:django_leasequeue_job_change", args=[job.id])
    assert operator.get(url).status_code == 200
    (first,) = claim(worker_id="w1")
    assert operator.post(url, {}).status_code == 405
    held = Job.objects.get(pk=job.id)
    assert (held.status, held.lease_version, held.leased_by, held.attempts) == ("leased", first.lease_version, "w1", 1)
    assert claim(worker_id="w2") == []
    assert store.job_renew([(job.id, first.lease_version, 30)]).keys() == {job.id}


def test_save_model_refuses_to_write_a_job():
    request = RequestFactory().post("/")
    request.user = make_user("op", "view_job", "change_job")
    job = enqueue("qa.record", ["x"])
    before = row(job.id)
    obj = Job.objects.get(pk=job.id)
    obj.status = "done"
    with pytest.raises(PermissionDenied, match="jobs are changed through the replay, cancel and retry-now actions"):
        admin.site._registry[Job].save_model(request, obj, form=None, change=True)
    assert row(job.id) == before
