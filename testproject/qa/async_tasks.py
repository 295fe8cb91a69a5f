"""``async def`` tasks for the process tests of async handlers (tests/worker/test_async_process.py).

Imported by workers started with ``LEASEQUEUE_ASYNC_TASKS=1`` (``LEASEQUEUE["IMPORTS"]``), and
registered by those tests for the test process itself, then unregistered: a registered async task
makes every worker of the test session claim for its event loop too.
"""

from __future__ import annotations

import asyncio
import threading

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
