"""Building workflows: :class:`Workflow` (any dependency graph) and its shapes :func:`chain`,
:func:`group` and :func:`chord`.

Everything is validated before the first row is written: each step's task, arguments and options
(the checks of :func:`~django_leasequeue.enqueue`), step names, missing dependencies and cycles.
Building writes the workflow row, every step and every dependency edge in the caller's transaction
(one statement for the steps and edges), so a rollback leaves nothing and a worker sees nothing
before the commit.
"""

from __future__ import annotations

import dataclasses
import graphlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from django.db import transaction

from .. import store
from ..arguments import check_name
from ..conf import get_settings
from ..enqueueing import build_job, insert_steps
from ..exceptions import EnqueueError
from ..payload import check_arguments_bind, encode_payload, enqueue_signature, positional_names
from ..registry import resolve_task
from ..steps import DEPENDENCY_POLICIES, STEP_OPTIONS, Step
from .handle import WorkflowHandle

if TYPE_CHECKING:
    from ..models import Job

INLINE_RESULTS_MAX = 10_000
"""The most members whose results a chord callback gets in its arguments (``pass_result``).
Beyond it, build the chord with ``pass_result=False`` and read :meth:`WorkflowHandle.results`."""


def check_policy(value: Any, what: str) -> str:
    """Refuse anything but ``"hold"``, ``"cancel"`` or ``"run"``.

    Raises:
        EnqueueError: naming ``what`` and the value.
    """
    if value not in DEPENDENCY_POLICIES:
        raise EnqueueError(f"{what} must be one of {DEPENDENCY_POLICIES}, got {value!r}")
    return str(value)


def _as_step(value: Any, what: str) -> Step:
    if not isinstance(value, Step):
        raise EnqueueError(f"{what} must be a Step (my_task.step(...)), got {value!r}")
    return value


class _JobBuilder:
    """Builds the :class:`~django_leasequeue.store.NewJob` of each step. Steps of one task with the
    same options share the option checks (done once) and get their own argument checks, as
    ``enqueue_many()`` does, so that a 10,000-member group builds fast."""

    def __init__(self) -> None:
        self._templates: dict[tuple[str, tuple[tuple[str, Any], ...]], Any] = {}
        self._limit = get_settings().max_payload_bytes

    def build(self, step: Step, *, pass_result: bool, what: str) -> store.NewJob:
        unknown = sorted(set(step.options) - set(STEP_OPTIONS))
        if unknown:
            raise EnqueueError(f"{what}: unknown step options {unknown}; a step takes {list(STEP_OPTIONS)}")
        spec = resolve_task(step.task)
        if not isinstance(step.args, (list, tuple)):
            raise EnqueueError(f"{what}: args must be a list or tuple of arguments, got {step.args!r}")
        args, kwargs = list(step.args), dict(step.kwargs)
        try:
            # The handler gets the dependencies' results as its first argument: bind a stand-in.
            check_arguments_bind(spec, [None, *args] if pass_result else args, kwargs)
            if spec.concurrency_key or spec.sequence_key or spec.rate_key or spec.fair_key:
                job = build_job(spec, args, kwargs, check_signature=False, **step.options)
            else:
                key = (spec.name, tuple(sorted(step.options.items(), key=lambda kv: kv[0])))
                template = self._templates.get(key)
                if template is None:
                    template = build_job(spec, [], {}, check_signature=False, **step.options)
                    self._templates[key] = template
                args_json, kwargs_json = encode_payload(args, kwargs, limit=self._limit,
                                                        names=positional_names(enqueue_signature(spec)))
                job = dataclasses.replace(template, args_json=args_json, kwargs_json=kwargs_json)
        except EnqueueError as exc:
            raise type(exc)(f"{what}: {exc}") from None
        if job.unique_key is not None or job.unique_mode != "keep":
            raise EnqueueError(f"{what}: task {spec.name!r} has a unique_key; a workflow's steps take none "
                               "(give the workflow a unique_key to make building it idempotent)")
        return job


@dataclasses.dataclass
class _Node:
    name: str | None
    step: Step
    depends_on: list[str]
    depends_on_ids: list[int]


