"""Enqueueing: ``@task``, :func:`enqueue`, :func:`enqueue_many`, :func:`enqueue_on_commit`.

The one way a job row is written. :func:`build_job` validates the values (with
:mod:`django_leasequeue.arguments`) and returns a :class:`~django_leasequeue.store.NewJob`;
:func:`insert_job` and :func:`insert_jobs` (one row, many rows) and :func:`enqueue_many` (one task,
many arguments) call the store's insert statements and send the ``enqueued`` event for every row
written, here and nowhere else. ``enqueue()``, ``enqueue_on_commit()``, the scheduler, the admin's
"run schedule now" and the Django tasks backend all go through them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Concatenate, Literal, Unpack, overload

from . import signals, tracing
from .arguments import (
    MAX_CONCURRENCY_LIMIT,
    JobOptions,
    check_lease,
    check_max_attempts,
    check_name,
    check_priority,
    check_task_options,
    check_unique_mode,
    check_unique_scope,
    run_at_delay,
    seconds_option,
    throttle_key,
)
from .conf import Settings, get_settings, parse_rate, queue_name_problem
from .dependents import dependency_id, insert_dependent
from .exceptions import ConfigurationError, EnqueueError
from .payload import check_arguments_bind, encode_chunks, encode_payload, enqueue_signature, positional_names
from .registry import P, R, TaskSpec, register_task, resolve_task
from .retry import BackoffLike, ExceptionClasses, check_retry_options

if TYPE_CHECKING:
    from .context import JobContext
    from .models import Job
    from .steps import Step
    from .store import NewJob

__all__ = ["Task", "build_job", "enqueue", "enqueue_many", "enqueue_on_commit", "insert_job", "insert_jobs",
           "split_arg_item", "task"]

# The store (and with it the models) is imported inside the functions below, not here: ``@task``
# runs in modules imported while Django loads its apps (an app's models module, the tasks backend),
# when importing models would raise AppRegistryNotReady.


class Task(TaskSpec[P, R]):
    """What ``@task`` returns: a :class:`~django_leasequeue.registry.TaskSpec` that enqueues.

    ``enqueue()`` writes a job in the caller's transaction, ``enqueue_on_commit()`` when it
    commits; ``using()`` returns a copy with other options; calling the object calls the handler
    in-process (no queue). Typed as ``Task[P, R]``: see :class:`~django_leasequeue.registry.TaskSpec`.
    """

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Enqueue one job of this task in the caller's transaction. See :func:`enqueue`."""
        return enqueue(self, args, kwargs)

    def enqueue_on_commit(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Enqueue one job when the current transaction commits. See :func:`enqueue_on_commit`."""
        enqueue_on_commit(self, args, kwargs)

    def step(self, *args: P.args, **kwargs: P.kwargs) -> Step:
        """A :class:`~django_leasequeue.steps.Step` of this task with these arguments, for a chain,
        group, chord, batch or workflow (:mod:`django_leasequeue.workflows`); nothing is written.

        Args:
            *args: the handler's positional arguments (JSON values). A step that receives its
                dependencies' results (``pass_result``) leaves out the first one, which the
                database fills in when it releases the step.
            **kwargs: the handler's keyword arguments (JSON values). Both are checked when the
                workflow is built (``Workflow.enqueue()``, ``BatchHandle.add()``), with the
                checks of :func:`enqueue`.

        Returns:
            A new :class:`~django_leasequeue.steps.Step` (Celery's signature, ``.s()``);
            ``step.set(...)`` returns a copy with other options.
        """
        from .steps import Step

        return Step(self, tuple(args), dict(kwargs))

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
         concurrency_limit: int | None = None, retry_on: ExceptionClasses | None = None,
         discard_on: ExceptionClasses | None = None,
         sequence_key: str | Callable[..., str] | None = None,
         sequence_on_dead: Literal["halt", "continue"] = "halt",
         rate_key: str | Callable[..., str] | None = None, rate_limit: str | None = None,
         fair_key: str | Callable[..., str] | None = None) -> Callable[[Callable[P, R]], Task[P, R]]: ...


@overload
def task(func: None = None, *, name: str | None = None, queue: str | None = None, priority: int = 0,
         max_attempts: int | None = None, backoff: BackoffLike | None = None, lease: float | timedelta | None = None,
         timeout: float | timedelta | None = None, takes_context: Literal[True], manual_heartbeat: bool = False,
         concurrency_key: str | Callable[..., str] | None = None,
         concurrency_limit: int | None = None, retry_on: ExceptionClasses | None = None,
         discard_on: ExceptionClasses | None = None,
         sequence_key: str | Callable[..., str] | None = None,
         sequence_on_dead: Literal["halt", "continue"] = "halt",
         rate_key: str | Callable[..., str] | None = None, rate_limit: str | None = None,
         fair_key: str | Callable[..., str] | None = None
         ) -> Callable[[Callable[Concatenate[JobContext, P], R]], Task[P, R]]: ...


@overload
def task(func: None = None, *, name: str | None = None, queue: str | None = None, priority: int = 0,
         max_attempts: int | None = None, backoff: BackoffLike | None = None, lease: float | timedelta | None = None,
         timeout: float | timedelta | None = None, takes_context: bool, manual_heartbeat: bool = False,
         concurrency_key: str | Callable[..., str] | None = None,
         concurrency_limit: int | None = None, retry_on: ExceptionClasses | None = None,
         discard_on: ExceptionClasses | None = None,
         sequence_key: str | Callable[..., str] | None = None,
         sequence_on_dead: Literal["halt", "continue"] = "halt",
         rate_key: str | Callable[..., str] | None = None, rate_limit: str | None = None,
         fair_key: str | Callable[..., str] | None = None) -> Callable[[Callable[..., R]], Task[..., R]]: ...


def task(func: Callable[..., Any] | None = None, *, name: str | None = None, queue: str | None = None,
         priority: int = 0, max_attempts: int | None = None, backoff: BackoffLike | None = None,
         lease: float | timedelta | None = None, timeout: float | timedelta | None = None,
         takes_context: bool = False, manual_heartbeat: bool = False,
         concurrency_key: str | Callable[..., str] | None = None,
         concurrency_limit: int | None = None, retry_on: ExceptionClasses | None = None,
         discard_on: ExceptionClasses | None = None,
         sequence_key: str | Callable[..., str] | None = None,
         sequence_on_dead: Literal["halt", "continue"] = "halt",
         rate_key: str | Callable[..., str] | None = None, rate_limit: str | None = None,
         fair_key: str | Callable[..., str] | None = None
         ) -> Task[..., Any] | Callable[[Callable[..., Any]], Task[..., Any]]:
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
        backoff: a :class:`~django_leasequeue.retry.Backoff`, base seconds, ``attempt -> seconds``
            or ``(attempt, exc) -> seconds | None`` (told apart by the callable's signature; None
            returned means the settings' delay); None means the ``BACKOFF_*`` settings.
        lease: lease length, seconds (int or float) or a ``datetime.timedelta``; None means the
            worker's default (``LEASE``).
        timeout: how long one attempt may run, seconds (int or float) or a ``datetime.timedelta``;
            past it the attempt fails as ``JobTimedOut`` (see :class:`Task`). None: no timeout.
        takes_context: pass the :class:`~django_leasequeue.context.JobContext` as first argument.
        manual_heartbeat: renew the lease only when the handler calls ``context.heartbeat()``.
        concurrency_key: a ``str.format`` template over the arguments, or a callable taking them.
        concurrency_limit: at most this many jobs of one ``concurrency_key`` are leased at once.
        retry_on: an exception class or a tuple of them; when given, only a failure raising one of
            them (``isinstance``) is retried, any other is dead-lettered at once ("not_retryable").
        discard_on: an exception class or a tuple of them; a failure raising one is dead-lettered
            at once ("discarded"), without spending the remaining attempts. It wins over
            ``retry_on`` when both match.
        sequence_key: a ``str.format`` template over the arguments, or a callable taking them
            (returning a str of at most 255 characters): jobs with the same key, of any task, run
            one at a time, in enqueue order, across all workers. None: no sequence.
        sequence_on_dead: what a dead job of the sequence does to the jobs behind it: ``"halt"``
            (default: they wait until an operator replays or skips the dead job) or ``"continue"``
            (the next one may start).
        rate_key: a ``str.format`` template over the arguments, or a callable taking them (as
            ``concurrency_key``); goes with ``rate_limit``.
        rate_limit: ``"N/s"``, ``"N/m"`` or ``"N/h"``: at most N jobs of one ``rate_key`` are
            claimed in any window of a second, minute or hour, across all workers.
        fair_key: a template or callable as ``concurrency_key``: in a queue with
            ``LEASEQUEUE["QUEUES"][name]["fair"] = True`` the claim takes jobs round-robin across
            these keys. None: the job's concurrency key (if the task has one).

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
                           queue=queue, takes_context=takes_context, manual_heartbeat=manual_heartbeat,
                           rate_key=rate_key, rate_limit=rate_limit, fair_key=fair_key)
        retry_classes, discard_classes = check_retry_options(task_name, retry_on, discard_on)
        check_sequence_options(task_name, sequence_key, sequence_on_dead)
        registered: Task[..., Any] = Task(
            func=fn, name=task_name, queue=queue, priority=priority, max_attempts=max_attempts, backoff=backoff,
            lease=lease_s, timeout=timeout_s, takes_context=takes_context, manual_heartbeat=manual_heartbeat,
            concurrency_key=concurrency_key, concurrency_limit=concurrency_limit,
            retry_on=retry_classes, discard_on=discard_classes,
            sequence_key=sequence_key, sequence_on_dead=sequence_on_dead,
            rate_key=rate_key,
            rate_limit=None if rate_limit is None else parse_rate(rate_limit, f"task {task_name!r}: rate_limit"),
            fair_key=fair_key,
        )
        register_task(registered)
        return registered

    return register(func) if func is not None else register


def _template_hint(key_option: Any, exc: Exception) -> str:
    """A hint for a key template that names an argument the call did not pass by that name: a
    template is formatted with the call's own arguments, positional ones by index."""
    if isinstance(key_option, str) and isinstance(exc, KeyError | IndexError):
        return (" (a key template is formatted with the enqueue's own arguments: keyword arguments by "
                "name, positional ones by index, '{0}' for the first; pass the argument by name or use "
                "a callable)")
    return ""


#: The values of ``@task(sequence_on_dead=...)``.
SEQUENCE_ON_DEAD = ("halt", "continue")


def check_sequence_options(task_name: str, sequence_key: Any, sequence_on_dead: Any) -> None:
    """Validate a task's sequence options at declaration.

    Args:
        task_name: the task, for the message.
        sequence_key: None, a non-empty ``str.format`` template or a callable.
        sequence_on_dead: ``"halt"`` or ``"continue"``.

    Raises:
        ConfigurationError: naming the task and the bad option.
    """
    if sequence_key is not None and not callable(sequence_key) and (
            not isinstance(sequence_key, str) or not sequence_key):
        raise ConfigurationError(f"task {task_name!r}: sequence_key must be a non-empty str.format template or a "
                                 f"callable, got {sequence_key!r}")
    if sequence_on_dead not in SEQUENCE_ON_DEAD:
        raise ConfigurationError(f"task {task_name!r}: sequence_on_dead must be 'halt' or 'continue', "
                                 f"got {sequence_on_dead!r}")


def build_job(task_spec: TaskSpec[..., Any], args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None, *,
              run_at: datetime | timedelta | None = None, queue: str | None = None,
              priority: int | None = None, unique_key: str | None = None, unique_scope: str | None = None,
              max_attempts: int | None = None, check_signature: bool = True, schedule_id: int | None = None,
              occurrence_at: datetime | None = None, unique_mode: str | None = None,
              debounce: float | timedelta | None = None, debounce_max_wait: float | timedelta | None = None,
              throttle: float | timedelta | None = None) -> NewJob:
    """Validate enqueue arguments against the settings and return a :class:`store.NewJob`.

    Args:
        task_spec: the task; its options are the defaults of the ones below.
        args, kwargs, run_at, queue, priority, unique_key, unique_scope, max_attempts: see
            :func:`enqueue`.
        check_signature: refuse arguments that do not bind to the handler's signature
            (:class:`ArgumentsMismatch`). The scheduler passes False: its jobs are emitted even for
            tasks this process does not know (a rolling deploy), so its signature may be stale.
        schedule_id: the schedule the job is emitted for (the scheduler, the admin's "run now").
        occurrence_at: the cron occurrence (an aware datetime) the job stands for (the scheduler).
        unique_mode, debounce, debounce_max_wait, throttle: see :func:`enqueue`; each None means
            the task's (``using()``).

    Returns:
        The row to insert (:func:`insert_job`, :func:`insert_jobs`); nothing is written yet.

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
                                            names=positional_names(enqueue_signature(task_spec)))
    if check_signature:
        check_arguments_bind(task_spec, args, kwargs)
    check_name(task_spec.name, "task name", 255)
    queue = queue or task_spec.queue or settings.default_queue
    problem = queue_name_problem(queue, "queue")
    if problem:
        raise EnqueueError(problem)
    if not settings.queue_allowed(queue):
        raise EnqueueError(f"unknown queue {queue!r}; LEASEQUEUE['QUEUES'] allows {sorted(settings.queues or [])}")
    priority = task_spec.priority if priority is None else priority
    check_priority(priority)
    # "is None", not "or": an explicit max_attempts=0 is an error, not a request for the default.
    attempts = max_attempts if max_attempts is not None else (task_spec.max_attempts or settings.max_attempts)
    check_max_attempts(attempts)
    check_lease(task_spec.lease, f"task {task_spec.name!r}: lease", EnqueueError)
    run_at_given = run_at is not None or task_spec.run_at is not None  # debounce refuses a run_at
    delay, run_at = run_at_delay(task_spec.run_at if run_at is None else run_at)
    unique_key = task_spec.unique_key if unique_key is None else unique_key
    unique_scope = unique_scope or task_spec.unique_scope
    check_unique_scope(unique_scope)
    if unique_key is not None:
        check_name(unique_key, "unique_key", 255)
    unique_mode = task_spec.unique_mode if unique_mode is None else unique_mode
    debounce = task_spec.debounce if debounce is None else debounce
    debounce_max_wait = task_spec.debounce_max_wait if debounce_max_wait is None else debounce_max_wait
    throttle = task_spec.throttle if throttle is None else throttle
    max_wait_s = throttle_s = None
    # The default ("keep", no mode option) skips the mode checks: enqueue() is benchmarked.
    if unique_mode != "keep" or debounce is not None or debounce_max_wait is not None or throttle is not None:
        debounce_s, max_wait_s, throttle_s = check_unique_mode(
            unique_mode, unique_key=unique_key, unique_scope=unique_scope, run_at_given=run_at_given,
            debounce=debounce, debounce_max_wait=debounce_max_wait, throttle=throttle)
        if debounce_s is not None:
            delay = debounce_s  # the first enqueue of the key: due at now + debounce
    if task_spec.concurrency_limit is not None and (
            isinstance(task_spec.concurrency_limit, bool) or not isinstance(task_spec.concurrency_limit, int)
            or not 1 <= task_spec.concurrency_limit <= MAX_CONCURRENCY_LIMIT):
        raise EnqueueError(f"task {task_spec.name!r}: concurrency_limit must be an int from 1 to "
                           f"{MAX_CONCURRENCY_LIMIT}, got {task_spec.concurrency_limit!r}")
    conc_key = _job_key(task_spec, "concurrency_key", args, kwargs)
    seq_key = _job_key(task_spec, "sequence_key", args, kwargs)
    rate = task_spec.rate_limit
    rate_key = _job_key(task_spec, "rate_key", args, kwargs) if rate is not None else None
    fair_key = _job_key(task_spec, "fair_key", args, kwargs)
    return NewJob(task=task_spec.name, queue=queue, priority=priority, args_json=args_json, kwargs_json=kwargs_json,
                  max_attempts=attempts, run_at=run_at, delay=delay, lease_seconds=task_spec.lease,
                  unique_key=unique_key, unique_scope=unique_scope, concurrency_key=conc_key,
                  concurrency_limit=task_spec.concurrency_limit if conc_key is not None else None,
                  schedule_id=schedule_id, occurrence_at=occurrence_at, unique_mode=unique_mode,
                  debounce_max_wait=max_wait_s, throttle=throttle_s, sequence_key=seq_key,
                  sequence_halts=seq_key is not None and task_spec.sequence_on_dead == "halt",
                  rate_key=rate_key, rate_limit_n=rate.limit if rate is not None and rate_key is not None else None,
                  rate_limit_secs=rate.per if rate is not None and rate_key is not None else None,
                  fair_key=fair_key if fair_key is not None else conc_key)


def _job_key(task_spec: TaskSpec[..., Any], option: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
    """The value of a per-job key option (``concurrency_key``, ``sequence_key``, ``rate_key``,
    ``fair_key``) for these arguments: the
    template formatted with them, or the callable's result as a str; None when the task has none.

    Raises:
        EnqueueError: the template or callable fails on these arguments, or the key is empty,
            longer than 255 characters or holds a NUL.
    """
    spec = getattr(task_spec, option)
    if spec is None:
        return None
    try:
        key = str(spec(*args, **kwargs)) if callable(spec) else spec.format(*args, **kwargs)
    except Exception as exc:
        raise EnqueueError(f"task {task_spec.name!r}: {option} failed on these arguments: {exc!r}"
                           f"{_template_hint(spec, exc)}") from None
    check_name(key, f"task {task_spec.name!r}: {option}", 255)
    return key


def enqueue(task_or_name: TaskSpec[..., Any] | str, args: Sequence[Any] = (),
            kwargs: Mapping[str, Any] | None = None, *,
            run_at: datetime | timedelta | None = None, queue: str | None = None, priority: int | None = None,
            unique_key: str | None = None, unique_scope: str | None = None,
            max_attempts: int | None = None, unique_mode: str | None = None,
            debounce: float | timedelta | None = None, debounce_max_wait: float | timedelta | None = None,
            throttle: float | timedelta | None = None, depends_on: Iterable[int | Job] = (),
            on_dependency_dead: str = "hold") -> Job:
    """Write one job in the caller's transaction and return it.

    The job exists only if the caller's transaction commits (on the job table's database, chosen by
    the database routers); a worker cannot see it before. With a ``unique_key`` already taken, the
    existing job is returned (``unique_mode="keep"``, the default), or the pending job holding the key
    is updated (``"replace"``, ``"debounce"``): no IntegrityError, and the caller's transaction is not
    aborted. docs/howto/idempotency.md gives each mode's exact rule.

    Args:
        task_or_name: a :class:`Task` or a registered task name.
        args: the handler's positional arguments; they must round-trip through JSON unchanged.
        kwargs: the handler's keyword arguments; the same rule.
        run_at: an aware datetime within 0001-01-02 .. 9999-12-30 in UTC (``arguments.RUN_AT_MIN``,
            ``arguments.RUN_AT_MAX``), or a timedelta from the database clock of at most 100 years
            either way; default: due now.
        queue: overrides the task's queue.
        priority: overrides the task's priority (-100..100).
        max_attempts: overrides the task's ``max_attempts``.
        unique_key: idempotency key (at most 255 characters).
        unique_scope: ``"retained"`` (default: the key stays taken while the row exists) or
            ``"active"`` (taken while the job is ready or leased).
        unique_mode: what to do when ``unique_key`` is taken. ``"keep"`` (default): return the
            holder. ``"replace"``: if the holder is pending (ready, never claimed, same task, no
            cancel request) it takes this enqueue's arguments, run_at, priority, queue,
            max_attempts and lease, and is returned; else the holder is returned unchanged.
            ``"debounce"``: as replace, with run_at = now + ``debounce``, but never later than the
            holder's created_at + ``debounce_max_wait``. ``"throttle"``: at most one job per
            ``throttle``-second window; the key is stored as ``"<key>@<window start>Z"``.
        debounce: seconds (number or timedelta, > 0) from each enqueue to run_at; ``"debounce"`` only.
        debounce_max_wait: seconds (>= ``debounce``) from the first enqueue of the pending job
            past which run_at is no longer pushed; None: no bound. ``"debounce"`` only.
        throttle: the window, a whole number of seconds >= 1; ``"throttle"`` only.
        depends_on: existing jobs (ids or :class:`~django_leasequeue.models.Job` objects) this one
            waits for: it is ``waiting`` (never claimed) until every one of them is done, and is
            released by the database in the transaction that completes the last
            (docs/howto/workflows.md). Their rows are locked until the caller commits. Not with
            ``unique_key``.
        on_dependency_dead: with ``depends_on``, what this job does when a dependency ends dead
            or cancelled: ``"hold"`` (wait until it is replayed and done), ``"cancel"`` or ``"run"``.

    Returns:
        The new :class:`~django_leasequeue.models.Job`, or the existing one holding ``unique_key``.

    Raises:
        PayloadNotSerializable: an argument is not JSON (the message names it). Nothing is written.
        ArgumentsMismatch: the arguments do not fit the handler's signature (missing or unexpected).
        PayloadTooLarge: the arguments exceed ``MAX_PAYLOAD_BYTES``.
        EnqueueError: naive ``run_at`` or one outside its range, priority outside -100..100,
            unknown queue, bad unique key, a bad unique mode or mode option (see
            :func:`~django_leasequeue.arguments.check_unique_mode`). Nothing is written.
        UnknownTask: ``task_or_name`` is a name nobody registered.
        django.db.OperationalError: SQLSTATE 40001 (serialization failure), only when the caller's
            transaction runs at REPEATABLE READ or SERIALIZABLE and another transaction committed
            ``unique_key`` after its snapshot; retry the whole transaction (docs/howto/idempotency.md).
    """
    task_spec = resolve_task(task_or_name)
    new = build_job(task_spec, args, kwargs, run_at=run_at, queue=queue, priority=priority, unique_key=unique_key,
                    unique_scope=unique_scope, max_attempts=max_attempts, unique_mode=unique_mode,
                    debounce=debounce, debounce_max_wait=debounce_max_wait, throttle=throttle)
    if isinstance(depends_on, (str, bytes)) or not isinstance(depends_on, Iterable):
        raise EnqueueError(f"depends_on must be a list of job ids or Job objects, got {depends_on!r}")
    dependency_ids = [dependency_id(dep) for dep in depends_on]
    if dependency_ids or on_dependency_dead != "hold":
        return insert_dependent(new, dependency_ids, on_dependency_dead)
    return insert_job(new)[0]


def insert_job(new: NewJob, *, now: datetime | None = None) -> tuple[Job, bool]:
    """Insert one job built by :func:`build_job` in the caller's transaction.

    Args:
        new: the job.
        now: the database clock reading to use (an aware datetime; tests); None: read it.

    Returns:
        ``(job, created)``: the new job and True, or the job already holding ``new.unique_key``
        and False (then no row was inserted and no ``enqueued`` event is sent; with
        ``unique_mode`` "replace" or "debounce" that job may be the holder with the new values).

    Raises:
        EnqueueError: the unique key kept changing hands (released and retaken) five times.
    """
    from . import store

    settings = get_settings()
    alias = store.db_alias()
    if new.unique_mode == "throttle":
        # One clock reading decides the window and stamps created_at, so the job lies in its window.
        now = now or store.db_now(alias)
        new = dataclasses.replace(new, unique_key=throttle_key(new.unique_key or "", new.throttle or 1, now))
    with tracing.send_span(new.queue, new.task) as sending:
        job, created = _insert_one(new, now, alias, settings, sending.carrier)
        sending.sent([job.id], created=created)
    return job, created


def _insert_one(new: NewJob, now: datetime | None, alias: str, settings: Settings,
                trace_context: Mapping[str, str] | None) -> tuple[Job, bool]:
    """:func:`insert_job`'s statements, with the trace context of its send span (or None)."""
    from . import store

    # A unique key held by a job in "active" scope can be released between our failed insert and
    # the lookup (the job finished); then we insert again. Two rounds are enough in practice.
    for _ in range(5):
        if new.unique_mode in ("replace", "debounce"):
            replaced = store.job_insert_replacing(new, notify=settings.notify, channel=settings.notify_channel,
                                                  now=now, alias=alias, trace_context=trace_context)
            if replaced is not None:
                if replaced[1] and signals.enabled("enqueued"):
                    signals.announce_enqueued(replaced[0].id, replaced[0].task, replaced[0].queue)
                return replaced
            job = None
        else:
            job = store.job_insert_one(new, notify=settings.notify, channel=settings.notify_channel, now=now,
                                       alias=alias, trace_context=trace_context)
        if job is not None:
            if signals.enabled("enqueued"):
                signals.announce_enqueued(job.id, job.task, job.queue)
            return job, True
        existing = store.job_get_by_unique_key(new.unique_key or "", new.unique_scope, alias=alias)
        if existing is not None:
            return existing, False
    raise EnqueueError(f"unique_key {new.unique_key!r} kept changing hands; try again")

def insert_jobs(new_jobs: Sequence[NewJob], *, now: datetime | None = None, alias: str | None = None,
                event_fields: Callable[[Job], Mapping[str, Any]] | None = None,
                settings: Settings | None = None) -> list[Job]:
    """Insert jobs built by :func:`build_job` in one statement, in the caller's transaction.

    Args:
        new_jobs: the rows to write (at most a few thousand per call: one statement).
        now: the database clock reading to stamp them with (the scheduler's tick); None: read it.
        alias: the database alias; None: the job table's.
        event_fields: extra fields of each job's ``enqueued`` event (the scheduler's schedule name
            and occurrence), or None.
        settings: whose ``NOTIFY`` and ``NOTIFY_CHANNEL`` wake the workers (the scheduler's own);
            None: the project's.

    Returns:
        The inserted jobs; a job whose ``unique_key`` is taken is skipped (not returned, no event).
    """
    from . import store

    for new in new_jobs:
        if new.unique_mode != "keep":
            raise EnqueueError(f"unique_mode={new.unique_mode!r} is for one job at a time (enqueue()); "
                               "a bulk insert only keeps the holder of a taken key")
    settings = settings or get_settings()
    if not new_jobs:
        return []
    queues = {new.queue for new in new_jobs}
    tasks = {new.task for new in new_jobs}
    with tracing.send_span(next(iter(queues)) if len(queues) == 1 else None,
                           next(iter(tasks)) if len(tasks) == 1 else None, batch=True) as sending:
        rows = store.job_insert(new_jobs, notify=settings.notify, channel=settings.notify_channel, now=now,
                                alias=alias, trace_context=sending.carrier)
        sending.sent([job.id for job in rows])
    if rows and signals.enabled("enqueued"):
        for job in rows:
            signals.announce_enqueued(job.id, job.task, job.queue, **(event_fields(job) if event_fields else {}))
    return rows

def split_arg_item(item: Sequence[Any] | tuple[Sequence[Any], Mapping[str, Any]]) -> tuple[list[Any], dict[str, Any]]:
    """One item of a bulk enqueue's ``arg_list`` as ``(args, kwargs)``: a list/tuple of positional
    arguments, or ``(args, kwargs)`` when it is a 2-tuple whose second element is a dict.

    Raises:
        EnqueueError: the positional arguments are a str, bytes or not iterable.
    """
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], Mapping):
        args, kwargs = item
    else:
        args, kwargs = item, {}
    if isinstance(args, (str, bytes)) or not isinstance(args, Iterable):
        raise EnqueueError(f"args must be a list or tuple of arguments, got {args!r}")
    return list(args), dict(kwargs)


