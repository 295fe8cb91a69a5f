"""The console's chart data: outcome series and latency percentiles, read from the outcome
counters (``leasequeue_job_stat``, see :class:`~django_leasequeue.models.JobStat`), never from the
job table.

* :func:`throughput` -> :class:`Series`: jobs done, failed (retried) and dead per minute over the
  last hour, per hour over the last 24 hours or per day over the last 30 days (:data:`RANGES`),
  zero-filled and aligned to the database clock, for every queue or one; one statement.
* :func:`latency` -> :class:`Latency` rows: wait time (due to claim) and run time (claim to done)
  per queue and task over the last hour or 24 hours (:data:`LATENCY_WINDOWS`): counts, means, and
  p50 and p95 estimated from the counters' histograms by :func:`histogram_quantile`; one statement.

Both take an injected ``now`` (an aware datetime: tests, or a page that already read the database
clock, such as the health snapshot's ``now``); without one they read the database clock first
(one more statement). Buckets are UTC epoch bins, as the counters store them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from .. import store
from ..models import STAT_BOUNDS

#: The throughput chart's ranges: name -> (bucket seconds, number of buckets).
RANGES: dict[str, tuple[int, int]] = {"hour": (60, 60), "day": (3600, 24), "month": (86400, 30)}

#: The latency table's windows: name -> seconds.
LATENCY_WINDOWS: dict[str, int] = {"hour": 3600, "day": 86400}


def _aware(now: datetime | None) -> datetime:
    if now is None:
        return store.db_now()
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be an aware datetime")
    return now


def bucket_start(moment: datetime, span: int) -> datetime:
    """The start of the ``span``-second UTC epoch bin that holds ``moment`` (an aware datetime),
    as the counters bin their rows."""
    epoch = int(moment.timestamp() // span) * span
    return datetime.fromtimestamp(epoch, tz=UTC)


@dataclass(frozen=True)
class Point:
    """One bucket of a :class:`Series`: its start (aware, UTC) and the jobs that finished ``done``,
    failed an attempt that will be retried (``failed``), were dead-lettered (``dead``), were
    claimed (``started``) or cancelled in it."""

    bucket: datetime
    done: int = 0
    failed: int = 0
    dead: int = 0
    started: int = 0
    cancelled: int = 0

    @property
    def total(self) -> int:
        """done + failed + dead: the height of the bucket's stacked bar."""
        return self.done + self.failed + self.dead


@dataclass(frozen=True)
class Series:
    """A zero-filled outcome series.

    Attributes:
        range: the :data:`RANGES` key (``hour``, ``day`` or ``month``).
        span: bucket length in seconds.
        now: the clock reading it is aligned to (aware datetime, database time).
        queue: the queue it counts, or None for every queue.
        points: one :class:`Point` per bucket, oldest first; the last is the bucket holding ``now``
            (still filling).
    """

    range: str
    span: int
    now: datetime
    queue: str | None
    points: list[Point] = field(default_factory=list)

    @property
    def start(self) -> datetime:
        """The first bucket's start (aware datetime)."""
        return self.points[0].bucket

    @property
    def end(self) -> datetime:
        """The end of the last bucket (aware datetime)."""
        return self.points[-1].bucket + timedelta(seconds=self.span)

    def totals(self) -> Point:
        """The sums over every bucket, as one :class:`Point` at :attr:`start`."""
        return Point(self.start, *(sum(getattr(p, k) for p in self.points)
                                   for k in ("done", "failed", "dead", "started", "cancelled")))

    @property
    def empty(self) -> bool:
        """No job finished, failed or died in the range."""
        return all(p.total == 0 for p in self.points)


def throughput(period: str = "hour", *, queue: str | None = None, now: datetime | None = None,
               alias: str | None = None) -> Series:
    """Jobs done, failed and dead per bucket over one of :data:`RANGES`, zero-filled.

    Args:
        period: ``"hour"`` (60 one-minute buckets), ``"day"`` (24 one-hour buckets) or ``"month"``
            (30 one-day buckets, UTC days).
        queue: one queue's counts; None: every queue.
        now: aware datetime to align to; None reads the database clock (one more statement).
        alias: database alias; default the job table's.

    Returns:
        :class:`Series` whose last bucket holds ``now``.

    Raises:
        ValueError: an unknown ``period`` or a naive ``now``.
    """
    if period not in RANGES:
        raise ValueError(f"period must be one of {', '.join(RANGES)}, got {period!r}")
    span, count = RANGES[period]
    now = _aware(now)
    first = bucket_start(now, span) - timedelta(seconds=span * (count - 1))
    rows = {p.bucket: p for p in store.stat_series(span=span, since=first, queue=queue, alias=alias)}
    points = []
    for i in range(count):
        b = first + timedelta(seconds=span * i)
        r = rows.get(b)
        points.append(Point(b, r.done, r.failed, r.dead, r.started, r.cancelled) if r else Point(b))
    return Series(range=period, span=span, now=now, queue=queue, points=points)


@dataclass(frozen=True)
class Quantile:
    """An estimated quantile in seconds. ``open`` marks an estimate that falls in the histogram's
    last, unbounded bucket: the value is then its lower bound (the largest bound), read ">= value"."""

    seconds: float
    open: bool = False

    def __str__(self) -> str:
        return (">= " if self.open else "") + short_seconds(self.seconds)


