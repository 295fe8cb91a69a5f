"""The handle of a workflow or batch: its state, counts, results, steps, and cancel-the-rest."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models import Q

from .. import store

if TYPE_CHECKING:
    from django.db.models import QuerySet

    from ..models import Job, Workflow

PENDING = ("waiting", "ready", "leased")


class WorkflowHandle:
    """A built workflow, batch, chain, group or chord, read from the database on each call.

    Attributes:
        id (int): the workflow's id (``Workflow`` row, the admin's workflow page).
        created (bool): False when building found its ``unique_key`` taken and returned the
            existing workflow (nothing was written).
    """

    def __init__(self, workflow_id: int, *, created: bool = True, alias: str | None = None) -> None:
        self.id = workflow_id
        self.created = created
        self.alias = alias or store.db_alias()

    def __repr__(self) -> str:
        return f"<WorkflowHandle #{self.id}>"

    @classmethod
    def get(cls, workflow_id: int) -> WorkflowHandle:
        """The handle of an existing workflow.

        Raises:
            LookupError: no workflow has this id.
        """
        from ..models import Workflow

        if not Workflow.objects.using(store.db_alias()).filter(id=workflow_id).exists():
            raise LookupError(f"no workflow #{workflow_id}")
        return cls(workflow_id, created=False)

    def row(self) -> Workflow:
        """The :class:`~django_leasequeue.models.Workflow` row as it is now (counters, times)."""
        from ..models import Workflow

        return Workflow.objects.using(self.alias).get(id=self.id)

    def jobs(self) -> QuerySet[Job]:
        """Every job of the workflow (members and callbacks), in id order."""
        from ..models import Job

        return Job.objects.using(self.alias).filter(workflow_id=self.id).order_by("id")

    def members(self) -> QuerySet[Job]:
        """The member jobs (not the callbacks), in the order they were added."""
        return self.jobs().filter(workflow_role="member")

    def steps(self) -> dict[str, Job]:
        """The named steps (chain, graph) by step name, in the order they were added."""
        return {job.workflow_step: job for job in self.members().exclude(workflow_step=None)
                if job.workflow_step is not None}

    def counts(self) -> dict[str, int]:
        """The members by job status: ``waiting``, ``ready``, ``leased``, ``done``, ``dead``,
        ``cancelled`` (every key present)."""
        return store.workflow_counts(self.id, alias=self.alias)

    def results(self) -> list[Any]:
        """The members' return values in member order (None for a member that is not done).

        A group's results are in the order its steps were given; a batch's in the order they were
        added. Reads at most 10,000 per query, in pages.
        """
        results: list[Any] = []
        after = 0
        while True:
            page = store.workflow_results(self.id, after=after, limit=10_000, alias=self.alias)
            results.extend(result for _, result in page)
            if len(page) < 10_000:
                return results
            after = page[-1][0]

    def callbacks(self) -> dict[str, Job]:
        """The callback jobs by role (``"on_success"``, ``"on_complete"``); absent roles are left out."""
        return {job.workflow_role: job for job in self.jobs().exclude(workflow_role="member")
                if job.workflow_role is not None}

    def blocked_by(self) -> list[Job]:
        """The dead or cancelled jobs that hold back a waiting job of this workflow (replay them
        to resume), in id order."""
        return self._blocked_by(self.row())

    def _blocked_by(self, row: Workflow) -> list[Job]:
        from ..models import Job

        waiting = self.jobs().filter(status="waiting").values("id")
        holding = Q(dependent_edges__job__in=waiting, dependent_edges__resolved=False)
        if row.on_success_id is not None and row.members_pending == 0 and self.jobs().filter(
                id=row.on_success_id, status="waiting").exists():
            # The on_success callback waits on the counters, not on edges: a failed member holds it.
            holding |= Q(workflow_id=self.id, workflow_role="member")
        return list(Job.objects.using(self.alias).filter(holding, status__in=("dead", "cancelled"))
                    .distinct().order_by("id"))

    def _callback_failed(self, row: Workflow) -> bool:
        ids = [i for i in (row.on_success_id, row.on_complete_id) if i is not None]
        return bool(ids) and self.jobs().filter(id__in=ids, status__in=("dead", "cancelled")).exists()

    @property
    def state(self) -> str:
        """One word for the whole workflow:

        ``"open"`` (a batch not closed yet), ``"running"`` (something is pending and nothing holds
        it back), ``"blocked"`` (a dead or cancelled job holds back a waiting one: see
        :meth:`blocked_by`), ``"succeeded"`` (finished, every member done and no callback dead or
        cancelled), ``"finished"`` (finished with dead or cancelled members, or a callback that
        ended dead or cancelled: see :meth:`callbacks`), ``"cancelled"`` (finished, every member
        cancelled).
        """
        row = self.row()
        if row.closed_at is None:
            return "open"
        if row.finished_at is not None:
            if row.members_done == row.members and not self._callback_failed(row):
                return "succeeded"
            if row.members and row.members_cancelled == row.members:
                return "cancelled"
            return "finished"
        if self._blocked_by(row):
            return "blocked"
        return "running"

    def cancel(self, *, by: str = "") -> store.CancelCounts:
        """Cancel the rest: every waiting or ready job of the workflow (members and callbacks) is
        cancelled now, every leased one is asked to stop (it ends cancelled at its worker's next
        write). Finished jobs are left as they are. An open batch is closed first, so that no
        member can be added after the cancel.

        Args:
            by: who cancelled (recorded in each job's history).

        Returns:
            :class:`~django_leasequeue.store.CancelCounts`.
        """
        with transaction.atomic(using=self.alias):
            # Closed before the jobs are read: a member added meanwhile is either in the list or
            # refused. Closed without settling: the callbacks are cancelled next, unreleased.
            store.workflow_close(self.id, channel=None, settle=False, alias=self.alias)
            ids = list(self.jobs().filter(status__in=PENDING).values_list("id", flat=True))
            return store.job_request_cancel(ids, by=by or f"workflow #{self.id} cancelled", alias=self.alias)

    def is_finished(self) -> bool:
        """True when the workflow is closed, no member is pending and no callback is pending."""
        return self.row().finished_at is not None
