"""The task of the process test of traces (``tests/worker/test_tracing_process.py``). It opens a
span of its own through OpenTelemetry's global tracer provider (which ``qa.otel`` installs), so
the test sees it nest under the attempt's process span. Imported by ``runworker`` through the
``IMPORTS`` setting only when ``TESTPROJECT_TRACE_FILE`` is set (it needs ``opentelemetry-api``,
the ``otel`` extra)."""

from __future__ import annotations

from opentelemetry import trace

from django_leasequeue import JobContext, task

# A proxy until a provider is installed; then it traces with that provider.
tracer = trace.get_tracer("qa.traced_tasks")


@task(name="qa.traced_charge", takes_context=True, max_attempts=3, backoff=0)
def traced_charge(context: JobContext, card: str) -> str:
    """Open a span ``charge card``; the first attempt of card ``"declined-once"`` fails. No backoff:
    the retry is due at once, before a ``--burst`` worker finds the queue empty."""
    with tracer.start_as_current_span("charge card"):
        if card == "declined-once" and context.attempt == 1:
            raise RuntimeError("card declined")
    return card
