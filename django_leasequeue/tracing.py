"""OpenTelemetry traces of jobs (the optional ``otel`` extra, built on ``opentelemetry-api``).

An enqueue opens a PRODUCER span ``send <queue>`` and writes its W3C trace context (the
``traceparent`` and ``tracestate`` the propagation API injects) into the job's ``trace_context``
column, in the INSERT itself. Every attempt of the job runs in a CONSUMER span ``process <queue>``
that links to that context, so that a retry gives a second process span linked to the same send
span; the handler's own spans nest under the process span. Attributes follow the messaging
semantic conventions (``messaging.system`` is ``"leasequeue"``), with the job's task, attempt and
fencing token under ``messaging.leasequeue.*``.

Tracing is off, and costs one ``isinstance`` per enqueue and per attempt, when the API is not
installed or no tracer provider is configured (the API's default proxy or no-op provider): nothing
is opened and ``trace_context`` stays NULL. A project turns it on by installing an SDK provider
(``opentelemetry.trace.set_tracer_provider``) in every process that enqueues or works, or gives
one to this module alone with :func:`set_tracer_provider` (docs/reference/monitoring.md).

The store only takes and returns the carrier dict; the spans are opened here, by the services
(:mod:`django_leasequeue.enqueueing`, :mod:`django_leasequeue.dependents`,
:mod:`django_leasequeue.executor`, :mod:`django_leasequeue.child`).
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, TypeVar

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the otel extra is not installed: tracing is off
    trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from .context import JobContext
    from .store import ClaimedJob

__all__ = ["SYSTEM", "attempt_ended", "attempt_failed", "bind_current_context", "carrier_of_current_span",
           "enabled", "process_span", "run_in_carrier", "send_span", "set_tracer_provider"]

T = TypeVar("T")

#: ``messaging.system`` of every span.
SYSTEM = "leasequeue"
# The key of the attempt's process span in ``JobContext.attempt_data``.
_SPAN_KEY = "leasequeue.tracing.span"
# Only the W3C trace context travels with a job: the stored column holds what a worker needs to
# link its span, never the caller's baggage (whatever the project's global propagators are).
_PROPAGATOR = TraceContextTextMapPropagator() if trace is not None else None

_provider: TracerProvider | None = None  # set_tracer_provider(); None: the global provider
_cached: tuple[Any, Tracer] | None = None  # (provider, its tracer): one get_tracer() per provider


def set_tracer_provider(provider: TracerProvider | None) -> None:
    """Trace with ``provider`` rather than OpenTelemetry's global tracer provider.

    Args:
        provider: an SDK ``TracerProvider`` (or any provider), or None to use the global one again.
    """
    global _provider
    _provider = provider


def _tracer() -> Tracer | None:
    """This package's tracer, or None when tracing is off (the API is not installed, or the provider
    is the API's default proxy, which nothing was installed behind, or its no-op provider)."""
    global _cached
    if trace is None:
        return None
    provider = _provider if _provider is not None else trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    cached = _cached
    if cached is not None and cached[0] is provider:
        return cached[1]
    try:
        version: str | None = importlib.metadata.version("django-leasequeue")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that is not installed
        version = None
    tracer = provider.get_tracer("django_leasequeue", version)
    _cached = (provider, tracer)
    return tracer


def enabled() -> bool:
    """Whether enqueues and attempts are traced now (see the module's docstring)."""
    return _tracer() is not None


def _carrier(trace_context: Any) -> dict[str, str] | None:
    """A stored ``trace_context`` as a propagation carrier, or None when it is not a JSON object of
    strings (NULL, or a row written by hand): the attempt is then traced without a link."""
    if not isinstance(trace_context, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in trace_context.items()):
        return None
    return trace_context


