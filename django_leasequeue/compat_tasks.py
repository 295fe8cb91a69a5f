"""One import point for Django's tasks framework: ``django.tasks`` or the ``django_tasks`` backport.

Django >= 6.0 ships the framework as ``django.tasks``; on Django 5.2 the same API comes from the
``django-tasks`` backport (``pip install "django-leasequeue[tasks-backport]"``), module
``django_tasks``. ``django.tasks`` wins when both are importable.

The two spell some exceptions differently (checked against Django 6.1.3 and django-tasks 0.12.0):

============================  ==========================  ===============================
meaning                       ``django.tasks`` (6.0/6.1)   ``django_tasks`` backport 0.12
============================  ==========================  ===============================
a Task is invalid             ``InvalidTask``             ``InvalidTaskError``
a backend is misconfigured    ``InvalidTaskBackend``      ``InvalidTaskBackendError``
no such result                ``TaskResultDoesNotExist``  ``TaskResultDoesNotExist``
result of another task        ``TaskResultMismatch``      ``TaskResultMismatch``
============================  ==========================  ===============================

This module exports them under the framework's current names (``InvalidTask``,
``InvalidTaskBackend``, ...) and also under the backport's (``InvalidTaskError``,
``InvalidTaskBackendError``), both bound to the classes of the installed framework, so
``except InvalidTask`` catches what the framework raises whichever one is installed.

Raises:
    ImportError: at import, when neither is installed (the message says what to install).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # Type checkers see Django's own framework (django-stubs types django.tasks); at run time the
    # backport is the fallback on Django 5.2.
    from django.tasks import (
        DEFAULT_TASK_BACKEND_ALIAS,
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task,
        task_backends,
    )
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskError
    from django.tasks.exceptions import InvalidTask, InvalidTaskBackend, TaskResultDoesNotExist, TaskResultMismatch
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    FRAMEWORK: str
    InvalidTaskError = InvalidTask
    InvalidTaskBackendError = InvalidTaskBackend
else:
    try:
        from django.tasks import (
            DEFAULT_TASK_BACKEND_ALIAS,
            DEFAULT_TASK_QUEUE_NAME,
            Task,
            TaskContext,
            TaskResult,
            TaskResultStatus,
            task,
            task_backends,
        )
        from django.tasks import exceptions as _exceptions
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import TaskError
        from django.tasks.signals import task_enqueued, task_finished, task_started

        FRAMEWORK = "django.tasks"
    except ImportError:
        try:
            from django_tasks import (
                DEFAULT_TASK_BACKEND_ALIAS,
                DEFAULT_TASK_QUEUE_NAME,
                TaskContext,
                TaskResult,
                TaskResultStatus,
                task,
                task_backends,
            )
            from django_tasks import checks as _checks  # noqa: F401  (registers the framework's system check)
            from django_tasks import exceptions as _exceptions
            from django_tasks.backends.base import BaseTaskBackend
            from django_tasks.base import Task, TaskError
            from django_tasks.signals import task_enqueued, task_finished, task_started
        except ImportError as exc:
            raise ImportError(
                "django_leasequeue.backends needs Django's tasks framework: Django >= 6.0 (django.tasks) or, on "
                'Django 5.2, the backport: pip install "django-leasequeue[tasks-backport]"'
            ) from exc
        FRAMEWORK = "django_tasks"

    try:  # Django >= 6.0 keeps it in django.utils.json; the backport in its utils module.
        from django.utils.json import normalize_json
    except ImportError:
        from django_tasks.utils import normalize_json

    def _first(*names: str) -> type[Exception]:
        for name in names:
            found = getattr(_exceptions, name, None)
            if found is not None:
                return found
        raise ImportError(f"the installed tasks framework ({FRAMEWORK}) has none of {names}")

    InvalidTask = InvalidTaskError = _first("InvalidTask", "InvalidTaskError")
    InvalidTaskBackend = InvalidTaskBackendError = _first("InvalidTaskBackend", "InvalidTaskBackendError")
    TaskResultDoesNotExist = _first("TaskResultDoesNotExist", "ResultDoesNotExist")
    TaskResultMismatch = _first("TaskResultMismatch")

__all__ = [
    "DEFAULT_TASK_BACKEND_ALIAS",
    "DEFAULT_TASK_QUEUE_NAME",
    "FRAMEWORK",
    "BaseTaskBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "InvalidTaskBackendError",
    "InvalidTaskError",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
