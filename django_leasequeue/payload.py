"""The payload of a job: the JSON round trip of its arguments and of a handler's return value, the
check that the arguments bind to the handler's signature, and the size limits.

Pure Python, no database. :mod:`django_leasequeue.enqueueing` encodes every job's arguments here
before the INSERT (one bad value is refused with its path, nothing is written); the executor, the
process-mode child and the tasks backend encode return values with :func:`json_dumps_result`.
"""

from __future__ import annotations

import inspect
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from .exceptions import ArgumentsMismatch, PayloadNotSerializable, PayloadTooLarge, ResultTooLarge


class HandlerSpec(Protocol):
    """What the signature checks read from a task spec (a :class:`~django_leasequeue.registry.TaskSpec`)."""

    @property
    def name(self) -> str: ...

    @property
    def func(self) -> Callable[..., Any]: ...

    @property
    def takes_context(self) -> bool: ...





# Deeper nesting would hit Python's recursion limit in json.dumps (and is never a sane payload).
MAX_JSON_DEPTH = 500


def check_text(text: str, path: str) -> None:
    """Refuse strings PostgreSQL's jsonb cannot store: NUL characters and lone surrogates."""
    if "\x00" in text:
        raise PayloadNotSerializable(f"{path} contains a NUL character (\\u0000), which PostgreSQL's jsonb rejects")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise PayloadNotSerializable(f"{path} contains a lone surrogate, which is not valid UTF-8") from None


# Python refuses to turn text of more than sys.int_info.default_max_str_digits (4300) digits into an
# int unless a process raises its own limit; json.loads then fails with a bare ValueError. The
# limit is the default one, not this process's: the worker, the admin and the result readers decode
# the row in their own processes, with the default limit.
MAX_INT_DIGITS = sys.int_info.default_max_str_digits or 4300
_INT_BOUND = 10 ** MAX_INT_DIGITS


def _check_int(number: int, path: str) -> None:
    """Refuse an int of more than :data:`MAX_INT_DIGITS` (4300) digits: ``json.dumps`` raises a
    bare ValueError on it in a process with the default limit, and a process with a raised limit
    would write JSON that every other process fails to read back."""
    if abs(number) >= _INT_BOUND:
        raise PayloadNotSerializable(f"{path} is an int of more than {MAX_INT_DIGITS} digits, which other Python "
                                     "processes cannot read back from JSON (sys.get_int_max_str_digits); "
                                     "pass it as a str")


def check_json(value: Any, where: str, *, exact_scalars: bool = True) -> None:
    """Check that ``value`` round-trips through JSON unchanged (same types, same values).

    Accepted: None, bool, int, finite float, str, list, and dict with str keys, nested.

    Args:
        exact_scalars: refuse subclasses of int/float/str (IntEnum, StrEnum, ...): they serialise
            as their base type, so a job argument would reach the handler as a plain int/str.
            False for return values, which are stored for reading, not passed back to code.

    Raises:
        PayloadNotSerializable: naming ``where`` and the path of the first offending value.
    """
    stack: list[tuple[Any, str, int]] = [(value, where, 0)]
    scalars = (bool, int, str)
    while stack:
        item, path, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise PayloadNotSerializable(f"{path} is nested more than {MAX_JSON_DEPTH} levels deep")
        if isinstance(item, str):
            check_text(item, path)
        elif isinstance(item, int) and item.bit_length() > 3000:  # about 900 digits: cheap pre-check
            _check_int(item, path)
        if item is None or (type(item) in scalars if exact_scalars else isinstance(item, scalars)):
            continue
        if type(item) is float or (not exact_scalars and isinstance(item, float)):
            if not math.isfinite(item):
                raise PayloadNotSerializable(f"{path} is {item!r}: JSON has no NaN or infinity")
            if "e+" in repr(item):
                # PostgreSQL's jsonb keeps numbers as numeric and prints 1e16 as 10000000000000000,
                # which comes back as an int.
                raise PayloadNotSerializable(
                    f"{path} is {item!r}: floats this large come back from PostgreSQL's jsonb as int; "
                    "pass it as a str or an int")
            continue
        if isinstance(item, list):
            stack.extend((v, f"{path}[{i}]", depth + 1) for i, v in enumerate(item))
            continue
        if isinstance(item, dict):
            for k, v in item.items():
                if not isinstance(k, str):
                    raise PayloadNotSerializable(
                        f"{path} has key {k!r} of type {type(k).__name__}: JSON object keys must be str "
                        "(it would come back as a different key)"
                    )
                check_text(k, f"{path} key {k!r}")
                stack.append((v, f"{path}[{k!r}]", depth + 1))
            continue
        hint = ""
        base = next((b.__name__ for b in (int, float, str) if isinstance(item, b)), None)
        if base is not None:
            hint = f" (a subclass of {base}: it would arrive as a plain {base}; pass {base}(value) and convert it back)"
        elif isinstance(item, tuple):
            hint = " (JSON would turn it into a list; pass a list)"
        elif type(item).__name__ in {"Decimal", "datetime", "date", "UUID", "time"}:
            hint = " (pass str(value) and convert it back in the handler)"
        raise PayloadNotSerializable(
            f"{path} is a {type(item).__module__}.{type(item).__qualname__}, which does not round-trip "
            f"through JSON{hint}"
        )


