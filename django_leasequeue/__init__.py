"""django-leasequeue: a durable PostgreSQL job queue and scheduler for Django.

Public API (imported lazily, so ``import django_leasequeue`` never imports models)::

    from django_leasequeue import task, enqueue, enqueue_on_commit, enqueue_many, JobContext
    from django_leasequeue import LeaseLost, JobCancelled, Snooze, Backoff
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "task": "registry",
    "Task": "registry",
    "enqueue": "registry",
    "enqueue_many": "registry",
    "enqueue_on_commit": "registry",
    "JobContext": "context",
    "Backoff": "retry",
    "LeaseQueueError": "exceptions",
    "ConfigurationError": "exceptions",
    "EnqueueError": "exceptions",
    "PayloadNotSerializable": "exceptions",
    "PayloadTooLarge": "exceptions",
    "UnknownTask": "exceptions",
    "LeaseLost": "exceptions",
    "JobCancelled": "exceptions",
    "Snooze": "exceptions",
}

__all__ = [*_EXPORTS, "__version__"]

if TYPE_CHECKING:
    from .context import JobContext
    from .exceptions import (
        ConfigurationError,
        EnqueueError,
        JobCancelled,
        LeaseLost,
        LeaseQueueError,
        PayloadNotSerializable,
        PayloadTooLarge,
        Snooze,
        UnknownTask,
    )
    from .registry import Task, enqueue, enqueue_many, enqueue_on_commit, task
    from .retry import Backoff


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'django_leasequeue' has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
