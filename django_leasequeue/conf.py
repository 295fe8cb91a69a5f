"""Settings: the ``LEASEQUEUE`` dict, validated once into a frozen dataclass.

Durations are seconds (int or float) or :class:`datetime.timedelta`; they are normalised to float
seconds. Unknown keys are refused with a did-you-mean suggestion (the idea is Oban's schema
validation). The cache is cleared on Django's ``setting_changed`` so ``override_settings`` works.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from functools import lru_cache
from typing import Any

from .exceptions import ConfigurationError

#: The longest lease, in seconds (7 days): for ``LEASE``, ``runworker --lease``, ``@task(lease=...)``
#: and ``using(lease=...)``. Longer leases are no longer leases (a dead worker's job would wait a week
#: or more), and values past this bound overflow PostgreSQL's interval arithmetic.
MAX_LEASE_SECONDS = 7 * 24 * 3600.0
#: The most claims a job may get (``MAX_ATTEMPTS``, ``@task(max_attempts=...)``, ``enqueue(max_attempts=...)``).
MAX_ATTEMPTS_LIMIT = 1_000_000


def check_lease_seconds(value: Any, what: str) -> str | None:
    """Return why ``value`` is not a lease length (finite seconds in (0, 7 days]), or None if it is.

    Args:
        value: the candidate, in seconds.
        what: how to name it in the message (e.g. ``"LEASEQUEUE['LEASE']"``).
    """
    import math

    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 < value <= MAX_LEASE_SECONDS:
        return f"{what} must be a number of seconds in (0, {MAX_LEASE_SECONDS:.0f}] (7 days at most), got {value!r}"
    return None


#: The longest queue name (``Job.queue`` and ``QueueState.name`` hold 100 characters).
MAX_QUEUE_NAME_LENGTH = 100
#: The one grammar of queue names: ASCII letters, digits and ``_ . : -``. No spaces (``" default"``
#: is not ``"default"``), no commas (``runworker --queues`` separates names with them) and no ``*``
#: (``--queues '*'`` means every queue), so every queue can be named on the command line.
QUEUE_NAME_RE = re.compile(rf"[A-Za-z0-9_.:-]{{1,{MAX_QUEUE_NAME_LENGTH}}}")


def queue_name_problem(value: Any, what: str = "queue name") -> str | None:
    """Return why ``value`` is not a valid queue name, or None if it is.

    The grammar is :data:`QUEUE_NAME_RE`: 1 to 100 characters among ``A-Z a-z 0-9 _ . : -``. Used by
    enqueue, the settings (``QUEUES``, ``DEFAULT_QUEUE``), ``runworker --queues`` and the queue
    pause/resume functions, so a queue one of them accepts is one every other can name.

    Args:
        value: the candidate (any object; only a str can be valid).
        what: how to name it in the message (e.g. ``"LEASEQUEUE['DEFAULT_QUEUE']"``).

    Returns:
        A message naming ``what`` and the value, or None.
    """
    if isinstance(value, str) and QUEUE_NAME_RE.fullmatch(value):
        return None
    if isinstance(value, str) and len(value) > MAX_QUEUE_NAME_LENGTH:
        return f"{what} is {len(value)} characters long; the limit is {MAX_QUEUE_NAME_LENGTH}: {value[:40]!r}..."
    rule = (f"use 1 to {MAX_QUEUE_NAME_LENGTH} characters among letters A-Z a-z, digits and _ . : - "
            "(no spaces, commas or '*')")
    if not isinstance(value, str) or not value:
        return f"{what} must be a non-empty str, got {value!r}: {rule}"
    bad = next(c for c in value if not QUEUE_NAME_RE.fullmatch(c))
    detail = "a NUL character" if bad == "\x00" else repr(bad)
    return f"{what} {value!r} contains {detail}, which a queue name cannot hold: {rule}"


def parse_queue_list(text: str | None, what: str = "--queues") -> list[str] | None:
    """Parse a comma-separated list of queue names (``runworker --queues``).

    Spaces around names are ignored; ``None``, ``""`` and ``"*"`` mean every queue.

    Args:
        text: the option's value.
        what: how to name the option in the message.

    Returns:
        The names in order without duplicates, or None for every queue.

    Raises:
        ConfigurationError: a name that is not a valid queue name (:func:`queue_name_problem`),
            such as an empty item (``"a,,b"``), or ``*`` among other names (it must stand alone).
    """
    if text is None or text.strip() in ("", "*"):
        return None
    names: list[str] = []
    for item in text.split(","):
        name = item.strip()
        if name == "*":
            # "*" is not a queue name but the whole selection: "queue '*' contains '*'" misled.
            raise ConfigurationError(f"{what}: '*' (every queue) must stand alone, not be listed with other "
                                     f"queues; got {text!r}: pass '*' alone, or only queue names")
        problem = queue_name_problem(name, f"{what}: queue")
        if problem:
            raise ConfigurationError(problem)
        if name not in names:
            names.append(name)
    return names


DEFAULTS: dict[str, Any] = {
    # Seconds a claim holds a job before another worker may take it; renewed by heartbeats.
    "LEASE": 30.0,
    # Heartbeat renewal interval; None means LEASE / 3.
    "HEARTBEAT_INTERVAL": None,
    "MAX_ATTEMPTS": 5,
    # Exponential backoff: BACKOFF_BASE * 2 ** (attempt - 1), capped at BACKOFF_MAX, with jitter.
    "BACKOFF_BASE": 2.0,
    "BACKOFF_MAX": 3600.0,
    "BACKOFF_JITTER": 0.5,
    "POLL_INTERVAL": 1.0,
    "REAPER_INTERVAL": 5.0,
    "SHUTDOWN_GRACE": 30.0,
    # None: any queue name is accepted. A dict or list restricts enqueue to those queues.
    "QUEUES": None,
    "DEFAULT_QUEUE": "default",
    "MAX_PAYLOAD_BYTES": 1024 * 1024,
    # A handler's return value larger than this (JSON, UTF-8 bytes) fails its job (dead, no retry).
    "MAX_RESULT_BYTES": 1024 * 1024,
    "NOTIFY": True,
    "NOTIFY_CHANNEL": "leasequeue",
    # Finished (done/cancelled) jobs are deleted this many seconds after finishing; None keeps them.
    "RETENTION": 7 * 24 * 3600.0,
    "PRUNE_BATCH": 1000,
    # Time-partitioned history for high volume (docs/howto/history.md): None (off: finished jobs
    # stay in the job table until the pruner deletes them), "hour" or "day": done jobs move into
    # the partitions of leasequeue_job_history, one per hour or day, which are dropped whole past
    # RETENTION. Dead and cancelled jobs, and jobs still read where they are, stay.
    "HISTORY": None,
    # Seconds a done job stays in the job table before it moves into the history (HISTORY set).
    "HISTORY_MOVE_AFTER": 300.0,
    # Workers elect one of them (through the process registry) to run the periodic maintenance
    # that runreaper runs: prune finished jobs by RETENTION, stale process rows and rate logs, fold
    # the chart counters. False: leave it to a runreaper process.
    "WORKER_MAINTENANCE": True,
    # Seconds between two runs of that maintenance (by the elected worker, or by runreaper).
    "MAINTENANCE_INTERVAL": 60.0,
    # Extra modules that register tasks, imported by workers besides each app's tasks.py / jobs.py.
    "IMPORTS": (),
    # A job snoozed more often than this is dead-lettered (a cap on runaway snoozing).
    "MAX_SNOOZES": 100,
    # ---- monitoring ----
    # Bearer token(s) that may read the Prometheus metrics view: a str, or a list of str (to rotate
    # tokens without downtime). None: only a staff session may read it (if METRICS_ALLOW_STAFF).
    "METRICS_TOKEN": None,
    # Whether a logged-in staff user may read the metrics view without a token.
    "METRICS_ALLOW_STAFF": True,
    # A registered process is alive when its heartbeat is newer than this; None: max(30, 3 x
    # REAPER_INTERVAL) (workers beat every 5 s, reapers once per sweep).
    "PROCESS_ALIVE_WITHIN": None,
    # Process rows silent for longer than this are deleted by the reaper; None: max(300, 2 x
    # PROCESS_ALIVE_WITHIN).
    "PROCESS_PRUNE_AFTER": None,
    # Prefetch: a worker may hold claimed jobs beyond its free threads, as many as its threads are
    # expected to start within PREFETCH_WAIT seconds (from recent job durations), at most
    # PREFETCH_MAX. Batches claims of short jobs; slow jobs are never prefetched. 0 disables it.
    "PREFETCH_WAIT": 0.05,
    "PREFETCH_MAX": 64,
    # Async handlers (``async def`` tasks) run as coroutines on one event loop thread per worker,
    # at most this many at once (``runworker --async-slots``), beside the handler threads. 0 runs
    # them on the handler threads instead, one private event loop per attempt.
    "ASYNC_SLOTS": 100,
    # Commit the worker's batched completions with synchronous_commit = off (per transaction, never
    # the server setting). A crash of PostgreSQL may then lose the last few hundred milliseconds of
    # completions: those jobs are leased again, and when the lease expires the reaper counts a failed
    # attempt: they run again, or are dead-lettered on their last attempt (docs/howto/performance.md).
    # Fencing is unchanged. Enqueues and claims stay durable.
    "ASYNC_COMPLETIONS": False,
    # Run the statements sent once per job or per claim (the worker's claim, the one-job enqueue
    # outside a transaction) as SQL PREPARE/EXECUTE: parsed and planned once per server connection
    # instead of on every call (about 1 ms less per claim, 10-20 % less per single enqueue). Safe behind
    # PgBouncer in any mode: a server connection that lacks the statement prepares it in the same
    # message (store/_prepared.py). Turn it off behind a pooler that pins a session on PREPARE
    # (Amazon RDS Proxy), where it would cost multiplexing.
    "PREPARED_STATEMENTS": True,
    # Rolling deploys: workers claim only the tasks they have registered. A due ready job whose
    # task no live worker serving its queue knows is dead-lettered as UnknownTask once it has been
    # due this long and every such worker has been registered this long. None: never (the job
    # waits for a worker that knows its task).
    "UNKNOWN_TASK_GRACE": 300.0,
    # Monitoring: an unfinished workflow or batch whose last progress (a member or callback
    # settled, members added, the batch closed) is older than this is stuck. Set it above the
    # longest a step may run or wait in its queue, or healthy slow workflows are reported.
    "WORKFLOW_STUCK_AFTER": 3600.0,
    # The console's charts: outcome counters (per minute, then per hour, then per day) older than
    # this are deleted by the reaper. At least 2 days: the charts show 30 days at most.
    "STATS_RETENTION": 90 * 24 * 3600.0,
    # ---- timeouts ----
    # How handlers run: "thread" (in the worker's threads; a handler past its task's timeout cannot
    # be stopped, so it keeps its slot and its job's lease until it returns) or "process" (each
    # handler in a child process, killed at its task's timeout: a hard time limit).
    "EXECUTION": "thread",
    # Thread mode: a worker exits (status 3) once this many of its handlers are stuck past their
    # timeout; None: all of its threads (--concurrency).
    "STUCK_HANDLERS_MAX": None,
    # Thread mode: a worker exits (status 3) once one handler is stuck this many seconds past its
    # timeout; None: never for that reason.
    "STUCK_EXIT_AFTER": 300.0,
    # Attempts refunded because a graceful stop interrupted the handler; the next interruption
    # dead-letters the job with an "Interrupted" error.
    "MAX_INTERRUPTIONS": 5,
}

_DURATIONS = {
    "LEASE", "HEARTBEAT_INTERVAL", "BACKOFF_BASE", "BACKOFF_MAX", "POLL_INTERVAL",
    "REAPER_INTERVAL", "SHUTDOWN_GRACE", "RETENTION", "PROCESS_ALIVE_WITHIN", "PROCESS_PRUNE_AFTER",
    "PREFETCH_WAIT", "STUCK_EXIT_AFTER", "UNKNOWN_TASK_GRACE", "WORKFLOW_STUCK_AFTER",
    "STATS_RETENTION", "MAINTENANCE_INTERVAL", "HISTORY_MOVE_AFTER",
}

#: The longest ``WORKFLOW_STUCK_AFTER``, in seconds (366 days): a workflow idle for a year is stuck
#: by any measure, and the bound keeps the database's interval arithmetic far from overflowing.
MAX_WORKFLOW_STUCK_AFTER = 366 * 24 * 3600.0
#: The shortest ``STATS_RETENTION``, in seconds (2 days): the hourly chart reads 24 h of hour rows,
#: which the reaper rolls into day rows after 25 h.
MIN_STATS_RETENTION = 2 * 24 * 3600.0
#: The longest ``STATS_RETENTION``, in seconds (10 years).
MAX_STATS_RETENTION = 3660 * 24 * 3600.0

# Workers touch their registry row every 5 s (worker.PROCESS_HEARTBEAT_INTERVAL); an "alive"
# threshold below two of those beats would make healthy workers flap between alive and dead.
MIN_PROCESS_ALIVE_WITHIN = 10.0


def to_seconds(value: float | int | timedelta | None, name: str) -> float | None:
    """Normalise a duration (seconds or timedelta) to float seconds; None stays None.

    Raises:
        ConfigurationError: the value is neither a number nor a timedelta.
    """
    if value is None:
        return None
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"LEASEQUEUE[{name!r}] must be a number of seconds (int or float) or a timedelta, "
                                 f"got {value!r}")
    return float(value)


# Per-queue options accepted in ``LEASEQUEUE["QUEUES"][name]``.
QUEUE_OPTIONS = {"rate_limit", "fair"}

_RATE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_RATE_RE = re.compile(r"^\s*(\d+)\s*/\s*([smh])\s*$")


@dataclass(frozen=True)
class RateLimit:
    """At most ``limit`` claims from a queue in any window of ``per`` seconds, across all workers.

    Attributes:
        limit (int): claims allowed per window (>= 1).
        per (float): window length in seconds (1, 60 or 3600).
    """

    limit: int
    per: float

    def __str__(self) -> str:
        unit = {1.0: "s", 60.0: "m", 3600.0: "h"}.get(self.per, f"{self.per}s")
        return f"{self.limit}/{unit}"


def parse_rate(value: Any, where: str = "rate_limit") -> RateLimit:
    """Parse a rate limit such as ``"100/m"`` (``N/s``, ``N/m`` or ``N/h``) into a :class:`RateLimit`.

    Raises:
        ConfigurationError: the value is not a string ``N/s|m|h`` with N >= 1, naming ``where``.
    """
    match = _RATE_RE.match(value) if isinstance(value, str) else None
    if match is None or int(match.group(1)) < 1:
        raise ConfigurationError(
            f"{where} must be a string 'N/s', 'N/m' or 'N/h' with N >= 1 (claims per second, minute or hour), "
            f"got {value!r}"
        )
    return RateLimit(limit=int(match.group(1)), per=_RATE_UNITS[match.group(2)])


def _did_you_mean(key: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'X'?)`` for an unknown key: the closest spelling, else a known key the
    unknown one starts or ends with (``LEASE_SECONDS`` -> ``LEASE``); empty when nothing fits."""
    options = sorted(choices)
    close = difflib.get_close_matches(key, options, n=1)
    if not close:
        close = sorted((k for k in options if key.startswith(k + "_") or key.endswith("_" + k)), key=len)[-1:]
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_keys_hint(keys: Iterable[Any], choices: Iterable[str]) -> str:
    """The unknown ``keys`` for an error message, each with its closest known key:
    ``"'LEASE_SECONDS' (did you mean 'LEASE'?), 'X'"``.

    Args:
        keys: the unknown keys, in the order to name them (each shown with ``repr``).
        choices: the known keys.

    Returns:
        The keys joined with ``", "`` (empty for no keys).
    """
    options = sorted(choices)
    return ", ".join(f"{key!r}{_did_you_mean(str(key), options)}" for key in keys)


