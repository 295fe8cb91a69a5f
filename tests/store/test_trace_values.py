"""What an enqueue stores in ``trace_context`` is what a claim reads back (store.trace_values).

An enqueue writes the carrier of its own send span; a carrier a claim would not read back (over
``TRACE_CONTEXT_MAX_BYTES`` as jsonb text, a key or value that is not an ASCII string) is not
stored as it is: its ``traceparent`` alone when that fits, else NULL, with a warning, never an
error (tracing must not cost an enqueue). The reader is tested on the values a row written by hand
may hold."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from django_leasequeue import store
from django_leasequeue.models import Job

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
BOUND = store.TRACE_CONTEXT_MAX_BYTES


def _insert(carrier) -> Job:
    new = store.NewJob(task="qa.record", queue="default", priority=0, args_json="[]", kwargs_json="{}", max_attempts=1)
    job = store.job_insert_one(new, notify=False, channel="unused", trace_context=carrier)
    assert job is not None
    return job


@pytest.mark.django_db
@pytest.mark.parametrize(("carrier", "stored", "warning"), [
    ({"traceparent": PARENT}, {"traceparent": PARENT}, None),
    ({"traceparent": PARENT, "tracestate": "v=" + "x" * BOUND}, {"traceparent": PARENT}, "traceparent alone"),
    ({"traceparent": "x" * (BOUND + 1)}, None, "not stored"),
    ({"traceparent": 7}, None, "not a mapping of ASCII strings"),
    ({"traceparent": "00-é"}, None, "not a mapping of ASCII strings"),
    ({"traceparent": "a\x00b"}, None, "not a mapping of ASCII strings"),
    (None, None, None),
], ids=["carrier", "long_tracestate", "long_traceparent", "number", "non_ascii", "nul", "none"])
def test_an_enqueue_stores_only_a_carrier_a_claim_reads_back(carrier, stored, warning, caplog):
    caplog.set_level(logging.WARNING, logger="django_leasequeue.store")
    job = _insert(carrier)
    assert Job.objects.values_list("trace_context", flat=True).get(pk=job.pk) == stored
    warnings = [r.getMessage() for r in caplog.records if r.name == "django_leasequeue.store"]
    assert len(warnings) == (warning is not None)
    assert all(warning in w for w in warnings)
    [claimed] = store.job_claim_ids([job.pk], worker_id="w", lease=30.0)
    assert claimed.trace_context == stored


def test_the_bound_is_checked_on_the_text_a_claim_reads():
    # jsonb prints ", " and ": ": a carrier at the bound in compact JSON is over it as read back.
    value = "x" * (BOUND - len('{"traceparent":""}'))
    text, problem = store.trace_json({"traceparent": value})
    assert (text, problem) == (None, f"the trace carrier is over {BOUND} bytes: not stored")
    fits = {"traceparent": "x" * (BOUND - len('{"traceparent": ""}'))}
    assert store.trace_json(fits) == (json.dumps(fits, separators=(",", ":")), None)
    assert store.trace_carrier(json.dumps(fits)) == (fits, None)


@pytest.mark.parametrize(("text", "reason"), [
    (None, None),
    ('{"traceparent": "p"}', None),
    # 3.11 and 3.12 give up on 2,000 nested arrays (RecursionError); 3.13's decoder reads them.
    ("[" * 2000 + "]" * 2000, "trace_context is nested too deeply to decode" if sys.version_info < (3, 13)
     else "trace_context is a JSON array, not an object"),
    ('{"a": ' * 580 + "1" + "}" * 580, "trace_context's 'a' is a JSON object, not a string"),
    ("x" * (BOUND + 1), f"trace_context is longer than {BOUND} bytes"),
    ("é" * (BOUND // 2 + 1), f"trace_context is longer than {BOUND} bytes"),
    ('"p"', "trace_context is a JSON string, not an object"),
    ("[1]", "trace_context is a JSON array, not an object"),
    ("1.5", "trace_context is a JSON number, not an object"),
    ("true", "trace_context is a JSON boolean, not an object"),
    ("null", "trace_context is a JSON null, not an object"),
    ('{"traceparent": {"a": 1}}', "trace_context's 'traceparent' is a JSON object, not a string"),
    ("{", "trace_context cannot be decoded: Expecting property name enclosed in double quotes: line 1 column 2 "
          "(char 1)"),
])
def test_a_claimed_text_is_a_carrier_or_none_with_the_reason(text, reason):
    carrier, problem = store.trace_carrier(text)
    assert problem == reason
    assert (carrier is None) == (reason is not None or text is None)
