"""The OpenTelemetry SDK's tracer provider with an in-memory span exporter, for the in-process
trace tests (``tests/worker/test_tracing.py``, ``test_trace_context_rows.py``): one provider, so
their spans land in one exporter that each test clears."""

from __future__ import annotations

from collections.abc import Iterator

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from django_leasequeue import tracing

PROVIDER = TracerProvider()
EXPORTER = InMemorySpanExporter()
PROVIDER.add_span_processor(SimpleSpanProcessor(EXPORTER))


def exported_spans() -> Iterator[InMemorySpanExporter]:
    """For a fixture: the exporter, emptied, while django_leasequeue traces with :data:`PROVIDER`
    (as a project that configured the SDK does); tracing off and the exporter emptied after."""
    EXPORTER.clear()
    tracing.set_tracer_provider(PROVIDER)
    try:
        yield EXPORTER
    finally:
        tracing.set_tracer_provider(None)
        EXPORTER.clear()
