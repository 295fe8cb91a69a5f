"""The process-mode child (``EXECUTION = "process"``): runs one handler in a fresh interpreter.

The worker starts it with the "spawn" start method, so this module must import nothing that needs
Django's app registry at import time: everything is imported inside :func:`main`, after
``django.setup()`` (the child inherits ``DJANGO_SETTINGS_MODULE`` from the worker's environment).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import signal
import threading
from typing import Any

# prctl(2) option: the signal the kernel sends this process when the thread that started it exits.
_PR_SET_PDEATHSIG = 1


def _die_with_worker(worker_pid: int | None) -> None:
    """Ask the kernel to SIGKILL this child when its worker dies (Linux), and exit at once if the
    worker is already gone.

    A worker killed with SIGKILL cannot kill its children; without this one would run on beside the
    job's next attempt (its lease expires and another worker claims the job), and, for a job of a
    sequence, beside the jobs behind it. Its writes are fenced, but not its other effects. The
    worker's thread that started this child waits for it, so the signal comes only when the whole
    worker process dies. Elsewhere than Linux this is a no-op.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):
        return
    if worker_pid is not None and os.getppid() != worker_pid:  # died before the prctl took effect
        os._exit(1)


def main(conn: Any, payload: dict[str, Any]) -> None:
    """Entry point of a process-mode child: set Django up, run the task registered under
    ``payload["task"]`` with a :class:`JobContext` on the job's fencing token (so ``fenced_atomic()``
    and ``heartbeat()`` are fenced as in a thread) and send the outcome back through ``conn``.

    Messages: ``("ready",)`` once set up, then (after the worker's ``"go"``; on ``"stop"`` it
    returns without running the handler) ``(kind, value, completed_in_transaction)`` with kind
    ``returned`` (the JSON value), ``snooze`` (seconds), ``cancelled``/``lease_lost`` (message),
    ``not_serializable`` (message) or ``raised`` (``{"error": the error entry, "decision": the
    retry.RetryDecision, or None when it could not be made}``)."""
    import django

    # A process group of its own: at the timeout the worker kills the group, so that subprocesses
    # the handler started die with it (a Ctrl-C to the worker's group no longer reaches it either).
    os.setpgrp()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the group stops the worker, not the handler
    _die_with_worker(payload.get("worker_pid"))
    django.setup()
    from django.db import connections

    from . import registry, tracing
    from .context import JobContext
    from .exceptions import JobCancelled, LeaseLost, PayloadNotSerializable, Snooze
    from .failures import describe_error
    from .payload import json_dumps_result

    registry.autodiscover()
    ctx = JobContext(**payload["ctx"])
    try:
        timeout = registry.get_task(payload["task"]).timeout
    except Exception:  # noqa: BLE001 - an unknown task fails below, with its own error
        timeout = None
    if timeout:
        # The worker kills this process at the timeout (SIGTERM, SIGKILL 2 s later). A handler
        # that ignores SIGTERM runs on meanwhile: its context times out here too, started before
        # the worker's clock, so fenced_atomic() refuses from then on, as in thread mode.
        timer = threading.Timer(timeout, ctx.time_out)
        timer.daemon = True
        timer.start()
    conn.send(("ready",))
    if conn.recv() != "go":  # the worker's start check refused the job (its queue was paused)
        return
    message: tuple[str, Any, bool]
    try:
        spec = registry.get_task(payload["task"])
        args = list(payload["args"])
        if spec.takes_context:
            args.insert(0, ctx)
        # The handler's spans are children of the worker's process span (when both processes trace).
        with tracing.run_in_carrier(payload.get("trace_parent")):
            result = spec.func(*args, **payload["kwargs"])
            if inspect.iscoroutine(result):
                result = asyncio.run(result)
        if isinstance(result, Snooze):
            raise result
        result_json = None if result is None else json_dumps_result(result)
        message = ("returned", None if result_json is None else json.loads(result_json), False)
    except Snooze as snooze:
        message = ("snooze", snooze.seconds, False)
    except JobCancelled as exc:
        message = ("cancelled", str(exc), False)
    except LeaseLost as exc:
        message = ("lease_lost", str(exc), False)
    except PayloadNotSerializable as exc:
        message = ("not_serializable", str(exc), False)
    except BaseException as exc:  # noqa: BLE001 - every error is the attempt's outcome
        # The retry decision is made here, where the exception object is (the worker only gets
        # its description): retry_on/discard_on match its class, a backoff may look at it.
        message = ("raised", {"error": describe_error(exc, attempt=ctx.attempt, worker=ctx.worker_id),
                              "decision": _decide(payload["task"], exc, ctx.attempt)}, False)
    if message[0] == "returned" and ctx.fenced_result:
        message = ("returned", None, True)  # fenced_atomic() wrote the result; keep it
    message = (message[0], message[1], ctx.completed_in_transaction)
    conn.send(message)
    conn.close()
    connections.close_all()


def _decide(task_name: str, exc: BaseException, attempt: int) -> Any:
    """The :class:`~django_leasequeue.retry.RetryDecision` for ``exc``, or None (the worker then
    decides from the error entry alone, as for an unknown task); never raises."""
    import logging

    from . import registry
    from .conf import get_settings
    from .retry import Backoff, decide

    try:
        spec = registry.get_task(task_name)
        settings = get_settings()
        default = Backoff(base=settings.backoff_base, max=settings.backoff_max, jitter=settings.backoff_jitter)
        logger = logging.getLogger("django_leasequeue.executor")
        return decide(exc, attempt, retry_on=spec.retry_on, discard_on=spec.discard_on, backoff=spec.backoff,
                      default=default, log=lambda message: logger.exception("task %s: %s", task_name, message))
    except Exception:  # noqa: BLE001 - the attempt's own error must still reach the worker
        return None
