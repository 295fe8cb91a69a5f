"""Lease advice: :class:`TaskLeaseStats` (one task's runtimes, lease losses and advice), its flags,
and :func:`recommend`, the rule that derives a timeout and a lease from a runtime distribution.
:func:`django_leasequeue.health.lease_report` fills them from the database.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

FLAG_P99_OVER_TIMEOUT = "p99>timeout"
FLAG_LOST_WHILE_HEALTHY = "lost-lease-while-healthy"
FLAG_UNREGISTERED = "unregistered"


@dataclass(frozen=True)
class TaskLeaseStats:
    """Lease advice for one task. Durations are seconds.

    Attributes:
        task: the task name.
        done, dead: jobs of the task that finished done / dead in the window (leased ones running
            now count in neither).
        p50, p95, p99, max: runtime of the done jobs' successful attempt (claim to completion),
            ``percentile_cont`` (linear interpolation); None without done jobs.
        lease_expired: leases of the task the reaper took back in the window (``LeaseExpired``).
        fence_rejected: attempts whose worker, still running, had a write refused because its
            fencing token was stale (the worker outlived its lease).
        lost_while_healthy: the part of ``fence_rejected`` whose attempt had not timed out (no
            ``timed_out`` history entry for its token): the lease expired although the handler
            was within its budget and its worker alive.
        registered: the task name is known to this process's registry.
        timeout: the registered timeout, or None.
        lease: the lease its jobs get (the task's ``lease`` or ``LEASEQUEUE["LEASE"]``).
        manual_heartbeat: the task renews only when its handler calls ``ctx.heartbeat()``.
        recommended_timeout, recommended_lease: see :func:`recommend`; None without data.
        flags: :data:`FLAG_P99_OVER_TIMEOUT`, :data:`FLAG_LOST_WHILE_HEALTHY`, :data:`FLAG_UNREGISTERED`.
    """

    task: str
    done: int
    dead: int
    p50: float | None
    p95: float | None
    p99: float | None
    max: float | None
    lease_expired: int
    fence_rejected: int
    lost_while_healthy: int
    registered: bool
    timeout: float | None
    lease: float
    manual_heartbeat: bool
    recommended_timeout: float | None
    recommended_lease: float | None
    flags: tuple[str, ...] = ()

    @property
    def recommended_renewal_interval(self) -> float | None:
        """Heartbeat interval that goes with :attr:`recommended_lease`: a third of it (the worker's rule)."""
        return None if self.recommended_lease is None else self.recommended_lease / 3

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {**asdict(self), "flags": list(self.flags),
                "recommended_renewal_interval": self.recommended_renewal_interval}


def recommend(*, p99: float | None, max_runtime: float | None, lease: float, manual_heartbeat: bool,
              lost_while_healthy: int) -> tuple[float | None, float]:
    """The lease-advice rule: a timeout and a lease for one task, from its runtime distribution.

    * **timeout** = ``ceil(max(2 * p99, 1.25 * max, 1))`` seconds. Past its timeout an attempt
      fails as ``JobTimedOut``, so the timeout must sit above the normal tail with room to spare:
      twice the p99 absorbs a tail that doubles under load, and 1.25 times the slowest successful
      run keeps every run seen in the window alive. None without runtimes.
    * **lease**: with automatic renewal (every lease / 3) the lease does not have to cover the
      runtime; it bounds how long a crashed worker's job waits before it runs again, so keep it.
      Exceptions:

      - the task lost leases while healthy (``lost_while_healthy`` > 0): renewals every lease / 3
        did not survive the worker's stalls (GC pauses, CPU starvation, slow database), so
        double it: ``2 * lease``;
      - manual heartbeats: nothing renews between the handler's own calls, so the lease must cover
        a whole run in the worst case: ``max(lease, ceil(1.5 * p99))``.

    Args:
        p99, max_runtime: seconds, or None without data.
        lease: the task's current lease in seconds.
        manual_heartbeat: the task renews only when its handler asks.
        lost_while_healthy: count of healthy lease losses in the window.

    Returns:
        ``(recommended timeout or None, recommended lease)`` in seconds.
    """
    timeout = None
    if p99 is not None and max_runtime is not None:
        timeout = float(math.ceil(max(2 * p99, 1.25 * max_runtime, 1.0) - 1e-9))
    recommended_lease = float(lease)
    if lost_while_healthy > 0:
        recommended_lease = 2 * float(lease)
    if manual_heartbeat and p99 is not None:
        recommended_lease = max(recommended_lease, float(math.ceil(1.5 * p99 - 1e-9)))
    return timeout, recommended_lease