# Handler -> its signature as enqueue() receives the arguments (the context parameter left out), or
# None when it has none Python can tell. Cached: inspect.signature costs more than the checks.
_SIGNATURES: dict[tuple[Any, bool], inspect.Signature | None] = {}


def enqueue_signature(task_spec: HandlerSpec) -> inspect.Signature | None:
    """The parameters a job of ``task_spec`` is enqueued with: the handler's signature without the
    :class:`JobContext` parameter of a ``takes_context`` handler. None when the handler has no
    signature Python can read (some builtins and C callables)."""
    key = (task_spec.func, task_spec.takes_context)
    try:
        return _SIGNATURES[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable callable: not cached
        return _read_signature(task_spec.func, task_spec.takes_context)
    if len(_SIGNATURES) > 10_000:
        _SIGNATURES.clear()
    found = _SIGNATURES[key] = _read_signature(task_spec.func, task_spec.takes_context)
    return found


def _read_signature(func: Callable[..., Any], takes_context: bool) -> inspect.Signature | None:
    try:
        signature = inspect.signature(func)
    except Exception:  # noqa: BLE001 - no signature (or annotations that cannot be evaluated)
        return None
    params = list(signature.parameters.values())
    if takes_context:
        if not params or params[0].kind not in (inspect.Parameter.POSITIONAL_ONLY,
                                                inspect.Parameter.POSITIONAL_OR_KEYWORD):
            return None  # (*args, **kwargs) or the like: the context goes who knows where
        params = params[1:]
    return signature.replace(parameters=params)


def positional_names(signature: inspect.Signature | None) -> list[str]:
    """The names of the positional parameters of ``signature`` (from :func:`enqueue_signature`), in
    order, to name a bad positional argument in a message; ``[]`` for None."""
    if signature is None:
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in signature.parameters.values() if p.kind in kinds]