class Sending:
    """The ``send`` span of one enqueue call, while its INSERT runs.

    Attributes:
        carrier (dict[str, str] | None): the span's W3C trace context (``traceparent``, and
            ``tracestate`` when there is one), to store with the jobs; None when tracing is off.
    """

    def __init__(self, span: Span | None = None, carrier: dict[str, str] | None = None, batch: bool = False) -> None:
        self._span = span
        self._batch = batch
        self.carrier = carrier

    def sent(self, job_ids: Iterable[int] = (), *, count: int | None = None, created: bool = True) -> None:
        """Record what the INSERT wrote: ``messaging.message.id`` of a single job, the count
        (``messaging.batch.message_count``) of a batch, and ``messaging.leasequeue.duplicate`` when
        a taken unique key returned the job holding it instead (``created`` False).

        Args:
            job_ids: the ids of the jobs the call returns.
            count: a batch's number of jobs inserted, when its ids are not at hand.
            created: False when no row was inserted (the unique key's holder was returned).
        """
        span = self._span
        if span is None:
            return
        ids = list(job_ids)
        if self._batch:
            span.set_attribute("messaging.batch.message_count", len(ids) if count is None else count)
        elif ids:
            span.set_attribute("messaging.message.id", str(ids[0]))
        if not created:
            span.set_attribute("messaging.leasequeue.duplicate", True)


_NOT_SENDING = Sending()


@contextmanager
def _send(tracer: Tracer, queue: str | None, task: str | None, batch: bool) -> Iterator[Sending]:
    attributes: dict[str, str] = {"messaging.system": SYSTEM, "messaging.operation.type": "send",
                                  "messaging.operation.name": "send"}
    if queue is not None:
        attributes["messaging.destination.name"] = queue
    if task is not None:
        attributes["messaging.leasequeue.task"] = task
    with tracer.start_as_current_span(f"send {queue}" if queue is not None else "send", kind=SpanKind.PRODUCER,
                                      attributes=attributes) as span:
        carrier: dict[str, str] = {}
        assert _PROPAGATOR is not None
        _PROPAGATOR.inject(carrier)
        yield Sending(span, carrier or None, batch)


def send_span(queue: str | None, task: str | None, *, batch: bool = False) -> AbstractContextManager[Sending]:
    """Open the PRODUCER span ``send <queue>`` of one enqueue call, current for the ``with`` block.

    Args:
        queue: the jobs' queue, or None when one call writes to several (the span is then ``send``).
        task: the jobs' task name, or None when they are of several tasks.
        batch: the call writes a batch (``enqueue_many``, a workflow): the span carries
            ``messaging.batch.message_count``.

    Returns:
        A context manager giving a :class:`Sending`, whose ``carrier`` is None when tracing is off
        (then nothing is opened). An exception leaving the block marks the span ERROR.
    """
    tracer = _tracer()
    if tracer is None:
        return nullcontext(_NOT_SENDING)
    return _send(tracer, queue, task, batch)


def bind_current_context(fn: Callable[[], T]) -> Callable[[], T]:
    """``fn`` run later in the trace context current now (``enqueue_on_commit``: the send span of
    the commit's INSERT is a child of the span that asked for it). ``fn`` itself when tracing is off.
    """
    if _tracer() is None:
        return fn
    captured = otel_context.get_current()

    @functools.wraps(fn)
    def in_context() -> T:
        token = otel_context.attach(captured)
        try:
            return fn()
        finally:
            otel_context.detach(token)

    return in_context


@contextmanager
def _process(tracer: Tracer, job: ClaimedJob, ctx: JobContext) -> Iterator[None]:
    links = []
    carrier = _carrier(job.trace_context)
    if carrier is not None:
        assert _PROPAGATOR is not None
        producer = trace.get_current_span(_PROPAGATOR.extract(carrier)).get_span_context()
        if producer.is_valid:
            links.append(Link(producer))
    attributes: dict[str, str | int] = {"messaging.system": SYSTEM, "messaging.operation.type": "process",
                  "messaging.operation.name": "process", "messaging.destination.name": job.queue,
                  "messaging.message.id": str(job.id), "messaging.leasequeue.task": job.task,
                  "messaging.leasequeue.attempt": job.attempts,
                  "messaging.leasequeue.lease_version": job.lease_version}
    with tracer.start_as_current_span(f"process {job.queue}", kind=SpanKind.CONSUMER, links=links,
                                      attributes=attributes) as span:
        ctx.attempt_data[_SPAN_KEY] = span
        try:
            yield
        finally:
            ctx.attempt_data.pop(_SPAN_KEY, None)


