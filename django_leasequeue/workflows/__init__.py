"""Workflows and batches: chains, groups, chords, batches and dependency graphs of jobs.

Dependencies are resolved by the database, in the transaction that finishes a job (the settle
trigger of migration 0011): a dependent is released, a batch's counters move and a fan-in callback
is released exactly once, whoever finishes last and whatever dies. Nothing polls.

* :mod:`~django_leasequeue.workflows.build`: :class:`Workflow`, :func:`chain`, :func:`group`,
  :func:`chord`; validation before anything is written.
* :mod:`~django_leasequeue.workflows.batch`: :class:`Batch`, members added over several
  transactions, then closed.
* :mod:`~django_leasequeue.workflows.handle`: :class:`WorkflowHandle`, the state, counts,
  results and cancel-the-rest of a built workflow.
"""

from __future__ import annotations

from .batch import Batch, BatchHandle
from .build import INLINE_RESULTS_MAX, Workflow, chain, chord, group
from .handle import WorkflowHandle

__all__ = ["INLINE_RESULTS_MAX", "Batch", "BatchHandle", "Workflow", "WorkflowHandle", "chain", "chord", "group"]
