"""Flow-control tasks of the test project: keyed limits, a rate-limited queue, snooze, cancel.

Each handler records what it saw as :class:`~flowlab.models.Probe` rows stamped with the database
clock, so tests compare times from one clock.
"""

from __future__ import annotations

import time

from django_leasequeue import Backoff, JobContext, Snooze, task
from django_leasequeue.store import db_now

from .models import Probe


def probe(ctx_or_id: JobContext | int, key: str, event: str) -> None:
    """Record ``event`` for ``key`` at the database's current time."""
    if isinstance(ctx_or_id, JobContext):
        job_id, attempt = ctx_or_id.job_id, ctx_or_id.attempt
    else:
        job_id, attempt = ctx_or_id, 0
    Probe.objects.create(key=key, event=event, job_id=job_id, attempt=attempt, at=db_now())


@task(name="flowlab.customer_job", queue="flow", concurrency_key="customer-{customer}", concurrency_limit=2)
def customer_job(customer: str, seq: int, seconds: float = 0.1) -> int:
    """Work for one customer: at most 2 of one customer's jobs run at once, across all workers."""
    time.sleep(seconds)
    return seq


@task(name="flowlab.rated_noop", queue="rated")
def rated_noop(seq: int) -> None:
    """A no-op on the ``rated`` queue (configure ``QUEUES['rated']['rate_limit']``)."""


@task(name="flowlab.snooze_once", queue="flow", takes_context=True)
def snooze_once(context: JobContext, key: str, seconds: float) -> str:
    """Snooze for ``seconds`` on the first run, finish on the second."""
    probe(context, key, "run")
    if Probe.objects.filter(key=key, event="run").count() == 1:
        return Snooze(seconds)
    return "woke up"


@task(name="flowlab.cancellable", queue="flow", takes_context=True, lease=3)
def cancellable(context: JobContext, key: str, max_seconds: float = 30.0) -> str:
    """A long loop that checks for a cancel request every 20 ms (cooperative cancel)."""
    probe(context, key, "started")
    deadline = time.monotonic() + max_seconds
    while time.monotonic() < deadline:
        if context.cancel_requested:
            probe(context, key, "observed")
            context.check_cancel()  # raises JobCancelled
        time.sleep(0.02)
    probe(context, key, "finished")
    return "finished"


@task(name="flowlab.ignores_cancel", queue="flow", takes_context=True, lease=3)
def ignores_cancel(context: JobContext, key: str, seconds: float = 2.0) -> str:
    """Never checks for a cancel: sleeps, then returns a result that must be discarded."""
    probe(context, key, "started")
    time.sleep(seconds)
    probe(context, key, "returned")
    return "finished anyway"


@task(name="flowlab.fenced_after_cancel", queue="flow", takes_context=True, lease=3)
def fenced_after_cancel(context: JobContext, key: str, max_seconds: float = 20.0) -> str:
    """Waits until the job row says cancel requested, then tries to commit through fenced_atomic()."""
    from django_leasequeue.models import Job

    probe(context, key, "started")
    deadline = time.monotonic() + max_seconds
    while time.monotonic() < deadline and not Job.objects.filter(pk=context.job_id, cancel_requested=True).exists():
        time.sleep(0.02)
    with context.fenced_atomic():
        probe(context, key, "committed")  # must roll back: the cancel refuses the commit
    return "committed"


@task(name="flowlab.sleeper", queue="flow")
def sleeper(customer: str, seq: int, seconds: float = 0.1) -> int:
    """The keyless twin of :func:`customer_job` (a baseline for the keyed-limit run time)."""
    time.sleep(seconds)
    return seq


@task(name="flowlab.pause_probe", queue="flow", takes_context=True)
def pause_probe(context: JobContext, seconds: float = 0.01) -> None:
    """Record the handler's start, by this host's wall clock read on entry, then work ``seconds``.

    The start is stamped before any statement runs, so that a start just before a pause returned
    is not recorded as after it by the time its row is written (the pause test compares it with
    the wall clock of the test process, on the same host)."""
    from datetime import UTC, datetime

    started = datetime.fromtimestamp(time.time(), UTC)
    Probe.objects.create(key="pause", event="started", job_id=context.job_id, attempt=context.attempt, at=started)
    time.sleep(seconds)


@task(name="flowlab.seq_step", queue="flow", takes_context=True, sequence_key="acct-{account}", max_attempts=1)
def seq_step(context: JobContext, account: str, n: int, seconds: float = 0.02, fail_once: bool = False) -> int:
    """One step of an account's sequence: records ``start`` and ``end`` (database clock). With
    ``fail_once`` the first run of the job fails (``failed``) and a later run, after a replay, succeeds.
    A dead step halts the account's sequence (the default ``sequence_on_dead``)."""
    key = f"acct-{account}"
    probe(context, key, "start")
    time.sleep(seconds)
    if fail_once and not Probe.objects.filter(job_id=context.job_id, event="failed").exists():
        probe(context, key, "failed")
        raise RuntimeError(f"step {n} of {key} fails once")
    probe(context, key, "end")
    return n


@task(name="flowlab.seq_step_loose", queue="flow", takes_context=True, sequence_key="acct-{account}",
      sequence_on_dead="continue", max_attempts=1)
def seq_step_loose(context: JobContext, account: str, n: int, seconds: float = 0.02, fail: bool = False) -> int:
    """Like :func:`seq_step`, but a dead one lets its sequence continue; ``fail`` always fails."""
    key = f"acct-{account}"
    probe(context, key, "start")
    time.sleep(seconds)
    if fail:
        probe(context, key, "failed")
        raise RuntimeError(f"step {n} of {key} fails")
    probe(context, key, "end")
    return n


@task(name="flowlab.keyed_rate", queue="flow", rate_key="customer-{0}", rate_limit="5/s")
def keyed_rate(customer: str, seq: int) -> int:
    """At most 5 jobs of one customer are claimed per second, across all workers."""
    return seq


@task(name="flowlab.tenant_job", queue="flow", fair_key="{0}")
def tenant_job(tenant: str, seq: int, seconds: float = 0.0) -> int:
    """Work for one tenant (make its queue fair with ``QUEUES["flow"]["fair"] = True``)."""
    if seconds:
        time.sleep(seconds)
    return seq


@task(name="flowlab.fail_once", queue="flow", takes_context=True, max_attempts=2,
      backoff=Backoff(base=1.5, jitter=0))
def fail_once(context: JobContext, key: str) -> str:
    """Fail the first attempt (retried 1.5 s later, no jitter), succeed on the second."""
    probe(context, key, "run")
    if context.attempt == 1:
        raise RuntimeError("the first attempt fails")
    return "second time lucky"
