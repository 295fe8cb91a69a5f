"""The native job spec that runs a framework task (its options over the backend's defaults), and
the registry resolver through which the worker finds it by name."""

from __future__ import annotations

from typing import Any

from .. import registry
from ..compat_tasks import Task
from .options import _options_of
from .registered import _TASKS, _backend_of
from .results import _ResultBackend
from .runner import _Runner


def _spec_for(task: Task[..., Any], backend: _ResultBackend) -> registry.TaskSpec[..., Any]:
    """The native job spec that runs ``task``: its options over the backend's defaults.

    Cached on the backend instance (one per thread and ``TASKS`` setting) by Task identity: the
    worker looks a job's spec up twice per attempt.
    """
    cached = backend._specs.get(id(task))
    if cached is not None and cached[0] is task:
        return cached[1]
    task_spec = _build_spec(task, backend)
    if len(backend._specs) > 10_000:  # .using() copies are enqueue-time only; keep the cache small
        backend._specs.clear()
    backend._specs[id(task)] = (task, task_spec)
    return task_spec


def _build_spec(task: Task[..., Any], backend: _ResultBackend) -> registry.TaskSpec[..., Any]:
    own = _options_of(task)
    defaults = backend.defaults
    return registry.TaskSpec(
        func=_Runner(task), name=task.module_path, queue=task.queue_name, priority=task.priority,
        max_attempts=own.max_attempts or defaults.max_attempts,
        backoff=own.backoff if own.backoff is not None else defaults.backoff,
        lease=own.lease or defaults.lease, timeout=own.timeout or defaults.timeout,
        takes_context=True, retry_on=own.retry_on, discard_on=own.discard_on,
    )


def _resolve(name: str) -> registry.TaskSpec[..., Any] | None:
    """Registry resolver: the spec of the framework task registered as ``name``, else None.

    Only Task objects that passed :meth:`LeaseQueueBackend.validate_task` in this process are
    found; ``name`` is never imported.
    """
    task = _TASKS.get(name)
    if task is None:
        return None
    return _spec_for(task, _backend_of(task))


registry.add_resolver(_resolve, names=lambda: list(_TASKS))

