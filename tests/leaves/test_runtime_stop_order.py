"""Graceful stop order of services sharing one process (no database needed).

A service that produces work (``stops_first``, e.g. the scheduler in ``runworker
--with-scheduler``) stops at once, so it emits nothing more while the worker spends its grace
period finishing jobs; the others stop in order.
"""

import threading
import time

from django_leasequeue.runtime import Service, run_services
from django_leasequeue.scheduler import SchedulerService


class Recorder(Service):
    def __init__(self, name: str, log: list[tuple[str, str]], *, slow_stop: float = 0.0) -> None:
        super().__init__()
        self.name, self.log, self.slow_stop = name, log, slow_stop

    def run_once(self) -> float:
        if self.stopping:
            return 0.0
        self.log.append((self.name, "tick"))
        return 0.02

    def on_stop(self) -> None:
        time.sleep(self.slow_stop)  # a worker finishing its running jobs within the grace period
        self.log.append((self.name, "stopped"))


class ProducerRecorder(Recorder):
    stops_first = True


def test_a_work_producing_service_stops_before_the_worker_finishes_its_grace_period():
    log: list[tuple[str, str]] = []
    worker = Recorder("worker", log, slow_stop=0.5)
    heartbeat = Recorder("heartbeat", log)
    scheduler = ProducerRecorder("scheduler", log)
    stop = threading.Event()
    runner = threading.Thread(target=run_services, args=([worker, heartbeat, scheduler],),
                              kwargs={"install_signals": False, "stop_when": stop})
    runner.start()
    time.sleep(0.1)
    stop.set()
    runner.join(10)
    stopped = [name for name, what in log if what == "stopped"]
    assert stopped == ["scheduler", "worker", "heartbeat"]
    # Nothing ticked after the stop was asked for except the services still draining.
    after_scheduler_stop = log[log.index(("scheduler", "stopped")):]
    assert ("scheduler", "tick") not in after_scheduler_stop


def test_the_scheduler_service_is_a_work_producer():
    assert SchedulerService.stops_first is True
    assert Service.stops_first is False
