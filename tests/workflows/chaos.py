"""The books of the workflow chaos tests (support code, not tests): the harness's ledger for the
workflow tasks of ``testproject/qa/wf_chaos_tasks.py``, plus the re-runs each fault allows and the
callback executions."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from qa.models import LedgerEntry

from django_leasequeue.models import Job
from tests.support.chaos.harness import Ledger, ledger, read_runs

FENCED = "qa.wf_fenced"


def books(ids: list[int], *, deaths: dict[int, datetime] | None = None) -> Ledger:
    """:func:`harness.ledger` over ``ids`` with ``fenced_done`` counted for ``qa.wf_fenced`` and
    for the ``qa.wf_barrier`` members run with ``fenced=True`` (the harness counts ``qa.chaos``),
    so that :func:`assert_books` can check one effect per done fenced job."""
    result = ledger(ids, deaths=deaths)
    done = Job.objects.filter(id__in=ids, status="done")
    result.fenced_done = (done.filter(task=FENCED).count()
                          + done.filter(task="qa.wf_barrier", kwargs__fenced=True).count())
    return result


def assert_books(result: Ledger) -> None:
    """Jobs in = out (every row there, every one finished and done), one effect per done fenced job
    under its final token, none under a refused token."""
    assert result.jobs == result.enqueued, result
    assert result.lost == 0, result
    assert result.statuses == {"done": result.enqueued}, result
    assert result.effects == result.fenced_done, result
    assert result.duplicate_effects == 0, result
    assert result.effects_under_refused == 0, result


def unexplained_reruns(ids: list[int], deaths: dict[int, datetime]) -> list[str]:
    """Re-runs of returned jobs that no kill explains: a job may run again after its handler
    returned only when the process that ran that returned execution was killed (its completion,
    batched or fenced, died with it). Returns a description of each other re-run."""
    by_job = defaultdict(list)
    for run in read_runs(ids):
        by_job[run.job_id].append(run)
    bad = []
    for job_id, runs in by_job.items():
        returned = [r for r in runs if r.outcome == "returned"]
        if not returned:
            continue
        first = min(returned, key=lambda r: r.token)
        later = [r for r in runs if r.token > first.token]
        if later and first.pid not in deaths:
            bad.append(f"job {job_id} returned under token {first.token} in live pid {first.pid}, ran again "
                       f"under {sorted(r.token for r in later)}")
    return bad


def callback_executions(job_ids: list[int]) -> dict[int, int]:
    """``{callback job id: handler executions}`` from the execution ledger (0 for none)."""
    counts = dict.fromkeys(job_ids, 0)
    for job_id in LedgerEntry.objects.filter(job_id__in=job_ids).values_list("job_id", flat=True):
        counts[job_id] += 1
    return counts
