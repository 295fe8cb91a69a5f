"""The page of one queue (``admin:django_leasequeue_queue``, ``admin/django_leasequeue/dashboard/queue/<name>/``):
its throughput chart and latency table, depth by state and the oldest due job's age, the live
workers that serve it with the jobs of it they run, its limits (rate limit, fairness, the threads
of the workers serving it, paused) with pause/resume, its top errors (groups of its dead letters
by task, error type and message, each linked to the dead-letter list filtered to it and to the
confirmed bulk replay) and its schedules (next run in the schedule's zone).

Everything the page shows is built by :func:`queue_context`, one dict; the figures that change
while the page is open are also under its ``live`` key, and the template marks each with
``data-live="<key>"`` so a live refresh can replace them in place.

Cost: a constant number of statements whatever the queue's size: the health snapshot restricted to
the queue (three), the workers page's data (three), the chart and the latency table (one each,
from the counters table), the queue's state and its error groups (two, the dead rows only) and
its schedules (one). The job table is read only through the partial indexes the dashboard uses.
"""

from __future__ import annotations

from typing import Any
from zoneinfo import ZoneInfo

from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode

from .. import health, store
from ..conf import get_settings
from .charts import throughput_svg
from .common import APP, duration, error_name
from .schedule_history import in_zone
from .workers import relative, workers_page

#: Error groups shown on the page (the largest).
ERRORS_SHOWN = 10


def chart_choice(value: str | None, choices: dict[str, Any], default: str = "hour") -> str:
    """The chart range or latency window a query parameter names, or ``default`` when it names none.

    Args:
        value: the parameter's value (``"hour"``, ``"day"``, ``"month"``), or None.
        choices: :data:`~django_leasequeue.health.RANGES` or :data:`~django_leasequeue.health.LATENCY_WINDOWS`.
        default: the key used for a missing or unknown value.

    Returns:
        A key of ``choices``.
    """
    return value if value in choices else default


def latency_rows(rows: list[health.Latency]) -> list[dict[str, Any]]:
    """The latency table's rows as the templates show them (quantiles and means in words).

    Args:
        rows: :func:`django_leasequeue.health.latency` rows.

    Returns:
        One dict per row: ``row`` (the :class:`~django_leasequeue.health.Latency`), ``wait_p50``,
        ``wait_p95``, ``wait_mean``, ``run_p50``, ``run_p95``, ``run_mean`` (text, ``"—"`` without values).
    """
    def words(value: Any) -> str:
        if value is None:
            return "—"
        return str(value) if isinstance(value, health.Quantile) else health.short_seconds(value)

    return [{"row": r, "wait_p50": words(r.wait.p50), "wait_p95": words(r.wait.p95), "wait_mean": words(r.wait.mean),
             "run_p50": words(r.run.p50), "run_p95": words(r.run.p95), "run_mean": words(r.run.mean)} for r in rows]


def _zone(name: str) -> ZoneInfo | None:
    try:
        return ZoneInfo(name)
    except (ValueError, KeyError):
        return None


def _serving(name: str, processes: list[Any]) -> list[dict[str, Any]]:
    """The workers page's rows of the workers that serve queue ``name``, with its jobs they run."""
    workers: list[dict[str, Any]] = []
    for row in processes:
        info = row.info
        if info is None or info.kind != "worker" or not info.serves(name):
            continue
        running = [j for j in row.jobs if j.queue == name]
        workers.append({"row": row, "info": info, "running": running,
                        "expired": sum(1 for j in running if j.expired)})
    return workers


