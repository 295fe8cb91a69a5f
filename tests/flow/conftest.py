"""Helpers for the flow-control tests: a database sampler thread and worker-process settings."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection


def raw_connection() -> psycopg.Connection[Any]:
    """A separate autocommit connection to the test database (for sampling while workers run)."""
    s = connection.settings_dict
    return psycopg.connect(dbname=s["NAME"], user=s["USER"], password=s["PASSWORD"] or None,
                           host=s["HOST"], port=s["PORT"], autocommit=True)


class Sampler:
    """Runs ``sql`` every ``interval`` seconds in a thread; ``samples`` holds (monotonic, rows)."""

    def __init__(self, sql: str, interval: float) -> None:
        self.sql = sql
        self.interval = interval
        self.samples: list[tuple[float, list[tuple[Any, ...]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with raw_connection() as conn:
            while not self._stop.is_set():
                rows = conn.execute(self.sql).fetchall()
                self.samples.append((time.monotonic(), rows))
                time.sleep(self.interval)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
def sampler() -> Iterator[Callable[[str, float], Sampler]]:
    """``sampler(sql, interval)`` starts a :class:`Sampler`; all are stopped at the end of the test."""
    started: list[Sampler] = []

    def start(sql: str, interval: float = 0.003) -> Sampler:
        s = Sampler(sql, interval).start()
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


def worker_env(**extra: str) -> dict[str, str]:
    """Environment for ``runworker`` subprocesses: fast polling, no stagger surprises."""
    env = {"LEASEQUEUE_POLL_INTERVAL": "0.2", "LEASEQUEUE_REAPER_INTERVAL": "5", "LEASEQUEUE_SHUTDOWN_GRACE": "2"}
    env.update(extra)
    return env


def wait_workers(n: int, timeout: float = 30.0) -> None:
    """Wait until ``n`` worker processes have registered (they are then ready to claim)."""
    from django_leasequeue.models import WorkerProcess
    from tests.conftest import wait_for

    wait_for(lambda: WorkerProcess.objects.filter(kind="worker").count() >= n, timeout=timeout,
             what=f"{n} workers registered")
