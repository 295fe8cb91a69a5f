"""Process behaviour that docs/howto/deploy.md relies on: a worker whose service thread crashes
exits non-zero (so systemd's Restart= and Kubernetes' restart policy replace it), and a clean
stop exits 0."""

from __future__ import annotations

import threading

from django_leasequeue.runtime import Service, run_services


class Crash(BaseException):
    """Not an Exception: the service loop retries those; a BaseException ends the thread."""


class Crashing(Service):
    name = "crashing"

    def run_once(self) -> float:
        raise Crash("boom")


class Idle(Service):
    name = "idle"

    def run_once(self) -> float:
        return 0.05


def test_a_crashed_service_stops_the_others_and_returns_1():
    idle = Idle()
    assert run_services([idle, Crashing()], install_signals=False) == 1
    assert idle.stopping and idle.join(5)


def test_a_requested_stop_returns_0():
    stop = threading.Event()
    idle = Idle()
    timer = threading.Timer(0.3, stop.set)
    timer.start()
    assert run_services([idle], install_signals=False, stop_when=stop) == 0
    assert idle.iterations > 0
