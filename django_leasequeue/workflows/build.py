"""Building workflows: :class:`Workflow` (any dependency graph) and its shapes :func:`chain`,
:func:`group` and :func:`chord`.

Everything is validated before the first row is written: each step's task, arguments and options
(the checks of :func:`~django_leasequeue.enqueue`), step names, missing dependencies and cycles.
Building writes the workflow row, every step and every dependency edge in the caller's transaction
(one statement for the steps and edges), so a rollback leaves nothing and a worker sees nothing
before the commit. Members that depend on nothing (a group's, a chord's, a batch's) take the path
of ``enqueue_many()``: options checked once per task and option set, the signature once per call
shape, each member's values one by one, all arguments encoded at once and inserted by one
statement without edges (:meth:`_JobBuilder.members`, ``store.workflow_insert_members``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import graphlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.db import transaction

from .. import store
from ..arguments import check_name
from ..conf import get_settings
from ..dependents import check_job_database, insert_members, insert_steps
from ..enqueueing import build_job
from ..exceptions import EnqueueError
from ..payload import (
    MAX_CHUNK_CHARS,
    check_arguments_bind,
    check_payload,
    encode_payload,
    enqueue_signature,
    positional_names,
)
from ..registry import TaskSpec, resolve_task
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
        hint = (" (a group inside a chain: build a Workflow and use Workflow.add(..., depends_on=[...]))"
                if isinstance(value, Workflow) else "")
        raise EnqueueError(f"{what} must be a Step (my_task.step(...)), got {value!r}{hint}")
    return value


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Hold the cyclic garbage collector while a bulk build allocates: tens of thousands of new
    objects (steps, their argument lists) set off collections that walk every live object, which
    took about half of a 10,000-member build. Nothing built here holds a cycle; the collector is
    switched back on (when it was on) at the end, whatever happens."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class _JobBuilder:
    """Builds the jobs of steps, checking each step as :func:`~django_leasequeue.enqueue` would,
    at the cost of ``enqueue_many()``: the options of one task and option set are checked once
    (a template job), the signature once per call shape (the number of positional arguments and
    the keyword names: binding never looks at the values), and each step's argument values one by
    one. :meth:`members` then encodes all the arguments at once, for one INSERT."""

    def __init__(self) -> None:
        self._templates: dict[tuple[Any, ...], store.NewJob] = {}
        self._bound: set[tuple[Any, ...]] = set()
        self._names: dict[str, list[str]] = {}
        self._limit = get_settings().max_payload_bytes

    def _check(self, step: Step, pass_result: bool,
               memo: dict[tuple[int, int], tuple[TaskSpec[..., Any], store.NewJob | None]] | None = None,
               ) -> tuple[TaskSpec[..., Any], store.NewJob | None]:
        """Check everything about ``step`` but its argument values; return its task and its
        template (None for a task with per-job keys, whose job is built whole).

        ``memo`` remembers the task and template of a (task object, options object) pair, for
        callers that hold every step alive meanwhile (an object's id is not reused while it lives):
        the members of ``add_many()`` share both objects."""
        args, kwargs = step.args, step.kwargs
        # Steps without options (each has its own empty dict) share one entry.
        memo_key = (id(step.task), id(step.options) if step.options else 0)
        found = memo.get(memo_key) if memo is not None else None
        if found is None:
            options = step.options
            for option in options:
                if option not in STEP_OPTIONS:
                    unknown = sorted(set(options) - set(STEP_OPTIONS))
                    raise EnqueueError(f"unknown step options {unknown}; a step takes {list(STEP_OPTIONS)}")
            spec = resolve_task(step.task)
            if not isinstance(args, (list, tuple)):
                raise EnqueueError(f"args must be a list or tuple of arguments, got {args!r}")
            self._bind(spec, args, kwargs, pass_result)
            found = (spec, self._template(spec, options))
            if memo is not None:
                memo[memo_key] = found
            return found
        if not isinstance(args, (list, tuple)):
            raise EnqueueError(f"args must be a list or tuple of arguments, got {args!r}")
        self._bind(found[0], args, kwargs, pass_result)
        return found

    def _bind(self, spec: TaskSpec[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any],
              pass_result: bool) -> None:
        shape = (spec.name, spec.func, pass_result, len(args), tuple(kwargs) if kwargs else ())
        if shape not in self._bound:
            # The handler gets the dependencies' results as its first argument: bind a stand-in.
            check_arguments_bind(spec, [None, *args] if pass_result else list(args), dict(kwargs))
            self._bound.add(shape)

    def _template(self, spec: TaskSpec[..., Any], options: Mapping[str, Any]) -> store.NewJob | None:
        if spec.concurrency_key or spec.sequence_key or spec.rate_key or spec.fair_key:
            return None
        key = (spec.name, spec.func, tuple(sorted(options.items(), key=lambda kv: kv[0])))
        template = self._templates.get(key)
        if template is None:
            template = build_job(spec, [], {}, check_signature=False, **options)
            self._check_unique(template, spec)
            self._templates[key] = template
        return template

    @staticmethod
    def _check_unique(job: store.NewJob, spec: TaskSpec[..., Any]) -> None:
        if job.unique_key is not None or job.unique_mode != "keep":
            raise EnqueueError(f"task {spec.name!r} has a unique_key; a workflow's steps take none "
                               "(give the workflow a unique_key to make building it idempotent)")

    def _positional(self, spec: TaskSpec[..., Any]) -> list[str]:
        names = self._names.get(spec.name)
        if names is None:
            names = self._names[spec.name] = positional_names(enqueue_signature(spec))
        return names

    def build(self, step: Step, *, pass_result: bool, what: str) -> store.NewJob:
        """The job of one step (steps with dependencies, and callbacks).

        Raises:
            EnqueueError (and its subclasses): the step is invalid; the message starts with ``what``.
        """
        try:
            spec, template = self._check(step, pass_result)
            args, kwargs = list(step.args), dict(step.kwargs)
            if template is None:
                job = build_job(spec, args, kwargs, check_signature=False, **step.options)
                self._check_unique(job, spec)
                return job
            args_json, kwargs_json = encode_payload(args, kwargs, limit=self._limit, names=self._positional(spec))
        except EnqueueError as exc:
            raise type(exc)(f"{what}: {exc}") from None
        return dataclasses.replace(template, args_json=args_json, kwargs_json=kwargs_json)

    def members(self, steps: Sequence[Step], *, label: Callable[[int], str], policies: Sequence[str] | None = None,
                names: Sequence[str | None] | None = None, policy: str = "hold") -> list[store.NewMembers]:
        """The jobs of member steps that depend on nothing, for :func:`store.workflow_insert_members`.

        Args:
            steps: the member steps, in order.
            label: the name of step ``i`` (from 0) in an error message (``"batch member 3"``).
            policies: each step's ``on_dependency_dead``, or None for ``policy`` for all.
            names: each step's name (None for anonymous), or None when all are anonymous.
            policy: the policy when ``policies`` is None.

        Returns:
            The members in chunks of at most 10,000 members and about 16 MB of JSON each
            (one INSERT per chunk), in order.

        Raises:
            EnqueueError (and its subclasses ArgumentsMismatch, PayloadNotSerializable,
                PayloadTooLarge): the first invalid step, its message starting with its label;
                nothing is built. The argument values of every step are checked before the size
                limit is, so with several bad steps a JSON error may be reported before the size
                of an earlier step.
            UnknownTask: a step names a task nobody registered.
        """
        index: dict[tuple[int, str], int] = {}
        templates: list[store.NewJob] = []
        template_policies: list[str] = []
        shape: list[int] = []
        pairs: list[tuple[Sequence[Any], Mapping[str, Any]]] = []
        any_kwargs = False
        memo: dict[tuple[int, int], tuple[TaskSpec[..., Any], store.NewJob | None]] = {}
        n = 0
        with _gc_paused():
            try:
                for n, step in enumerate(steps):
                    step_policy = policies[n] if policies is not None else policy
                    spec, template = self._check(step, False, memo)
                    # No copies: the arguments are encoded before this returns.
                    args, kwargs = step.args, step.kwargs if type(step.kwargs) is dict else dict(step.kwargs)
                    check_payload(args, kwargs, names=self._positional(spec))
                    if template is None:
                        template = build_job(spec, args, kwargs, check_signature=False, **step.options)
                        self._check_unique(template, spec)
                        shape.append(len(templates))
                        templates.append(template)
                        template_policies.append(step_policy)
                    else:
                        slot = index.get((id(template), step_policy))
                        if slot is None:
                            slot = index[(id(template), step_policy)] = len(templates)
                            templates.append(template)
                            template_policies.append(step_policy)
                        shape.append(slot)
                    if kwargs:
                        any_kwargs = True
                    pairs.append((args, kwargs))
            except EnqueueError as exc:
                raise type(exc)(f"{label(n)}: {exc}") from None
            dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
            self._check_sizes(pairs, label, dumps, any_kwargs)
            chunks: list[store.NewMembers] = []
            for start in range(0, len(pairs), 10_000):
                chunks.extend(self._chunk(pairs, start, min(start + 10_000, len(pairs)), dumps, any_kwargs,
                                          templates, template_policies, shape, names))
        return chunks

    def _check_sizes(self, pairs: Sequence[tuple[Sequence[Any], Mapping[str, Any]]], label: Callable[[int], str],
                     dumps: Callable[[Any], str], any_kwargs: bool) -> None:
        """Refuse a step whose arguments are over ``MAX_PAYLOAD_BYTES``, with
        :func:`~django_leasequeue.payload.encode_payload`'s message. The whole list's JSON is at
        least as long as any step's, so a list within the limit needs no per-step look."""
        if not self._limit:
            return
        size = len(dumps([a for a, _ in pairs]).encode())
        size += len(dumps([kw for _, kw in pairs]).encode()) if any_kwargs else 2 * len(pairs)
        if size <= self._limit:
            return
        for n, (args, kwargs) in enumerate(pairs):
            try:
                encode_payload(args, kwargs, limit=self._limit)
            except EnqueueError as exc:
                raise type(exc)(f"{label(n)}: {exc}") from None

    def _chunk(self, pairs: Sequence[tuple[Sequence[Any], Mapping[str, Any]]], start: int, stop: int,
               dumps: Callable[[Any], str], any_kwargs: bool, templates: list[store.NewJob],
               policies: list[str], shape: list[int], names: Sequence[str | None] | None) -> list[store.NewMembers]:
        part = pairs[start:stop]
        args_json = dumps([a for a, _ in part])
        kwargs_json = dumps([kw for _, kw in part]) if any_kwargs else None
        if len(part) > 1 and len(args_json) + len(kwargs_json or "") > MAX_CHUNK_CHARS:
            half = start + len(part) // 2
            return (self._chunk(pairs, start, half, dumps, any_kwargs, templates, policies, shape, names)
                    + self._chunk(pairs, half, stop, dumps, any_kwargs, templates, policies, shape, names))
        used = sorted(set(shape[start:stop]))
        if used == [0] and len(templates) == 1:
            part_templates, part_policies, part_shape = tuple(templates), tuple(policies), None
        else:
            local = {g: i for i, g in enumerate(used)}
            part_templates = tuple(templates[g] for g in used)
            part_policies = tuple(policies[g] for g in used)
            part_shape = tuple(local[g] for g in shape[start:stop])
            if len(used) == 1:
                part_shape = None
        part_names = tuple(names[start:stop]) if names is not None and any(names[start:stop]) else None
        return [store.NewMembers(templates=part_templates, policies=part_policies, args_json=args_json,
                                 kwargs_json=kwargs_json, shape=part_shape, steps=part_names, count=len(part))]


@dataclasses.dataclass
class _Node:
    name: str | None
    step: Step
    depends_on: Sequence[str]
    depends_on_ids: Sequence[int]


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
                check_job_database(dep, f"step {name!r}: depends_on")
                ids.append(dep.pk)
            else:
                raise EnqueueError(f"step {name!r}: depends_on takes step names, job ids or Job objects, got {dep!r}")
        if len(set(names)) != len(names) or len(set(ids)) != len(ids):
            raise EnqueueError(f"step {name!r} names a dependency twice: {names + [str(i) for i in ids]}")
        self._nodes.append(_Node(name, step, names, ids))
        return name

    def _add_anonymous(self, steps: Iterable[Any], what: str) -> None:
        """``add(None, step)`` for each of ``steps`` (group and chord members), without the checks
        a name or a dependency needs."""
        nodes = self._nodes
        with _gc_paused():
            for index, step in enumerate(steps, 1):
                if not isinstance(step, Step):
                    _as_step(step, f"{what} {index}")
                nodes.append(_Node(None, step, (), ()))

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
        graph: dict[str, Sequence[str]] = {}
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

    def _build_steps(self) -> tuple[list[store.NewMembers], list[store.NewStep]]:
        """Validate and build every job: ``(members, steps)``. When no step has a dependency the
        members go the lean way (:meth:`_JobBuilder.members`, one INSERT without edges) and
        ``steps`` holds only the callbacks; otherwise every job is a :class:`store.NewStep`."""
        self._check_graph()
        builder = _JobBuilder()
        members: list[store.NewMembers] = []
        steps: list[store.NewStep] = []
        nodes = self._nodes
        if not any(node.depends_on or node.depends_on_ids for node in nodes):
            policies = [check_policy(node.step.on_dependency_dead or self.on_dependency_dead,
                                     f"step {node.name!r}: on_dependency_dead") for node in nodes]
            names = [node.name for node in nodes]
            members = builder.members(
                [node.step for node in nodes], policies=policies,
                names=names if any(name is not None for name in names) else None,
                label=lambda n: f"step {nodes[n].name!r}" if nodes[n].name is not None else f"member {n + 1}")
        else:
            for node in nodes:
                policy = check_policy(node.step.on_dependency_dead or self.on_dependency_dead,
                                      f"step {node.name!r}: on_dependency_dead")
                has_deps = bool(node.depends_on or node.depends_on_ids)
                pass_result = has_deps and (self._pass_default if node.step.pass_result is None
                                            else node.step.pass_result)
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
                    "WorkflowHandle(ctx.workflow_id()).results() in the callback (a takes_context=True task)")
            job = builder.build(callback, pass_result=pass_result, what=role)
            steps.append(store.NewStep(job, role=role, pass_result=pass_result))
        return members, steps

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
        members, steps = self._build_steps()
        alias = store.db_alias()
        with transaction.atomic(using=alias):
            workflow_id = store.workflow_create(kind=self.kind, name=self.name, unique_key=self.unique_key,
                                                on_dependency_dead=self.on_dependency_dead, closed=True,
                                                members=len(self._nodes), alias=alias)
            if workflow_id is None:
                existing = store.workflow_get_by_unique_key(self.unique_key or "", alias=alias)
                if existing is None:
                    raise EnqueueError(f"workflow unique_key {self.unique_key!r} kept changing hands; try again")
                return WorkflowHandle(existing.id, created=False, alias=alias)
            for chunk in members:
                insert_members(workflow_id, chunk, alias=alias)
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
    workflow._add_anonymous(_flatten(steps), "group member")
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
    workflow._add_anonymous(source, "chord member")
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
