"""Framework (``@task``) tasks used by the backend tests. Module level, as the framework requires."""

import threading

import django
from django.db.models import F
from invoices.models import FlakyAttempt

from django_leasequeue.backends import task_options
from django_leasequeue.compat_tasks import FRAMEWORK, task

# Django 6.1 and the backport pass extra @task keywords on to the backend's task class; Django 6.0's
# @task takes none, so there the same options go through task_options (the spelling documented
# for 6.0). The tests of the keyword path itself skip on 6.0.
TASK_KWARGS = FRAMEWORK == "django_tasks" or django.VERSION >= (6, 1)


def keyword_task(**options):
    """``@task(**options)`` where the framework takes our keywords, else ``@task`` over ``@task_options``."""
    if TASK_KWARGS:
        return task(**options)
    return lambda func: task(task_options(**options)(func))

# Set by ``hold`` when it starts; ``hold`` returns once the test sets RELEASE.
RUNNING = threading.Event()
RELEASE = threading.Event()


@task
def add(a: int, b: int) -> int:
    return a + b


@keyword_task(max_attempts=2, backoff=0)
def fail_always(message: str) -> None:
    raise ValueError(message)


@keyword_task(max_attempts=3, backoff=0)
def flaky(key: str, failures: int) -> str:
    """Fail the first ``failures`` attempts, then return a string."""
    row, _ = FlakyAttempt.objects.get_or_create(key=key)
    FlakyAttempt.objects.filter(pk=row.pk).update(tries=F("tries") + 1)
    row.refresh_from_db()
    if row.tries <= failures:
        raise ConnectionError(f"try {row.tries} failed")
    return f"ok after {row.tries}"


@task(takes_context=True)
def inspect_context(context, x: int) -> dict:
    from django_leasequeue.compat_tasks import TaskContext

    return {
        "x": x,
        "attempt": context.attempt,
        "result_id": context.task_result.id,
        "status": str(context.task_result.status),
        "worker_ids": context.task_result.worker_ids,
        "token": context.lease_version,
        "job_id": context.job_id,
        "is_task_context": isinstance(context, TaskContext),
    }


@task
def hold() -> str:
    RUNNING.set()
    RELEASE.wait(20)
    return "released"


@task
def returns_object() -> object:
    return object()


@task
def returns_tuple() -> tuple:
    return (1, "two")


@task
async def async_add(a: int, b: int) -> int:
    return a + b


@keyword_task(unique_key="report:{0}", max_attempts=7, lease=45, timeout=120)
def unique_report(day: str) -> str:
    return day


@task
@task_options(max_attempts=9, lease=12.5)
def with_function_options() -> None:
    return None


# Retries decided by the error, through @task keywords (Django 6.1, the backport) and task_options.
@keyword_task(max_attempts=5, discard_on=PermissionError, backoff=0)
def fw_discarded(n: int) -> None:
    raise PermissionError(f"no access to record {n}")


def _fw_backoff(attempt: int, exc: BaseException) -> float | None:
    return 7.0 * attempt if isinstance(exc, ConnectionError) else None


@task
@task_options(max_attempts=4, retry_on=ConnectionError, backoff=_fw_backoff)
def fw_retry_on(kind: str) -> None:
    raise {"conn": ConnectionError("down"), "value": ValueError("bad input")}[kind]


@keyword_task(max_attempts=2)
def fw_retry_at(at: str, reason: str) -> None:
    from datetime import datetime

    from django_leasequeue import Retry

    raise Retry(at=datetime.fromisoformat(at), reason=reason)