def _queue_options(queues: dict[str, dict[str, Any]]) -> dict[str, RateLimit]:
    """Validate per-queue options (did-you-mean on unknown keys); return the rate limits by queue."""
    rates: dict[str, RateLimit] = {}
    for name, options in queues.items():
        unknown = sorted(set(options) - QUEUE_OPTIONS)
        if unknown:
            raise ConfigurationError(f"Unknown option(s) for LEASEQUEUE['QUEUES'][{name!r}]: "
                                     + unknown_keys_hint(unknown, QUEUE_OPTIONS))
        if options.get("rate_limit") is not None:
            rates[name] = parse_rate(options["rate_limit"], f"LEASEQUEUE['QUEUES'][{name!r}]['rate_limit']")
    return rates


def _fair_queues(queues: dict[str, dict[str, Any]]) -> frozenset[str]:
    """The queues with ``"fair": True`` (claimed round-robin across fair keys).

    Raises:
        ConfigurationError: ``fair`` is not a bool, or is combined with the queue's ``rate_limit``
            (the fair claim does not keep the queue's rate log).
    """
    fair = set()
    for name, options in queues.items():
        flag = options.get("fair", False)
        if not isinstance(flag, bool):
            raise ConfigurationError(f"LEASEQUEUE['QUEUES'][{name!r}]['fair'] must be True or False, got {flag!r}")
        if flag and options.get("rate_limit") is not None:
            raise ConfigurationError(f"LEASEQUEUE['QUEUES'][{name!r}]: 'fair' and 'rate_limit' cannot be combined; "
                                     "limit the rate per key instead (task option rate_key)")
        if flag:
            fair.add(name)
    return frozenset(fair)