def check_arguments_bind(task_spec: HandlerSpec, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Refuse arguments the handler of ``task_spec`` cannot be called with (missing or unexpected ones).

    Raises:
        ArgumentsMismatch: naming the task, the problem and the handler's signature.
    """
    signature = enqueue_signature(task_spec)
    if signature is None:
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise ArgumentsMismatch(f"task {task_spec.name!r} cannot take these arguments: {exc}; it is enqueued "
                                f"as {task_spec.name}{signature}") from None


def check_payload(args: Sequence[Any], kwargs: Mapping[str, Any], *, names: Sequence[str] = ()) -> None:
    """The checks of :func:`encode_payload` without the encoding (nor the size limit): every
    argument round-trips through JSON and every keyword name is a str. A bulk insert runs this per
    job and encodes all the jobs at once.

    Args:
        args, kwargs: one job's arguments.
        names: the handler's positional parameter names, to name a bad positional argument.

    Raises:
        PayloadNotSerializable: as :func:`encode_payload`, with the same message.
    """
    for i, value in enumerate(args):
        # The commonest arguments, a small int, a bool or None, need no walk (check_json would
        # accept them at its first test); the path is only formatted for a value that is walked.
        if value is None or (type(value) in _PLAIN and -_SMALL < value < _SMALL):
            continue
        check_json(value, f"argument {names[i]!r}" if i < len(names) else f"args[{i}]")
    for key, value in kwargs.items():
        if not isinstance(key, str):
            raise PayloadNotSerializable(f"keyword argument name {key!r} is not a str")
        check_text(key, f"keyword argument name {key!r}")
        check_json(value, f"keyword argument {key!r}")


_PLAIN = (int, bool)
_SMALL = 2 ** 63  # far below the digit limit of _check_int


def encode_payload(args: Sequence[Any], kwargs: Mapping[str, Any], *, limit: int,
                   names: Sequence[str] = ()) -> tuple[str, str]:
    """Validate and JSON-encode a job's arguments.

    Args:
        args, kwargs: the arguments.
        limit: the largest encoded size in bytes (0: no limit).
        names: the names of the handler's positional parameters, to name a bad positional argument
            (``argument 'amount'``); a positional argument without a name is ``args[i]`` (from 0).

    Returns:
        ``(args_json, kwargs_json)``.

    Raises:
        PayloadNotSerializable: an argument does not round-trip through JSON (named in the message).
        PayloadTooLarge: the encoded arguments exceed ``limit`` bytes.
    """
    args = list(args)
    check_payload(args, kwargs, names=names)
    args_json = json.dumps(args, separators=(",", ":"), ensure_ascii=False)
    kwargs_json = json.dumps(dict(kwargs), separators=(",", ":"), ensure_ascii=False)
    size = len(args_json.encode()) + len(kwargs_json.encode())
    if limit and size > limit:
        raise PayloadTooLarge(
            f"job arguments are {size} bytes, over LEASEQUEUE['MAX_PAYLOAD_BYTES'] = {limit}; "
            "store large data in a table and pass its id"
        )
    return args_json, kwargs_json


# The largest JSON text (in characters) one job_insert_many() statement sends. PostgreSQL refuses a
# jsonb value over 256 MB, and a chunk of 10,000 jobs of up to MAX_PAYLOAD_BYTES each (1 MiB by
# default) can be far larger; numbers also take more room in jsonb than in JSON text. A chunk over
# this is split (the general path sent one text per job, each within the per-job limit).
MAX_CHUNK_CHARS = 16 * 1024 * 1024


def encode_chunks(pairs: Sequence[tuple[list[Any], dict[str, Any]]], first: int, *, limit: int,
                   names: Sequence[str]) -> list[tuple[str, str | None]]:
    """:func:`encode_payload_many` of ``pairs``, split in halves until each part's JSON is at most
    ``MAX_CHUNK_CHARS`` characters (a single job is never split). Returns the parts in order."""
    args_json, kwargs_json = encode_payload_many(pairs, limit=limit, names=names, first=first)
    if len(pairs) > 1 and len(args_json) + len(kwargs_json or "") > MAX_CHUNK_CHARS:
        half = len(pairs) // 2
        return (encode_chunks(pairs[:half], first, limit=limit, names=names)
                + encode_chunks(pairs[half:], first + half, limit=limit, names=names))
    return [(args_json, kwargs_json)]


def encode_payload_many(pairs: Sequence[tuple[list[Any], dict[str, Any]]], *, limit: int,
                        names: Sequence[str] = (), first: int = 0) -> tuple[str, str | None]:
    """Validate many jobs' arguments and encode them as two JSON arrays (for :func:`store.job_insert_many`).

    Every job gets the checks of :func:`encode_payload` (JSON round trip: NUL characters, lone
    surrogates, nesting depth, large floats, str keyword names; the size limit per job).

    Args:
        pairs: ``(args list, kwargs dict)`` per job.
        limit: ``MAX_PAYLOAD_BYTES`` per job (0: no limit).
        names: the handler's positional parameter names, to name a bad positional argument (as
            :func:`encode_payload`).
        first: the index of ``pairs[0]`` in the caller's whole list (for the messages).

    Returns:
        ``(args array JSON, kwargs array JSON or None when no job has keyword arguments)``.

    Raises:
        PayloadNotSerializable, PayloadTooLarge: as :func:`encode_payload`, naming the job's index.
    """
    any_kwargs = False
    for i, (a, kw) in enumerate(pairs, first):
        try:
            check_payload(a, kw, names=names)
        except PayloadNotSerializable as exc:  # every message starts with the value's path
            raise PayloadNotSerializable(f"job {i} {exc}") from None
        if kw:
            any_kwargs = True
    dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
    args_json = dumps([a for a, _ in pairs])
    kwargs_json = dumps([kw for _, kw in pairs]) if any_kwargs else None
    # The arrays are at least as long as their largest element (each empty kwargs counts as "{}").
    if limit and len(args_json.encode()) + (len(kwargs_json.encode()) if kwargs_json else 2 * len(pairs)) > limit:
        # The whole chunk is over one job's limit: find the job that is (most chunks never get here).
        for i, (a, kw) in enumerate(pairs, first):
            size = len(dumps(a).encode()) + len(dumps(kw).encode())
            if size > limit:
                raise PayloadTooLarge(
                    f"job {i}: arguments are {size} bytes, over LEASEQUEUE['MAX_PAYLOAD_BYTES'] = {limit}; "
                    "store large data in a table and pass its id"
                )
    return args_json, kwargs_json


def json_dumps_result(value: Any) -> str:
    """Encode a handler's return value for storage; raise PayloadNotSerializable if it is not JSON."""
    check_json(value, "return value", exact_scalars=False)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def json_size_floor(value: Any, limit: int) -> int:
    """A lower bound, in bytes, of the UTF-8 JSON encoding of ``value``, found without encoding it.

    The walk stops once the bound passes ``limit`` (bytes), so it costs at most about ``limit``
    steps. Why: encoding and measuring a huge result (hundreds of MB) are single C calls that hold
    the GIL for seconds, long enough to starve this worker's heartbeat and let its other jobs'
    leases expire; a string's length (each character is at least one byte, plus its quotes) is
    known at once.

    Args:
        value: the handler's return value (already known to be JSON-compatible or not: values of
            other types count as 1 byte; the encoder reports them).
        limit: bytes; the walk may stop as soon as the bound exceeds it.

    Returns:
        The bound in bytes (exact for nothing but tiny values; never above the real size).
    """
    total = 0
    stack = [value]
    while stack and total <= limit:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item) + 2
        elif isinstance(item, list):
            total += 1 + len(item)  # brackets and commas
            stack.extend(item)
        elif isinstance(item, dict):
            total += 1 + len(item)  # braces, colons and commas (at least)
            for key, sub in item.items():
                if isinstance(key, str):
                    total += len(key) + 2
                stack.append(sub)
        else:
            total += 1
    return total


def encode_result(result: Any, limit: int) -> str:
    """Encode a handler's return value as JSON text within ``limit`` bytes (0: no limit).

    Raises:
        ResultTooLarge: the JSON is over ``limit`` (checked first by :func:`json_size_floor`, so a
            huge value is refused without being encoded).
        PayloadNotSerializable: the value is not JSON.
    """
    if limit:
        floor = json_size_floor(result, limit)
        if floor > limit:
            raise ResultTooLarge(floor, limit, at_least=True)
    result_json = json_dumps_result(result)
    check_result_size(result_json, limit)
    return result_json


def check_result_size(result_json: str, limit: int) -> None:
    """Raise :class:`ResultTooLarge` when ``result_json`` is over ``limit`` bytes (UTF-8; 0: no limit).

    Encodes only when the character count cannot decide (a character is 1 to 4 bytes in UTF-8).
    """
    if not limit or len(result_json) * 4 <= limit:
        return
    size = len(result_json.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise ResultTooLarge(size, limit)
