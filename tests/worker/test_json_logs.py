"""The JSON log format (django_leasequeue.logging.JSONFormatter): the lines of a real run carry
the job's id, task, queue, attempt and fencing token, for the lifecycle events and for what the
handler and the executor log while the attempt runs."""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime

import pytest

from django_leasequeue.enqueueing import enqueue, task
from django_leasequeue.logging import JobFieldsFilter, JSONFormatter, attempt_fields, current_attempt
from django_leasequeue.models import Job
from django_leasequeue.testing import drain

pytestmark = pytest.mark.django_db

handler_log = logging.getLogger("tests.worker.json_logs")


@task(name="tests.worker.json_logs.shout", queue="default", max_attempts=2, backoff=0)
def shout(word: str) -> str:
    """Log one line from inside the handler; fail the first attempt when ``word`` is "fail"."""
    handler_log.info("shouting %s", word)
    if word == "fail" and Job.objects.get(task="tests.worker.json_logs.shout", kwargs={}).attempts == 1:
        raise RuntimeError("first attempt fails")
    return word.upper()


def lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    formatter = JSONFormatter()
    return [json.loads(formatter.format(record)) for record in caplog.records]


def test_a_run_logs_the_job_fields_on_every_line(caplog):
    # One level for both loggers: set_level also sets the capturing handler's level.
    caplog.set_level(logging.DEBUG, logger="tests.worker.json_logs")
    caplog.set_level(logging.DEBUG, logger="django_leasequeue.events")
    # The records are formatted after the run: the filter stamps the attempt on them when logged.
    caplog.handler.addFilter(JobFieldsFilter())
    job = enqueue(shout, ["fail"])
    drain(raise_failures=False)
    job.refresh_from_db()
    assert (job.status, job.attempts, job.lease_version) == ("done", 2, 2)
    got = [(line["logger"], line.get("event"), line["message"],
            [line.get(k) for k in ("job_id", "task", "queue", "attempt", "lease_version")])
           for line in lines(caplog)]
    task_name = "tests.worker.json_logs.shout"
    retried_message = (f"job {job.id} retried ({task_name}, attempt 1): builtins.RuntimeError: first attempt "
                       f"fails; next attempt at ")
    assert len(got) == 7 and str(got[3][2]).startswith(retried_message)
    assert got == [
        ("django_leasequeue.events", "enqueued", f"job {job.id} enqueued ({task_name}, attempt 0)",
         [job.id, task_name, "default", 0, 0]),
        ("django_leasequeue.events", "claimed", f"job {job.id} claimed ({task_name}, attempt 1)",
         [job.id, task_name, "default", 1, 1]),
        ("tests.worker.json_logs", None, "shouting fail", [job.id, task_name, "default", 1, 1]),
        ("django_leasequeue.events", "retried", got[3][2], [job.id, task_name, "default", 1, 1]),
        ("django_leasequeue.events", "claimed", f"job {job.id} claimed ({task_name}, attempt 2)",
         [job.id, task_name, "default", 2, 2]),
        ("tests.worker.json_logs", None, "shouting fail", [job.id, task_name, "default", 2, 2]),
        ("django_leasequeue.events", "succeeded", f"job {job.id} succeeded ({task_name}, attempt 2)",
         [job.id, task_name, "default", 2, 2]),
    ]
    # The retried event's own extras are fields of the line too; no line keeps the raw "token".
    retried = lines(caplog)[3]
    assert retried["error"] == "builtins.RuntimeError"
    assert retried["job_message"] == "first attempt fails"
    assert datetime.fromisoformat(str(retried["run_at"])) > job.created_at
    assert all("token" not in line and line["level"] in ("DEBUG", "INFO") for line in lines(caplog))


def test_a_record_outside_any_attempt_has_no_job_fields_and_keeps_its_traceback():
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed %s", ("here",), None)
        record.exc_info = sys.exc_info()
    record.created = 0.0
    line = json.loads(JSONFormatter().format(record))
    assert current_attempt() is None
    assert set(line) == {"time", "level", "logger", "message", "exception"}
    assert (line["time"], line["level"], line["message"]) == ("1970-01-01T00:00:00.000+00:00", "ERROR", "failed here")
    assert line["exception"].splitlines()[-1] == "ValueError: boom"


def test_record_extra_wins_over_the_current_attempt_and_odd_values_become_text():
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", (), None)
    record.job_id, record.token, record.obj = 7, 3, object
    with attempt_fields(1, "t", "q", 2, 9):
        line = json.loads(JSONFormatter().format(record))
        plain = json.loads(JSONFormatter().format(logging.LogRecord("x", logging.INFO, __file__, 1, "m", (), None)))
    assert (line["job_id"], line["lease_version"], "task" in line, line["obj"]) == (7, 3, False, "<class 'object'>")
    assert [plain[k] for k in ("job_id", "task", "queue", "attempt", "lease_version")] == [1, "t", "q", 2, 9]
    assert current_attempt() is None
