"""Workflow test tasks for the process tests (``tests/workflows/test_process_*.py``): each handler
writes one ``Execution`` row (tag ``wf:<name>``), so a test counts executions per step exactly.

The "flag" of :func:`wf_flagged` is an ``Effect`` row with key ``wf-flag:<key>``: the handler fails
until a test writes it (no model of its own, so no migration).
"""

from django_leasequeue import JobContext, task

from .models import Effect, Execution


def _record(context: JobContext, tag: str) -> None:
    Execution.objects.create(job_id=context.job_id, lease_version=context.lease_version, attempt=context.attempt,
                             worker=context.worker_id, tag=f"wf:{tag}")


@task(name="qa.wf_add", takes_context=True, max_attempts=1)
def wf_add(context: JobContext, x: int, y: int = 0) -> int:
    """Return ``x + y`` (in a chain ``x`` is the previous step's result)."""
    _record(context, "add")
    return x + y


@task(name="qa.wf_collect", takes_context=True, max_attempts=1)
def wf_collect(context: JobContext, *results: object) -> list[object]:
    """Return the results it was given (the dependencies' results, prepended on release)."""
    _record(context, "collect")
    return list(results)


@task(name="qa.wf_member", takes_context=True, max_attempts=3)
def wf_member(context: JobContext, n: int) -> int:
    """A batch member: return ``n``."""
    _record(context, "member")
    return n


@task(name="qa.wf_callback", takes_context=True, max_attempts=1)
def wf_callback(context: JobContext, tag: str = "callback") -> str:
    """A fan-in callback: return ``tag``."""
    _record(context, tag)
    return tag


@task(name="qa.wf_flagged", takes_context=True, max_attempts=1)
def wf_flagged(context: JobContext, x: int, key: str) -> int:
    """Fail until the flag ``key`` is set (an ``Effect`` row ``wf-flag:<key>``), then return ``x * 10``."""
    _record(context, "flagged")
    if not Effect.objects.filter(key=f"wf-flag:{key}").exists():
        raise RuntimeError(f"flag {key} not set")
    return x * 10
