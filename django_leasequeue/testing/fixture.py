"""The testing helpers on one object, :class:`LeaseQueue`: the ``leasequeue`` pytest fixture."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from ..models import Job
from .assertions import assert_enqueued, assert_not_enqueued, enqueued_jobs
from .clock import Clock
from .eagerly import eager
from .lost_lease import simulate_lost_lease
from .running import drain, tick_schedules


class LeaseQueue:
    """The helpers above on one object: the ``leasequeue`` pytest fixture.

    Attributes:
        clock (Clock): the database clock of the test's connection.
    """

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or Clock()

    drain = staticmethod(drain)
    eager = staticmethod(eager)
    enqueued_jobs = staticmethod(enqueued_jobs)
    assert_enqueued = staticmethod(assert_enqueued)
    assert_not_enqueued = staticmethod(assert_not_enqueued)
    simulate_lost_lease = staticmethod(simulate_lost_lease)
    tick_schedules = staticmethod(tick_schedules)

    def advance_clock(self, seconds: float | timedelta) -> datetime:
        """Move the database clock forward (see :meth:`Clock.advance`); return the new time."""
        return self.clock.advance(seconds)

    def now(self) -> datetime:
        """The database clock now."""
        return self.clock.now()

    def jobs(self, **filters: Any) -> list[Job]:
        """Same as :func:`enqueued_jobs` with keyword filters only (``task=`` included)."""
        return enqueued_jobs(**filters)
