"""What the testing helpers report: :class:`JobRun` (one attempt), :class:`DrainResult` (every
attempt of a drain or an eager block) and :class:`JobFailed` (the assertion a failed attempt raises)."""

from __future__ import annotations

import collections
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from .. import store
from ..models import Job

# Outcomes of an attempt that count as a failure of the job's handler.
FAILED_OUTCOMES = frozenset({"ready", "dead", "unrecorded"})


@dataclass(frozen=True)
class JobRun:
    """One attempt run by :func:`drain`, :func:`eager` or :func:`simulate_lost_lease`.

    Attributes:
        job_id (int), task (str), queue (str): the job.
        attempt (int): 1 for the first claim, 2 for the first retry...
        token (int): the fencing token (``lease_version``) this attempt held.
        outcome (str): ``done``; ``ready`` (failed, retry scheduled after the backoff); ``dead``
            (failed, attempts exhausted, or not retryable); ``snoozed``; ``cancelled``;
            ``lease_lost`` (a fenced write of this attempt was refused); ``unrecorded`` (the
            failure could not be written).
        worker (str): the worker id that ran it (``host:pid:name``).
    """

    job_id: int
    task: str
    queue: str
    attempt: int
    token: int
    outcome: str
    worker: str

    @property
    def failed(self) -> bool:
        """True when the handler failed this attempt (outcome ``ready``, ``dead`` or ``unrecorded``)."""
        return self.outcome in FAILED_OUTCOMES


@dataclass
class DrainResult:
    """What :func:`drain` (or an :func:`eager` block) ran, in order.

    Attributes:
        runs (list[JobRun]): every attempt, in the order run.
        reaped (int): expired leases taken back by the reaper sweep before claiming.
        throttled (bool): the drain stopped because a queue's rate limit was used up.
        not_due (list[int]): (eager mode) ids of jobs enqueued in the block that were not run:
            scheduled for later, in a paused queue or over their concurrency limit.
    """

    runs: list[JobRun] = field(default_factory=list)
    reaped: int = 0
    throttled: bool = False
    not_due: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.runs)

    def __iter__(self) -> Iterator[JobRun]:
        return iter(self.runs)

    @property
    def outcomes(self) -> collections.Counter[str]:
        """Number of attempts per outcome, e.g. ``Counter({"done": 3, "ready": 1})``."""
        return collections.Counter(run.outcome for run in self.runs)

    @property
    def done(self) -> int:
        """Number of attempts that ended ``done``."""
        return self.outcomes["done"]

    @property
    def failed(self) -> list[JobRun]:
        """The attempts whose handler failed (see :attr:`JobRun.failed`)."""
        return [run for run in self.runs if run.failed]

    @property
    def job_ids(self) -> list[int]:
        """Distinct job ids run, in first-run order."""
        return list(dict.fromkeys(run.job_id for run in self.runs))

    def raise_failures(self) -> None:
        """Raise :class:`JobFailed` if any attempt failed.

        Raises:
            JobFailed: naming each failed attempt with the error its job row recorded.
        """
        if self.failed:
            raise JobFailed(self.failed, self)


class JobFailed(AssertionError):
    """A job's handler failed while a testing helper ran it.

    The message shows, for each failed attempt, the exception type, message and traceback that
    the job row recorded. An ``AssertionError``, so pytest reports it as a test failure.

    Attributes:
        failures (list[JobRun]): the failed attempts.
        result (DrainResult): everything that was run.
    """

    def __init__(self, failures: Sequence[JobRun], result: DrainResult) -> None:
        self.failures = list(failures)
        self.result = result
        errors = {job.pk: job.errors for job in Job.objects.using(store.db_alias())
                  .filter(pk__in=[run.job_id for run in failures])}
        parts = []
        for run in failures:
            entries = [e for e in errors.get(run.job_id) or [] if e.get("attempt") == run.attempt]
            entry = entries[-1] if entries else {}
            parts.append(
                f"job {run.job_id} ({run.task}) attempt {run.attempt}: {run.outcome}; "
                f"{entry.get('type', '?')}: {entry.get('message', '')}\n{entry.get('traceback', '').rstrip()}"
            )
        super().__init__(
            f"{len(self.failures)} job attempt(s) failed (pass raise_failures=False to inspect failures "
            "instead):\n" + "\n".join(parts)
        )

