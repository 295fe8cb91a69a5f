"""Process registration: the ``WorkerProcess`` row of a long-running service.

Every worker, scheduler and reaper process keeps one row in the process registry: written when
it starts, touched by its heartbeat, deleted when it stops cleanly. Monitoring counts a process
alive by the age of that heartbeat, and a row pruned as stale (the process was silent too long) is
written again at its next heartbeat. :class:`RegisteredService` does this once for all three.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from . import store
from .runtime import Service


def make_process_id(name: str) -> str:
    """Return ``host:pid:name``, the id of this process's registry row.

    Args:
        name: the last part (``"scheduler"``, ``"reaper"``, a worker's name).
    """
    return f"{socket.gethostname()}:{os.getpid()}:{name}"


class RegisteredService(Service):
    """A :class:`~django_leasequeue.runtime.Service` with a row in the process registry.

    Subclasses set :attr:`kind` and, in ``__init__``, ``process_id`` and ``alias``; they call
    :meth:`register`, :meth:`beat` and :meth:`deregister` from their lifecycle hooks.

    Attributes:
        kind (str): the row's kind (``"worker"``, ``"scheduler"``, ``"reaper"``).
        process_id (str): the row's id, ``host:pid:name``.
        alias (str): the database alias.
    """

    kind = "service"
    process_id: str
    alias: str

    def registration(self) -> dict[str, Any]:
        """The row's extra columns: ``queues``, ``concurrency`` and ``tasks`` (a worker's own)."""
        return {"queues": None, "concurrency": 0}

    def reaps(self) -> bool:
        """Whether this process runs the reaper's sweep (recorded in its row for monitoring)."""
        return False

    def register(self) -> None:
        """Write (or write again) this process's registry row."""
        store.process_register(process_id=self.process_id, kind=self.kind, host=socket.gethostname(),
                               pid=os.getpid(), reaps=self.reaps(), alias=self.alias, **self.registration())

    def beat(self, *, tick: bool = False) -> None:
        """Touch the row's heartbeat (and the scheduler tick when ``tick``); a row pruned as stale
        (this process was silent too long, a long pause) is registered again, and touched again
        when ``tick``, so that the tick is recorded too."""
        if not store.process_heartbeat(self.process_id, tick=tick, alias=self.alias):
            self.register()
            if tick:
                store.process_heartbeat(self.process_id, tick=True, alias=self.alias)

    def deregister(self) -> None:
        """Delete this process's row (a clean stop).

        Raises:
            DatabaseError: the database is unreachable (the row is pruned later).
        """
        store.process_deregister(self.process_id, alias=self.alias)
