"""The fenced effect of the chaos workloads (``qa.chaos``, ``qa.wf_fenced``): one ``Effect`` row
keyed by job id and token, committed inside ``fenced_atomic()`` together with the job's completion.
A refused commit (stale token) leaves a ``Probe(kind="fenced", ok=False)`` row, so the ledger can
check that no effect exists for that token."""

from __future__ import annotations

from typing import Any

from django_leasequeue import JobContext, LeaseLost

from .models import Effect, Probe


def commit_fenced_effect(context: JobContext, result: Any = None) -> None:
    """Commit this attempt's ``Effect`` and the job's completion in one fenced transaction, with
    ``result`` as the job's result when it is not None (``fence.set_result``: dependents released
    by that commit receive it).

    Raises:
        LeaseLost: the token is stale (the ``Probe`` row is written first).
    """
    try:
        with context.fenced_atomic() as fence:
            Effect.objects.create(key=f"job-{context.job_id}", job_id=context.job_id,
                                  lease_version=context.lease_version)
            if result is not None:
                fence.set_result(result)
    except LeaseLost:
        Probe.objects.create(job_id=context.job_id, lease_version=context.lease_version, kind="fenced", ok=False)
        raise
