"""The benchmark app: with ``LQBENCH_CLAIM_TIMES`` set, worker processes record their claim times.

``bench/scale_bench.py`` reads the claim statement's latency from the worker side: the server
cannot tell it (``pg_stat_statements`` is not loaded on every server, and it gives no percentiles).
Each worker process appends one line per claim statement, ``"<seconds>\\n"``, to
``$LQBENCH_CLAIM_TIMES/<pid>.txt``. The timing is a Django execute wrapper (Django's own hook around
``cursor.execute``) on every connection the process opens, so nothing of the queue is patched; it
recognises the claim by the claim statement's text from ``django_leasequeue.store.claim``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from django.apps import AppConfig


class ClaimTimer:
    """Execute wrapper: time statements that contain one of the claim statements; append the
    seconds (wall clock of ``execute``: the round trip, the server's work and the rows' transfer)
    to this process's file."""

    def __init__(self, folder: str) -> None:
        from django_leasequeue.store.claim import JOB_CLAIM, JOB_CLAIM_ANY_QUEUE

        self.claims = (JOB_CLAIM, JOB_CLAIM_ANY_QUEUE)
        self.folder = folder
        self.fd: int | None = None

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if not isinstance(sql, str) or not any(claim in sql for claim in self.claims):
            return execute(sql, params, many, context)
        t0 = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            elapsed = time.perf_counter() - t0
            if self.fd is None:
                path = os.path.join(self.folder, f"{os.getpid()}.txt")
                self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(self.fd, f"{elapsed:.6f}\n".encode())


class LqBenchConfig(AppConfig):
    name = "lqbench"

    def ready(self) -> None:
        folder = os.environ.get("LQBENCH_CLAIM_TIMES")
        if not folder:
            return
        from django.db.backends.signals import connection_created

        timer = ClaimTimer(folder)

        def add_timer(sender: Any, connection: Any, **kwargs: Any) -> None:
            if timer not in connection.execute_wrappers:
                connection.execute_wrappers.append(timer)

        connection_created.connect(add_timer, weak=False)
