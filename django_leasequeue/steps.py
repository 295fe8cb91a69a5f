"""A step: a task with its arguments and enqueue options, not yet written (Celery's signature).

``my_task.step(*args, **kwargs)`` makes one; :mod:`django_leasequeue.workflows` puts steps into
chains, groups, chords, batches and dependency graphs, and validates them there, before anything
is written. A step holds no database state and can be reused in several workflows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from .exceptions import EnqueueError
from .registry import TaskSpec

STEP_OPTIONS = ("queue", "priority", "run_at", "max_attempts")
"""The enqueue options a step takes through :meth:`Step.set` (the others are the task's)."""

DEPENDENCY_POLICIES = ("hold", "cancel", "run")
"""What a waiting step does when a dependency ends dead or cancelled (``on_dependency_dead``)."""


@dataclasses.dataclass(frozen=True)
class Step:
    """A task call to enqueue as part of a workflow.

    Attributes:
        task: the task (a :class:`~django_leasequeue.registry.TaskSpec`) or a registered task name.
        args: positional arguments (JSON values).
        kwargs: keyword arguments (JSON values).
        options: enqueue options among :data:`STEP_OPTIONS` (``queue``, ``priority`` -100..100,
            ``run_at`` an aware datetime or a timedelta, ``max_attempts``).
        pass_result: prepend the dependencies' results to ``args`` when the step is released: the
            single dependency's return value, or a dict step name -> return value for several
            (None for a failed dependency of a step that runs anyway); a chord callback gets the
            list of member results. None: the builder's default (True in :func:`chain` and for a
            chord callback, False elsewhere).
        on_dependency_dead: ``"hold"``, ``"cancel"`` or ``"run"``; None: the workflow's policy.
    """

    task: TaskSpec[..., Any] | str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    pass_result: bool | None = None
    on_dependency_dead: str | None = None

    def set(self, *, queue: str | None = None, priority: int | None = None,
            run_at: datetime | timedelta | None = None, max_attempts: int | None = None,
            pass_result: bool | None = None, on_dependency_dead: str | None = None) -> Step:
        """A copy with these options changed (the ones left None keep their value).

        Args:
            queue: a queue name, as for :func:`~django_leasequeue.enqueue`.
            priority: -100..100, higher first.
            run_at: an aware datetime, or a timedelta from the database clock at build time.
            max_attempts: attempts before the step is dead-lettered.
            pass_result: see the class attributes; ``False`` is Celery's immutable signature (``.si()``).
            on_dependency_dead: ``"hold"``, ``"cancel"`` or ``"run"``.

        Returns:
            A new :class:`Step` (a step is immutable).

        Raises:
            EnqueueError: ``on_dependency_dead`` is not one of the three policies (as everywhere
                else a step's options are refused).
        """
        if on_dependency_dead is not None and on_dependency_dead not in DEPENDENCY_POLICIES:
            raise EnqueueError(f"on_dependency_dead must be one of {DEPENDENCY_POLICIES}, got {on_dependency_dead!r}")
        given = {"queue": queue, "priority": priority, "run_at": run_at, "max_attempts": max_attempts}
        options = {**self.options, **{k: v for k, v in given.items() if v is not None}}
        return dataclasses.replace(
            self, options=options,
            pass_result=self.pass_result if pass_result is None else pass_result,
            on_dependency_dead=self.on_dependency_dead if on_dependency_dead is None else on_dependency_dead)

    @property
    def task_name(self) -> str:
        """The task's registered name."""
        return self.task if isinstance(self.task, str) else self.task.name

    def __repr__(self) -> str:
        call = ", ".join([*map(repr, self.args), *(f"{k}={v!r}" for k, v in self.kwargs.items())])
        return f"<Step {self.task_name}({call})>"
