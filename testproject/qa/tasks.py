"""Test tasks: each records what happened in ``qa.models`` so tests can count executions, effects
and refused writes exactly. Names are explicit (``qa.<name>``) so tests can enqueue them by name.

Retry delays are short (``backoff=0.05`` s) so retry tests do not sleep; ``raise_base`` uses a
60 s backoff so its retry is visibly scheduled and not run again within a test.
"""

import asyncio
import os
import time
from decimal import Decimal

from django_leasequeue import Backoff, JobContext, LeaseLost, task

from .models import Effect, Execution, Probe


def _record(context: JobContext, tag: str = "") -> None:
    Execution.objects.create(job_id=context.job_id, lease_version=context.lease_version, attempt=context.attempt,
                             worker=context.worker_id, tag=tag)


@task(name="qa.record", takes_context=True, max_attempts=3)
def record(context: JobContext, tag: str = "", sleep: float = 0.0) -> str:
    """Count one execution, then sleep ``sleep`` seconds (a job that is "in the middle" while tests
    signal its worker)."""
    _record(context, tag)
    if sleep:
        time.sleep(sleep)
    return tag


@task(name="qa.fenced_effect", takes_context=True, max_attempts=5)
def fenced_effect(context: JobContext, key: str, sleep: float = 0.0) -> None:
    """Work ``sleep`` seconds, renew the lease once by hand, then write an :class:`Effect` inside
    ``fenced_atomic()``. Both outcomes are recorded as :class:`Probe` rows, so a test can see that a
    stale worker's heartbeat and fenced completion were refused."""
    _record(context, key)
    if sleep:
        time.sleep(sleep)
    renewed = context.heartbeat()
    Probe.objects.create(job_id=context.job_id, lease_version=context.lease_version, kind="heartbeat", ok=renewed)
    try:
        with context.fenced_atomic():
            Effect.objects.create(key=key, job_id=context.job_id, lease_version=context.lease_version)
    except LeaseLost:
        Probe.objects.create(job_id=context.job_id, lease_version=context.lease_version, kind="fenced", ok=False)
        raise
    Probe.objects.create(job_id=context.job_id, lease_version=context.lease_version, kind="fenced", ok=True)


@task(name="qa.flaky", takes_context=True, max_attempts=4, backoff=0.05)
def flaky(context: JobContext, failures: int = 2) -> int:
    """Fail the first ``failures`` attempts, then succeed."""
    _record(context, "flaky")
    if context.attempt <= failures:
        raise ConnectionError(f"attempt {context.attempt} of {failures} planned failures")
    return context.attempt


@task(name="qa.poison", takes_context=True, max_attempts=3, backoff=0.05)
def poison(context: JobContext) -> None:
    """Always fail."""
    _record(context, "poison")
    raise ValueError("malformed payload")


@task(name="qa.fail_once", takes_context=True, max_attempts=1)
def fail_once(context: JobContext) -> None:
    """Fail with max_attempts=1: must execute exactly once, then be dead (case C02)."""
    _record(context, "fail_once")
    raise ValueError("no retries for this one")


@task(name="qa.crash", takes_context=True, max_attempts=3)
def crash(context: JobContext) -> None:
    """Kill the worker process running it, every time (case C02)."""
    _record(context, "crash")
    os._exit(1)


_BASE_EXCEPTIONS = {
    "SystemExit": lambda: SystemExit(3),
    "KeyboardInterrupt": KeyboardInterrupt,
    "CancelledError": asyncio.CancelledError,
}


@task(name="qa.raise_base", takes_context=True, max_attempts=2, backoff=Backoff(base=60, jitter=0))
def raise_base(context: JobContext, kind: str) -> None:
    """Raise an exception outside the ``Exception`` hierarchy (case C06)."""
    _record(context, kind)
    raise _BASE_EXCEPTIONS[kind]()


@task(name="qa.bad_return", takes_context=True, max_attempts=2)
def bad_return(context: JobContext) -> object:
    """Return a value that is not JSON (case C25)."""
    _record(context, "bad_return")
    return object()


class Unprintable(Exception):
    """An exception whose message cannot be rendered and whose args are not JSON (case C25)."""

    def __str__(self) -> str:
        raise RuntimeError("cannot print me")


@task(name="qa.unprintable", takes_context=True, max_attempts=1)
def unprintable(context: JobContext) -> None:
    _record(context, "unprintable")
    raise Unprintable(Decimal("1"), object())


@task(name="qa.hang", takes_context=True, max_attempts=3, timeout=1)
def hang(context: JobContext, seconds: float) -> None:
    """Hang for ``seconds`` on the first attempt only; ``timeout=1`` stops its heartbeats."""
    _record(context, "hang")
    if context.attempt == 1:
        time.sleep(seconds)


@task(name="qa.busy", takes_context=True, max_attempts=3)
def busy(context: JobContext, seconds: float) -> None:
    """Spin pure-Python CPU for ``seconds`` (the heartbeat thread must still get the GIL)."""
    _record(context, "busy")
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        n += 1