@dataclass(frozen=True)
class Settings:
    """The validated ``LEASEQUEUE`` setting. Durations are float seconds."""

    lease: float
    heartbeat_interval: float
    max_attempts: int
    backoff_base: float
    backoff_max: float
    backoff_jitter: float
    poll_interval: float
    reaper_interval: float
    shutdown_grace: float
    queues: dict[str, dict[str, Any]] | None
    default_queue: str
    max_payload_bytes: int
    notify: bool
    notify_channel: str
    retention: float | None
    prune_batch: int
    #: ``HISTORY``: None (off), "hour" or "day" (the history table's partition size).
    history: str | None = None
    history_move_after: float = 300.0
    imports: tuple[str, ...] = field(default=())
    max_snoozes: int = 100
    worker_maintenance: bool = True
    maintenance_interval: float = 60.0
    # ---- monitoring ----
    metrics_tokens: tuple[str, ...] = field(default=(), repr=False)
    metrics_allow_staff: bool = True
    process_alive_within: float = 30.0
    process_prune_after: float = 300.0
    # Queue name -> RateLimit, parsed from QUEUES[name]["rate_limit"].
    rate_limits: dict[str, RateLimit] = field(default_factory=dict)
    prefetch_wait: float = 0.05
    prefetch_max: int = 64
    async_slots: int = 100
    async_completions: bool = False
    prepared_statements: bool = True
    unknown_task_grace: float | None = 300.0
    workflow_stuck_after: float = 3600.0
    stats_retention: float = 90 * 24 * 3600.0
    max_result_bytes: int = 1024 * 1024
    # ---- timeouts ----
    execution: str = "thread"
    stuck_handlers_max: int | None = None
    stuck_exit_after: float | None = 300.0
    max_interruptions: int = 5
    # Queue names with QUEUES[name]["fair"] = True.
    fair_queues: frozenset[str] = field(default_factory=frozenset)

    def queue_allowed(self, name: str) -> bool:
        """Return True when ``name`` may be enqueued to (any name when QUEUES is not restricted)."""
        return self.queues is None or name in self.queues


