"""The worker: claims due jobs in batches and runs them on a pool of threads.

One job per module: :mod:`.producer` (the claim loop, prefetch and throttling), :mod:`.pool`
(the handler threads and the table of held jobs), :mod:`.heartbeat` (lease renewals),
:mod:`.completer` (batched completions), :mod:`.tally` (what the worker did, for the line it prints
when it stops) and :mod:`.service` (the :class:`WorkerService` that composes them, with the reaper's
sweep and the LISTEN wake-ups).
"""

from .completer import Completer
from .heartbeat import PROCESS_HEARTBEAT_INTERVAL, HeartbeatService
from .pool import PREFETCH_RELEASE_AFTER, RUNTIME_EWMA_WEIGHT, InFlight, Pool, start_margin
from .producer import THROTTLE_MARGIN, Producer
from .service import EXIT_STUCK, WorkerService, make_worker_id, stuck_jobs_outcome
from .tally import WorkerCounts, WorkerTally

__all__ = [
    "EXIT_STUCK",
    "PREFETCH_RELEASE_AFTER",
    "PROCESS_HEARTBEAT_INTERVAL",
    "RUNTIME_EWMA_WEIGHT",
    "THROTTLE_MARGIN",
    "Completer",
    "HeartbeatService",
    "InFlight",
    "Pool",
    "Producer",
    "WorkerCounts",
    "WorkerService",
    "WorkerTally",
    "make_worker_id",
    "start_margin",
    "stuck_jobs_outcome",
]
