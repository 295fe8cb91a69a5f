"""The banner of a real ``manage.py runworker`` counts the tasks it will run, the framework's
(``django.tasks``) as well as the native ones, on one line however many there are."""

from __future__ import annotations

import os
import re

import pytest

from django_leasequeue.compat_tasks import TaskResultStatus
from django_leasequeue.models import Job

from ..conftest import ROOT
from .fwonly import tasks as fwonly

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

FRAMEWORK_ONLY = ["--settings", "tests.commands.fwonly_settings"]
ENV = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "testproject")]), "LEASEQUEUE_POLL_INTERVAL": "0.2"}


def banner_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if "task(s) registered" in line]


def test_a_project_with_only_framework_tasks_counts_them_all_on_one_line(spawn):
    seven = fwonly.step_07.enqueue(6)
    last = fwonly.step_37.enqueue(1)
    worker = spawn("runworker", "--burst", *FRAMEWORK_ONLY, env=ENV)
    assert worker.wait(60) == 0
    output = worker.output()
    prefix = "tests.commands.fwonly.tasks.step_"
    assert banner_lines(output) == [
        f"37 task(s) registered (0 native, 37 django.tasks): {prefix}01, {prefix}02, {prefix}03, {prefix}04 "
        "and 33 more"
    ]
    # The tasks the banner counted are the ones it ran.
    assert fwonly.step_07.get_result(seven.id).return_value == 42
    assert fwonly.step_37.get_result(last.id).status == TaskResultStatus.SUCCESSFUL
    assert fwonly.step_37.get_result(last.id).return_value == 37
    assert dict(Job.objects.values_list("task", "status")) == {f"{prefix}07": "done", f"{prefix}37": "done"}


def test_the_test_project_counts_native_and_framework_tasks(spawn):
    # The test project has both kinds; its only framework tasks are invoices.framework_tasks' four.
    worker = spawn("runworker", "--burst", env=ENV)
    assert worker.wait(60) == 0
    (line,) = banner_lines(worker.output())
    found = re.fullmatch(r"(\d+) task\(s\) registered \((\d+) native, (\d+) django\.tasks\): "
                         r"flowlab\.cancellable, flowlab\.customer_job, flowlab\.fail_once, "
                         r"flowlab\.fenced_after_cancel and (\d+) more", line)
    assert found, line
    total, native, framework, more = map(int, found.groups())
    assert (framework, native, more) == (4, total - 4, total - 4)
    assert native > 50 and len(line) < 200


def test_a_worker_with_async_tasks_shows_its_async_slots_and_counts_those_tasks(spawn):
    # qa.async_tasks has four async def tasks (and one sync): the slots run them, so they are shown.
    worker = spawn("runworker", "--burst", "--async-slots", "1000", env={**ENV, "LEASEQUEUE_ASYNC_TASKS": "1"})
    assert worker.wait(60) == 0
    output = worker.output()
    (start,) = [line for line in output.splitlines() if line.startswith("worker ") and ": queues " in line]
    assert ", 4 thread(s), async slots 1000, lease " in start, start
    (line,) = banner_lines(output)
    assert re.match(r"\d+ task\(s\) registered \(\d+ native, 4 django\.tasks; 4 async\): ", line), line
    # Without async tasks, the slots run nothing and are not shown.
    worker = spawn("runworker", "--burst", "--async-slots", "1000", env=ENV)
    assert worker.wait(60) == 0
    assert "async slots" not in worker.output() and "async)" not in worker.output()
