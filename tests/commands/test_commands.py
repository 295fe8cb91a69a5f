"""Management commands, in-process: option validation refuses to start, ``runreaper --once``."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_leasequeue import enqueue, store
from django_leasequeue.models import Job
from tests.support import claim

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--concurrency", "0"], "--concurrency must be >= 1"),
     (["--lease", "-1"], "--lease must be a number of seconds in")],
)
def test_runworker_refuses_bad_options(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("runworker", *args)


@override_settings(LEASEQUEUE={"QUEUES": ["default", "emails"]})
def test_runworker_refuses_unknown_queue_when_restricted():
    with pytest.raises(CommandError, match=r"unknown queue\(s\) \['emial'\]"):
        call_command("runworker", "--queues", "default,emial")


@override_settings(LEASEQUEUE={"LAESE": 5})
def test_runworker_refuses_invalid_settings_with_suggestion():
    with pytest.raises(CommandError, match="did you mean 'LEASE'"):
        call_command("runworker")


def test_runreaper_once_takes_back_expired_leases(db_clock):
    job = enqueue("qa.record")
    claim(store.db_now() + timedelta(seconds=1), lease=1)
    db_clock.advance(5)
    out = StringIO()
    call_command("runreaper", "--once", stdout=out)
    assert "reaped 1 expired lease(s)" in out.getvalue()
    job.refresh_from_db()
    assert (job.status, job.lease_version, job.errors[0]["type"]) == ("ready", 2, "LeaseExpired")
    assert Job.objects.count() == 1