def process_span(job: ClaimedJob, ctx: JobContext) -> AbstractContextManager[None]:
    """Open the CONSUMER span ``process <queue>`` of one attempt of ``job``, current for the ``with``
    block (the handler's spans are its children), linked to the send span its enqueue stored.

    Args:
        job: the claimed job (its ``trace_context``, id, queue, task, attempt and fencing token).
        ctx: the attempt's context; the span rides on its ``attempt_data`` for
            :func:`attempt_failed` and :func:`attempt_ended`.

    Returns:
        A context manager; nothing is opened when tracing is off.
    """
    tracer = _tracer()
    if tracer is None:
        return nullcontext()
    return _process(tracer, job, ctx)


def attempt_failed(ctx: JobContext, exc: BaseException, error: Mapping[str, Any]) -> None:
    """Mark the attempt's process span ERROR and record the exception (nothing when not traced).

    Args:
        ctx: the attempt's context.
        exc: what the attempt raised (for a process-mode child, the worker's ``ChildError``).
        error: the error entry the executor records (``type``, ``message``, ``traceback``): the
            span shows the handler's own exception type and message, also from a child process.
    """
    span = ctx.attempt_data.get(_SPAN_KEY)
    if span is None:
        return
    span.record_exception(exc, attributes={"exception.type": str(error.get("type", "")),
                                           "exception.message": str(error.get("message", "")),
                                           "exception.stacktrace": str(error.get("traceback", ""))})
    span.set_status(Status(StatusCode.ERROR, f"{error.get('type', '')}: {error.get('message', '')}"))


def attempt_ended(ctx: JobContext, outcome: str) -> None:
    """Put the attempt's outcome on its process span (``messaging.leasequeue.outcome``); a lost
    lease (the fencing token moved on, the outcome was discarded) marks it ERROR.

    Args:
        ctx: the attempt's context.
        outcome: what :meth:`Executor.run <django_leasequeue.executor.Executor.run>` returns
            (``done``, ``ready`` for a retry, ``dead``, ``snoozed``, ``cancelled``, ``lease_lost`` ...).
    """
    span = ctx.attempt_data.get(_SPAN_KEY)
    if span is None:
        return
    span.set_attribute("messaging.leasequeue.outcome", outcome)
    if outcome == "lease_lost":
        span.set_status(Status(StatusCode.ERROR, "lease lost: the fencing token moved on; the outcome was discarded"))


def carrier_of_current_span() -> dict[str, str] | None:
    """The current span's W3C trace context as a carrier (process mode sends it to the child that
    runs the handler), or None when tracing is off or no span is current."""
    if _tracer() is None:
        return None
    carrier: dict[str, str] = {}
    assert _PROPAGATOR is not None
    _PROPAGATOR.inject(carrier)
    return carrier or None


@contextmanager
def run_in_carrier(carrier: Any) -> Iterator[None]:
    """Make the span context of ``carrier`` (from :func:`carrier_of_current_span`) the current
    parent for the ``with`` block: a process-mode child's handler spans nest under the worker's
    process span. Nothing when the API is not installed or the carrier is None."""
    parent = _carrier(carrier)
    if trace is None or parent is None:
        yield
        return
    assert _PROPAGATOR is not None
    token = otel_context.attach(_PROPAGATOR.extract(parent))
    try:
        yield
    finally:
        otel_context.detach(token)