class Workflow:
    """A dependency graph of steps, with optional ``on_success`` / ``on_complete`` callbacks.

    Add steps with :meth:`add`, naming the steps (or existing jobs) each one waits for; build it
    with :meth:`enqueue`. A step starts when all its dependencies are done; its dependents are
    released by the database in the transaction that completes it.

    Args:
        name: a label for the admin and monitoring (at most 255 characters).
        unique_key: building again with the same key returns the existing workflow and writes
            nothing (``WorkflowHandle.created`` is False); at most 255 characters.
        on_dependency_dead: the default policy of the steps (``"hold"``: wait until the dead
            dependency is replayed and done; ``"cancel"``: cancel the step and, through theirs, its
            dependents; ``"run"``: run anyway, the failure passed in), and of ``on_success``.
        kind: the label of the shape (``"graph"``; :func:`chain`, :func:`group` and :func:`chord`
            set theirs).

    Raises:
        EnqueueError: a bad name, key or policy.
    """

    def __init__(self, name: str = "", *, unique_key: str | None = None, on_dependency_dead: str = "hold",
                 kind: str = "graph") -> None:
        if name:
            check_name(name, "workflow name", 255)
        if unique_key is not None:
            check_name(unique_key, "workflow unique_key", 255)
        self.name = name
        self.unique_key = unique_key
        self.on_dependency_dead = check_policy(on_dependency_dead, "on_dependency_dead")
        self.kind = kind
        self._nodes: list[_Node] = []
        self._names: set[str] = set()
        self._on_success: Step | None = None
        self._on_complete: Step | None = None
        self._pass_default = False

    def __len__(self) -> int:
        return len(self._nodes)

    def add(self, name: str | None, step: Step, *, depends_on: Iterable[str | int | Job] = ()) -> str | None:
        """Add a step.

        Args:
            name: the step's name, unique in this workflow (its dependents name it, its result is
                passed under it); None for an anonymous member (groups), which nothing can depend on.
            step: ``my_task.step(*args, **kwargs)``, optionally ``.set(...)``.
            depends_on: step names of this workflow (added before or after this one), existing job
                ids, or :class:`~django_leasequeue.models.Job` objects.

        Returns:
            ``name``.

        Raises:
            EnqueueError: the name is taken or invalid, or a dependency is neither a name nor a job.
        """
        _as_step(step, f"step {name!r}")
        if name is not None:
            check_name(name, "step name", 255)
            if name in self._names:
                raise EnqueueError(f"step name {name!r} is used twice in this workflow")
            self._names.add(name)
        names: list[str] = []
        ids: list[int] = []
        for dep in depends_on:
            if isinstance(dep, str):
                names.append(dep)
            elif isinstance(dep, int) and not isinstance(dep, bool):
                ids.append(dep)
            elif hasattr(dep, "pk") and isinstance(dep.pk, int):
                ids.append(dep.pk)
            else:
                raise EnqueueError(f"step {name!r}: depends_on takes step names, job ids or Job objects, got {dep!r}")
        if len(set(names)) != len(names) or len(set(ids)) != len(ids):
            raise EnqueueError(f"step {name!r} names a dependency twice: {names + [str(i) for i in ids]}")
        self._nodes.append(_Node(name, step, names, ids))
        return name

    def on_success(self, step: Step) -> Workflow:
        """Run ``step`` once, when every member is done (a dead member holds it until it is
        replayed and done; with the workflow policy ``"cancel"`` it is cancelled instead, with
        ``"run"`` it runs anyway). Returns this workflow."""
        self._on_success = _as_step(step, "on_success")
        return self

    def on_complete(self, step: Step) -> Workflow:
        """Run ``step`` once, when every member has finished: done, dead or cancelled. Returns
        this workflow."""
        self._on_complete = _as_step(step, "on_complete")
        return self

    def _check_graph(self) -> None:
        if not self._nodes:
            raise EnqueueError(f"a {self.kind} needs at least one step")
        graph: dict[str, list[str]] = {}
        for node in self._nodes:
            for dep in node.depends_on:
                if dep not in self._names:
                    raise EnqueueError(f"step {node.name!r} depends on {dep!r}, which is not a step of this "
                                       f"workflow (its steps: {sorted(self._names)})")
                if dep == node.name:
                    raise EnqueueError(f"step {node.name!r} depends on itself")
            if node.name is not None:
                graph[node.name] = node.depends_on
        try:
            graphlib.TopologicalSorter(graph).prepare()
        except graphlib.CycleError as exc:
            cycle = exc.args[1]
            raise EnqueueError(f"the workflow has a cycle: {' -> '.join(reversed(cycle))}") from None

    def _build_steps(self) -> list[store.NewStep]:
        self._check_graph()
        builder = _JobBuilder()
        steps: list[store.NewStep] = []
        for node in self._nodes:
            policy = check_policy(node.step.on_dependency_dead or self.on_dependency_dead,
                                  f"step {node.name!r}: on_dependency_dead")
            has_deps = bool(node.depends_on or node.depends_on_ids)
            pass_result = has_deps and (self._pass_default if node.step.pass_result is None else node.step.pass_result)
            what = f"step {node.name!r}" if node.name is not None else f"member {len(steps) + 1}"
            job = builder.build(node.step, pass_result=pass_result, what=what)
            steps.append(store.NewStep(job, role="member", step=node.name, depends_on=tuple(node.depends_on),
                                       depends_on_ids=tuple(node.depends_on_ids), pass_result=pass_result,
                                       on_dependency_dead=policy))
        for role, callback in (("on_success", self._on_success), ("on_complete", self._on_complete)):
            if callback is None:
                continue
            pass_result = self._callback_passes(callback)
            if pass_result and len(self._nodes) > INLINE_RESULTS_MAX:
                raise EnqueueError(
                    f"{role}: {len(self._nodes)} members are too many results to pass in the callback's "
                    f"arguments (at most {INLINE_RESULTS_MAX}); use .set(pass_result=False) and read "
                    "WorkflowHandle(ctx workflow).results() in the callback")
            job = builder.build(callback, pass_result=pass_result, what=role)
            steps.append(store.NewStep(job, role=role, pass_result=pass_result))
        return steps

    def _callback_passes(self, callback: Step) -> bool:
        return bool(callback.pass_result) if callback.pass_result is not None else self.kind == "chord"

    def enqueue(self) -> WorkflowHandle:
        """Build the workflow in the caller's transaction.

        Returns:
            Its :class:`WorkflowHandle`; with a ``unique_key`` already taken, the existing
            workflow's (``created`` False; nothing is written).

        Raises:
            EnqueueError: a step or the graph is invalid (cycle, missing dependency, duplicate
                name), or a ``depends_on`` job does not exist; also its subclasses
                ArgumentsMismatch, PayloadNotSerializable and PayloadTooLarge. Nothing is written.
            UnknownTask: a step names a task nobody registered.
        """
        steps = self._build_steps()
        alias = store.db_alias()
        members = sum(1 for s in steps if s.role == "member")
        with transaction.atomic(using=alias):
            workflow_id = store.workflow_create(kind=self.kind, name=self.name, unique_key=self.unique_key,
                                                on_dependency_dead=self.on_dependency_dead, closed=True,
                                                members=members, alias=alias)
            if workflow_id is None:
                existing = store.workflow_get_by_unique_key(self.unique_key or "", alias=alias)
                if existing is None:
                    raise EnqueueError(f"workflow unique_key {self.unique_key!r} kept changing hands; try again")
                return WorkflowHandle(existing.id, created=False, alias=alias)
            ids = insert_steps(workflow_id, steps, alias=alias)
            by_role = {s.role: i for s, i in zip(steps, ids, strict=True) if s.role != "member"}
            if by_role:
                store.workflow_set_callbacks(workflow_id, on_success=by_role.get("on_success"),
                                             on_complete=by_role.get("on_complete"), alias=alias)
        return WorkflowHandle(workflow_id, alias=alias)

    def enqueue_on_commit(self) -> None:
        """Build the workflow when the current transaction commits (``transaction.on_commit``).

        Everything is validated now, so a bad step raises here. Outside a transaction the workflow
        is built at once.

        Raises:
            EnqueueError: as :meth:`enqueue`, for the checks that need no database.
        """
        self._build_steps()
        transaction.on_commit(self.enqueue, using=store.db_alias(), robust=False)


