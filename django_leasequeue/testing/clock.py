"""The database clock of the test's connection: :class:`Clock` and :func:`advance_clock` move
``leasequeue_now()``, which every store statement and the scheduler read."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime, timedelta

from .. import store


def _seconds(value: float | timedelta) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


class Clock:
    """The database clock of this test's connection: ``leasequeue_now()``.

    Every store statement (claim, backoff, lease expiry, reaper, prune) and the scheduler's tick
    read ``leasequeue_now()`` = ``clock_timestamp()`` + the session setting
    ``leasequeue.clock_offset``. Moving the clock changes that offset: the clock keeps running at
    real speed from the new point; nothing sleeps. Python-side ``timezone.now()`` is not moved
    (use time-machine or freezegun for that if your own code needs it).

    The offset belongs to the database session. In a pytest-django ``db`` test it is rolled back
    with the test's transaction; on a connection that outlives the test (``transactional_db``),
    call :meth:`reset` (the ``leasequeue_clock`` fixture does). Worker subprocesses have their own
    sessions: pass them the offset through your settings (see :meth:`env`).

    Args:
        alias: database alias; default: the job table's (through the routers).
    """

    def __init__(self, alias: str | None = None) -> None:
        self.alias = alias or store.db_alias()

    @property
    def offset(self) -> float:
        """Seconds the database clock runs ahead of real time on this connection."""
        return store.clock_offset_get(alias=self.alias)

    def now(self) -> datetime:
        """The database clock now (aware datetime)."""
        return store.db_now(self.alias)

    def advance(self, seconds: float | timedelta) -> datetime:
        """Move the clock forward by ``seconds`` (float seconds or a timedelta; negative moves it
        back). Returns the new database time."""
        store.clock_offset_set(self.offset + _seconds(seconds), alias=self.alias)
        return self.now()

    def set(self, when: datetime) -> None:
        """Make the clock read ``when`` now (it keeps running from there).

        Raises:
            ValueError: ``when`` is naive.
        """
        if when.tzinfo is None or when.utcoffset() is None:
            raise ValueError(f"{when!r} is naive; pass an aware datetime")
        real = store.clock_real_now(alias=self.alias)
        store.clock_offset_set((when - real).total_seconds(), alias=self.alias)

    def reset(self) -> None:
        """Back to the real clock (offset 0)."""
        store.clock_offset_set(0, alias=self.alias)

    @contextlib.contextmanager
    def at(self, when: datetime) -> Iterator[None]:
        """Set the clock to ``when`` for the block, then restore the previous offset."""
        previous = self.offset
        self.set(when)
        try:
            yield
        finally:
            store.clock_offset_set(previous, alias=self.alias)

    def env(self) -> dict[str, str]:
        """``{"LEASEQUEUE_CLOCK_OFFSET": "<seconds>s"}``: the environment a worker subprocess needs
        when its settings turn that variable into the connection option
        ``-c leasequeue.clock_offset=...`` (see :meth:`connection_options`)."""
        return {"LEASEQUEUE_CLOCK_OFFSET": f"{self.offset:.6f}s"}

    def connection_options(self) -> dict[str, str]:
        """``DATABASES[...]["OPTIONS"]`` entries that start a new connection at this offset."""
        return {"options": f"-c leasequeue.clock_offset={self.offset:.6f}s"}


def advance_clock(seconds: float | timedelta) -> datetime:
    """Move the database clock of this connection forward (see :class:`Clock`); return the new time."""
    return Clock().advance(seconds)

