"""A ``trace_context`` that cannot be read costs the job nothing: the job runs, once, to ``done``,
its attempt traced without a link to a producer, and a warning names the job and the reason.

The column carries only trace data, yet a row written by raw SQL with an object nested 4,000 levels
deep was dead-lettered as ``CorruptRow`` (``RecursionError`` while decoding the claimed row) without
running, with tracing off too. Each bad value here is written by raw SQL into a row enqueued
normally, beside good rows enqueued under a send span, and the queue is drained with tracing off
and with an SDK provider (in-memory exporter): every bad row's job runs once and ends done, and the
good rows' process spans still link to their send spans."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from django.db import connection
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from qa.models import Execution
from qa.tasks import record

from django_leasequeue import store
from django_leasequeue.conf import parse_rate
from django_leasequeue.models import Job
from django_leasequeue.testing import drain
from tests.support.spans import PROVIDER, exported_spans

pytestmark = pytest.mark.django_db

app_tracer = PROVIDER.get_tracer("tests.worker.trace_context_rows")

GOOD_PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
# The bad values, as SQL literals cast to jsonb, and the reason the warning gives for each.
BAD = {
    "deep": ("'" + '{"a":' * 4000 + "1" + "}" * 4000 + "'", "longer than 4096 bytes"),
    # Python 3.11 and 3.12 give up on 2,000 nested arrays (RecursionError); 3.13's decoder reads
    # them, and the value is then refused as an array. Either way the job runs without a link.
    "deep_small": ("'" + "[" * 2000 + "]" * 2000 + "'",
                   ("nested too deeply to decode", "is a JSON array, not an object")),
    "string": (f"'\"{GOOD_PARENT}\"'", "is a JSON string, not an object"),
    "array": (f"'[\"{GOOD_PARENT}\"]'", "is a JSON array, not an object"),
    "number": ("'42'", "is a JSON number, not an object"),
    "huge": (f"jsonb_build_object('traceparent', '{GOOD_PARENT}', 'x', repeat('y', 5000000))",
             "longer than 4096 bytes"),
    "wrong_type": ("'{\"traceparent\": 7}'", "'traceparent' is a JSON number, not a string"),
}


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    yield from exported_spans()


def _write_bad_rows() -> dict[str, int]:
    """One job per bad value (enqueued normally, then its trace_context set by raw SQL)."""
    ids = {}
    for name, (literal, _) in BAD.items():
        job = record.using(max_attempts=1).enqueue(name)
        with connection.cursor() as cur:
            cur.execute(f"UPDATE leasequeue_job SET trace_context = {literal}::jsonb WHERE id = %s", [job.pk])
        ids[name] = job.pk
    return ids


def _trace_warnings(caplog: pytest.LogCaptureFixture) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for rec in caplog.records:
        if rec.name == "django_leasequeue.store" and "trace_context ignored" in rec.getMessage():
            found.setdefault(int(rec.args[0]), []).append(rec.getMessage())  # type: ignore[index]
    return found


def _assert_each_ran_once_and_is_done(ids: list[int]) -> None:
    rows = dict(Job.objects.filter(pk__in=ids).values_list("pk", "status"))
    assert rows == dict.fromkeys(ids, "done")
    assert sorted(Execution.objects.filter(job_id__in=ids).values_list("job_id", flat=True)) == sorted(ids)
    assert not Job.objects.filter(pk__in=ids, errors__contains=[{"type": "CorruptRow"}]).exists()


def test_with_tracing_off_every_bad_trace_context_runs_once_and_is_warned_about_once(caplog):
    caplog.set_level(logging.WARNING, logger="django_leasequeue.store")
    bad = _write_bad_rows()
    good = record.using(max_attempts=1).enqueue("good")
    assert len(drain(raise_failures=False).runs) == len(bad) + 1
    _assert_each_ran_once_and_is_done([*bad.values(), good.pk])
    warned = _trace_warnings(caplog)
    assert sorted(warned) == sorted(bad.values())  # none for the good (NULL) row
    for name, job_id in bad.items():
        [message] = warned[job_id]
        reasons = BAD[name][1]
        assert f"job {job_id}: " in message, (name, message)
        assert any(reason in message for reason in ((reasons,) if isinstance(reasons, str) else reasons)), \
            (name, message)


def test_with_a_tracer_provider_bad_rows_run_unlinked_and_good_rows_link(spans, caplog):
    caplog.set_level(logging.WARNING, logger="django_leasequeue.store")
    with app_tracer.start_as_current_span("POST /checkout"):
        good = [record.using(max_attempts=1).enqueue(f"good-{n}") for n in range(2)]
    bad = _write_bad_rows()
    assert len(drain(raise_failures=False).runs) == len(bad) + 2
    _assert_each_ran_once_and_is_done([*bad.values(), *(j.pk for j in good)])
    assert sorted(_trace_warnings(caplog)) == sorted(bad.values())

    finished = spans.get_finished_spans()
    sends = {s.context.span_id: s for s in finished if s.name == "send default"}
    process = {int((s.attributes or {})["messaging.message.id"]): s for s in finished if s.name == "process default"}
    assert sorted(process) == sorted([*bad.values(), *(j.pk for j in good)])
    for job in good:
        [link] = process[job.pk].links
        assert link.context.span_id in sends
    for job_id in bad.values():
        assert process[job_id].links == ()
        assert (process[job_id].attributes or {})["messaging.leasequeue.outcome"] == "done"


@pytest.mark.parametrize("variant", ["queues", "any-queue", "rated", "fair", "ids"])
def test_every_claim_statement_reads_a_bad_trace_context_as_none(variant, caplog):
    caplog.set_level(logging.WARNING, logger="django_leasequeue.store")
    bad = _write_bad_rows()
    common = {"worker_id": "tests:1:trace-rows", "lease": 30.0}
    limit = len(bad)
    if variant == "ids":
        claimed = store.job_claim_ids(list(bad.values()), **common)
    else:
        claimed = store.job_claim(
            queues=None if variant == "any-queue" else ["default"], limit=limit,
            rate_limits={"default": parse_rate("1000/s")} if variant == "rated" else {},
            fair_queues={"default"} if variant == "fair" else (), **common)
    assert sorted(j.id for j in claimed) == sorted(bad.values())
    assert claimed.corrupt == []
    assert [j.trace_context for j in claimed] == [None] * len(bad)
    assert sorted(_trace_warnings(caplog)) == sorted(bad.values())


def test_a_good_trace_context_is_read_back_as_written():
    job = record.enqueue("good")
    carrier = {"traceparent": GOOD_PARENT, "tracestate": "vendor=" + "v" * 200}
    with connection.cursor() as cur:
        cur.execute("UPDATE leasequeue_job SET trace_context = %s::jsonb WHERE id = %s",
                    [store.trace_json(carrier)[0], job.pk])
    [claimed] = store.job_claim_ids([job.pk], worker_id="w", lease=30.0)
    assert claimed.trace_context == carrier
