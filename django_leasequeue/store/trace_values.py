"""The ``trace_context`` column's values: what an enqueue may store, and how a claim reads it back.

The column carries only trace data (the W3C ``traceparent``/``tracestate`` carrier of the enqueue's
send span), so a value that cannot be read must never cost the job: the claim returns it as text
clipped by the database (:data:`CLAIMED_TRACE_CONTEXT`), and :func:`trace_carrier` turns that text
into a carrier or into None with the reason. A row written by raw SQL or by an old version may hold
anything a ``jsonb`` column holds (an array, a string, an object nested thousands of levels deep,
megabytes); every such row runs, traced without a link to its producer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

#: The largest ``trace_context`` a claim reads, in bytes of its JSON text. A W3C carrier is a
#: 55-byte ``traceparent`` and a ``tracestate`` of at most 32 list members (a few hundred bytes in
#: practice); a longer value is not one we wrote, and it is never sent to the worker.
TRACE_CONTEXT_MAX_BYTES = 4096

# The claim statements' trace_context column: the stored value as JSON text, clipped by the
# database to one byte more than the bound, so a 5 MB value costs the server one serialisation and
# the worker TRACE_CONTEXT_MAX_BYTES + 1 characters, and the decoder can tell it was clipped.
# (Clipping counts characters, the bound bytes: a clipped text is always over the bound.)
CLAIMED_TRACE_CONTEXT = f"left(j.trace_context::text, {TRACE_CONTEXT_MAX_BYTES + 1}) AS trace_context"


def _json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


def trace_carrier(text: str | None) -> tuple[dict[str, str] | None, str | None]:
    """Read a claimed ``trace_context`` (the JSON text of :data:`CLAIMED_TRACE_CONTEXT`).

    Args:
        text: the column's JSON text, clipped to ``TRACE_CONTEXT_MAX_BYTES + 1`` characters, or None
            (SQL NULL: the job was enqueued with tracing off).

    Returns:
        ``(carrier, None)`` for a JSON object of strings at most :data:`TRACE_CONTEXT_MAX_BYTES`
        bytes long; ``(None, None)`` for NULL; ``(None, reason)`` for anything else, the reason
        saying what the value is (too long, too deeply nested to decode, not an object, a value that
        is not a string). Never raises.
    """
    if text is None:
        return None, None
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > TRACE_CONTEXT_MAX_BYTES:
        return None, f"trace_context is longer than {TRACE_CONTEXT_MAX_BYTES} bytes"
    try:
        value = json.loads(text)
    except RecursionError:
        return None, "trace_context is nested too deeply to decode"
    except ValueError as exc:
        return None, f"trace_context cannot be decoded: {str(exc)[:200]}"
    if not isinstance(value, dict):
        return None, f"trace_context is a JSON {_json_type(value)}, not an object"
    for key, item in value.items():
        if not isinstance(item, str):
            return None, f"trace_context's {key[:64]!r} is a JSON {_json_type(item)}, not a string"
    return value, None


def trace_json(carrier: Mapping[str, str] | None) -> tuple[str | None, str | None]:
    """The ``trace_context`` an enqueue stores for ``carrier``, checked as a claim will read it.

    Args:
        carrier: the send span's W3C carrier (``traceparent``, maybe ``tracestate``), or None.

    Returns:
        ``(json_text, None)`` to store; ``(None, None)`` for no carrier (SQL NULL). A carrier a
        claim would not read back (a key or value that is not a string, JSON text over
        :data:`TRACE_CONTEXT_MAX_BYTES` bytes) gives ``(None, reason)`` if even its ``traceparent``
        alone does not fit, else its ``traceparent`` alone and the reason ``tracestate`` was left
        out. Never raises: tracing must not cost an enqueue.
    """
    if not carrier:
        return None, None
    entries = dict(carrier)
    if not all(_w3c_text(k) and _w3c_text(v) for k, v in entries.items()):
        return None, "the trace carrier is not a mapping of ASCII strings"
    if _read_back_size(entries) <= TRACE_CONTEXT_MAX_BYTES:
        return json.dumps(entries, separators=(",", ":")), None
    parent = entries.get("traceparent")
    if parent is not None and _read_back_size({"traceparent": parent}) <= TRACE_CONTEXT_MAX_BYTES:
        return (json.dumps({"traceparent": parent}, separators=(",", ":")),
                f"the trace carrier is over {TRACE_CONTEXT_MAX_BYTES} bytes: stored its traceparent alone")
    return None, f"the trace carrier is over {TRACE_CONTEXT_MAX_BYTES} bytes: not stored"


def _w3c_text(value: object) -> bool:
    # W3C trace context headers are printable ASCII; a NUL is refused by jsonb.
    return isinstance(value, str) and value.isascii() and "\x00" not in value


def _read_back_size(entries: Mapping[str, str]) -> int:
    # The size of the jsonb column's text output (what a claim reads): ", " and ": " separators.
    return len(json.dumps(entries))