def build(raw: dict[str, Any] | None) -> Settings:
    """Validate a raw ``LEASEQUEUE`` dict and return :class:`Settings`.

    Raises:
        ConfigurationError: unknown key (with a suggestion), wrong type, out of range, or a broken
            cross-field rule (heartbeat interval must be below the lease, BACKOFF_MAX >= BACKOFF_BASE).
    """
    raw = dict(raw or {})
    unknown = sorted(set(raw) - set(DEFAULTS))
    if unknown:
        raise ConfigurationError("Unknown LEASEQUEUE setting(s): " + unknown_keys_hint(unknown, DEFAULTS))
    merged = {**DEFAULTS, **raw}
    for key in _DURATIONS:
        merged[key] = to_seconds(merged[key], key)
    lease = merged["LEASE"]
    problem = check_lease_seconds(lease, "LEASEQUEUE['LEASE']")
    if problem:
        raise ConfigurationError(problem)
    heartbeat = merged["HEARTBEAT_INTERVAL"] if merged["HEARTBEAT_INTERVAL"] is not None else lease / 3
    if not 0 < heartbeat < lease:
        raise ConfigurationError(
            f"LEASEQUEUE['HEARTBEAT_INTERVAL'] ({heartbeat}) must be > 0 and below LEASE ({lease})"
        )
    for key in ("POLL_INTERVAL", "REAPER_INTERVAL", "BACKOFF_BASE", "BACKOFF_MAX", "MAINTENANCE_INTERVAL"):
        if merged[key] is None or merged[key] <= 0:
            raise ConfigurationError(f"LEASEQUEUE[{key!r}] must be > 0, got {merged[key]!r}")
    if not isinstance(merged["WORKER_MAINTENANCE"], bool):
        raise ConfigurationError(f"LEASEQUEUE['WORKER_MAINTENANCE'] must be True or False, "
                                 f"got {merged['WORKER_MAINTENANCE']!r}")
    if not isinstance(merged["PREPARED_STATEMENTS"], bool):
        raise ConfigurationError(f"LEASEQUEUE['PREPARED_STATEMENTS'] must be True or False, "
                                 f"got {merged['PREPARED_STATEMENTS']!r}")
    if merged["SHUTDOWN_GRACE"] is None or merged["SHUTDOWN_GRACE"] < 0:
        raise ConfigurationError("LEASEQUEUE['SHUTDOWN_GRACE'] must be >= 0")
    if merged["BACKOFF_MAX"] > 100 * 366 * 24 * 3600.0:
        # retry.MAX_BACKOFF_SECONDS: a longer retry delay overflows the database's interval arithmetic.
        raise ConfigurationError(f"LEASEQUEUE['BACKOFF_MAX'] must be at most 100 years, got {merged['BACKOFF_MAX']!r}")
    if merged["BACKOFF_MAX"] < merged["BACKOFF_BASE"]:
        raise ConfigurationError("LEASEQUEUE['BACKOFF_MAX'] must be >= BACKOFF_BASE")
    if not 0 <= merged["BACKOFF_JITTER"] <= 1:
        raise ConfigurationError("LEASEQUEUE['BACKOFF_JITTER'] must be between 0 and 1")
    if merged["PREFETCH_WAIT"] is None or merged["PREFETCH_WAIT"] < 0:
        raise ConfigurationError("LEASEQUEUE['PREFETCH_WAIT'] must be >= 0 seconds (0 disables prefetching)")
    prefetch_max = merged["PREFETCH_MAX"]
    if isinstance(prefetch_max, bool) or not isinstance(prefetch_max, int) or prefetch_max < 0:
        raise ConfigurationError(f"LEASEQUEUE['PREFETCH_MAX'] must be an int >= 0, got {prefetch_max!r}")
    async_slots = merged["ASYNC_SLOTS"]
    if isinstance(async_slots, bool) or not isinstance(async_slots, int) or async_slots < 0:
        raise ConfigurationError(f"LEASEQUEUE['ASYNC_SLOTS'] must be an int >= 0, got {async_slots!r}")
    max_attempts = merged["MAX_ATTEMPTS"]
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) \
            or not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT:
        raise ConfigurationError(f"LEASEQUEUE['MAX_ATTEMPTS'] must be an int from 1 to {MAX_ATTEMPTS_LIMIT}, "
                                 f"got {max_attempts!r}")
    max_payload = merged["MAX_PAYLOAD_BYTES"]
    if isinstance(max_payload, bool) or not isinstance(max_payload, int) or max_payload < 0:
        raise ConfigurationError(
            f"LEASEQUEUE['MAX_PAYLOAD_BYTES'] must be an int >= 0 (0: no limit), got {max_payload!r}"
        )
    max_result = merged["MAX_RESULT_BYTES"]
    if isinstance(max_result, bool) or not isinstance(max_result, int) or max_result < 0:
        raise ConfigurationError(
            f"LEASEQUEUE['MAX_RESULT_BYTES'] must be an int >= 0 (bytes of JSON; 0: no limit), got {max_result!r}"
        )
    queues = merged["QUEUES"]
    if queues is not None:
        if isinstance(queues, (list, tuple, set, frozenset)):
            queues = {q: {} for q in queues}
        elif isinstance(queues, dict):
            for name, cfg in queues.items():
                if cfg is not None and not isinstance(cfg, dict):
                    raise ConfigurationError(
                        f"LEASEQUEUE['QUEUES'][{name!r}] must be a dict of options such as "
                        f"{{'rate_limit': '100/m'}}, got {cfg!r}"
                    )
            queues = {q: dict(cfg or {}) for q, cfg in queues.items()}
        else:
            raise ConfigurationError("LEASEQUEUE['QUEUES'] must be None, a list of names or a dict")
        for name in queues:
            problem = queue_name_problem(name, "LEASEQUEUE['QUEUES'] key")
            if problem:
                raise ConfigurationError(problem)
    problem = queue_name_problem(merged["DEFAULT_QUEUE"], "LEASEQUEUE['DEFAULT_QUEUE']")
    if problem:
        raise ConfigurationError(problem)
    grace = merged["UNKNOWN_TASK_GRACE"]
    if grace is not None and not 0 <= grace <= MAX_LEASE_SECONDS:
        raise ConfigurationError(
            f"LEASEQUEUE['UNKNOWN_TASK_GRACE'] must be None (never dead-letter) or from 0 to "
            f"{MAX_LEASE_SECONDS:g} seconds, got {grace!r}"
        )
    monitoring = _build_monitoring(merged)
    rate_limits = _queue_options(queues) if queues else {}
    fair_queues = _fair_queues(queues) if queues else frozenset()
    return Settings(
        lease=lease,
        heartbeat_interval=heartbeat,
        max_attempts=max_attempts,
        backoff_base=merged["BACKOFF_BASE"],
        backoff_max=merged["BACKOFF_MAX"],
        backoff_jitter=float(merged["BACKOFF_JITTER"]),
        poll_interval=merged["POLL_INTERVAL"],
        reaper_interval=merged["REAPER_INTERVAL"],
        shutdown_grace=merged["SHUTDOWN_GRACE"],
        queues=queues,
        default_queue=str(merged["DEFAULT_QUEUE"]),
        max_payload_bytes=max_payload,
        notify=bool(merged["NOTIFY"]),
        notify_channel=str(merged["NOTIFY_CHANNEL"]),
        retention=merged["RETENTION"],
        prune_batch=int(merged["PRUNE_BATCH"]),
        **_build_history(merged),
        imports=tuple(merged["IMPORTS"]),
        max_snoozes=int(merged["MAX_SNOOZES"]),
        worker_maintenance=merged["WORKER_MAINTENANCE"],
        maintenance_interval=merged["MAINTENANCE_INTERVAL"],
        **monitoring,
        rate_limits=rate_limits,
        prefetch_wait=float(merged["PREFETCH_WAIT"]),
        prefetch_max=prefetch_max,
        async_slots=async_slots,
        async_completions=bool(merged["ASYNC_COMPLETIONS"]),
        prepared_statements=bool(merged["PREPARED_STATEMENTS"]),
        unknown_task_grace=grace,
        **_build_timeouts(merged),
        max_result_bytes=max_result,
        fair_queues=fair_queues,
    )


