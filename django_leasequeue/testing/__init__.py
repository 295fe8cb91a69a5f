"""Helpers for testing a project's own tasks: run jobs in the test's process, assert what was
enqueued, move the database clock, and prove a handler is fenced when its lease is lost.

Everything here runs on the test's own database connection, in the calling thread, through the
real claim and executor path (:mod:`store` claims, :class:`~django_leasequeue.worker.WorkerService`
builds the context, the :class:`~django_leasequeue.executor.Executor` classifies the outcome and the
:class:`~django_leasequeue.worker.completer.Completer` writes it, fenced on the token). So it works inside a
pytest-django ``db`` test (one transaction that no other connection can see) as well as with
``transactional_db``; no thread, process or ``sleep`` is involved.

* :func:`drain` runs due jobs until none is left; :func:`eager` runs each job enqueued inside its
  block as soon as a worker could see it (when the enqueuing transaction commits).
* :func:`enqueued_jobs`, :func:`assert_enqueued`, :func:`assert_not_enqueued` read the job table.
* :class:`Clock` (:func:`advance_clock`) shifts ``leasequeue_now()``, the clock every store
  statement and the scheduler read: run_at, backoff, lease expiry and schedules move with it.
* :func:`tick_schedules` runs one scheduler tick; :func:`simulate_lost_lease` runs a job twice,
  a stale worker against a worker that took its lease over, and reports what each one achieved.

The modules, lowest first (each imports only those above it):

================  ===========================================================================
``results``       :class:`JobRun`, :class:`DrainResult`, :class:`JobFailed`
``clock``         :class:`Clock`, :func:`advance_clock`
``inline``        one claimed job run in this thread through the worker's pool, executor and
                  completer
``running``       :func:`drain`, :func:`tick_schedules`
``eagerly``       :func:`eager`
``assertions``    :func:`enqueued_jobs`, :func:`assert_enqueued`, :func:`assert_not_enqueued`
``lost_lease``    :func:`simulate_lost_lease`, :class:`LostLease`
``fixture``       :class:`LeaseQueue`, the helpers on one object
================  ===========================================================================

The pytest plugin (:mod:`django_leasequeue.pytest_plugin`) wraps these in fixtures
(``leasequeue``, ``leasequeue_clock``, ``leasequeue_eager``). The guide is ``docs/howto/testing.md``.
"""

from .assertions import assert_enqueued, assert_not_enqueued, enqueued_jobs
from .clock import Clock, advance_clock
from .eagerly import eager
from .fixture import LeaseQueue
from .lost_lease import LostLease, simulate_lost_lease
from .results import FAILED_OUTCOMES as FAILED_OUTCOMES
from .results import DrainResult, JobFailed, JobRun
from .running import DRAIN_SAFETY_LIMIT as DRAIN_SAFETY_LIMIT
from .running import drain, tick_schedules

__all__ = [
    "Clock",
    "DrainResult",
    "JobFailed",
    "JobRun",
    "LeaseQueue",
    "LostLease",
    "advance_clock",
    "assert_enqueued",
    "assert_not_enqueued",
    "drain",
    "eager",
    "enqueued_jobs",
    "simulate_lost_lease",
    "tick_schedules",
]