def _live_values(stats: Any, state: Any, workers: list[dict[str, Any]], now: Any) -> dict[str, Any]:
    return {
        "ready_due": stats.ready_due, "scheduled": stats.scheduled, "leased": stats.leased,
        "leased_expired": stats.leased_expired, "waiting": stats.waiting, "dead": stats.dead,
        "oldest_due": duration(stats.oldest_ready_age_seconds) if stats.ready_due else "—",
        "done_short": stats.done_recent_short, "dead_short": stats.dead_recent_short,
        "done_long": stats.done_recent_long, "dead_long": stats.dead_recent_long,
        "workers_serving": stats.workers_serving, "paused": stats.paused,
        "state": "paused" if stats.paused else "running",
        "throttled_total": int(state[3]) if state else 0,
        "threads": sum(int(w["info"].concurrency) for w in workers if w["info"].alive),
        "alive_workers": sum(1 for w in workers if bool(w["info"].alive)),
        "now": timezone.localtime(now).strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def queue_live(name: str) -> tuple[dict[str, Any], Any]:
    """The queue page's live figures, for its JSON endpoint (6 statements: the snapshot of the
    queue, the workers page's data, the queue's state; no charts, error groups or schedules).

    Args:
        name: the queue name.

    Returns:
        ``(values, now)``: the texts keyed as the page marks them (``data-live``), only the marks
        the page has (an expired-lease count only when it is not 0, claims cut short only with a
        rate limit), and the database clock reading they refer to.
    """
    snap = health.snapshot(queues=[name])
    stats = snap.queue(name)
    _, processes = workers_page(snap.now, can_release=False)
    state, _ = store.queue_page_rows(name, limit=0)
    values = _live_values(stats, state, _serving(name, processes), snap.now)
    del values["paused"]
    if not values["leased_expired"]:
        del values["leased_expired"]
    if name not in get_settings().rate_limits:
        del values["throttled_total"]
    return values, snap.now


def queue_context(name: str, *, period: str = "hour", window: str = "hour", can_pause: bool = False,
                  can_replay: bool = False, can_release: bool = False) -> dict[str, Any]:
    """Read everything the queue page shows, in a constant number of statements.

    Args:
        name: the queue name (need not hold jobs: its figures are then zero).
        period: the chart's range, a :data:`~django_leasequeue.health.RANGES` key.
        window: the latency table's window, a :data:`~django_leasequeue.health.LATENCY_WINDOWS` key.
        can_pause: show pause/resume (the viewer has ``change_queuestate``).
        can_replay: link the error groups to the confirmed bulk replay.
        can_release: give the workers' expired leases a release link (``change_job``).

    Returns:
        The template context of the page (without the admin site's own), with ``live``: the
        figures that change while the page is open, by the key of their ``data-live`` attribute,
        each the text the page shows (numbers, ``oldest_due`` in words, ``state`` "paused" or
        "running", ``now`` the database time in the active time zone); ``paused`` is the flag.

    Raises:
        ValueError: an unknown ``period`` or ``window``.
        django.db.DatabaseError: the database cannot be read.
    """
    settings = get_settings()
    snap = health.snapshot(queues=[name])
    stats = snap.queue(name)
    now = snap.now
    series = health.throughput(period, queue=name, now=now)
    latency = health.latency(window, queue=name, now=now)
    _, processes = workers_page(now, can_release=can_release)
    state, error_rows = store.queue_page_rows(name, limit=ERRORS_SHOWN)
    schedules = store.queue_schedules(name)

    job_list = reverse(f"admin:{APP}_job_changelist")
    dead_list = reverse(f"admin:{APP}_deadletter_changelist")
    bulk = reverse(f"admin:{APP}_deadletter_bulk", args=["replay"])
    workers = _serving(name, processes)
    errors = []
    for task, kind, message, n, newest in error_rows:
        # Grouped by task and error type, as Dead letters groups them, so that the group's links
        # select (and replay) exactly the jobs counted; the message is the newest one's.
        encoded = urlencode({"queue": name, "task": task, "error_type": kind or "-"})
        errors.append({"task": task, "error_type": error_name(kind) or "(no error recorded)", "full_type": kind,
                       "message": message, "n": n, "newest": relative((newest - now).total_seconds()),
                       "list_url": f"{dead_list}?{encoded}", "replay_url": f"{bulk}?{encoded}" if can_replay else ""})
    schedule_rows = []
    for s in schedules:
        zone = _zone(s.zone_name)
        nxt = s.next_occurrence_at
        schedule_rows.append({
            "schedule": s, "zone": s.zone_name,
            "next": in_zone(nxt, zone) if zone is not None and nxt is not None else "—",
            "next_relative": relative((nxt - now).total_seconds()) if nxt is not None else "",
            "url": reverse(f"admin:{APP}_schedule_change", args=[s.pk]),
        })
    paused_at = state[1] if state else None
    rate = settings.rate_limits.get(name)
    live = _live_values(stats, state, workers, now)
    return {
        "queue": name,
        "now": now,
        "stats": stats,
        "live": live,
        "period": period,
        "window": window,
        "ranges": list(health.RANGES),
        "windows": list(health.LATENCY_WINDOWS),
        "series": series,
        "chart": throughput_svg(series, title=f"Queue {name}: jobs done, failed and dead"),
        "latency": latency_rows(latency),
        "workers": workers,
        "alive_workers": live["alive_workers"],
        "limits": {
            "rate_limit": str(rate) if rate is not None else None,
            "fair": name in settings.fair_queues,
            "paused_at": paused_at,
            "paused_by": state[2] if state else "",
        },
        "errors": errors,
        "schedules": schedule_rows,
        "can_pause": can_pause,
        "can_replay": can_replay,
        "ready_url": f"{job_list}?{urlencode({'status': 'ready', 'queue': name})}",
        "leased_url": f"{job_list}?{urlencode({'status': 'leased', 'queue': name})}",
        "waiting_url": f"{job_list}?{urlencode({'status': 'waiting', 'queue': name})}",
        "dead_url": f"{dead_list}?{urlencode({'queue': name})}",
        "dashboard_url": reverse(f"admin:{APP}_dashboard_changelist"),
        "pause_query": urlencode({"queue": name, "_from": "queue"}),
    }
