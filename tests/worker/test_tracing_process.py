"""OpenTelemetry traces across real processes: the test enqueues under a request's trace context
with a known trace id, a ``runworker --burst`` process runs the jobs with the SDK's tracer
provider installed by the test project (``TESTPROJECT_TRACE_FILE``: ``qa.otel`` makes it the global
provider in ``QaConfig.ready()``, with the SDK's ``ConsoleSpanExporter`` writing one JSON line per
span to the file this test names), and the test reads the worker's spans back from that file.

In this process the package traces with an SDK provider of the test's own
(``tracing.set_tracer_provider``), never the global one (which other tests need unset)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags
from qa.traced_tasks import traced_charge

from django_leasequeue import tracing
from django_leasequeue.enqueueing import enqueue
from django_leasequeue.models import Job

pytestmark = pytest.mark.process

# The request the jobs are enqueued under, as an incoming ``traceparent`` would give it (the W3C
# specification's example ids): every send span is its child, in its trace.
TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
REQUEST_SPAN_ID = 0x00F067AA0BA902B7
TASK = "qa.traced_charge"


def hex_trace(trace_id: int) -> str:
    return f"0x{trace_id:032x}"


def hex_span(span_id: int) -> str:
    return f"0x{span_id:016x}"


def enqueue_under_request(*cards: str) -> tuple[list[Job], list[ReadableSpan]]:
    """Enqueue one ``qa.traced_charge`` job per card inside the request's trace context, traced by
    an SDK provider of this test's; return the jobs and their send spans, in order."""
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    request = SpanContext(trace_id=TRACE_ID, span_id=REQUEST_SPAN_ID, is_remote=True,
                          trace_flags=TraceFlags(TraceFlags.SAMPLED))
    tracing.set_tracer_provider(provider)
    token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(request)))
    try:
        jobs = [enqueue(traced_charge, [card]) for card in cards]
    finally:
        otel_context.detach(token)
        tracing.set_tracer_provider(None)
    return jobs, list(exporter.get_finished_spans())


