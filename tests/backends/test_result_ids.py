"""``get_result()`` reads only the result ids the backend issued: ``str(job.id)``, canonical decimal.
Every other spelling that ``int()`` would turn into the same job names no result."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_leasequeue.compat_tasks import TaskResultDoesNotExist, TaskResultStatus
from django_leasequeue.models import Job

from . import fw_tasks

FULLWIDTH = str.maketrans("0123456789", "０１２３４５６７８９")
ARABIC_INDIC = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")


@pytest.fixture
def issued() -> str:
    """The id of one enqueued job, at least two digits (so that "5_2" has a place for its "_")."""
    with connection.cursor() as cur:
        cur.execute("SELECT setval(pg_get_serial_sequence('leasequeue_job', 'id'), "
                    "greatest((SELECT last_value FROM leasequeue_job_id_seq), 51))")
    result = fw_tasks.add.enqueue(2, 3)
    assert len(result.id) >= 2 and result.id == str(int(result.id))
    return result.id


def bad_forms(job_id: str) -> dict[str, object]:
    return {
        "padded": f" {job_id} ",
        "newline": f"{job_id}\n",
        "leading zero": f"0{job_id}",
        "plus sign": f"+{job_id}",
        "underscore": f"{job_id[0]}_{job_id[1:]}",
        "fullwidth digits": job_id.translate(FULLWIDTH),
        "arabic-indic digits": job_id.translate(ARABIC_INDIC),
        "an int": int(job_id),
    }


@pytest.mark.django_db
def test_the_issued_id_reads_the_result(issued):
    result = fw_tasks.add.get_result(issued)
    assert (result.id, result.status, result.args) == (issued, TaskResultStatus.READY, [2, 3])


@pytest.mark.django_db
@pytest.mark.parametrize("form", ["padded", "newline", "leading zero", "plus sign", "underscore",
                                  "fullwidth digits", "arabic-indic digits", "an int"])
def test_other_spellings_of_the_same_job_name_no_result(issued, form):
    bad = bad_forms(issued)[form]
    assert int(bad) == int(issued)  # int() would read it as the job
    with CaptureQueriesContext(connection) as queries, pytest.raises(TaskResultDoesNotExist, match="not a result id"):
        fw_tasks.add.get_result(bad)  # type: ignore[arg-type]
    assert queries.captured_queries == []  # refused before reading any row
    assert Job.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("bad", ["", " ", "0", "-1", "1.0", "1e2", "0x10", "9223372036854775808",
                                 "99999999999999999999"])
def test_ids_no_job_can_have_name_no_result(bad):
    with CaptureQueriesContext(connection) as queries, pytest.raises(TaskResultDoesNotExist, match="not a result id"):
        fw_tasks.add.get_result(bad)
    assert queries.captured_queries == []


@pytest.mark.django_db
def test_the_largest_job_id_is_looked_up_and_not_found():
    with pytest.raises(TaskResultDoesNotExist) as raised:
        fw_tasks.add.get_result("9223372036854775807")
    assert "not a result id" not in str(raised.value)
