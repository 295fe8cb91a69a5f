"""The worker's event loop: one thread running the ``async def`` handlers, many at once.

A worker with async slots (``ASYNC_SLOTS``, ``runworker --async-slots``) starts this loop with the
first async job it claims. Each async job is a task on the loop (:meth:`AsyncLoop.spawn`), not a
thread: a thousand handlers waiting on the network cost a thousand small coroutines. The worker's
other threads (claim loop, heartbeat, completer) hand work to the loop with
``call_soon_threadsafe``, and the loop never calls the database itself: an outcome that writes
runs on one of a few recording threads (:meth:`AsyncLoop.in_thread`), which are also the loop's
default executor, so that ``sync_to_async(thread_sensitive=False)`` and ``asyncio.to_thread()`` in
handlers (and ``JobContext.afenced_atomic()``) run there, each thread with its own connection.

A blocking call inside an async handler (``time.sleep``, a synchronous ORM query, ``requests``)
stops every handler of the loop until it returns, timeouts included. The loop beats a tick every
:data:`TICK` seconds, and the heartbeat logs a warning when the tick is late by more than
:data:`STALL_WARN_AFTER` seconds (:meth:`AsyncLoop.stalled_for`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from django.db import connections

from ..executor import ATTEMPT_THREADS

logger = logging.getLogger("django_leasequeue.worker")

T = TypeVar("T")

# Threads that record async outcomes that write (failures, snoozes, cancels) and run handlers'
# sync_to_async(thread_sensitive=False) calls; each may hold one database connection.
RECORD_THREADS = 4
# Seconds between the loop's ticks (its liveness, read by the heartbeat).
TICK = 0.1
# Seconds a tick may be late before the heartbeat warns of a blocked loop.
STALL_WARN_AFTER = 1.0
# Seconds the worker's stop waits for cancelled handlers to end.
STOP_WAIT = 5.0


class _AttemptThreadPool(concurrent.futures.ThreadPoolExecutor):
    """The recording threads: a call submitted from an async handler (its context carries
    :data:`~django_leasequeue.executor.ATTEMPT_THREADS`) is counted there until it ends."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        future = super().submit(fn, *args, **kwargs)
        pending = ATTEMPT_THREADS.get()
        if pending is not None:
            pending.add(future)
            future.add_done_callback(pending.discard)
        return future


class AsyncLoop:
    """An event loop on a thread of its own, with a small pool of recording threads.

    Args:
        name: the loop thread's name.
        threads: recording threads (the loop's default executor).
    """

    def __init__(self, name: str = "leasequeue-async", threads: int = RECORD_THREADS) -> None:
        self.name = name
        self.threads = threads
        self.loop = asyncio.new_event_loop()
        self.executor = _AttemptThreadPool(max_workers=threads, thread_name_prefix=f"{name}-record")
        self.loop.set_default_executor(self.executor)
        self.tasks: set[asyncio.Task[Any]] = set()  # the attempts (spawned coroutines)
        self.handlers: set[asyncio.Task[Any]] = set()  # their handlers' own tasks, while they run
        self.tick_at = time.monotonic()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._started = threading.Event()

    def start(self) -> None:
        """Start the loop's thread and wait until the loop runs."""
        self._thread.start()
        self._started.wait()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._tick)
        self.loop.call_soon(self._started.set)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def _tick(self) -> None:
        self.tick_at = time.monotonic()
        self.loop.call_later(TICK, self._tick)

    def stalled_for(self, now: float) -> float:
        """Seconds by which the loop's tick is late at monotonic ``now`` (0 when on time): how long
        a blocking call has held the loop."""
        return max(0.0, now - self.tick_at - TICK)

    def spawn(self, makers: Sequence[Callable[[], Coroutine[Any, Any, Any]]]) -> None:
        """Run each coroutine ``make()`` of ``makers`` as a task on the loop (thread-safe; returns
        at once). One wake-up of the loop for the whole batch of a claim."""
        if makers:
            self.loop.call_soon_threadsafe(self._spawn, makers)

    def _spawn(self, makers: Sequence[Callable[[], Coroutine[Any, Any, Any]]]) -> None:
        for make in makers:
            task = self.loop.create_task(make())
            self.tasks.add(task)  # a strong reference until it ends (the loop keeps only weak ones)
            task.add_done_callback(self.tasks.discard)

    def call(self, fn: Callable[[], object]) -> None:
        """Call ``fn()`` on the loop's thread soon (thread-safe)."""
        self.loop.call_soon_threadsafe(fn)

    async def in_thread(self, fn: Callable[[], T]) -> T:
        """Run ``fn()`` on a recording thread, in a copy of the caller's context (its log fields and
        trace span), and return what it returns."""
        context = contextvars.copy_context()
        return await self.loop.run_in_executor(self.executor, context.run, fn)

    def stop(self, cancel: Callable[[], None], timeout: float = STOP_WAIT) -> None:
        """Cancel what still runs (``cancel()`` is called on the loop's thread), wait up to
        ``timeout`` seconds for the tasks to end, stop the loop and its recording threads, and close
        their database connections."""
        if not self._thread.is_alive():
            return

        async def drain() -> None:
            cancel()
            if self.tasks:
                await asyncio.wait(list(self.tasks), timeout=timeout)

        try:
            asyncio.run_coroutine_threadsafe(drain(), self.loop).result(timeout + 1.0)
        except (concurrent.futures.TimeoutError, RuntimeError):
            logger.warning("async handlers still running %.0f s after they were cancelled", timeout)
        self._close_thread_connections()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        self.executor.shutdown(wait=False, cancel_futures=True)

    def _close_thread_connections(self) -> None:
        """Close the database connections of the recording threads: one call on each, held at a
        barrier so that no thread takes two (an in-process worker must leave no session behind)."""
        barrier = threading.Barrier(self.threads)

        def close() -> None:
            try:
                barrier.wait(2.0)
            except threading.BrokenBarrierError:
                pass
            connections.close_all()

        futures = [self.executor.submit(close) for _ in range(self.threads)]
        concurrent.futures.wait(futures, timeout=5.0)
