"""A tracer provider for the process test of traces (``tests/worker/test_tracing_process.py``).

With ``TESTPROJECT_TRACE_FILE`` set, :func:`install_from_environment` (called by
``QaConfig.ready()``, so in every process of the test project that sets Django up: ``runworker``
and its children) installs OpenTelemetry's SDK ``TracerProvider`` as the global provider, as a
project does in its settings or an ``AppConfig.ready()``. Its exporter is the SDK's own
``ConsoleSpanExporter``, writing each ended span as one line of JSON (``ReadableSpan.to_json``)
to that file. The resource names the process (``process.pid``), so a test can tell whose spans
it reads. Without the variable nothing is installed and tracing stays off.
"""

from __future__ import annotations

import os


def install_from_environment() -> None:
    """Install the SDK tracer provider writing JSON lines to ``TESTPROJECT_TRACE_FILE``, if set.

    Raises:
        ImportError: the variable is set and ``opentelemetry-sdk`` is not installed.
    """
    path = os.environ.get("TESTPROJECT_TRACE_FILE")
    if not path:
        return
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    # Line-buffered and appended to: each span is one write of one line, flushed by the exporter.
    out = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - open for the process's lifetime
    provider = TracerProvider(resource=Resource.create({"service.name": "testproject", "process.pid": os.getpid()}))
    provider.add_span_processor(SimpleSpanProcessor(
        ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")))
    trace.set_tracer_provider(provider)
