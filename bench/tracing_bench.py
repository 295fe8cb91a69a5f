"""What OpenTelemetry tracing costs an ``enqueue()`` (django_leasequeue.tracing): the loops behind
docs/reference/monitoring.md's figures.

Measures, back to back on one scratch database, the time per call of (each a loop of ``--n``
calls, every call its own transaction and commit)::

    off        no tracer provider: nothing is opened, trace_context is NULL
    on         an SDK TracerProvider with a SimpleSpanProcessor into an InMemorySpanExporter (the
               span is exported inside the call: the worst case; a BatchSpanProcessor exports on
               its own thread): one "send" span and its traceparent stored per job
    off, no database   tracing.send_span() entered and left with tracing off, the only code the off
               path adds to an enqueue (the trace_context parameter itself is a NULL)
    on, no database    the same with tracing on: the span, its traceparent and its export

Each row is the median over ``--reps`` rounds; the rounds run the loops in rotation, so load from
other processes hits them alike. Compare the rows with each other, not with another machine.

Usage (from the repository root, with the dev extra installed; creates and drops
``<LQBENCH_DB>_trace``, default ``leasequeue_bench_trace``)::

    .venv/bin/python bench/tracing_bench.py [--n 2000] [--reps 3] [--keep]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [BENCH, os.path.dirname(BENCH)]  # loops and lqbench, then the working tree's package

from loops import load_average, per_call, print_table, rounds, scratch_database  # noqa: E402

LABELS = {"off": "enqueue(), tracing off (no provider)", "on": "enqueue(), tracing on (SDK, in-memory export)",
          "span_off": "send_span() with tracing off, no database",
          "span_on": "send_span() with tracing on (SDK, in-memory export), no database"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="calls per loop (default 2000)")
    ap.add_argument("--reps", type=int, default=3, help="rounds; each row is the median (default 3)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch database")
    a = ap.parse_args(argv)
    with scratch_database("trace", keep=a.keep):
        return run(a.n, a.reps)


def run(n: int, reps: int) -> int:
    import django

    django.setup()
    from lqbench.tasks import noop
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from django_leasequeue import registry, tracing
    from django_leasequeue.models import Job

    registry.autodiscover()
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    def traced(on: bool) -> float:
        tracing.set_tracer_provider(provider if on else None)
        try:
            return per_call(noop.enqueue, n)
        finally:
            tracing.set_tracer_provider(None)

    def span() -> None:
        with tracing.send_span("default", "noop") as sending:
            sending.sent([1])

    def span_on() -> float:
        tracing.set_tracer_provider(provider)
        try:
            return per_call(span, n)
        finally:
            tracing.set_tracer_provider(None)

    bodies: dict[str, Callable[[], float]] = {"off": lambda: traced(False), "on": lambda: traced(True),
                                              "span_off": lambda: per_call(span, n), "span_on": span_on}
    noop.enqueue()  # warm up the connection and caches
    load = load_average()
    results = rounds(bodies, reps, tag="tracing_bench")
    spans, stored = len(exporter.get_finished_spans()), Job.objects.filter(trace_context__isnull=False).count()
    print(f"Tracing cost of enqueue(): {n:,} calls per loop, median of {reps} round(s) [min-max]; load average "
          f"{load} at start, {load_average()} at end; {spans:,} send spans exported (both 'on' "
          f"loops), {stored:,} jobs with a trace context (of {Job.objects.count():,})")
    print()
    print_table(results, LABELS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
