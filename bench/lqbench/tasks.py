"""Tasks measured by the benchmark.

``noop`` is the drain job (it does nothing, so the figure is the queue's own cost per job).
``lat`` records its start time next to the enqueue time it was given (enqueue-to-start latency).
``sleep`` is the long job of the heartbeat (HOT) measurement. ``harness_noop``/``harness_lat`` are
the same jobs for the peers harness (``../shared/bench/peers``), which reads its own recorder files;
its ``recorder`` module is on ``PYTHONPATH`` only in processes the harness starts.
"""

import os
import time

from django_leasequeue import task

_fd: int | None = None


def stamp(t_enq: float) -> None:
    """Append ``"<start unix time> <enqueue unix time>"`` to ``$LQBENCH_STAMPS/<pid>.txt``.

    One ``os.write`` of about 40 bytes: microseconds, far below a database round trip.
    """
    global _fd
    now = time.time()
    if _fd is None:
        path = os.path.join(os.environ["LQBENCH_STAMPS"], f"{os.getpid()}.txt")
        _fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_fd, f"{now:.6f} {t_enq:.6f}\n".encode())


@task(name="bench.noop")
def noop() -> None:
    """Do nothing."""


@task(name="bench.lat")
def lat(t_enq: float) -> None:
    """Record the start time of this job and the time it was enqueued (unix seconds)."""
    stamp(t_enq)


@task(name="bench.sleep")
def sleep(seconds: float) -> None:
    """Sleep ``seconds`` (a long job: its lease is renewed by heartbeats meanwhile)."""
    time.sleep(seconds)


@task(name="bench.harness_noop")
def harness_noop() -> None:
    """The peers harness's no-op job: one line in the harness's recorder file."""
    from recorder import record

    record("d")


@task(name="bench.harness_lat")
def harness_lat(t_enq: float) -> None:
    """The peers harness's latency job."""
    from recorder import record

    record("l", t_enq)


# The flow section's drains (bench/run.py --only flow): the same no-op with a per-job key. The
# limits never bind, so each drain measures the cost of the check, not of waiting.
@task(name="bench.flow_rate_key", rate_key=lambda i: f"r{i % 1000}", rate_limit="100000/s")
def flow_rate_key(i: int) -> None:
    """No-op with one of 1,000 rate keys, 100,000 per second each."""


@task(name="bench.flow_fair", fair_key=lambda i: f"t{i % 1000:04d}")
def flow_fair(i: int) -> None:
    """No-op with one of 1,000 fair keys (the queue is fair when ``LQBENCH_FAIR=1``)."""


@task(name="bench.flow_conc", concurrency_key=lambda i: f"k{i % 100}", concurrency_limit=5)
def flow_conc(i: int) -> None:
    """No-op with one of 100 concurrency keys, at most 5 leased each."""


@task(name="bench.flow_seq", sequence_key=lambda i: f"s{i % 1000}")
def flow_seq(i: int) -> None:
    """No-op in one of 1,000 sequences (keys round-robin over the job numbers, so every claim finds
    heads of many keys; at most one job per key runs at a time)."""


@task(name="bench.flow_plain")
def flow_plain(i: int) -> None:
    """The flow section's reference: the same no-op and argument, no key."""


@task(name="bench.wf_member")
def wf_member(i: int) -> None:
    """A workflow member that does nothing (the workflows section's drain job)."""


@task(name="bench.wf_callback")
def wf_callback() -> None:
    """A batch's on_success callback that does nothing (the bench counts its job rows and attempts)."""


@task(name="bench.wf_step")
def wf_step(previous: int | None = None) -> int:
    """A chain step: return the previous step's result plus one (chain passes it in)."""
    return (previous or 0) + 1


@task(name="bench.asleep")
async def asleep(seconds: float) -> None:
    """Wait ``seconds`` on the event loop (the async handlers row: ``bench/async_bench.py``)."""
    import asyncio

    await asyncio.sleep(seconds)
