"""OpenTelemetry traces (django_leasequeue.tracing) through the SDK's in-memory exporter: the enqueue's
PRODUCER span "send <queue>", whose W3C trace context the INSERT stores with the job, and one
CONSUMER span "process <queue>" per attempt, linked to it, parent of the handler's own spans.

The SDK provider is given to the package with ``tracing.set_tracer_provider`` (and to the handlers
here): OpenTelemetry's global provider can be set only once per process, and it stays unset, so
that the other tests of the session, and the no-provider test below, run with tracing off."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from django_leasequeue import Batch, chain, store, tracing
from django_leasequeue.conf import parse_rate
from django_leasequeue.enqueueing import enqueue, enqueue_many, enqueue_on_commit, task
from django_leasequeue.models import Job
from django_leasequeue.testing import drain
from tests.support.spans import EXPORTER, PROVIDER, exported_spans

pytestmark = pytest.mark.django_db

# What a project's code (a view, a handler) traces with; here the test's provider, not the global.
app_tracer = PROVIDER.get_tracer("tests.worker.tracing")

CHARGE = "tests.worker.tracing.charge"


@task(name=CHARGE, queue="default", max_attempts=3, backoff=0)
def charge(card: str) -> str:
    """Open a span of its own; the first attempt of card "declined-once" fails."""
    with app_tracer.start_as_current_span("charge card"):
        if card == "declined-once" and Job.objects.get(task=CHARGE, args=[card]).attempts == 1:
            raise RuntimeError("card declined")
    return card


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    yield from exported_spans()


def ids(span: ReadableSpan) -> tuple[int, int]:
    return span.context.trace_id, span.context.span_id


def traceparent(span: ReadableSpan) -> str:
    return f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-{int(span.context.trace_flags):02x}"


def tree(finished: tuple[ReadableSpan, ...]) -> str:
    """The spans as an indented tree in start order: children under their parent, a process span's
    link shown as ``-> link <name of the linked span>``, an ERROR status as ``[ERROR]``."""
    by_id = {s.context.span_id: s for s in finished}
    lines: list[str] = []

    def walk(span: ReadableSpan, depth: int) -> None:
        text = "  " * depth + span.name
        if span.status.status_code is StatusCode.ERROR:
            text += " [ERROR]"
        for link in span.links:
            text += f" -> link {by_id[link.context.span_id].name}"
        lines.append(text)
        for child in sorted((s for s in finished if s.parent is not None and s.parent.span_id == span.context.span_id),
                            key=lambda s: s.start_time or 0):
            walk(child, depth + 1)

    for root in sorted((s for s in finished if s.parent is None), key=lambda s: s.start_time or 0):
        walk(root, 0)
    return "\n".join(lines)


def named(finished: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return sorted((s for s in finished if s.name == name), key=lambda s: s.start_time or 0)


def test_a_retried_job_gives_two_process_spans_linked_to_its_one_send_span(spans, capsys):
    with app_tracer.start_as_current_span("POST /checkout"):
        job = enqueue(charge, ["declined-once"])
    result = drain(raise_failures=False)
    job.refresh_from_db()
    assert (job.status, job.attempts, len(result.runs)) == ("done", 2, 2)

    finished = spans.get_finished_spans()
    text = tree(finished)
    print("\n" + text)  # the trace tree of this run, for the record (pytest -s)
    assert text == ("POST /checkout\n"
                    "  send default\n"
                    "process default [ERROR] -> link send default\n"
                    "  charge card [ERROR]\n"
                    "process default -> link send default\n"
                    "  charge card")
    assert len(finished) == 6
    [request] = named(finished, "POST /checkout")
    [send] = named(finished, "send default")
    first, second = named(finished, "process default")
    charges = named(finished, "charge card")

    # The send span: a PRODUCER child of the request, whose context is what the INSERT stored.
    assert send.kind is SpanKind.PRODUCER and send.parent is not None and send.parent.span_id == request.context.span_id
    assert dict(send.attributes or {}) == {
        "messaging.system": "leasequeue", "messaging.operation.type": "send", "messaging.operation.name": "send",
        "messaging.destination.name": "default", "messaging.leasequeue.task": CHARGE,
        "messaging.message.id": str(job.id)}
    assert job.trace_context == {"traceparent": traceparent(send)}
    assert send.context.trace_id == request.context.trace_id

    # Two CONSUMER spans, roots of their own traces, each linked to the one send span.
    for attempt, span in ((1, first), (2, second)):
        assert span.kind is SpanKind.CONSUMER and span.parent is None
        assert [(lk.context.trace_id, lk.context.span_id) for lk in span.links] == [ids(send)]
        assert dict(span.attributes or {}) == {
            "messaging.system": "leasequeue", "messaging.operation.type": "process",
            "messaging.operation.name": "process", "messaging.destination.name": "default",
            "messaging.message.id": str(job.id), "messaging.leasequeue.task": CHARGE,
            "messaging.leasequeue.attempt": attempt, "messaging.leasequeue.lease_version": attempt,
            "messaging.leasequeue.outcome": "ready" if attempt == 1 else "done"}
    assert first.context.trace_id != second.context.trace_id

    # The failed attempt: status ERROR with the handler's exception, recorded as an event.
    assert first.status.status_code is StatusCode.ERROR
    assert first.status.description == "builtins.RuntimeError: card declined"
    [event] = first.events
    assert event.name == "exception"
    assert (event.attributes or {})["exception.type"] == "builtins.RuntimeError"
    assert (event.attributes or {})["exception.message"] == "card declined"
    assert "RuntimeError: card declined" in str((event.attributes or {})["exception.stacktrace"])
    assert second.status.status_code is StatusCode.UNSET and second.events == ()

    # The handler's spans nest under their attempt's process span.
    assert [(c.parent.span_id if c.parent else None) for c in charges] == [first.context.span_id,
                                                                          second.context.span_id]
    assert [c.context.trace_id for c in charges] == [first.context.trace_id, second.context.trace_id]


def test_enqueue_many_is_one_send_span_and_every_job_links_to_it(spans):
    assert enqueue_many(charge, [["a"], ["b"], ["c"]]) == 3
    rows = list(Job.objects.filter(task=CHARGE).order_by("id").values_list("id", "trace_context"))
    [send] = spans.get_finished_spans()
    assert send.name == "send default" and send.kind is SpanKind.PRODUCER and send.parent is None
    assert dict(send.attributes or {}) == {
        "messaging.system": "leasequeue", "messaging.operation.type": "send", "messaging.operation.name": "send",
        "messaging.destination.name": "default", "messaging.leasequeue.task": CHARGE,
        "messaging.batch.message_count": 3}
    assert [tc for _, tc in rows] == [{"traceparent": traceparent(send)}] * 3

    assert len(drain().runs) == 3
    processes = named(spans.get_finished_spans(), "process default")
    assert sorted((s.attributes or {})["messaging.message.id"] for s in processes) == sorted(str(i) for i, _ in rows)
    assert [[(lk.context.trace_id, lk.context.span_id) for lk in s.links] for s in processes] == [[ids(send)]] * 3


def test_enqueue_on_commit_sends_at_the_commit_under_the_span_that_asked(spans, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        with app_tracer.start_as_current_span("POST /checkout") as request:
            enqueue_on_commit(charge, ["x"])
    assert [s.name for s in spans.get_finished_spans()] == ["POST /checkout"]  # nothing sent before the commit
    [commit] = callbacks
    commit()  # the commit, after the request's span ended
    _, send = spans.get_finished_spans()
    assert send.name == "send default" and send.parent is not None
    assert (send.parent.trace_id, send.parent.span_id) == (request.context.trace_id, request.context.span_id)
    job = Job.objects.get(task=CHARGE)
    assert job.trace_context == {"traceparent": traceparent(send)}
    assert dict(send.attributes or {})["messaging.message.id"] == str(job.id)


def test_workflows_and_dependents_store_their_send_span(spans):
    chained = chain(charge.step("a"), charge.step("b").set(pass_result=False),
                    charge.step("c").set(pass_result=False))
    handle = chained.enqueue()
    first = Job.objects.filter(task=CHARGE).order_by("id").first()
    assert first is not None
    dependent = enqueue(charge, ["d"], depends_on=[first.id])
    batch = Batch.open()
    batch.add_many(charge, [["e"], ["f"]])
    sends = named(spans.get_finished_spans(), "send default")
    assert [(dict(s.attributes or {}).get("messaging.batch.message_count"),
             dict(s.attributes or {}).get("messaging.message.id")) for s in sends] == [
        (3, None), (None, str(dependent.id)), (2, None)]
    by_arg = {tuple(args): tc for args, tc in Job.objects.filter(task=CHARGE).values_list("args", "trace_context")}
    chain_send, dependent_send, batch_send = sends
    assert by_arg == {("a",): {"traceparent": traceparent(chain_send)},
                      ("b",): {"traceparent": traceparent(chain_send)},
                      ("c",): {"traceparent": traceparent(chain_send)},
                      ("d",): {"traceparent": traceparent(dependent_send)},
                      ("e",): {"traceparent": traceparent(batch_send)},
                      ("f",): {"traceparent": traceparent(batch_send)}}
    assert handle.state in ("pending", "running")


def test_a_taken_unique_key_keeps_the_first_context_and_marks_the_send_a_duplicate(spans):
    first = enqueue(charge, ["u"], unique_key="order-1")
    again = enqueue(charge, ["u"], unique_key="order-1")
    assert again.id == first.id and Job.objects.filter(task=CHARGE).count() == 1
    send1, send2 = named(spans.get_finished_spans(), "send default")
    assert (send2.attributes or {})["messaging.leasequeue.duplicate"] is True
    assert "messaging.leasequeue.duplicate" not in (send1.attributes or {})
    assert Job.objects.get(id=first.id).trace_context == {"traceparent": traceparent(send1)}


def test_every_claim_statement_returns_the_stored_context(spans):
    jobs = [enqueue(charge, [str(n)]) for n in range(5)]
    expected = {j.id: Job.objects.get(id=j.id).trace_context for j in jobs}
    assert all(tc is not None and set(tc) == {"traceparent"} for tc in expected.values())
    claimed = {}
    common = {"worker_id": "tests:1:tracing", "lease": 30.0}
    for claim in (
        lambda: store.job_claim(queues=["default"], limit=1, rate_limits={}, fair_queues=(), **common),
        lambda: store.job_claim(queues=None, limit=1, rate_limits={}, fair_queues=(), **common),
        lambda: store.job_claim(queues=["default"], limit=1, rate_limits={"default": parse_rate("100/s")},
                                fair_queues=(), **common),
        lambda: store.job_claim(queues=["default"], limit=1, rate_limits={}, fair_queues={"default"}, **common),
        lambda: store.job_claim_ids([jobs[4].id], **common),
    ):
        [job] = claim()
        claimed[job.id] = job.trace_context
    assert claimed == expected


def test_a_stored_context_that_is_not_a_carrier_runs_the_attempt_without_a_link(spans):
    job = enqueue(charge, ["z"])
    Job.objects.filter(id=job.id).update(trace_context=["not", "a", "carrier"])
    assert len(drain().runs) == 1
    [process] = named(spans.get_finished_spans(), "process default")
    assert process.links == () and (process.attributes or {})["messaging.leasequeue.outcome"] == "done"


def test_without_a_provider_nothing_is_traced_and_nothing_is_stored():
    # No SDK provider installed anywhere: OpenTelemetry's global provider is still the API's proxy.
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider) and not tracing.enabled()
    EXPORTER.clear()
    enqueue(charge, ["a"])
    enqueue_many(charge, [["b"], ["c"]])
    chain(charge.step("d"), charge.step("e").set(pass_result=False)).enqueue()
    assert list(Job.objects.filter(task=CHARGE).values_list("trace_context", flat=True)) == [None] * 5
    assert Job.objects.filter(trace_context__isnull=False).count() == 0
    assert len(drain().runs) == 5
    # Only the handlers' own spans (they trace with the test's provider): roots, no process span.
    assert [(s.name, s.parent) for s in EXPORTER.get_finished_spans()] == [("charge card", None)] * 5


def test_without_the_api_the_tracing_module_is_off():
    code = ("import sys\n"
            "sys.modules['opentelemetry'] = None\n"  # what `import opentelemetry` sees when not installed
            "from django_leasequeue import tracing\n"
            "assert tracing.trace is None and not tracing.enabled()\n"
            "with tracing.send_span('default', 't') as sending:\n"
            "    assert sending.carrier is None\n"
            "    sending.sent([1])\n"
            "assert tracing.carrier_of_current_span() is None\n"
            "with tracing.run_in_carrier({'traceparent': '00-' + '1' * 32 + '-' + '2' * 16 + '-01'}):\n"
            "    pass\n"
            "f = lambda: 7\n"
            "assert tracing.bind_current_context(f) is f\n"
            "print('off')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (0, "off\n", "")