#: The partition sizes ``HISTORY`` accepts besides None (store.HISTORY_PERIODS), in seconds.
HISTORY_PERIOD_SECONDS = {"hour": 3600.0, "day": 86400.0}
HISTORY_PERIODS = tuple(HISTORY_PERIOD_SECONDS)
#: The most partitions ``RETENTION`` may keep (``RETENTION`` / the period): 41 days of hours, or
#: 2.7 years of days.
MAX_HISTORY_PARTITIONS = 1000


def _build_history(merged: dict[str, Any]) -> dict[str, Any]:
    """Validate ``HISTORY`` and ``HISTORY_MOVE_AFTER`` of a merged ``LEASEQUEUE`` dict.

    Raises:
        ConfigurationError: ``HISTORY`` not None, "hour" or "day"; ``HISTORY_MOVE_AFTER`` not a
            finite number of seconds from 0, or not below ``RETENTION`` (the job would be pruned
            before it could move); ``RETENTION`` over :data:`MAX_HISTORY_PARTITIONS` periods.
    """
    history = merged["HISTORY"]
    if history is not None and history not in HISTORY_PERIODS:
        raise ConfigurationError(f"LEASEQUEUE['HISTORY'] must be None (off), 'hour' or 'day', got {history!r}")
    after = merged["HISTORY_MOVE_AFTER"]
    if isinstance(after, bool) or not isinstance(after, (int, float)) or not 0 <= after < float("inf"):
        raise ConfigurationError(f"LEASEQUEUE['HISTORY_MOVE_AFTER'] must be a finite number of seconds from 0, "
                                 f"got {after!r}")
    retention = merged["RETENTION"]
    if (history is not None and retention is not None
            and retention / HISTORY_PERIOD_SECONDS[history] > MAX_HISTORY_PARTITIONS):
        raise ConfigurationError(
            f"LEASEQUEUE['HISTORY'] {history!r} with RETENTION {retention:g} s would keep more than "
            f"{MAX_HISTORY_PARTITIONS} partitions (each lookup of a moved job probes every one): use 'day'")
    if history is not None and retention is not None and after >= retention:
        raise ConfigurationError(f"LEASEQUEUE['HISTORY_MOVE_AFTER'] ({after:g}) must be below RETENTION "
                                 f"({retention:g}): done jobs would be pruned before they could move")
    return {"history": history, "history_move_after": float(after)}


