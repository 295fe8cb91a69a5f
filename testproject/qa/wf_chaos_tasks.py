"""Workflow chaos tasks (tests/workflows/test_chaos_*.py): members and chain steps on both
completion paths (a returned value, and ``fenced_atomic()``), a fan-in callback, and a member that
waits at a filesystem barrier so the last two members of a chord return at the same moment.

Every handler writes a ``qa.LedgerEntry`` row per start (``qa.ledger``), so the tests count
handler executions, re-runs of returned jobs and callback executions exactly.
"""

import os
import time
from pathlib import Path

from django_leasequeue import Backoff, JobContext, task

from . import ledger
from .effects import commit_fenced_effect

RETRY = Backoff(base=0.05, factor=2, max=0.5)


@task(name="qa.wf_plain", takes_context=True, max_attempts=25, backoff=RETRY)
def wf_plain(context: JobContext, *values: int, work: float = 0.0) -> int:
    """Return ``sum(values)`` (a chain step gets the previous step's result prepended, so a chain
    of ``step(1)`` steps returns 1, 2, 3, ...), completed by the default completion path. ``work``:
    seconds to sleep first."""
    with ledger.execution(context, "qa.wf_plain"):
        if work:
            time.sleep(work)
        return sum(values)


@task(name="qa.wf_fenced", takes_context=True, max_attempts=25, backoff=RETRY)
def wf_fenced(context: JobContext, *values: int, work: float = 0.0) -> int:
    """Like :func:`wf_plain`, but commit one ``Effect`` (keyed by job id and token) inside
    ``fenced_atomic()`` together with the job's completion and its result (``fence.set_result``);
    a refused commit leaves a ``Probe(kind="fenced", ok=False)``, as ``qa.chaos`` does."""
    with ledger.execution(context, "qa.wf_fenced"):
        if work:
            time.sleep(work)
        commit_fenced_effect(context, result=sum(values))
        return sum(values)


@task(name="qa.wf_chaos_callback", takes_context=True, max_attempts=25, backoff=RETRY)
def wf_callback(context: JobContext, results: list[int], *values: int) -> dict[str, int]:
    """A fan-in callback: the members' results (list, in member order); returns their count and
    sum. Each run is a ledger row of task ``qa.wf_callback``: the callback executions."""
    with ledger.execution(context, "qa.wf_callback"):
        return {"members": len(results), "sum": sum(r or 0 for r in results)}


@task(name="qa.wf_barrier", takes_context=True, max_attempts=5, backoff=RETRY)
def wf_barrier(context: JobContext, directory: str, chord: int, parties: int = 2, timeout: float = 20.0,
               fenced: bool = False) -> int:
    """Arrive at the barrier ``<directory>/<chord>``: create a file named after this job, then wait
    (polling every millisecond) until ``parties`` files are there and return ``chord``, so the
    members of one chord, run by different workers, return at the same moment. A barrier not met
    within ``timeout`` seconds leaves a ``missed-<job>`` file (the test asserts there is none).
    ``fenced``: complete inside ``fenced_atomic()`` (an ``Effect`` and the result ``chord``)
    instead of by the returned value."""
    with ledger.execution(context, "qa.wf_barrier"):
        gate = Path(directory) / str(chord)
        gate.mkdir(parents=True, exist_ok=True)
        (gate / f"{context.job_id}-{context.lease_version}").touch()
        deadline = time.monotonic() + timeout
        while len([p for p in os.listdir(gate) if not p.startswith("missed")]) < parties:
            if time.monotonic() > deadline:
                (gate / f"missed-{context.job_id}").touch()
                break
            time.sleep(0.001)
        if fenced:
            commit_fenced_effect(context, result=chord)
        return chord
