"""The framework tasks this process knows (fed by ``validate_task``, read by the worker through
:mod:`django_leasequeue.registry`) and the backends by alias for the worker's lookups."""

from __future__ import annotations

import threading
from typing import Any

from django.core.signals import setting_changed

from ..compat_tasks import InvalidTaskBackend, Task
from .results import _ResultBackend

_TASKS: dict[str, Task[..., Any]] = {}
_TASKS_LOCK = threading.Lock()


def _register(task: Task[..., Any]) -> None:
    """Remember a validated framework Task under its ``module_path``.

    The first Task seen for a function is the decorated one (``.using()`` copies come later and
    share its function), so it is kept; a new function object under the same path (a module
    reload) replaces it.
    """
    name = task.module_path
    with _TASKS_LOCK:
        current = _TASKS.get(name)
        if current is None or current.func is not task.func:
            _TASKS[name] = task


def registered_framework_tasks() -> dict[str, Task[..., Any]]:
    """Return a snapshot of the framework tasks this process knows, by ``module_path``."""
    return dict(_TASKS)


# Backends by alias for the worker's lookups (the framework's handler keeps one instance per
# thread behind an asgiref Local, which costs more than the rest of the lookup). Ours are
# stateless apart from caches, so threads may share one; cleared when TASKS changes.
_BACKENDS: dict[str, _ResultBackend] = {}


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in ("TASKS", "LEASEQUEUE"):
        _BACKENDS.clear()


setting_changed.connect(_on_setting_changed, dispatch_uid="leasequeue-tasks-backends")


def _backend_of(task: Task[..., Any]) -> _ResultBackend:
    cached = _BACKENDS.get(task.backend)
    if cached is not None:
        return cached
    backend = task.get_backend()
    if not isinstance(backend, _ResultBackend):
        raise InvalidTaskBackend(
            f"task {task.module_path!r} uses backend {task.backend!r}, which is not a LeaseQueueBackend"
        )
    _BACKENDS[task.backend] = backend
    return backend