def enqueue_many(task_or_name: TaskSpec[..., Any] | str,
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
    from . import store

    task_spec = resolve_task(task_or_name)
    settings = get_settings()
    pairs = [split_arg_item(item) for item in arg_list]
    if not pairs:
        return 0
    report = signals.enabled("enqueued")
    if (task_spec.concurrency_key is not None or task_spec.sequence_key is not None
            or task_spec.rate_key is not None or task_spec.fair_key is not None):
        # Per-job concurrency, sequence, rate or fair keys: the general path, one NewJob per job.
        jobs = [build_job(task_spec, a, kw, **options) for a, kw in pairs]
        return sum(len(insert_jobs(jobs[start:start + 10_000])) for start in range(0, len(jobs), 10_000))
    # Same task and options for every job: validate the options once, each job's arguments one by
    # one (the same checks as enqueue(), signature included), and send the arguments as one JSON
    # array per chunk. Every chunk is checked before the first is inserted: a bad job writes nothing.
    template = build_job(task_spec, [], {}, check_signature=False, **options)
    if template.unique_mode != "keep":
        raise EnqueueError(f"enqueue_many() does not take unique_mode={template.unique_mode!r}: its jobs share "
                           "one unique key, so only the first could be inserted; call enqueue() per job")
    names = positional_names(enqueue_signature(task_spec))
    # The payload checks first, then the signature, in build_job()'s order: a job gets the error
    # enqueue() would raise for it (e.g. a keyword name that is not a str cannot be stored).
    chunks = [chunk for start in range(0, len(pairs), 10_000)
              for chunk in encode_chunks(pairs[start:start + 10_000], start, limit=settings.max_payload_bytes,
                                          names=names)]
    for a, kw in pairs:
        check_arguments_bind(task_spec, a, kw)
    total = 0
    with tracing.send_span(template.queue, template.task, batch=True) as sending:
        for args_json, kwargs_json in chunks:
            count, ids = store.job_insert_many(template, args_json, kwargs_json, notify=settings.notify,
                                               channel=settings.notify_channel, want_ids=report,
                                               trace_context=sending.carrier)
            total += count
            for job_id in ids:
                signals.announce_enqueued(job_id, template.task, template.queue)
        sending.sent(count=total)
    return total


def enqueue_on_commit(task_or_name: TaskSpec[..., Any] | str, args: Sequence[Any] = (),
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

    task_spec = resolve_task(task_or_name)
    new = build_job(task_spec, args, kwargs, **options)  # validate and snapshot the arguments now
    # The send span opens at the commit, as a child of the span current now (the request's).
    transaction.on_commit(tracing.bind_current_context(lambda: insert_job(new)), using=store.db_alias())

