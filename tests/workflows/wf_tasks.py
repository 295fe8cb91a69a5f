"""Tasks and helpers shared by the in-process workflow tests (``drain()`` in this process).

``flaky`` fails while its ``fail`` keyword is true, so a test makes a dead letter and then
"fixes the payload" by replaying it with ``kwargs={"fail": False}``, as an operator would.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from django_leasequeue.enqueueing import task
from django_leasequeue.models import Dependency, Job, Workflow


@task(name="tests.wfx.add")
def add(x, y=0):
    return x + y


@task(name="tests.wfx.echo")
def echo(*args, **kwargs):
    return {"args": list(args), "kwargs": kwargs}


@task(name="tests.wfx.total")
def total(results):
    return sum(r for r in results if r is not None)


@task(name="tests.wfx.collect")
def collect(results):
    return results


@task(name="tests.wfx.merge")
def merge(values):
    return sum(values.values())


@task(name="tests.wfx.flaky", max_attempts=1)
def flaky(value, fail=False):
    if fail:
        raise ValueError(f"flaky failed on {value!r}")
    return value


@task(name="tests.wfx.inspect", takes_context=True)
def inspect_dependencies(ctx, *args):
    deps = ctx.dependencies()
    return {
        "args": list(args),
        "workflow": ctx.workflow_id(),
        "deps": {name: {"job": d.job_id, "status": d.status, "result": d.result, "resolved": d.resolved,
                        "error": None if d.error is None else [d.error["type"], d.error["message"]]}
                 for name, d in deps.items()},
    }


def rows() -> dict[str, int]:
    """The row counts of the three tables a workflow writes."""
    return {"jobs": Job.objects.count(), "workflows": Workflow.objects.count(),
            "dependencies": Dependency.objects.count()}


@contextmanager
def refused(exc: type[BaseException], match: str) -> Iterator[pytest.ExceptionInfo[Any]]:
    """Expect ``exc`` (its message matching ``match``) and that not one row was written."""
    before = rows()
    with pytest.raises(exc, match=match) as info:
        yield info
    assert rows() == before


def status(job_id: int) -> str:
    return Job.objects.get(id=job_id).status


def statuses(handle: Any) -> list[str]:
    """Every job of a workflow (members then callbacks, by id) as its status."""
    return [job.status for job in handle.jobs()]
