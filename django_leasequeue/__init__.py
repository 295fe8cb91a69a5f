"""django-leasequeue: a durable PostgreSQL job queue and scheduler for Django.

Public API (imported lazily, so ``import django_leasequeue`` never imports models)::

    from django_leasequeue import task, enqueue, enqueue_on_commit, enqueue_many, JobContext
    from django_leasequeue import LeaseLost, JobCancelled, Snooze, Retry, Backoff
    from django_leasequeue import chain, group, chord, Workflow, Batch, WorkflowHandle, Step
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "task": "enqueueing",
    "Task": "enqueueing",
    "enqueue": "enqueueing",
    "enqueue_many": "enqueueing",
    "enqueue_on_commit": "enqueueing",
    "JobContext": "context",
    "FencedCompletion": "context",
    "Backoff": "retry",
    "LeaseQueueError": "exceptions",
    "ConfigurationError": "exceptions",
    "EnqueueError": "exceptions",
    "PayloadNotSerializable": "exceptions",
    "ArgumentsMismatch": "exceptions",
    "PayloadTooLarge": "exceptions",
    "UnknownTask": "exceptions",
    "NotMigrated": "exceptions",
    "LeaseLost": "exceptions",
    "JobCancelled": "exceptions",
    "Snooze": "exceptions",
    "Retry": "exceptions",
    "Step": "steps",
    "DependencyOutcome": "store",
    "Workflow": "workflows",
    "WorkflowHandle": "workflows",
    "Batch": "workflows",
    "chain": "workflows",
    "group": "workflows",
    "chord": "workflows",
}

__all__ = [*_EXPORTS, "__version__"]

if TYPE_CHECKING:
    # "X as X": explicit re-exports for type checkers (__all__ above is computed).
    from .context import FencedCompletion as FencedCompletion
    from .context import JobContext as JobContext
    from .enqueueing import Task as Task
    from .enqueueing import enqueue as enqueue
    from .enqueueing import enqueue_many as enqueue_many
    from .enqueueing import enqueue_on_commit as enqueue_on_commit
    from .enqueueing import task as task
    from .exceptions import ArgumentsMismatch as ArgumentsMismatch
    from .exceptions import ConfigurationError as ConfigurationError
    from .exceptions import EnqueueError as EnqueueError
    from .exceptions import JobCancelled as JobCancelled
    from .exceptions import LeaseLost as LeaseLost
    from .exceptions import LeaseQueueError as LeaseQueueError
    from .exceptions import NotMigrated as NotMigrated
    from .exceptions import PayloadNotSerializable as PayloadNotSerializable
    from .exceptions import PayloadTooLarge as PayloadTooLarge
    from .exceptions import Retry as Retry
    from .exceptions import Snooze as Snooze
    from .exceptions import UnknownTask as UnknownTask
    from .retry import Backoff as Backoff
    from .steps import Step as Step
    from .store import DependencyOutcome as DependencyOutcome
    from .workflows import Batch as Batch
    from .workflows import Workflow as Workflow
    from .workflows import WorkflowHandle as WorkflowHandle
    from .workflows import chain as chain
    from .workflows import chord as chord
    from .workflows import group as group


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'django_leasequeue' has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
