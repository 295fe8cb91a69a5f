"""Type-checker test of the public API (run by mypy in scripts/test, never imported by pytest).

``assert_type`` pins what a type checker infers; a ``# type: ignore[code]`` marks a call that must
be an error: with ``warn_unused_ignores`` (part of ``--strict``) mypy fails if the call type-checks,
so the negative cases are tested too.
"""

from __future__ import annotations

from datetime import timedelta
from typing import assert_type

from django_leasequeue import JobContext, Task, enqueue, enqueue_many, task
from django_leasequeue.models import Job


@task
def plain(account_id: int, period: str) -> dict[str, int]:
    return {"account": account_id}


@task(queue="billing", max_attempts=3)
def with_options(amount_cents: int, *, currency: str = "EUR") -> None:
    pass


@task(takes_context=True, lease=10)
def with_context(context: JobContext, account_id: int, period: str) -> str:
    return f"{context.job_id}:{account_id}:{period}"


@task(takes_context=True)
async def async_with_context(context: JobContext, report_id: int) -> None:
    pass


# Calling the task object calls the handler in-process, with its return type.
assert_type(plain(42, "2026-11"), dict[str, int])
assert_type(with_options(1999), None)
_as_any_task: Task[..., str] = with_context  # R is the handler's return type, context or not

# enqueue() takes the handler's parameters (without the context) and returns the Job row.
assert_type(plain.enqueue(42, "2026-11"), Job)
assert_type(with_options.enqueue(1999, currency="USD"), Job)
assert_type(with_context.enqueue(42, period="2026-11"), Job)
assert_type(plain.using(run_at=timedelta(minutes=5), unique_key="k").enqueue(1, "p"), Job)
with_context.enqueue_on_commit(42, "2026-11")
async_with_context.enqueue(7)

# Wrong arguments are type errors.
plain.enqueue("42", "2026-11")  # type: ignore[arg-type]
plain.enqueue(42)  # type: ignore[call-arg]
with_options.enqueue(1999, currencyy="USD")  # type: ignore[call-arg]
with_context.enqueue(42, "2026-11", "extra")  # type: ignore[call-arg]
async_with_context.enqueue(report_id="7")  # type: ignore[arg-type]
plain.using(lease="30")  # type: ignore[arg-type]
plain.using(timeout=30)  # type: ignore[call-arg]

# The untyped entry points take a task or a registered name.
assert_type(enqueue(plain, [42, "2026-11"], run_at=timedelta(seconds=5)), Job)
assert_type(enqueue("billing.tasks.charge", [1, 100]), Job)
assert_type(enqueue_many(plain, [[1, "p"], ([2, "p"], {})], priority=5), int)
enqueue_many(plain, [[1, "p"]], prio=5)  # type: ignore[call-arg]

# A takes_context handler must accept the context first.
@task(takes_context=True)  # type: ignore[arg-type]
def forgot_the_context() -> None:
    pass


def declared_at_runtime(flag: bool) -> None:
    # takes_context not known statically: the task's parameters are unchecked, the return type kept.
    flexible = task(takes_context=flag)(plain.func)
    assert_type(flexible.enqueue("anything", 1, 2), Job)


# Retries decided by the error: exception classes, and a backoff that receives the exception.
def _per_error(attempt: int, exc: BaseException) -> float | None:
    return None


@task(max_attempts=5, retry_on=(ConnectionError, TimeoutError), discard_on=PermissionError, backoff=_per_error)
def with_retry_rules(record_id: int) -> None:
    pass


@task(takes_context=True, retry_on=ConnectionError)
def with_retry_rules_and_context(context: JobContext, record_id: int) -> None:
    pass


assert_type(with_retry_rules.enqueue(1), Job)
assert_type(with_retry_rules_and_context.enqueue(1), Job)
task(retry_on="ConnectionError")  # type: ignore[call-overload]