def chain(*steps: Step, name: str = "", unique_key: str | None = None, on_dependency_dead: str = "hold") -> Workflow:
    """Steps that run one after another, each receiving the previous one's return value as its
    first argument (``step.set(pass_result=False)`` for one that does not: Celery's ``.si()``).

    The steps are named ``"1"``, ``"2"``, ... If a step is dead-lettered the rest wait (policy
    ``"hold"``), and replaying it resumes the chain from there.

    Args:
        steps: at least one :class:`~django_leasequeue.steps.Step`.
        name: a label (at most 255 characters), as for :class:`Workflow`.
        unique_key: makes building idempotent, as for :class:`Workflow`.
        on_dependency_dead: ``"hold"``, ``"cancel"`` or ``"run"``, as for :class:`Workflow`.

    Returns:
        The :class:`Workflow`; call ``.enqueue()`` to build it.

    Raises:
        EnqueueError: no step, or a value that is not a Step.
    """
    workflow = Workflow(name, unique_key=unique_key, on_dependency_dead=on_dependency_dead, kind="chain")
    workflow._pass_default = True
    previous: str | None = None
    for index, step in enumerate(steps, 1):
        previous = workflow.add(str(index), _as_step(step, f"chain step {index}"),
                                depends_on=[previous] if previous is not None else [])
    return workflow