def read_spans(path: Path) -> list[dict]:
    """The worker's spans, one JSON object per line (``ReadableSpan.to_json``), in the order ended."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def tree(sends: list[ReadableSpan], cards: list[str], spans: list[dict]) -> str:
    """The trace across the two processes, as text: each send span (this process) with the process
    spans that link to it (the worker) in attempt order, and under each its children; an ERROR
    status as ``[ERROR]``."""
    lines = []
    for send, card in zip(sends, cards, strict=True):
        lines.append(f"{send.name} ({card})")
        send_id = hex_span(send.context.span_id)
        linked = [s for s in spans if [lk["context"]["span_id"] for lk in s["links"]] == [send_id]]
        for span in sorted(linked, key=lambda s: s["attributes"]["messaging.leasequeue.attempt"]):
            error = " [ERROR]" if span["status"]["status_code"] == "ERROR" else ""
            lines.append(f"  <- {span['name']}{error} (attempt {span['attributes']['messaging.leasequeue.attempt']})")
            for child in (s for s in spans if s["parent_id"] == span["context"]["span_id"]):
                error = " [ERROR]" if child["status"]["status_code"] == "ERROR" else ""
                lines.append(f"       {child['name']}{error}")
    return "\n".join(lines)


def test_a_runworker_process_traces_each_attempt_linked_to_the_send_span_of_this_process(spawn, tmp_path):
    cards = ["ok", "declined-once"]
    jobs, sends = enqueue_under_request(*cards)

    # The PRODUCER spans: children of the request, in its trace; the INSERT stored each one's context.
    assert [(s.name, s.kind, s.context.trace_id, s.parent.span_id if s.parent else None) for s in sends] == [
        ("send default", SpanKind.PRODUCER, TRACE_ID, REQUEST_SPAN_ID)] * 2
    assert [dict(s.attributes or {})["messaging.message.id"] for s in sends] == [str(j.id) for j in jobs]
    assert [Job.objects.get(id=j.id).trace_context for j in jobs] == [
        {"traceparent": f"00-{TRACE_ID:032x}-{s.context.span_id:016x}-01"} for s in sends]

    spans_file = tmp_path / "spans.jsonl"
    worker = spawn("runworker", "--burst", "--concurrency", "1", env={"TESTPROJECT_TRACE_FILE": str(spans_file)})
    assert worker.wait(60) == 0, worker.output()
    assert [(j.status, j.attempts) for j in Job.objects.filter(id__in=[j.id for j in jobs]).order_by("id")] == [
        ("done", 1), ("done", 2)]

    spans = read_spans(spans_file)
    text = tree(sends, cards, spans)
    print("\n" + text)  # the trace across the two processes, for the record (pytest -s)
    assert text == ("send default (ok)\n"
                    "  <- process default (attempt 1)\n"
                    "       charge card\n"
                    "send default (declined-once)\n"
                    "  <- process default [ERROR] (attempt 1)\n"
                    "       charge card [ERROR]\n"
                    "  <- process default (attempt 2)\n"
                    "       charge card")
    # Every span in the file is the worker's, and there are no others than those in the tree.
    assert len(spans) == 6
    assert {s["resource"]["attributes"]["process.pid"] for s in spans} == {worker.pid}
    assert {s["resource"]["attributes"]["service.name"] for s in spans} == {"testproject"}

    processes = [s for s in spans if s["name"] == "process default"]
    send_of = {str(j.id): send for j, send in zip(jobs, sends, strict=True)}
    attempts = sorted(((s["attributes"]["messaging.message.id"], s["attributes"]["messaging.leasequeue.attempt"], s)
                       for s in processes), key=lambda t: (int(t[0]), t[1]))
    assert [(job_id, attempt) for job_id, attempt, _ in attempts] == [
        (str(jobs[0].id), 1), (str(jobs[1].id), 1), (str(jobs[1].id), 2)]
    for job_id, attempt, span in attempts:
        send = send_of[job_id]
        # A CONSUMER span per attempt, the root of a trace of its own, linked to the send span by
        # the trace id and span id that crossed the database in the job's row.
        assert span["kind"] == "SpanKind.CONSUMER" and span["parent_id"] is None
        assert span["context"]["trace_id"] != hex_trace(TRACE_ID)
        link = {"trace_id": hex_trace(TRACE_ID), "span_id": hex_span(send.context.span_id), "trace_state": "[]"}
        assert span["links"] == [{"context": link, "attributes": {}}]
        retried = job_id == str(jobs[1].id) and attempt == 1
        assert span["attributes"] == {
            "messaging.system": "leasequeue", "messaging.operation.type": "process",
            "messaging.operation.name": "process", "messaging.destination.name": "default",
            "messaging.message.id": job_id, "messaging.leasequeue.task": TASK,
            "messaging.leasequeue.attempt": attempt, "messaging.leasequeue.lease_version": attempt,
            "messaging.leasequeue.outcome": "ready" if retried else "done"}
        if retried:
            assert span["status"] == {"status_code": "ERROR", "description": "builtins.RuntimeError: card declined"}
            [event] = span["events"]
            assert event["name"] == "exception"
            assert (event["attributes"]["exception.type"], event["attributes"]["exception.message"]) == (
                "builtins.RuntimeError", "card declined")
            assert "RuntimeError: card declined" in event["attributes"]["exception.stacktrace"]
        else:
            assert span["status"] == {"status_code": "UNSET"} and span["events"] == []
        # The handler's own span (through the global provider the project installed) is its child.
        [child] = [s for s in spans if s["parent_id"] == span["context"]["span_id"]]
        assert (child["name"], child["kind"], child["context"]["trace_id"]) == (
            "charge card", "SpanKind.INTERNAL", span["context"]["trace_id"])
    assert len({s["context"]["trace_id"] for s in processes}) == 3
