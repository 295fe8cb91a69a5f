"""Task registration (``@task``) and enqueueing (``enqueue``, ``enqueue_on_commit``).

Only tasks registered here ever run: a worker looks a job's ``task`` name up in this registry and
dead-letters names it does not know. It never imports a dotted path taken from a job row.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import json
import math
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Concatenate, Generic, Literal, ParamSpec, TypedDict, TypeVar, Unpack, overload

from .conf import MAX_ATTEMPTS_LIMIT, MAX_LEASE_SECONDS, check_lease_seconds, get_settings, queue_name_problem
from .exceptions import (
    ArgumentsMismatch,
    ConfigurationError,
    EnqueueError,
    PayloadNotSerializable,
    PayloadTooLarge,
    UnknownTask,
)
from .retry import BackoffLike

if TYPE_CHECKING:
    from .context import JobContext
    from .models import Job
    from .store import NewJob

#: The handler's parameters, as ``enqueue()`` must receive them (without the context).
P = ParamSpec("P")
#: The handler's return type.
R = TypeVar("R")

_REGISTRY: dict[str, Task[..., Any]] = {}
_LOCK = threading.Lock()
# Extra resolvers (the Django tasks backend registers one) consulted after the native registry.
_RESOLVERS: list[Callable[[str], Task[..., Any] | None]] = []
_NAME_SOURCES: list[Callable[[], Iterable[str]]] = []
_autodiscovered = False

PRIORITY_MIN, PRIORITY_MAX = -100, 100
#: The largest per-key concurrency limit (the column is an int; no key needs more slots).
MAX_CONCURRENCY_LIMIT = 1_000_000


class JobOptions(TypedDict, total=False):
    """Per-enqueue options of :func:`enqueue`, :func:`enqueue_many` and :func:`enqueue_on_commit`
    (all optional; see :func:`enqueue` for their meaning)."""

    run_at: datetime | timedelta | None
    queue: str | None
    priority: int | None
    unique_key: str | None
    unique_scope: str | None
    max_attempts: int | None


class UsingOptions(TypedDict, total=False):
    """Options :meth:`Task.using` accepts (all optional; see :func:`enqueue`). ``lease`` is in seconds
    (int or float) or a ``datetime.timedelta``."""

    run_at: datetime | timedelta | None
    queue: str | None
    priority: int
    unique_key: str | None
    unique_scope: str
    max_attempts: int | None
    lease: float | timedelta | None


@dataclass(frozen=True)
class Task(Generic[P, R]):
    """A registered handler plus its queue options. Create with :func:`task`; immutable.

    Calling the object calls the handler in-process (no queue). ``enqueue()`` writes a job;
    ``using()`` returns a copy with other options (like Django's ``Task.using``).

    Typing: ``Task[P, R]`` is generic over the handler's parameters ``P`` *as enqueued* and its
    return type ``R``, so a type checker checks ``enqueue(*args, **kwargs)`` against the handler's
    signature. For a ``takes_context=True`` handler ``P`` leaves out the first parameter (the
    :class:`~django_leasequeue.context.JobContext` the worker passes). Calling the task object
    directly (``task(...)``) passes the arguments through unchanged, context included, so it is
    typed loosely (``(*args: Any, **kwargs: Any) -> R``).

    Attributes:
        func: the handler.
        name (str): registry name stored in each job row.
        queue (str), priority (int -100..100): defaults for enqueued jobs.
        max_attempts (int | None): claims before dead-lettering; None means the setting.
        backoff: a :class:`~django_leasequeue.retry.Backoff`, base seconds or ``attempt -> seconds``.
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
    # Options for the next enqueue, set through using().
    run_at: datetime | timedelta | None = field(default=None, compare=False)
    unique_key: str | None = field(default=None, compare=False)
    unique_scope: str = field(default="retained", compare=False)

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        return self.func(*args, **kwargs)

    def using(self, **options: Unpack[UsingOptions]) -> Task[P, R]:
        """Return a copy with other options for the jobs it enqueues (``run_at``: an aware datetime
        within 0001-01-02 .. 9999-12-30 UTC or a timedelta of at most 100 years; ``queue``,
        ``priority``, ``unique_key``, ``unique_scope``, ``max_attempts``, ``lease`` in seconds as an
        int or float, or a ``datetime.timedelta``, stored as seconds).

        ``timeout`` and ``backoff`` are not accepted: they are not stored in the job row, and the
        worker reads them from the registered task, so a per-enqueue value would be silently ignored.

        Raises:
            TypeError: an unknown option.
            EnqueueError: a bad value (the same checks and messages as :func:`enqueue`).
        """
        allowed = {"run_at", "queue", "priority", "unique_key", "unique_scope", "max_attempts", "lease"}
        unknown = set(options) - allowed
        if unknown:
            raise TypeError(f"using() got unknown option(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
        checked: dict[str, Any] = dict(options)
        if "lease" in checked:
            checked["lease"] = seconds_option(checked["lease"], f"task {self.name!r}: lease", EnqueueError)
        _check_using(self.name, checked)
        return dataclasses.replace(self, **checked)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Enqueue one job of this task in the caller's transaction. See :func:`enqueue`."""
        return enqueue(self, args, kwargs)

    def enqueue_on_commit(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Enqueue one job when the current transaction commits. See :func:`enqueue_on_commit`."""
        enqueue_on_commit(self, args, kwargs)

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Async wrapper of :meth:`enqueue` (runs it in a thread with ``sync_to_async``)."""
        from asgiref.sync import sync_to_async

        return await sync_to_async(self.enqueue)(*args, **kwargs)


@overload
def task(func: Callable[P, R], /) -> Task[P, R]: ...


@overload
def task(func: None = None, *, name: str | None = None, queue: str | None = None, priority: int = 0,
         max_attempts: int | None = None, backoff: BackoffLike | None = None, lease: float | timedelta | None = None,
         timeout: float | timedelta | None = None, takes_context: Literal[False] = False,
         manual_heartbeat: bool = False,
         concurrency_key: str | Callable[..., str] | None = None,
         concurrency_limit: int | None = None) -> Callable[[Callable[P, R]], Task[P, R]]: ...


@overload
def task(func: None = None, *, name: str | None = None, queue: str | None = None, priority: int = 0,
         max_attempts: int | None = None, backoff: BackoffLike | None = None, lease: float | timedelta | None = None,
         timeout: float | timedelta | None = None, takes_context: Literal[True], manual_heartbeat: bool = False,
         concurrency_key: str | Callable[..., str] | None = None,
         concurrency_limit: int | None = None) -> Callable[[Callable[Concatenate[JobContext, P], R]], Task[P, R]]: ...


@overload
def task(func: None = None, *, name: str | None = None, queue: str | None = None, priority: int = 0,
         max_attempts: int | None = None, backoff: BackoffLike | None = None, lease: float | timedelta | None = None,
         timeout: float | timedelta | None = None, takes_context: bool, manual_heartbeat: bool = False,
         concurrency_key: str | Callable[..., str] | None = None,
         concurrency_limit: int | None = None) -> Callable[[Callable[..., R]], Task[..., R]]: ...


def task(func: Callable[..., Any] | None = None, *, name: str | None = None, queue: str | None = None,
         priority: int = 0, max_attempts: int | None = None, backoff: BackoffLike | None = None,
         lease: float | timedelta | None = None, timeout: float | timedelta | None = None,
         takes_context: bool = False, manual_heartbeat: bool = False,
         concurrency_key: str | Callable[..., str] | None = None,
         concurrency_limit: int | None = None) -> Task[..., Any] | Callable[[Callable[..., Any]], Task[..., Any]]:
    """Register a function as a task. Use as ``@task`` or ``@task(queue="emails", max_attempts=3)``.

    The returned :class:`Task` keeps the handler's signature for type checkers:
    ``Task[P, R]``, whose ``enqueue(*args: P.args, **kwargs: P.kwargs)`` is checked against the
    handler's parameters. With ``takes_context=True`` (given as the literal ``True``) the first
    parameter, the :class:`~django_leasequeue.context.JobContext`, is left out of ``P``.

    Args:
        func: the handler, when used as a bare ``@task``.
        name: registry name; default ``"<module>.<qualname>"``.
        queue: default queue; None means ``LEASEQUEUE["DEFAULT_QUEUE"]``.
        priority: -100..100, higher first.
        max_attempts: claims before dead-lettering (>= 1); None means the setting.
        backoff: a :class:`~django_leasequeue.retry.Backoff`, base seconds or ``attempt -> seconds``;
            None means the ``BACKOFF_*`` settings.
        lease: lease length, seconds (int or float) or a ``datetime.timedelta``; None means the
            worker's default (``LEASE``).
        timeout: how long one attempt may run, seconds (int or float) or a ``datetime.timedelta``;
            past it the attempt fails as ``JobTimedOut`` (see :class:`Task`). None: no timeout.
        takes_context: pass the :class:`~django_leasequeue.context.JobContext` as first argument.
        manual_heartbeat: renew the lease only when the handler calls ``context.heartbeat()``.
        concurrency_key: a ``str.format`` template over the arguments, or a callable taking them.
        concurrency_limit: at most this many jobs of one ``concurrency_key`` are leased at once.

    Returns:
        A :class:`Task`.

    Raises:
        ConfigurationError: a bad option, or another function already registered under ``name``.
    """

    def register(fn: Callable[..., Any]) -> Task[..., Any]:
        task_name = name or f"{fn.__module__}.{fn.__qualname__}"
        lease_s = seconds_option(lease, f"task {task_name!r}: lease", ConfigurationError)
        timeout_s = seconds_option(timeout, f"task {task_name!r}: timeout", ConfigurationError)
        check_task_options(task_name, priority=priority, max_attempts=max_attempts, lease=lease_s, timeout=timeout_s,
                           backoff=backoff, concurrency_key=concurrency_key, concurrency_limit=concurrency_limit,
                           queue=queue, takes_context=takes_context, manual_heartbeat=manual_heartbeat)
        spec: Task[..., Any] = Task(
            func=fn, name=task_name, queue=queue, priority=priority, max_attempts=max_attempts, backoff=backoff,
            lease=lease_s, timeout=timeout_s, takes_context=takes_context, manual_heartbeat=manual_heartbeat,
            concurrency_key=concurrency_key, concurrency_limit=concurrency_limit,
        )
        register_task(spec)
        return spec

    return register(func) if func is not None else register


def seconds_option(value: Any, what: str, error: type[Exception]) -> float | None:
    """A duration option as seconds: ``value`` unchanged when a number, converted when a timedelta.

    Args:
        value: None, a number of seconds (int or float, not bool) or a ``datetime.timedelta``.
        what: how to name the option in the message (e.g. ``"task 'x': timeout"``).
        error: the exception class to raise (``ConfigurationError`` at declaration,
            ``EnqueueError`` in :meth:`Task.using`).

    Returns:
        None for None, else the seconds (a float for a timedelta; the range is checked elsewhere).

    Raises:
        error: ``value`` is of another type (a str such as ``"5"``, a bool).
    """
    if value is None:
        return None
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise error(f"{what} must be a number of seconds (int or float) or a timedelta, got {value!r}")
    return value


def check_task_options(task_name: str, *, priority: int = 0, max_attempts: int | None = None,
                       lease: float | timedelta | None = None, timeout: float | timedelta | None = None,
                       backoff: Any = None,
                       concurrency_key: Any = None, concurrency_limit: int | None = None,
                       queue: str | None = None, takes_context: bool = False,
                       manual_heartbeat: bool = False) -> None:
    """Validate a task's options (shared by :func:`task` and the Django tasks backend).

    Args:
        task_name: the registry name (a non-empty str of at most 255 characters, no NUL).
        priority: int, -100..100. max_attempts: int from 1 to ``MAX_ATTEMPTS_LIMIT`` or None.
        lease: seconds (int, float or timedelta) in (0, 7 days] or None.
        timeout: finite seconds (int, float or timedelta) > 0 or None.
        backoff: a :class:`~django_leasequeue.retry.Backoff`, a number of seconds from 0 to 100
            years, a callable ``attempt -> seconds``, or None.
        concurrency_key: a ``str.format`` template or a callable, with ``concurrency_limit`` (an
            int from 1 to ``MAX_CONCURRENCY_LIMIT``); both or neither.
        queue: a queue name (see :func:`~django_leasequeue.conf.queue_name_problem`) or None.
        takes_context, manual_heartbeat: bool.

    Raises:
        ConfigurationError: naming the task and the bad option.
    """
    if not isinstance(task_name, str) or not task_name or len(task_name) > 255 or "\x00" in task_name:
        raise ConfigurationError(f"task name {task_name!r} must be a non-empty str of at most 255 characters "
                                 "without NUL")
    if isinstance(priority, bool) or not isinstance(priority, int) or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise ConfigurationError(f"task {task_name!r}: priority {priority!r} is not an int in -100..100")
    if max_attempts is not None and (isinstance(max_attempts, bool) or not isinstance(max_attempts, int)
                                     or not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT):
        raise ConfigurationError(f"task {task_name!r}: max_attempts must be an int from 1 to {MAX_ATTEMPTS_LIMIT}, "
                                 f"got {max_attempts!r}")
    lease = seconds_option(lease, f"task {task_name!r}: lease", ConfigurationError)
    timeout = seconds_option(timeout, f"task {task_name!r}: timeout", ConfigurationError)
    for option, value in (("lease", lease), ("timeout", timeout)):
        if value is not None and (not math.isfinite(value) or value <= 0):
            raise ConfigurationError(f"task {task_name!r}: {option} must be > 0 seconds, got {value!r}")
    if lease is not None and lease > MAX_LEASE_SECONDS:
        # Every enqueue would refuse it (see _check_lease): say so at declaration.
        raise ConfigurationError(f"task {task_name!r}: lease must be at most {MAX_LEASE_SECONDS:.0f} seconds "
                                 f"(7 days), got {lease!r}")
    if backoff is not None:
        from .retry import Backoff, as_backoff

        try:
            as_backoff(backoff, Backoff())
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"task {task_name!r}: {exc}") from None
    if queue is not None:
        problem = queue_name_problem(queue, f"task {task_name!r}: queue")
        if problem:
            raise ConfigurationError(problem)
    for option, flag in (("takes_context", takes_context), ("manual_heartbeat", manual_heartbeat)):
        if not isinstance(flag, bool):
            raise ConfigurationError(f"task {task_name!r}: {option} must be True or False, got {flag!r}")
    if (concurrency_key is None) != (concurrency_limit is None):
        raise ConfigurationError(f"task {task_name!r}: concurrency_key and concurrency_limit go together")
    if concurrency_key is not None and not (isinstance(concurrency_key, str) or callable(concurrency_key)):
        raise ConfigurationError(f"task {task_name!r}: concurrency_key must be a str.format template or a callable, "
                                 f"got {concurrency_key!r}")
    if concurrency_limit is not None and (isinstance(concurrency_limit, bool) or not isinstance(concurrency_limit, int)
                                          or not 1 <= concurrency_limit <= MAX_CONCURRENCY_LIMIT):
        raise ConfigurationError(f"task {task_name!r}: concurrency_limit must be an int from 1 to "
                                 f"{MAX_CONCURRENCY_LIMIT}, got {concurrency_limit!r}")


def register_task(spec: Task[..., Any]) -> None:
    """Add a task to the registry.

    Raises:
        ConfigurationError: a different function is already registered under the same name
            (re-registering the same function, e.g. on module reload, is allowed).
    """
    with _LOCK:
        existing = _REGISTRY.get(spec.name)
        if existing is not None and _qualified(existing.func) != _qualified(spec.func):
            raise ConfigurationError(
                f"task name {spec.name!r} is already registered for {_qualified(existing.func)}"
            )
        _REGISTRY[spec.name] = spec


def _qualified(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def add_resolver(resolver: Callable[[str], Task[..., Any] | None],
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


def did_you_mean(name: str) -> str:
    """``"did you mean 'a' or 'b'?"`` over the known task names close to ``name``, or ``""``."""
    close = difflib.get_close_matches(name, known_task_names(), n=3, cutoff=0.8)
    return f"did you mean {' or '.join(map(repr, close))}?" if close else ""


def known_task_names() -> list[str]:
    """Every task name this process can run: the native registry's and the resolvers' (sorted)."""
    names = set(_REGISTRY)
    for source in _NAME_SOURCES:
        names.update(source())
    return sorted(names)


def get_task(name: str) -> Task[..., Any]:
    """Return the registered task called ``name``.

    Raises:
        UnknownTask: nothing is registered under that name. Nothing is imported from the name.
    """
    spec = _REGISTRY.get(name)
    if spec is not None:
        return spec
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


def registered_tasks() -> dict[str, Task[..., Any]]:
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


# ---------------------------------------------------------------------------------------------
# Payload checks
# ---------------------------------------------------------------------------------------------


# Deeper nesting would hit Python's recursion limit in json.dumps (and is never a sane payload).
MAX_JSON_DEPTH = 500


def _check_text(text: str, path: str) -> None:
    """Refuse strings PostgreSQL's jsonb cannot store: NUL characters and lone surrogates."""
    if "\x00" in text:
        raise PayloadNotSerializable(f"{path} contains a NUL character (\\u0000), which PostgreSQL's jsonb rejects")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise PayloadNotSerializable(f"{path} contains a lone surrogate, which is not valid UTF-8") from None


# Python refuses to turn text of more than sys.int_info.default_max_str_digits (4300) digits into an
# int unless a process raises its own limit; json.loads then fails with a bare ValueError. The
# limit is the default one, not this process's: the worker, the admin and the result readers decode
# the row in their own processes, with the default limit.
MAX_INT_DIGITS = sys.int_info.default_max_str_digits or 4300
_INT_BOUND = 10 ** MAX_INT_DIGITS


def _check_int(number: int, path: str) -> None:
    """Refuse an int of more than :data:`MAX_INT_DIGITS` (4300) digits: ``json.dumps`` raises a
    bare ValueError on it in a process with the default limit, and a process with a raised limit
    would write JSON that every other process fails to read back."""
    if abs(number) >= _INT_BOUND:
        raise PayloadNotSerializable(f"{path} is an int of more than {MAX_INT_DIGITS} digits, which other Python "
                                     "processes cannot read back from JSON (sys.get_int_max_str_digits); "
                                     "pass it as a str")


def check_json(value: Any, where: str, *, exact_scalars: bool = True) -> None:
    """Check that ``value`` round-trips through JSON unchanged (same types, same values).

    Accepted: None, bool, int, finite float, str, list, and dict with str keys, nested.

    Args:
        exact_scalars: refuse subclasses of int/float/str (IntEnum, StrEnum, ...): they serialise
            as their base type, so a job argument would reach the handler as a plain int/str.
            False for return values, which are stored for reading, not passed back to code.

    Raises:
        PayloadNotSerializable: naming ``where`` and the path of the first offending value.
    """
    stack: list[tuple[Any, str, int]] = [(value, where, 0)]
    scalars = (bool, int, str)
    while stack:
        item, path, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise PayloadNotSerializable(f"{path} is nested more than {MAX_JSON_DEPTH} levels deep")
        if isinstance(item, str):
            _check_text(item, path)
        elif isinstance(item, int) and item.bit_length() > 3000:  # about 900 digits: cheap pre-check
            _check_int(item, path)
        if item is None or (type(item) in scalars if exact_scalars else isinstance(item, scalars)):
            continue
        if type(item) is float or (not exact_scalars and isinstance(item, float)):
            if not math.isfinite(item):
                raise PayloadNotSerializable(f"{path} is {item!r}: JSON has no NaN or infinity")
            if "e+" in repr(item):
                # PostgreSQL's jsonb keeps numbers as numeric and prints 1e16 as 10000000000000000,
                # which comes back as an int.
                raise PayloadNotSerializable(
                    f"{path} is {item!r}: floats this large come back from PostgreSQL's jsonb as int; "
                    "pass it as a str or an int")
            continue
        if isinstance(item, list):
            stack.extend((v, f"{path}[{i}]", depth + 1) for i, v in enumerate(item))
            continue
        if isinstance(item, dict):
            for k, v in item.items():
                if not isinstance(k, str):
                    raise PayloadNotSerializable(
                        f"{path} has key {k!r} of type {type(k).__name__}: JSON object keys must be str "
                        "(it would come back as a different key)"
                    )
                _check_text(k, f"{path} key {k!r}")
                stack.append((v, f"{path}[{k!r}]", depth + 1))
            continue
        hint = ""
        base = next((b.__name__ for b in (int, float, str) if isinstance(item, b)), None)
        if base is not None:
            hint = f" (a subclass of {base}: it would arrive as a plain {base}; pass {base}(value) and convert it back)"
        elif isinstance(item, tuple):
            hint = " (JSON would turn it into a list; pass a list)"
        elif type(item).__name__ in {"Decimal", "datetime", "date", "UUID", "time"}:
            hint = " (pass str(value) and convert it back in the handler)"
        raise PayloadNotSerializable(
            f"{path} is a {type(item).__module__}.{type(item).__qualname__}, which does not round-trip "
            f"through JSON{hint}"
        )


# Handler -> its signature as enqueue() receives the arguments (the context parameter left out), or
# None when it has none Python can tell. Cached: inspect.signature costs more than the checks.
_SIGNATURES: dict[tuple[Any, bool], inspect.Signature | None] = {}


def enqueue_signature(spec: Task[..., Any]) -> inspect.Signature | None:
    """The parameters a job of ``spec`` is enqueued with: the handler's signature without the
    :class:`JobContext` parameter of a ``takes_context`` handler. None when the handler has no
    signature Python can read (some builtins and C callables)."""
    key = (spec.func, spec.takes_context)
    try:
        return _SIGNATURES[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable callable: not cached
        return _read_signature(spec.func, spec.takes_context)
    if len(_SIGNATURES) > 10_000:
        _SIGNATURES.clear()
    found = _SIGNATURES[key] = _read_signature(spec.func, spec.takes_context)
    return found


def _read_signature(func: Callable[..., Any], takes_context: bool) -> inspect.Signature | None:
    try:
        signature = inspect.signature(func)
    except Exception:  # noqa: BLE001 - no signature (or annotations that cannot be evaluated)
        return None
    params = list(signature.parameters.values())
    if takes_context:
        if not params or params[0].kind not in (inspect.Parameter.POSITIONAL_ONLY,
                                                inspect.Parameter.POSITIONAL_OR_KEYWORD):
            return None  # (*args, **kwargs) or the like: the context goes who knows where
        params = params[1:]
    return signature.replace(parameters=params)


def _positional_names(signature: inspect.Signature | None) -> list[str]:
    if signature is None:
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in signature.parameters.values() if p.kind in kinds]


def check_arguments_bind(spec: Task[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Refuse arguments the handler of ``spec`` cannot be called with (missing or unexpected ones).

    Raises:
        ArgumentsMismatch: naming the task, the problem and the handler's signature.
    """
    signature = enqueue_signature(spec)
    if signature is None:
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise ArgumentsMismatch(f"task {spec.name!r} cannot take these arguments: {exc}; it is enqueued "
                                f"as {spec.name}{signature}") from None


def encode_payload(args: Sequence[Any], kwargs: Mapping[str, Any], *, limit: int,
                   names: Sequence[str] = ()) -> tuple[str, str]:
    """Validate and JSON-encode a job's arguments.

    Args:
        args, kwargs: the arguments.
        limit: the largest encoded size in bytes (0: no limit).
        names: the names of the handler's positional parameters, to name a bad positional argument
            (``argument 'amount'``); a positional argument without a name is ``args[i]`` (from 0).

    Returns:
        ``(args_json, kwargs_json)``.

    Raises:
        PayloadNotSerializable: an argument does not round-trip through JSON (named in the message).
        PayloadTooLarge: the encoded arguments exceed ``limit`` bytes.
    """
    args = list(args)
    for i, value in enumerate(args):
        check_json(value, f"argument {names[i]!r}" if i < len(names) else f"args[{i}]")
    for key, value in kwargs.items():
        if not isinstance(key, str):
            raise PayloadNotSerializable(f"keyword argument name {key!r} is not a str")
        _check_text(key, f"keyword argument name {key!r}")
        check_json(value, f"keyword argument {key!r}")
    args_json = json.dumps(args, separators=(",", ":"), ensure_ascii=False)
    kwargs_json = json.dumps(dict(kwargs), separators=(",", ":"), ensure_ascii=False)
    size = len(args_json.encode()) + len(kwargs_json.encode())
    if limit and size > limit:
        raise PayloadTooLarge(
            f"job arguments are {size} bytes, over LEASEQUEUE['MAX_PAYLOAD_BYTES'] = {limit}; "
            "store large data in a table and pass its id"
        )
    return args_json, kwargs_json


# ---------------------------------------------------------------------------------------------
# Enqueue
# ---------------------------------------------------------------------------------------------


MAX_QUEUE_LENGTH = 100  # Job.queue's max_length
MAX_DELAY_SECONDS = 100 * 366 * 24 * 3600.0


def _check_name(value: Any, what: str, max_length: int) -> None:
    """Refuse a queue name, unique key or concurrency key the job table cannot store as given."""
    if not isinstance(value, str) or not value:
        raise EnqueueError(f"{what} must be a non-empty str, got {value!r}")
    if len(value) > max_length:
        raise EnqueueError(f"{what} is {len(value)} characters long; the limit is {max_length}: {value[:40]!r}...")
    if "\x00" in value:
        raise EnqueueError(f"{what} {value!r} contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise EnqueueError(f"{what} {value!r} is not valid UTF-8") from None


# The earliest and latest run_at accepted, in UTC. PostgreSQL stores far wider timestamps, but
# Python's datetime ends at years 1 and 9999: a run_at past 9999-12-31 in UTC (an aware value near
# the end of year 9999 in a zone west of UTC) is written, then cannot be read back, so enqueue would
# raise after the INSERT and every page listing the job would fail. A day of margin on each side
# keeps the value printable in every time zone (UTC-12 to UTC+14).
#: The earliest ``run_at`` accepted (UTC).
RUN_AT_MIN = datetime(1, 1, 2, tzinfo=UTC)
#: The latest ``run_at`` accepted (UTC): the end of 9999-12-30.
RUN_AT_MAX = datetime(9999, 12, 30, 23, 59, 59, 999999, tzinfo=UTC)


def _check_run_at_range(run_at: datetime) -> None:
    """Refuse an aware ``run_at`` whose UTC value is outside [:data:`RUN_AT_MIN`, :data:`RUN_AT_MAX`].

    Raises:
        EnqueueError: naming the value and the range.
    """
    try:
        utc = run_at.astimezone(UTC)
    except (OverflowError, ValueError):
        utc = None
    if utc is None or not RUN_AT_MIN <= utc <= RUN_AT_MAX:
        raise EnqueueError(f"run_at {run_at.isoformat()} is outside the range a job can be stored and read back "
                           f"with: {RUN_AT_MIN.isoformat()} to {RUN_AT_MAX.isoformat()} in UTC")


def _check_using(task_name: str, options: dict[str, Any]) -> None:
    """Validate the options given to :meth:`Task.using` now, not at the next enqueue.

    Raises:
        EnqueueError: naming the bad option, with the message :func:`build_job` would give.
    """
    queue = options.get("queue")
    if queue is not None:
        problem = queue_name_problem(queue, "queue")
        if problem:
            raise EnqueueError(problem)
    priority = options.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int) or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise EnqueueError(f"priority must be an int from -100 to 100, got {priority!r}")
    attempts = options.get("max_attempts")
    if attempts is not None and (isinstance(attempts, bool) or not isinstance(attempts, int)
                                 or not 1 <= attempts <= MAX_ATTEMPTS_LIMIT):
        raise EnqueueError(f"max_attempts must be an int from 1 to {MAX_ATTEMPTS_LIMIT}, got {attempts!r}")
    _check_lease(options.get("lease"), f"task {task_name!r}: lease", EnqueueError)
    scope = options.get("unique_scope", "retained")
    if scope not in ("retained", "active"):
        raise EnqueueError(f"unique_scope must be 'retained' or 'active', got {scope!r}")
    if options.get("unique_key") is not None:
        _check_name(options["unique_key"], "unique_key", 255)
    run_at = options.get("run_at")
    if isinstance(run_at, timedelta):
        if abs(run_at.total_seconds()) > MAX_DELAY_SECONDS:
            raise EnqueueError(f"run_at timedelta of {run_at.total_seconds():.0f} seconds is more than 100 years away")
    elif run_at is not None:
        if not isinstance(run_at, datetime):
            raise EnqueueError(f"run_at must be an aware datetime or a timedelta, got {run_at!r}")
        if run_at.tzinfo is None or run_at.utcoffset() is None:
            raise EnqueueError(f"run_at {run_at.isoformat()} is naive; pass an aware datetime "
                               "(django.utils.timezone.make_aware) or a timedelta")
        _check_run_at_range(run_at)


def _check_lease(value: Any, what: str, error: type[Exception]) -> None:
    """A lease is None (the worker's default) or finite seconds in (0, 7 days]."""
    problem = check_lease_seconds(value, what) if value is not None else None
    if problem:
        raise error(problem)


def _resolve_spec(task_or_name: Task[..., Any] | str) -> Task[..., Any]:
    if isinstance(task_or_name, Task):
        return task_or_name
    if isinstance(task_or_name, str):
        spec = _REGISTRY.get(task_or_name)
        if spec is None:
            autodiscover()
            spec = _REGISTRY.get(task_or_name)
        if spec is None:
            raise UnknownTask(f"cannot enqueue {task_or_name!r}: no task is registered under that name. "
                              f"{unknown_task_help(task_or_name)}")
        return spec
    raise TypeError(f"enqueue() needs a Task or a registered task name, got {task_or_name!r}")


def build_job(spec: Task[..., Any], args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None, *,
              run_at: datetime | timedelta | None = None, queue: str | None = None,
              priority: int | None = None, unique_key: str | None = None, unique_scope: str | None = None,
              max_attempts: int | None = None, check_signature: bool = True) -> NewJob:
    """Validate enqueue arguments against the settings and return a :class:`store.NewJob`.

    Args:
        check_signature: refuse arguments that do not bind to the handler's signature
            (:class:`ArgumentsMismatch`). The scheduler passes False: its jobs are emitted even for
            tasks this process does not know (a rolling deploy), so its signature may be stale.

    Raises:
        EnqueueError (and its subclasses): see :func:`enqueue`.
    """
    from .store import NewJob

    settings = get_settings()
    kwargs = dict(kwargs or {})
    if isinstance(args, (str, bytes)) or not isinstance(args, Iterable):
        raise EnqueueError(f"args must be a list or tuple of arguments, got {args!r}")
    args = list(args)
    args_json, kwargs_json = encode_payload(args, kwargs, limit=settings.max_payload_bytes,
                                            names=_positional_names(enqueue_signature(spec)))
    if check_signature:
        check_arguments_bind(spec, args, kwargs)
    _check_name(spec.name, "task name", 255)
    queue = queue or spec.queue or settings.default_queue
    problem = queue_name_problem(queue, "queue")
    if problem:
        raise EnqueueError(problem)
    if not settings.queue_allowed(queue):
        raise EnqueueError(f"unknown queue {queue!r}; LEASEQUEUE['QUEUES'] allows {sorted(settings.queues or [])}")
    priority = spec.priority if priority is None else priority
    if isinstance(priority, bool) or not isinstance(priority, int) or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise EnqueueError(f"priority must be an int from -100 to 100, got {priority!r}")
    # "is None", not "or": an explicit max_attempts=0 is an error, not a request for the default.
    attempts = max_attempts if max_attempts is not None else (spec.max_attempts or settings.max_attempts)
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= MAX_ATTEMPTS_LIMIT:
        raise EnqueueError(f"max_attempts must be an int from 1 to {MAX_ATTEMPTS_LIMIT}, got {attempts!r}")
    _check_lease(spec.lease, f"task {spec.name!r}: lease", EnqueueError)
    run_at = spec.run_at if run_at is None else run_at
    delay = 0.0
    if isinstance(run_at, timedelta):
        delay, run_at = run_at.total_seconds(), None
        if abs(delay) > MAX_DELAY_SECONDS:
            raise EnqueueError(f"run_at timedelta of {delay:.0f} seconds is more than 100 years away")
    elif run_at is not None:
        if not isinstance(run_at, datetime):
            raise EnqueueError(f"run_at must be an aware datetime or a timedelta, got {run_at!r}")
        if run_at.tzinfo is None or run_at.utcoffset() is None:
            raise EnqueueError(
                f"run_at {run_at.isoformat()} is naive; pass an aware datetime "
                "(django.utils.timezone.make_aware) or a timedelta"
            )
        _check_run_at_range(run_at)
    unique_key = spec.unique_key if unique_key is None else unique_key
    unique_scope = unique_scope or spec.unique_scope
    if unique_scope not in ("retained", "active"):
        raise EnqueueError(f"unique_scope must be 'retained' or 'active', got {unique_scope!r}")
    if unique_key is not None:
        _check_name(unique_key, "unique_key", 255)
    if spec.concurrency_limit is not None and (
            isinstance(spec.concurrency_limit, bool) or not isinstance(spec.concurrency_limit, int)
            or not 1 <= spec.concurrency_limit <= MAX_CONCURRENCY_LIMIT):
        raise EnqueueError(f"task {spec.name!r}: concurrency_limit must be an int from 1 to "
                           f"{MAX_CONCURRENCY_LIMIT}, got {spec.concurrency_limit!r}")
    conc_key = None
    if spec.concurrency_key is not None:
        try:
            if callable(spec.concurrency_key):
                conc_key = str(spec.concurrency_key(*args, **kwargs))
            else:
                conc_key = spec.concurrency_key.format(*args, **kwargs)
        except Exception as exc:
            raise EnqueueError(f"task {spec.name!r}: concurrency_key failed on these arguments: {exc!r}")
        _check_name(conc_key, f"task {spec.name!r}: concurrency_key", 255)
    return NewJob(task=spec.name, queue=queue, priority=priority, args_json=args_json, kwargs_json=kwargs_json,
                  max_attempts=attempts, run_at=run_at, delay=delay, lease_seconds=spec.lease,
                  unique_key=unique_key, unique_scope=unique_scope, concurrency_key=conc_key,
                  concurrency_limit=spec.concurrency_limit if conc_key is not None else None)


def enqueue(task_or_name: Task[..., Any] | str, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None, *,
            run_at: datetime | timedelta | None = None, queue: str | None = None, priority: int | None = None,
            unique_key: str | None = None, unique_scope: str | None = None,
            max_attempts: int | None = None) -> Job:
    """Write one job in the caller's transaction and return it.

    The job exists only if the caller's transaction commits (on the job table's database, chosen by
    the database routers); a worker cannot see it before. With a ``unique_key`` already taken, the
    existing job is returned: no IntegrityError, and the caller's transaction is not aborted.

    Args:
        task_or_name: a :class:`Task` or a registered task name.
        args: the handler's positional arguments; they must round-trip through JSON unchanged.
        kwargs: the handler's keyword arguments; the same rule.
        run_at: an aware datetime within 0001-01-02 .. 9999-12-30 in UTC (``registry.RUN_AT_MIN``,
            ``registry.RUN_AT_MAX``), or a timedelta from the database clock of at most 100 years
            either way; default: due now.
        queue: overrides the task's queue.
        priority: overrides the task's priority (-100..100).
        max_attempts: overrides the task's ``max_attempts``.
        unique_key: idempotency key (at most 255 characters).
        unique_scope: ``"retained"`` (default: the key stays taken while the row exists) or
            ``"active"`` (taken while the job is ready or leased).

    Returns:
        The new :class:`~django_leasequeue.models.Job`, or the existing one holding ``unique_key``.

    Raises:
        PayloadNotSerializable: an argument is not JSON (the message names it). Nothing is written.
        ArgumentsMismatch: the arguments do not fit the handler's signature (missing or unexpected).
        PayloadTooLarge: the arguments exceed ``MAX_PAYLOAD_BYTES``.
        EnqueueError: naive ``run_at`` or one outside its range, priority outside -100..100,
            unknown queue, bad unique key. Nothing is written.
        UnknownTask: ``task_or_name`` is a name nobody registered.
        django.db.OperationalError: SQLSTATE 40001 (serialization failure), only when the caller's
            transaction runs at REPEATABLE READ or SERIALIZABLE and another transaction committed
            ``unique_key`` after its snapshot; retry the whole transaction (docs/howto/idempotency.md).
    """
    spec = _resolve_spec(task_or_name)
    new = build_job(spec, args, kwargs, run_at=run_at, queue=queue, priority=priority, unique_key=unique_key,
                    unique_scope=unique_scope, max_attempts=max_attempts)
    return insert_job(new)[0]


def insert_job(new: NewJob) -> tuple[Job, bool]:
    """Insert one job built by :func:`build_job` in the caller's transaction.

    Returns:
        ``(job, created)``: the new job and True, or the job already holding ``new.unique_key``
        and False (then nothing was written and no ``enqueued`` event is sent).

    Raises:
        EnqueueError: the unique key kept changing hands (released and retaken) five times.
    """
    from . import signals, store

    settings = get_settings()
    alias = store.db_alias()
    # A unique key held by a job in "active" scope can be released between our failed insert and
    # the lookup (the job finished); then we insert again. Two rounds are enough in practice.
    for _ in range(5):
        job = store.job_insert_one(new, notify=settings.notify, channel=settings.notify_channel, alias=alias)
        if job is not None:
            if signals.enabled("enqueued"):
                signals.emit("enqueued", job_id=job.id, task=job.task, queue=job.queue, attempt=0, token=0)
            return job, True
        existing = store.job_get_by_unique_key(new.unique_key or "", new.unique_scope, alias=alias)
        if existing is not None:
            return existing, False
    raise EnqueueError(f"unique_key {new.unique_key!r} kept changing hands; try again")


def enqueue_many(task_or_name: Task[..., Any] | str,
                 arg_list: Iterable[Sequence[Any] | tuple[Sequence[Any], Mapping[str, Any]]],
                 **options: Unpack[JobOptions]) -> int:
    """Enqueue many jobs of one task in one INSERT statement (bulk), in the caller's transaction.

    Args:
        arg_list: each item is a list/tuple of positional arguments, or ``(args, kwargs)`` when
            given as a 2-tuple whose second element is a dict.
        options: as for :func:`enqueue` (``run_at``, ``queue``, ``priority``, ``max_attempts``).

    Returns:
        The number of jobs inserted (jobs whose ``unique_key`` was taken are skipped).
    """
    from . import signals, store

    spec = _resolve_spec(task_or_name)
    settings = get_settings()
    pairs = []
    for item in arg_list:
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], Mapping):
            a, kw = item
        else:
            a, kw = item, {}
        if isinstance(a, (str, bytes)) or not isinstance(a, Iterable):
            raise EnqueueError(f"args must be a list or tuple of arguments, got {a!r}")
        pairs.append((list(a), dict(kw)))
    if not pairs:
        return 0
    report = signals.enabled("enqueued")
    if spec.concurrency_key is not None:
        # Per-job concurrency keys: the general path, one NewJob per job.
        jobs = [build_job(spec, a, kw, **options) for a, kw in pairs]
        total = 0
        for start in range(0, len(jobs), 10_000):
            rows = store.job_insert(jobs[start:start + 10_000], notify=settings.notify,
                                    channel=settings.notify_channel)
            total += len(rows)
            if report:
                for job in rows:
                    signals.emit("enqueued", job_id=job.id, task=job.task, queue=job.queue, attempt=0, token=0)
        return total
    # Same task and options for every job: validate the options once, each job's arguments one by
    # one (the same checks as enqueue(), signature included), and send the arguments as one JSON
    # array per chunk. Every chunk is checked before the first is inserted: a bad job writes nothing.
    template = build_job(spec, [], {}, check_signature=False, **options)
    names = _positional_names(enqueue_signature(spec))
    # The payload checks first, then the signature, in build_job()'s order: a job gets the error
    # enqueue() would raise for it (e.g. a keyword name that is not a str cannot be stored).
    chunks = [chunk for start in range(0, len(pairs), 10_000)
              for chunk in _encode_chunks(pairs[start:start + 10_000], start, limit=settings.max_payload_bytes,
                                          names=names)]
    for a, kw in pairs:
        check_arguments_bind(spec, a, kw)
    total = 0
    for args_json, kwargs_json in chunks:
        count, ids = store.job_insert_many(template, args_json, kwargs_json, notify=settings.notify,
                                           channel=settings.notify_channel, want_ids=report)
        total += count
        for job_id in ids:
            signals.emit("enqueued", job_id=job_id, task=template.task, queue=template.queue, attempt=0, token=0)
    return total


# The largest JSON text (in characters) one job_insert_many() statement sends. PostgreSQL refuses a
# jsonb value over 256 MB, and a chunk of 10,000 jobs of up to MAX_PAYLOAD_BYTES each (1 MiB by
# default) can be far larger; numbers also take more room in jsonb than in JSON text. A chunk over
# this is split (the general path sent one text per job, each within the per-job limit).
MAX_CHUNK_CHARS = 16 * 1024 * 1024


def _encode_chunks(pairs: Sequence[tuple[list[Any], dict[str, Any]]], first: int, *, limit: int,
                   names: Sequence[str]) -> list[tuple[str, str | None]]:
    """:func:`encode_payload_many` of ``pairs``, split in halves until each part's JSON is at most
    ``MAX_CHUNK_CHARS`` characters (a single job is never split). Returns the parts in order."""
    args_json, kwargs_json = encode_payload_many(pairs, limit=limit, names=names, first=first)
    if len(pairs) > 1 and len(args_json) + len(kwargs_json or "") > MAX_CHUNK_CHARS:
        half = len(pairs) // 2
        return (_encode_chunks(pairs[:half], first, limit=limit, names=names)
                + _encode_chunks(pairs[half:], first + half, limit=limit, names=names))
    return [(args_json, kwargs_json)]


def encode_payload_many(pairs: Sequence[tuple[list[Any], dict[str, Any]]], *, limit: int,
                        names: Sequence[str] = (), first: int = 0) -> tuple[str, str | None]:
    """Validate many jobs' arguments and encode them as two JSON arrays (for :func:`store.job_insert_many`).

    Every job gets the checks of :func:`encode_payload` (JSON round trip: NUL characters, lone
    surrogates, nesting depth, large floats, str keyword names; the size limit per job).

    Args:
        pairs: ``(args list, kwargs dict)`` per job.
        limit: ``MAX_PAYLOAD_BYTES`` per job (0: no limit).
        names: the handler's positional parameter names, to name a bad positional argument (as
            :func:`encode_payload`).
        first: the index of ``pairs[0]`` in the caller's whole list (for the messages).

    Returns:
        ``(args array JSON, kwargs array JSON or None when no job has keyword arguments)``.

    Raises:
        PayloadNotSerializable, PayloadTooLarge: as :func:`encode_payload`, naming the job's index.
    """
    any_kwargs = False
    for i, (a, kw) in enumerate(pairs, first):
        for n, value in enumerate(a):
            check_json(value, f"job {i} argument {names[n]!r}" if n < len(names) else f"job {i} args[{n}]")
        if kw:
            any_kwargs = True
            for key, value in kw.items():
                if not isinstance(key, str):
                    raise PayloadNotSerializable(f"job {i} keyword argument name {key!r} is not a str")
                _check_text(key, f"job {i} keyword argument name {key!r}")
                check_json(value, f"job {i} keyword argument {key!r}")
    dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
    args_json = dumps([a for a, _ in pairs])
    kwargs_json = dumps([kw for _, kw in pairs]) if any_kwargs else None
    # The arrays are at least as long as their largest element (each empty kwargs counts as "{}").
    if limit and len(args_json.encode()) + (len(kwargs_json.encode()) if kwargs_json else 2 * len(pairs)) > limit:
        # The whole chunk is over one job's limit: find the job that is (most chunks never get here).
        for i, (a, kw) in enumerate(pairs, first):
            size = len(dumps(a).encode()) + len(dumps(kw).encode())
            if size > limit:
                raise PayloadTooLarge(
                    f"job {i}: arguments are {size} bytes, over LEASEQUEUE['MAX_PAYLOAD_BYTES'] = {limit}; "
                    "store large data in a table and pass its id"
                )
    return args_json, kwargs_json


def enqueue_on_commit(task_or_name: Task[..., Any] | str, args: Sequence[Any] = (),
                      kwargs: Mapping[str, Any] | None = None, **options: Unpack[JobOptions]) -> None:
    """Enqueue when the current transaction commits (``transaction.on_commit``); same arguments as
    :func:`enqueue`.

    The arguments are validated and encoded now, so a bad argument raises here, not after the
    commit, and changing the argument objects after this call does not change the job. An error
    in the deferred enqueue is not swallowed: Django raises it from the commit (``robust=False``).
    Outside a transaction the job is enqueued at once.
    """
    from django.db import transaction

    from . import store

    spec = _resolve_spec(task_or_name)
    new = build_job(spec, args, kwargs, **options)  # validate and snapshot the arguments now
    transaction.on_commit(lambda: insert_job(new), using=store.db_alias())


def json_dumps_result(value: Any) -> str:
    """Encode a handler's return value for storage; raise PayloadNotSerializable if it is not JSON."""
    check_json(value, "return value", exact_scalars=False)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