#: The handler execution modes (``EXECUTION``, ``runworker --execution``).
EXECUTION_MODES = ("thread", "process")


def _build_timeouts(merged: dict[str, Any]) -> dict[str, Any]:
    """Validate the timeout keys of a merged ``LEASEQUEUE`` dict (durations already seconds).

    Raises:
        ConfigurationError: ``EXECUTION`` not one of :data:`EXECUTION_MODES`, ``STUCK_HANDLERS_MAX``
            not None or an int >= 1, ``STUCK_EXIT_AFTER`` not None or > 0 seconds,
            ``MAX_INTERRUPTIONS`` not an int >= 0.
    """
    execution = merged["EXECUTION"]
    if execution not in EXECUTION_MODES:
        raise ConfigurationError(f"LEASEQUEUE['EXECUTION'] must be one of {', '.join(map(repr, EXECUTION_MODES))}, "
                                 f"got {execution!r}")
    stuck_max = merged["STUCK_HANDLERS_MAX"]
    if stuck_max is not None and (isinstance(stuck_max, bool) or not isinstance(stuck_max, int) or stuck_max < 1):
        raise ConfigurationError("LEASEQUEUE['STUCK_HANDLERS_MAX'] must be None (all of the worker's threads) "
                                 f"or an int >= 1, got {stuck_max!r}")
    stuck_after = merged["STUCK_EXIT_AFTER"]
    if stuck_after is not None and not (stuck_after > 0 and stuck_after != float("inf")):
        raise ConfigurationError("LEASEQUEUE['STUCK_EXIT_AFTER'] must be None (never) or a finite number of "
                                 f"seconds > 0, got {stuck_after!r}")
    interruptions = merged["MAX_INTERRUPTIONS"]
    if isinstance(interruptions, bool) or not isinstance(interruptions, int) or not 0 <= interruptions <= 1_000_000:
        raise ConfigurationError("LEASEQUEUE['MAX_INTERRUPTIONS'] must be an int from 0 to 1000000, "
                                 f"got {interruptions!r}")
    return {"execution": execution, "stuck_handlers_max": stuck_max, "stuck_exit_after": stuck_after,
            "max_interruptions": interruptions}