def short_seconds(seconds: float) -> str:
    """Seconds in a short unit for a table: ``"4 ms"``, ``"0.35 s"``, ``"12 s"``, ``"3.5 min"``, ``"1.0 h"``."""
    if seconds < 0.1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def histogram_quantile(q: float, hist: Mapping[int, int], bounds: Sequence[float] = STAT_BOUNDS) -> Quantile | None:
    """Estimate the ``q`` quantile of a histogram, as Prometheus' ``histogram_quantile`` does.

    Index ``i`` of ``hist`` counts values in ``[bounds[i-1], bounds[i])`` (from 0 for ``i = 0``);
    index ``len(bounds)`` counts values from the last bound up. The rank ``q * total`` falls in one
    bucket; the estimate interpolates linearly between that bucket's bounds, by how far into the
    bucket's count the rank lies. A rank in the open last bucket gives the last bound, marked open.

    Args:
        q: the quantile, in [0, 1] (0.5: the median).
        hist: ``{bucket index: count}`` (missing indexes count 0).
        bounds: the buckets' upper bounds in seconds, increasing.

    Returns:
        :class:`Quantile`, or None for an empty histogram.

    Raises:
        ValueError: ``q`` outside [0, 1].
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q!r}")
    counts = [int(hist.get(i, 0)) for i in range(len(bounds) + 1)]
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    below = 0
    for i, n in enumerate(counts):
        if n and below + n >= rank:
            if i == len(bounds):
                return Quantile(float(bounds[-1]), open=True)
            lower = float(bounds[i - 1]) if i else 0.0
            upper = float(bounds[i])
            return Quantile(lower + (upper - lower) * max(rank - below, 0.0) / n)
        below += n
    return Quantile(float(bounds[-1]), open=True)  # unreachable: the loop ends on the last non-empty bucket


@dataclass(frozen=True)
class Timing:
    """One latency figure (wait or run) over a window: how many values, their mean and the p50 and
    p95 estimates, in seconds (None without values)."""

    count: int
    mean: float | None
    p50: Quantile | None
    p95: Quantile | None


def timing(total: float, hist: Mapping[int, int]) -> Timing:
    """A :class:`Timing` of a histogram and the sum of its values (seconds)."""
    count = sum(int(v) for v in hist.values())
    return Timing(count=count, mean=total / count if count else None,
                  p50=histogram_quantile(0.5, hist), p95=histogram_quantile(0.95, hist))


@dataclass(frozen=True)
class Latency:
    """Outcomes and latencies of one queue and task over a window.

    Attributes:
        queue: the queue.
        task: the task, or None for the row that sums every task of the queue.
        started, done, failed, dead, cancelled: counts in the window.
        wait: from due (``run_at``) to claim, over the claims.
        run: from claim to ``done``, over the successful attempts.
    """

    queue: str
    task: str | None
    started: int
    done: int
    failed: int
    dead: int
    cancelled: int
    wait: Timing
    run: Timing


def _add(a: dict[int, int], b: Mapping[int, int]) -> None:
    for k, v in b.items():
        a[k] = a.get(k, 0) + v


def latency(window: str = "hour", *, queue: str | None = None, now: datetime | None = None,
            alias: str | None = None) -> list[Latency]:
    """Wait and run time per queue and task over one of :data:`LATENCY_WINDOWS`.

    The window is whole buckets: the last 60 minutes (the minute holding ``now`` included) or the
    last 24 hours, so it matches the counters' roll-up exactly.

    Args:
        window: ``"hour"`` or ``"day"``.
        queue: one queue; None: every queue.
        now: aware datetime; None reads the database clock (one more statement).
        alias: database alias; default the job table's.

    Returns:
        Per queue (by name) first a row with ``task=None`` summing its tasks, then one row per task
        (by name). Queues and tasks without events in the window are absent.

    Raises:
        ValueError: an unknown ``window`` or a naive ``now``.
    """
    if window not in LATENCY_WINDOWS:
        raise ValueError(f"window must be one of {', '.join(LATENCY_WINDOWS)}, got {window!r}")
    seconds = LATENCY_WINDOWS[window]
    span = 60 if seconds <= 3600 else 3600
    since = bucket_start(_aware(now), span) - timedelta(seconds=seconds - span)
    rows = store.stat_totals(since=since, queue=queue, alias=alias)
    out: list[Latency] = []
    by_queue: dict[str, list[store.StatTotals]] = {}
    for r in rows:
        by_queue.setdefault(r.queue, []).append(r)
    for name in sorted(by_queue):
        tasks = by_queue[name]
        wait_hist: dict[int, int] = {}
        run_hist: dict[int, int] = {}
        for r in tasks:
            _add(wait_hist, r.wait_hist)
            _add(run_hist, r.run_hist)
        sums = {k: sum(getattr(r, k) for r in tasks) for k in ("started", "done", "failed", "dead", "cancelled")}
        out.append(Latency(name, None, sums["started"], sums["done"], sums["failed"], sums["dead"],
                           sums["cancelled"], wait=timing(sum(r.wait_sum for r in tasks), wait_hist),
                           run=timing(sum(r.run_sum for r in tasks), run_hist)))
        for r in sorted(tasks, key=lambda t: t.task):
            out.append(Latency(name, r.task, r.started, r.done, r.failed, r.dead, r.cancelled,
                               wait=timing(r.wait_sum, r.wait_hist), run=timing(r.run_sum, r.run_hist)))
    return out
