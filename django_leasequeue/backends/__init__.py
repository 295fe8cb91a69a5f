"""A backend for Django's tasks framework: ``@task`` code runs on django-leasequeue workers.

Configure it in ``TASKS`` (Django >= 6.0 ``django.tasks``, or the ``django_tasks`` backport on
Django 5.2; see :mod:`django_leasequeue.compat_tasks`)::

    TASKS = {
        "default": {
            "BACKEND": "django_leasequeue.backends.LeaseQueueBackend",
            "QUEUES": ["default", "emails"],          # the framework's own queue check
            "OPTIONS": {"LEASE": 60, "MAX_ATTEMPTS": 5, "BACKOFF": {"base": 2, "max": 600}, "TIMEOUT": None},
        }
    }

and run ``manage.py runworker``. Every framework task then gets our leases, heartbeats, fencing
tokens, retries with backoff, dead letters and admin replay.

How it maps (docs/howto/django-tasks.md has the user's view):

* ``enqueue``/``aenqueue`` validate through :func:`enqueue.build_job` (JSON arguments, queue,
  priority, ``run_after`` as an aware datetime or a ``timedelta`` from the database clock) and
  insert through :func:`enqueue.insert_job` (``store.job_insert_one``) **in the caller's
  transaction**, like our own ``enqueue``. The job's ``task`` column is the task's
  ``module_path``; the result id is the job id as a string.
* ``get_result``/``aget_result`` read the job row: status ``ready`` -> READY, ``leased`` ->
  RUNNING, ``done`` -> SUCCESSFUL, ``dead`` and ``cancelled`` -> FAILED; ``errors`` has one
  ``TaskError`` per failed attempt; ``worker_ids`` has one entry per counted attempt (so the
  framework's ``attempts``, which is ``len(worker_ids)``, equals the job's ``attempts``).
* **Only registered framework tasks run.** ``Task.__post_init__`` calls :meth:`validate_task` when
  ``@task`` decorates a function (Django 6.x and the backport alike), and that call records the
  Task object here; a worker learns the tasks by importing the project's modules
  (:func:`registry.autodiscover`: every app's ``tasks``/``jobs`` module and
  ``LEASEQUEUE["IMPORTS"]``). A job naming anything else (``os.system``, a module never imported)
  is dead-lettered with :class:`~django_leasequeue.exceptions.UnknownTask`; nothing is imported
  from a job row.
* The worker sends the framework's ``task_started`` before each attempt and ``task_finished``
  after the attempt's outcome is written: status SUCCESSFUL, FAILED (dead-lettered or cancelled)
  or READY (a retry is scheduled; ``task_result.is_finished`` is then False). ``task_enqueued`` is
  sent by ``enqueue`` for a new job (not when a unique key returned an existing one).
* ``takes_context`` tasks get a :class:`LeaseQueueTaskContext`: the framework's ``TaskContext``
  (``task_result``, ``attempt``) plus our fencing token and ``fenced_atomic()``.
* Async task functions are supported: the worker runs them with the framework's ``Task.call``
  (``async_to_sync``) on the job's worker thread, so ``sync_to_async`` ORM calls inside them run on
  that thread and its connection.
* Per-task options (``max_attempts``, ``backoff``, ``lease``, ``timeout``, ``unique_key``,
  ``unique_scope``, ``retry_on``, ``discard_on``) live on :class:`LeaseQueueTask`, the
  backend's ``task_class``. Django 6.1 and the backport (0.12) pass extra ``@task(...)``
  keywords to it; on Django 6.0 use :func:`task_options` under ``@task``. Precedence: the task's own option, then
  :func:`task_options`, then ``OPTIONS``, then ``LEASEQUEUE``. ``retry_on`` and ``discard_on``
  are per task only (no ``OPTIONS`` key); a ``BACKOFF`` callable may take ``(attempt, exc)``; a
  task may ``raise Retry(...)`` as a native handler does.

The modules, lowest first (each imports only those above it):

================  ===========================================================================
``options``       per-task options (:func:`task_options`, ``TASK_OPTION_NAMES``) and ``OPTIONS``
``tasks``         :class:`LeaseQueueTask`, :class:`LeaseQueueTaskContext`, ``_clone``
``results``       job row or claim -> ``TaskResult``; the backend's base class that builds them
``registered``    the framework tasks this process validated; backends by alias
``events``        ``task_started``/``task_finished``: the executor's attempt hook, the reaper's
                  lease expiry, robust sending
``runner``        the native spec's handler that runs a framework task in the worker
``specs``         the native spec of a framework task; the registry resolver
``backend``       :class:`LeaseQueueBackend`: configuration, validation, enqueue, results, checks
================  ===========================================================================

Where the ideas come from: the capability flags and ``check()`` are Django's backend contract
(``django/tasks/backends/base.py``); the lazy model import follows django-tasks-db, so that
``@task`` in a module imported during app loading never raises ``AppRegistryNotReady``.
"""

from .backend import LeaseQueueBackend
from .options import OPTION_KEYS as OPTION_KEYS
from .options import TASK_OPTION_NAMES as TASK_OPTION_NAMES
from .options import task_options
from .registered import registered_framework_tasks as registered_framework_tasks
from .results import task_result_status
from .tasks import LeaseQueueTask, LeaseQueueTaskContext

__all__ = ["LeaseQueueBackend", "LeaseQueueTask", "LeaseQueueTaskContext", "task_options", "task_result_status"]