def _build_monitoring(merged: dict[str, Any]) -> dict[str, Any]:
    """Validate the monitoring keys of a merged ``LEASEQUEUE`` dict (durations already seconds).

    Raises:
        ConfigurationError: a token that is not a non-empty str without whitespace, an alive
            threshold below 10 s, a prune age not above the alive threshold, or a
            ``WORKFLOW_STUCK_AFTER`` not in (0, 366 days], a ``STATS_RETENTION`` not in [2 days,
            10 years].
    """
    raw_tokens = merged["METRICS_TOKEN"]
    if raw_tokens is None:
        tokens: tuple[str, ...] = ()
    elif isinstance(raw_tokens, str):
        tokens = (raw_tokens,)
    elif isinstance(raw_tokens, (list, tuple)):
        tokens = tuple(raw_tokens)
    else:
        raise ConfigurationError("LEASEQUEUE['METRICS_TOKEN'] must be None, a str or a list of str")
    for token in tokens:
        if not isinstance(token, str) or not token or token != token.strip() or any(c.isspace() for c in token):
            raise ConfigurationError(
                "LEASEQUEUE['METRICS_TOKEN'] entries must be non-empty strings without whitespace"
            )
    stuck_after = merged["WORKFLOW_STUCK_AFTER"]
    if stuck_after is None or not 0 < stuck_after <= MAX_WORKFLOW_STUCK_AFTER:
        raise ConfigurationError(
            f"LEASEQUEUE['WORKFLOW_STUCK_AFTER'] must be a number of seconds (or a timedelta) above 0 and at "
            f"most {MAX_WORKFLOW_STUCK_AFTER:g} (366 days), got {stuck_after!r}"
        )
    stats_retention = merged["STATS_RETENTION"]
    if stats_retention is None or not MIN_STATS_RETENTION <= stats_retention <= MAX_STATS_RETENTION:
        raise ConfigurationError(
            f"LEASEQUEUE['STATS_RETENTION'] must be a number of seconds (or a timedelta) from "
            f"{MIN_STATS_RETENTION:g} (2 days) to {MAX_STATS_RETENTION:g} (10 years), got {stats_retention!r}"
        )
    if not isinstance(merged["METRICS_ALLOW_STAFF"], bool):
        raise ConfigurationError("LEASEQUEUE['METRICS_ALLOW_STAFF'] must be True or False")
    alive = merged["PROCESS_ALIVE_WITHIN"]
    if alive is None:
        alive = max(30.0, 3 * merged["REAPER_INTERVAL"])
    elif alive < MIN_PROCESS_ALIVE_WITHIN:
        raise ConfigurationError(
            f"LEASEQUEUE['PROCESS_ALIVE_WITHIN'] must be >= {MIN_PROCESS_ALIVE_WITHIN:g} seconds "
            f"(workers beat every 5 s), got {alive!r}"
        )
    prune = merged["PROCESS_PRUNE_AFTER"]
    if prune is None:
        prune = max(300.0, 2 * alive)
    elif prune <= alive:
        raise ConfigurationError(
            f"LEASEQUEUE['PROCESS_PRUNE_AFTER'] ({prune:g}) must be above PROCESS_ALIVE_WITHIN ({alive:g})"
        )
    return {"metrics_tokens": tokens, "metrics_allow_staff": merged["METRICS_ALLOW_STAFF"],
            "process_alive_within": alive, "process_prune_after": prune, "workflow_stuck_after": stuck_after,
            "stats_retention": stats_retention}


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Return the validated settings (cached; cleared when ``LEASEQUEUE`` changes in tests)."""
    from django.conf import settings

    return build(getattr(settings, "LEASEQUEUE", None))


def _on_setting_changed(*, setting: str, **_: Any) -> None:
    if setting == "LEASEQUEUE":
        get_settings.cache_clear()