def group(*steps: Step | Iterable[Step], name: str = "", unique_key: str | None = None) -> Workflow:
    """Steps that run in parallel, with one handle for their combined state and their results in
    order (:meth:`WorkflowHandle.results`).

    Args:
        steps: :class:`~django_leasequeue.steps.Step` objects, or one iterable of them.
        name: a label (at most 255 characters), as for :class:`Workflow`.
        unique_key: makes building idempotent, as for :class:`Workflow`.

    Returns:
        The :class:`Workflow`; call ``.enqueue()`` to build it.
    """
    workflow = Workflow(name, unique_key=unique_key, kind="group")
    for index, step in enumerate(_flatten(steps), 1):
        workflow.add(None, _as_step(step, f"group member {index}"))
    return workflow


def chord(members: Workflow | Sequence[Step] | Iterable[Step], callback: Step, *, policy: str = "all_succeeded",
          name: str = "", unique_key: str | None = None) -> Workflow:
    """A group plus a callback that runs exactly once when the members are finished.

    Args:
        members: a :func:`group` or the member steps.
        callback: the step to run; it gets the list of member results (in member order) as its
            first argument, unless ``callback.set(pass_result=False)``.
        policy: ``"all_succeeded"`` (the callback runs when every member is done; a dead member
            holds it until replayed and done) or ``"all_finished"`` (it runs once every member is
            done, dead or cancelled; failed members' results are None).
        name: a label (at most 255 characters), as for :class:`Workflow`.
        unique_key: makes building idempotent, as for :class:`Workflow`.

    Returns:
        The :class:`Workflow`; call ``.enqueue()`` to build it.

    Raises:
        EnqueueError: an unknown policy, or a member that is not a Step.
    """
    if policy not in ("all_succeeded", "all_finished"):
        raise EnqueueError(f"chord policy must be 'all_succeeded' or 'all_finished', got {policy!r}")
    source = [node.step for node in members._nodes] if isinstance(members, Workflow) else list(_flatten([members]))
    workflow = Workflow(name or (members.name if isinstance(members, Workflow) else ""), unique_key=unique_key,
                        kind="chord")
    for index, step in enumerate(source, 1):
        workflow.add(None, _as_step(step, f"chord member {index}"))
    if policy == "all_succeeded":
        workflow.on_success(_as_step(callback, "chord callback"))
    else:
        workflow.on_complete(_as_step(callback, "chord callback"))
    return workflow


def _flatten(items: Iterable[Any]) -> Iterable[Any]:
    for item in items:
        if isinstance(item, Step) or isinstance(item, (str, bytes)) or not isinstance(item, Iterable):
            yield item
        else:
            yield from item
