"""Batches: a fan-in whose members are added over several transactions, then closed.

A batch's callbacks wait for the close: a batch whose first members finish before the last ones
are added does not fire early. ``on_complete`` runs once when the closed batch has no pending
member; ``on_success`` once every member is done.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django.db import transaction

from .. import store
from ..arguments import check_name
from ..conf import get_settings
from ..dependents import insert_members, insert_steps
from ..enqueueing import split_arg_item
from ..exceptions import EnqueueError
from ..steps import Step
from .build import INLINE_RESULTS_MAX, _as_step, _gc_paused, _JobBuilder, check_policy
from .handle import WorkflowHandle


class BatchHandle(WorkflowHandle):
    """The handle of a batch: a :class:`WorkflowHandle` that can also add members and close."""

    def add(self, *steps: Step) -> list[int]:
        """Add member steps, in the caller's transaction.

        Args:
            steps: :class:`~django_leasequeue.steps.Step` objects (no dependencies: members of a
                batch run as soon as they are due).

        Returns:
            The new job ids, in order.

        Raises:
            EnqueueError: the batch is closed (nothing is written), or a step is invalid.
        """
        chunks = _JobBuilder().members(
            [_as_step(step, f"batch member {n}") for n, step in enumerate(steps, 1)],
            label=lambda n: f"batch member {n + 1}")
        count = sum(chunk.count for chunk in chunks)
        if not count:
            return []
        with transaction.atomic(using=self.alias):
            outcome = store.workflow_add_members(self.id, count, max_passed=INLINE_RESULTS_MAX, alias=self.alias)
            if outcome == "closed":
                raise EnqueueError(f"batch #{self.id} is closed (or does not exist): open a new batch")
            if outcome == "too_many":
                raise EnqueueError(
                    f"batch #{self.id}: a callback takes the members' results, and a batch passes at most "
                    f"{INLINE_RESULTS_MAX} of them in its arguments; open it with a callback built with "
                    ".set(pass_result=False) and read WorkflowHandle(ctx.workflow_id()).results() in it")
            ids: list[int] = []
            for chunk in chunks:
                ids.extend(insert_members(self.id, chunk, alias=self.alias))
        return ids

    def add_many(self, task: Any, arg_list: Iterable[Sequence[Any] | tuple[Sequence[Any], Mapping[str, Any]]],
                 **options: Any) -> list[int]:
        """Add one member per item of ``arg_list``, like :func:`~django_leasequeue.enqueue_many`.

        Args:
            task: a task or a registered task name.
            arg_list: each item a list of positional arguments, or ``(args, kwargs)``.
            options: step options (``queue``, ``priority``, ``run_at``, ``max_attempts``).

        Returns:
            The new job ids, in order.

        Raises:
            EnqueueError: an item's positional arguments are a str or not a list (as
                ``enqueue_many()``), the batch is closed, or a step is invalid.
        """
        shared = dict(options)  # one mapping for every member: a step never changes it
        with _gc_paused():
            steps = [Step(task, tuple(args), kwargs, shared) for args, kwargs in map(split_arg_item, arg_list)]
        return self.add(*steps)

    def close(self) -> bool:
        """Close the batch: no member can be added any more, and its callbacks run once no member
        is pending (at once, when none is).

        Returns:
            True when this call closed it; False when it was closed already.
        """
        settings = get_settings()
        return store.workflow_close(self.id, channel=settings.notify_channel if settings.notify else None,
                                    alias=self.alias)


class Batch:
    """Opens batches (:meth:`open`); a batch is then used through its :class:`BatchHandle`."""

    @staticmethod
    def open(name: str = "", *, on_success: Step | None = None, on_complete: Step | None = None,
             unique_key: str | None = None, on_dependency_dead: str = "hold") -> BatchHandle:
        """Create an open batch, in the caller's transaction.

        Args:
            name: a label (at most 255 characters).
            on_success: a step to run once every member is done.
            on_complete: a step to run once every member has finished (done, dead or cancelled).
            unique_key: opening again with the same key returns the existing batch (``created``
                False, nothing written).
            on_dependency_dead: ``"hold"`` (default: ``on_success`` waits for dead members to be
                replayed and done), ``"cancel"`` (it is cancelled) or ``"run"`` (it runs anyway).

        Returns:
            Its :class:`BatchHandle`.

        Raises:
            EnqueueError: a bad name, key, policy or callback step (nothing is written).
        """
        if name:
            check_name(name, "batch name", 255)
        if unique_key is not None:
            check_name(unique_key, "batch unique_key", 255)
        policy = check_policy(on_dependency_dead, "on_dependency_dead")
        builder = _JobBuilder()
        callbacks = [store.NewStep(builder.build(_as_step(step, role), pass_result=bool(step.pass_result), what=role),
                                   role=role, pass_result=bool(step.pass_result))
                     for role, step in (("on_success", on_success), ("on_complete", on_complete))
                     if step is not None]
        alias = store.db_alias()
        with transaction.atomic(using=alias):
            workflow_id = store.workflow_create(kind="batch", name=name, unique_key=unique_key,
                                                on_dependency_dead=policy, closed=False, members=0, alias=alias)
            if workflow_id is None:
                existing = store.workflow_get_by_unique_key(unique_key or "", alias=alias)
                if existing is None:
                    raise EnqueueError(f"batch unique_key {unique_key!r} kept changing hands; try again")
                return BatchHandle(existing.id, created=False, alias=alias)
            ids = insert_steps(workflow_id, callbacks, alias=alias)
            roles = {s.role: i for s, i in zip(callbacks, ids, strict=True)}
            if roles:
                store.workflow_set_callbacks(workflow_id, on_success=roles.get("on_success"),
                                             on_complete=roles.get("on_complete"), alias=alias)
        return BatchHandle(workflow_id, alias=alias)

    @staticmethod
    def get(batch_id: int) -> BatchHandle:
        """The handle of an existing batch.

        Raises:
            LookupError: no batch has this id.
        """
        from ..models import Workflow

        if not Workflow.objects.using(store.db_alias()).filter(id=batch_id, kind="batch").exists():
            raise LookupError(f"no batch #{batch_id}")
        return BatchHandle(batch_id, created=False)
