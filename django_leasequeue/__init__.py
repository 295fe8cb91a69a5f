"""django-leasequeue: a durable PostgreSQL job queue and scheduler for Django.

Public API (imported lazily, so ``import django_leasequeue`` never imports models)::

    from django_leasequeue import task, enqueue, enqueue_on_commit, enqueue_many, JobContext
    from django_leasequeue import LeaseLost, JobCancelled, Snooze, Backoff
"""

from __future__ import annotations

import sys
import types
from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "task": "enqueue",
    "Task": "enqueue",
    "enqueue": "enqueue",
    "enqueue_many": "enqueue",
    "enqueue_on_commit": "enqueue",
    "JobContext": "context",
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
}

__all__ = [*_EXPORTS, "__version__"]

if TYPE_CHECKING:
    # "X as X": explicit re-exports for type checkers (__all__ above is computed).
    from .context import JobContext as JobContext
    from .enqueue import Task as Task
    from .enqueue import enqueue as enqueue
    from .enqueue import enqueue_many as enqueue_many
    from .enqueue import enqueue_on_commit as enqueue_on_commit
    from .enqueue import task as task
    from .exceptions import ArgumentsMismatch as ArgumentsMismatch
    from .exceptions import ConfigurationError as ConfigurationError
    from .exceptions import EnqueueError as EnqueueError
    from .exceptions import JobCancelled as JobCancelled
    from .exceptions import LeaseLost as LeaseLost
    from .exceptions import LeaseQueueError as LeaseQueueError
    from .exceptions import NotMigrated as NotMigrated
    from .exceptions import PayloadNotSerializable as PayloadNotSerializable
    from .exceptions import PayloadTooLarge as PayloadTooLarge
    from .exceptions import Snooze as Snooze
    from .exceptions import UnknownTask as UnknownTask
    from .retry import Backoff as Backoff

def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'django_leasequeue' has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    """The package's module type: keeps each exported name bound to the exported object.

    The import system binds a submodule as an attribute of its package once it is loaded. The
    submodule ``enqueue`` has the name of the function ``enqueue``; without this, importing the
    submodule first would make ``from django_leasequeue import enqueue`` return the module. The
    submodule stays in ``sys.modules``: ``from django_leasequeue.enqueue import build_job`` works.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _EXPORTS and isinstance(value, types.ModuleType) and value.__name__ == f"{__name__}.{name}":
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
