"""Task specs and their lookups: registration, :func:`get_task`, names and "did you mean" hints.

Only tasks registered here ever run: a worker looks a job's ``task`` name up in this registry and
dead-letters names it does not know. It never imports a dotted path taken from a job row.

A :class:`TaskSpec` holds a handler and its options; it has no enqueue methods (enqueueing is
:mod:`django_leasequeue.enqueueing`, whose ``@task`` returns a :class:`TaskSpec` subclass that has them).
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Generic, ParamSpec, Self, TypeVar, Unpack

from .arguments import JobOptions, UsingOptions, check_using, seconds_option
from .conf import RateLimit, get_settings, parse_rate
from .exceptions import ConfigurationError, EnqueueError, UnknownTask
from .retry import BackoffLike, ExceptionClasses

__all__ = ["JobOptions", "P", "R", "TaskSpec", "UsingOptions", "add_resolver", "autodiscover",
           "close_matches", "did_you_mean", "get_task", "known_task_names", "register_task", "registered_tasks",
           "resolve_task", "unknown_task_help"]

#: The handler's parameters, as ``enqueue()`` must receive them (without the context).
P = ParamSpec("P")
#: The handler's return type.
R = TypeVar("R")

_REGISTRY: dict[str, TaskSpec[..., Any]] = {}
_LOCK = threading.Lock()
# Extra resolvers (the Django tasks backend registers one) consulted after the native registry.
_RESOLVERS: list[Callable[[str], TaskSpec[..., Any] | None]] = []
_NAME_SOURCES: list[Callable[[], Iterable[str]]] = []
_autodiscovered = False


@dataclass(frozen=True)
class TaskSpec(Generic[P, R]):
    """A registered handler plus its queue options; immutable. ``@task`` creates them (as the
    subclass :class:`django_leasequeue.enqueueing.Task`, which adds ``enqueue()``), the Django tasks
    backend builds one per framework task, and the worker looks them up with :func:`get_task`.

    Calling the object calls the handler in-process (no queue). ``using()`` returns a copy with
    other options for the jobs enqueued from it (like Django's ``Task.using``).

    Typing: ``TaskSpec[P, R]`` is generic over the handler's parameters ``P`` *as enqueued* and its
    return type ``R``, so a type checker checks ``enqueue(*args, **kwargs)`` against the handler's
    signature. For a ``takes_context=True`` handler ``P`` leaves out the first parameter (the
    :class:`~django_leasequeue.context.JobContext` the worker passes). Calling the object directly
    (``task_spec(...)``) passes the arguments through unchanged, context included, so it is typed
    loosely (``(*args: Any, **kwargs: Any) -> R``).

    Attributes:
        func: the handler.
        name (str): registry name stored in each job row.
        queue (str), priority (int -100..100): defaults for enqueued jobs.
        max_attempts (int | None): claims before dead-lettering; None means the setting.
        backoff: a :class:`~django_leasequeue.retry.Backoff`, base seconds, ``attempt -> seconds`` or
            ``(attempt, exc) -> seconds | None`` (None: the ``BACKOFF_*`` settings' delay).
        lease (float | None): lease length in seconds; None means the worker's default.
        timeout (float | None): seconds one attempt may run, counted from the handler's start.
            In thread mode a handler past it keeps its thread's slot and its job's lease until it
            returns; the attempt is recorded as timed out and ends as a ``JobTimedOut`` failure
            (a late return value is discarded). ``EXECUTION = "process"`` kills the handler at the
            timeout instead. None: no timeout.
        takes_context (bool): the handler's first parameter receives the :class:`JobContext`.
        manual_heartbeat (bool): renew only when the handler calls ``context.heartbeat()``
            ("alive is not progressing").
        concurrency_key: a callable ``(*args, **kwargs) -> str`` or a ``str.format`` template over
            the arguments; with ``concurrency_limit`` N at most N such jobs are leased at once.
        concurrency_limit (int | None): see ``concurrency_key``.
        retry_on: an exception class or a tuple of them: only a failure raising one of them
            (``isinstance``) is retried; any other is dead-lettered at once (``not_retryable``).
            None: every failure is retried until ``max_attempts``.
        discard_on: an exception class or a tuple of them: a failure raising one is dead-lettered
            at once (``discarded``), even when it matches ``retry_on`` too.
        sequence_key: a callable ``(*args, **kwargs) -> str`` or a ``str.format`` template over the
            arguments; jobs with the same key run one at a time, in enqueue order.
        sequence_on_dead (str): ``"halt"`` (a dead job holds its sequence until an operator
            replays or skips it) or ``"continue"`` (the next job of the sequence may start).
        rate_key: a callable or a ``str.format`` template over the arguments, as
            ``concurrency_key``; with ``rate_limit`` at most ``rate_limit.limit`` jobs of one key
            are claimed in any window of ``rate_limit.per`` seconds, across all workers.
        rate_limit (RateLimit | None): see ``rate_key``.
        fair_key: a callable or a ``str.format`` template over the arguments; in a fair queue the
            claim serves the keys round-robin. None: the job's concurrency key, if any.
    """

    func: Callable[..., R]
    name: str
    queue: str | None = None
    priority: int = 0
    max_attempts: int | None = None
    backoff: BackoffLike | None = None
    lease: float | None = None
    timeout: float | None = None
    takes_context: bool = False
    manual_heartbeat: bool = False
    concurrency_key: str | Callable[..., str] | None = None
    concurrency_limit: int | None = None
    # Which errors are retried (see retry.decide): exception classes, checked at declaration.
    retry_on: ExceptionClasses | None = None
    discard_on: ExceptionClasses | None = None
    rate_key: str | Callable[..., str] | None = None
    rate_limit: RateLimit | None = None
    fair_key: str | Callable[..., str] | None = None
    # Options for the next enqueue, set through using().
    run_at: datetime | timedelta | None = field(default=None, compare=False)
    unique_key: str | None = field(default=None, compare=False)
    unique_scope: str = field(default="retained", compare=False)
    unique_mode: str = field(default="keep", compare=False)
    debounce: float | None = field(default=None, compare=False)
    debounce_max_wait: float | None = field(default=None, compare=False)
    throttle: float | None = field(default=None, compare=False)
    sequence_key: str | Callable[..., str] | None = None
    sequence_on_dead: str = "halt"

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        return self.func(*args, **kwargs)

    @property
    def is_async(self) -> bool:
        """True when the handler is a coroutine function (``async def``): a worker with async
        slots (``ASYNC_SLOTS``) runs it on its event loop instead of a handler thread."""
        return inspect.iscoroutinefunction(self.func)

    def using(self, **options: Unpack[UsingOptions]) -> Self:
        """Return a copy with other options for the jobs it enqueues (``run_at``: an aware datetime
        within 0001-01-02 .. 9999-12-30 UTC or a timedelta of at most 100 years; ``queue``,
        ``priority``, ``unique_key``, ``unique_scope``, ``max_attempts``, ``lease`` in seconds as an
        int or float, or a ``datetime.timedelta``, stored as seconds; ``unique_mode`` with
        ``debounce``, ``debounce_max_wait`` and ``throttle`` in seconds, stored as seconds;
        ``sequence_key``, a key or ``str.format`` template over the arguments that replaces the
        task's own, so that these jobs join that sequence under the task's ``sequence_on_dead``;
        ``rate_key`` and ``fair_key`` as a literal key (a str, used as is, not as a template) or
        None for none; ``rate_limit`` as ``"N/s|m|h"`` or None).

        ``timeout`` and ``backoff`` are not accepted: they are not stored in the job row, and the
        worker reads them from the registered task, so a per-enqueue value would be silently ignored.

        Raises:
            TypeError: an unknown option.
            EnqueueError: a bad value (the same checks and messages as
                :func:`~django_leasequeue.enqueueing.enqueue`).
        """
        allowed = {"run_at", "queue", "priority", "unique_key", "unique_scope", "max_attempts", "lease",
                   "unique_mode", "debounce", "debounce_max_wait", "throttle",
                   "sequence_key",
                   "rate_key", "rate_limit", "fair_key"}
        unknown = set(options) - allowed
        if unknown:
            raise TypeError(f"using() got unknown option(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
        checked: dict[str, Any] = dict(options)
        if "lease" in checked:
            checked["lease"] = seconds_option(checked["lease"], f"task {self.name!r}: lease", EnqueueError)
        check_using(self.name, checked)
        if "sequence_key" in checked and (not isinstance(checked["sequence_key"], str) or not checked["sequence_key"]):
            raise EnqueueError(f"task {self.name!r}: using(sequence_key=...) must be a non-empty str, "
                               f"got {checked['sequence_key']!r}")
        for option in ("rate_key", "fair_key"):
            if checked.get(option) is not None:
                checked[option] = _literal_key(checked[option])
        if "rate_limit" in checked and checked["rate_limit"] is not None:
            try:
                checked["rate_limit"] = parse_rate(checked["rate_limit"], f"task {self.name!r}: rate_limit")
            except ConfigurationError as exc:
                raise EnqueueError(str(exc)) from None
        copy = dataclasses.replace(self, **checked)
        if (copy.rate_key is None) != (copy.rate_limit is None):
            raise EnqueueError(f"task {self.name!r}: rate_key and rate_limit go together")
        return copy


def _literal_key(key: str) -> Callable[..., str]:
    """A key option that yields ``key`` itself whatever the arguments (``using(rate_key="acme")``:
    braces in it are not a template)."""
    return lambda *args, **kwargs: key





def register_task(task_spec: TaskSpec[..., Any]) -> None:
    """Add a task to the registry.

    Raises:
        ConfigurationError: a different function is already registered under the same name
            (re-registering the same function, e.g. on module reload, is allowed).
    """
    with _LOCK:
        existing = _REGISTRY.get(task_spec.name)
        if existing is not None and _qualified(existing.func) != _qualified(task_spec.func):
            raise ConfigurationError(
                f"task name {task_spec.name!r} is already registered for {_qualified(existing.func)}"
            )
        _REGISTRY[task_spec.name] = task_spec


def _qualified(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def add_resolver(resolver: Callable[[str], TaskSpec[..., Any] | None],
                 names: Callable[[], Iterable[str]] | None = None) -> None:
    """Add a fallback lookup ``name -> runnable or None`` (used by the Django tasks backend).

    Args:
        resolver: returns the task registered as the name, or None.
        names: returns every name ``resolver`` knows (for "did you mean" hints); optional.
    """
    if resolver not in _RESOLVERS:
        _RESOLVERS.append(resolver)
        if names is not None:
            _NAME_SOURCES.append(names)


def close_matches(word: str, choices: Iterable[str], *, n: int = 1, cutoff: float = 0.6) -> str:
    """``"did you mean 'a' or 'b'?"`` over the ``choices`` close to ``word``, or ``""``.

    Args:
        word: the unknown name or key.
        choices: the known ones (any order; sorted before matching).
        n: at most this many suggestions. cutoff: ``difflib`` similarity, 0..1.

    Returns:
        The hint text without surrounding spaces, or ``""`` when nothing is close.
    """
    close = difflib.get_close_matches(word, sorted(choices), n=n, cutoff=cutoff)
    return f"did you mean {' or '.join(map(repr, close))}?" if close else ""


def did_you_mean(name: str) -> str:
    """``"did you mean 'a' or 'b'?"`` over the known task names close to ``name``, or ``""``."""
    return close_matches(name, known_task_names(), n=3, cutoff=0.8)


def known_task_names() -> list[str]:
    """Every task name this process can run: the native registry's and the resolvers' (sorted)."""
    names = set(_REGISTRY)
    for source in _NAME_SOURCES:
        names.update(source())
    return sorted(names)


def get_task(name: str) -> TaskSpec[..., Any]:
    """Return the registered task called ``name``.

    Raises:
        UnknownTask: nothing is registered under that name. Nothing is imported from the name.
    """
    task_spec = _REGISTRY.get(name)
    if task_spec is not None:
        return task_spec
    for resolver in _RESOLVERS:
        found = resolver(name)
        if found is not None:
            return found
    raise UnknownTask(f"no task is registered as {name!r} (only registered tasks run; a task name read "
                      f"from a job is never imported). {unknown_task_help(name)}")


def unknown_task_help(name: str) -> str:
    """Explain, for an error message, where this process looked for ``name`` and how to fix it.

    Names the close matches among the registered tasks, the modules this process imported to find
    tasks (installed apps' ``tasks``/``jobs`` modules and ``LEASEQUEUE["IMPORTS"]``) and the fix.

    Args:
        name: the task name that was not found.

    Returns:
        One paragraph of text (no trailing newline).
    """
    parts = []
    known = known_task_names()
    suggestion = did_you_mean(name)
    if suggestion:
        parts.append(suggestion[0].upper() + suggestion[1:])
    modules = _task_modules()
    shown = ", ".join(modules[:10]) + (f" and {len(modules) - 10} more" if len(modules) > 10 else "")
    parts.append(
        "Tasks are found by importing the 'tasks' and 'jobs' modules of every installed app and the "
        f"modules listed in LEASEQUEUE['IMPORTS'] (this process imported {shown or 'none'}; "
        f"{len(known)} task(s) registered). To fix: decorate the function with @task in such a module "
        "(name= must match the job's task name) or add its module to LEASEQUEUE['IMPORTS'], deploy it to "
        "the workers, then replay the job."
    )
    return " ".join(parts)


def _task_modules() -> list[str]:
    """The modules autodiscovery imports that this process has imported, in order."""
    from django.apps import apps

    names = [f"{app.name}.{sub}" for app in apps.get_app_configs() for sub in ("tasks", "jobs")]
    try:
        names += list(get_settings().imports)
    except Exception:  # noqa: BLE001 - an invalid setting is reported elsewhere; this is a hint
        pass
    return [module for module in dict.fromkeys(names) if module in sys.modules]


def registered_tasks() -> dict[str, TaskSpec[..., Any]]:
    """Return a snapshot of the native registry, by name."""
    return dict(_REGISTRY)


def autodiscover() -> None:
    """Import ``tasks`` and ``jobs`` modules of every installed app, and ``LEASEQUEUE["IMPORTS"]``.

    This is how a worker learns its tasks: by importing the project's own modules, never a path
    read from a job row. Idempotent.
    """
    global _autodiscovered
    if _autodiscovered:
        return
    from importlib import import_module

    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("tasks", "jobs")
    for module in get_settings().imports:
        import_module(module)
    _autodiscovered = True



def resolve_task(task_or_name: TaskSpec[..., Any] | str) -> TaskSpec[..., Any]:
    """The spec to enqueue: ``task_or_name`` itself, or the native task registered under that name
    (autodiscovering once when it is not registered yet).

    Raises:
        UnknownTask: a name nobody registered.
        TypeError: neither a :class:`TaskSpec` nor a str.
    """
    if isinstance(task_or_name, TaskSpec):
        return task_or_name
    if isinstance(task_or_name, str):
        task_spec = _REGISTRY.get(task_or_name)
        if task_spec is None:
            autodiscover()
            task_spec = _REGISTRY.get(task_or_name)
        if task_spec is None:
            raise UnknownTask(f"cannot enqueue {task_or_name!r}: no task is registered under that name. "
                              f"{unknown_task_help(task_or_name)}")
        return task_spec
    raise TypeError(f"enqueue() needs a Task or a registered task name, got {task_or_name!r}")


#: Names this module held before the enqueue path got its own modules, and where they live now.
#: They keep working from here (the API reference documented ``registry.task`` and
#: ``registry.enqueue``), with a DeprecationWarning. They resolve on first use: this module is a
#: leaf and must not import :mod:`~django_leasequeue.enqueueing` when it loads (a cycle).
MOVED = {
    "Task": "enqueueing", "task": "enqueueing", "enqueue": "enqueueing", "enqueue_many": "enqueueing",
    "enqueue_on_commit": "enqueueing", "build_job": "enqueueing", "insert_job": "enqueueing",
    "check_json": "payload", "check_arguments_bind": "payload", "check_task_options": "arguments",
    "encode_payload": "payload", "encode_payload_many": "payload", "json_dumps_result": "payload",
}


def __getattr__(name: str) -> Any:
    """Resolve a name of :data:`MOVED` from its new module, warning once per call site.

    Raises:
        AttributeError: ``name`` is neither defined here nor in :data:`MOVED`.
    """
    module = MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    import warnings

    warnings.warn(f"django_leasequeue.registry.{name} moved to django_leasequeue.{module}.{name}",
                  DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)
