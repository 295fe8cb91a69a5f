"""The Django tasks backend's enqueue checks values as ``enqueue()`` does: a ``run_after`` past year
9999 in UTC is refused before the INSERT, and no row is written."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_leasequeue.exceptions import EnqueueError
from django_leasequeue.models import Job

from . import fw_tasks


@pytest.mark.django_db(transaction=True)
def test_run_after_past_year_9999_is_refused_before_the_insert():
    late = fw_tasks.add.using(run_after=datetime(9999, 12, 31, 23, tzinfo=ZoneInfo("Etc/GMT+12")))
    with CaptureQueriesContext(connection) as queries, pytest.raises(EnqueueError, match="outside the range"):
        late.enqueue(1, 2)
    assert queries.captured_queries == []
    assert Job.objects.count() == 0
