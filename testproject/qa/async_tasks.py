"""``async def`` tasks for the process tests of async handlers (tests/worker/test_async_process.py).

Imported by workers started with ``LEASEQUEUE_ASYNC_TASKS=1`` (``LEASEQUEUE["IMPORTS"]``), and
registered by those tests for the test process itself, then unregistered: a registered async task
makes every worker of the test session claim for its event loop too.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from django_leasequeue import task

_running = 0


@task(name="qa.async_nap")
async def async_nap(seconds: float) -> list[object]:
    """Wait ``seconds`` on the worker's event loop; return the thread's name and how many of these
    coroutines were running when this one started (itself included)."""
    global _running
    _running += 1  # one event loop thread: no lock needed
    seen = _running
    try:
        await asyncio.sleep(seconds)
    finally:
        _running -= 1
    return [threading.current_thread().name, seen]


ASYNC_TASKS = [async_nap]


# -- the async chaos ledger (tests/worker/test_async_chaos_ledger.py) --------------------------------
# Each handler execution writes a qa.ledger row (start, then its end: "returned", "raised",
# "timed_out"); with ``fenced`` it commits an Effect and the job's completion through
# ctx.afenced_atomic(), else it completes by its return value. The ledger's writes are short
# blocking calls on the loop (its own autocommit connection): acceptable in a test.


async def _ledger_body(ctx: Any, name: str, seconds: float, fenced: bool, swallow: float, block: float) -> int:
    from . import ledger
    from .models import Effect

    key = ledger.start(ctx, name)
    outcome = "raised"
    try:
        if block:
            time.sleep(block)  # a handler that blocks the loop
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            if not swallow:
                raise
            await asyncio.sleep(swallow)  # swallows the cancel and goes on
        ctx.check_cancel()
        if fenced:
            def write(fence: Any, job_id: int, token: int) -> None:
                Effect.objects.create(key=f"async-{job_id}", job_id=job_id, lease_version=token)

            await ctx.afenced_atomic(write, ctx.job_id, ctx.lease_version)
        outcome = "timed_out" if ctx.timed_out else "returned"
        return int(ctx.job_id)
    finally:
        ledger.finish(key, outcome)


@task(name="qa.async_ledger", takes_context=True, timeout=30, max_attempts=10, backoff=0)
async def async_ledger(ctx: Any, seconds: float, fenced: bool = False, swallow: float = 0.0,
                       block: float = 0.0) -> int:
    """One ledgered async execution (see above)."""
    return await _ledger_body(ctx, "qa.async_ledger", seconds, fenced, swallow, block)


@task(name="qa.async_ledger_short", takes_context=True, timeout=1, max_attempts=2, backoff=0)
async def async_ledger_short(ctx: Any, seconds: float, fenced: bool = False, swallow: float = 0.0,
                             block: float = 0.0) -> int:
    """As ``qa.async_ledger``, with a timeout of 1 s and two attempts."""
    return await _ledger_body(ctx, "qa.async_ledger_short", seconds, fenced, swallow, block)


@task(name="qa.async_ledger_once", takes_context=True, timeout=30, max_attempts=1)
async def async_ledger_once(ctx: Any, seconds: float, fenced: bool = False, swallow: float = 0.0,
                            block: float = 0.0) -> int:
    """As ``qa.async_ledger``, with one attempt only."""
    return await _ledger_body(ctx, "qa.async_ledger_once", seconds, fenced, swallow, block)


@task(name="qa.sync_ledger", takes_context=True, timeout=30, max_attempts=10, backoff=0)
def sync_ledger(ctx: Any, seconds: float, fenced: bool = False) -> int:
    """The sync counterpart (a handler thread), for workers running both kinds."""
    from . import ledger

    with ledger.execution(ctx, "qa.sync_ledger"):
        time.sleep(seconds)
        if fenced:
            from .models import Effect

            with ctx.fenced_atomic():
                Effect.objects.create(key=f"sync-{ctx.job_id}", job_id=ctx.job_id, lease_version=ctx.lease_version)
    return int(ctx.job_id)


ASYNC_TASKS += [async_ledger, async_ledger_short, async_ledger_once, sync_ledger]
