"""The failover test's workload (``tests/worker/test_failover.py``): two tasks whose handlers append
each execution to a file outside the database, so that the executions are counted even when the
database that ran them loses their rows (an asynchronous standby promoted before it had them).

The file is ``QA_EXECUTIONS_FILE``; each event is one JSON line, written with one ``write()`` on a
descriptor opened with ``O_APPEND`` and fsynced before the handler goes on, so the lines of every
thread and process are whole and in the order they happened: ``{"event": "start" | "returned" |
"raised", "key": ..., "job": ..., "token": ..., "pid": ..., "at": POSIX seconds}``. ``key`` is the
job's unique key, the name the producer acknowledged it under (a job id can be issued twice across
a failover that loses the sequence's last values).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from django_leasequeue import Backoff, JobContext, task

from .effects import commit_fenced_effect


def append_event(event: str, key: str, context: JobContext) -> None:
    """Append one execution event of the job running in ``context`` to ``QA_EXECUTIONS_FILE`` and
    fsync it.

    Raises:
        KeyError: ``QA_EXECUTIONS_FILE`` is not set (only the failover test runs these tasks).
    """
    line = json.dumps({"event": event, "key": key, "job": context.job_id, "token": context.lease_version,
                       "pid": os.getpid(), "at": time.time()}) + "\n"
    fd = os.open(os.environ["QA_EXECUTIONS_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def counted(context: JobContext, key: str) -> Iterator[None]:
    """Wrap a handler body: a ``start`` line before it, ``returned`` or ``raised`` after it."""
    append_event("start", key, context)
    outcome = "raised"
    try:
        yield
        outcome = "returned"
    finally:
        append_event(outcome, key, context)


# Faults (a connection cut under the handler's fenced commit) cost attempts: many, with short backoffs.
RETRIES = {"max_attempts": 25, "backoff": Backoff(base=0.05, factor=2, max=0.5)}


@task(name="qa.failover_plain", takes_context=True, **RETRIES)
def failover_plain(context: JobContext, key: str, work: float = 0.0) -> dict[str, object]:
    """Work ``work`` seconds and return a value: completed by the worker's default completion path."""
    with counted(context, key):
        if work:
            time.sleep(work)
        return {"key": key, "token": context.lease_version}


@task(name="qa.failover_fenced", takes_context=True, **RETRIES)
def failover_fenced(context: JobContext, key: str, work: float = 0.0) -> None:
    """Work ``work`` seconds, then commit an ``Effect`` and the job's completion in one
    ``fenced_atomic()`` transaction: completed by the fenced path."""
    with counted(context, key):
        if work:
            time.sleep(work)
        commit_fenced_effect(context)
