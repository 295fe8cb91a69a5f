"""django-leasequeue: a durable PostgreSQL job queue and scheduler for Django.

Public API (``import django_leasequeue`` never imports models: the enqueue names come from
:mod:`django_leasequeue.enqueue`, which imports the store only when it writes; the rest load lazily)::

    from django_leasequeue import task, enqueue, enqueue_on_commit, enqueue_many, JobContext
    from django_leasequeue import LeaseLost, JobCancelled, Snooze, Backoff
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Imported now, not through __getattr__: the submodule ``enqueue`` shares its name with the
# function, and importing a submodule binds it as an attribute of the package; this import binds the
# function over it once, before anything else can import the submodule.
from .enqueue import Task as Task
from .enqueue import enqueue as enqueue
from .enqueue import enqueue_many as enqueue_many
from .enqueue import enqueue_on_commit as enqueue_on_commit
from .enqueue import task as task

_EAGER = ["task", "Task", "enqueue", "enqueue_many", "enqueue_on_commit"]

_EXPORTS = {
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

__all__ = [*_EAGER, *_EXPORTS, "__version__"]

if TYPE_CHECKING:
    # "X as X": explicit re-exports for type checkers (__all__ above is computed).
    from .context import JobContext as JobContext
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
