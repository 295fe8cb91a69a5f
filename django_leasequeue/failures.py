"""The error entry of a failed attempt, as stored in the job's ``errors``.

Used in the worker process (the executor, the completer) and in a process-mode child, so it
imports nothing from the package: a child formats its handler's error before Django is set up.
"""

from __future__ import annotations

import traceback
from typing import Any

MAX_MESSAGE = 4000
MAX_TRACEBACK = 20000


def describe_error(exc: BaseException, *, attempt: int, worker: str) -> dict[str, Any]:
    """Build the JSON error entry for a failed attempt; never raises, whatever ``exc`` is.

    Args:
        exc: the handler's exception (any ``BaseException``).
        attempt: the attempt number (1-based). worker: the worker id.

    Returns:
        ``{"attempt", "type", "message", "traceback", "worker"}``, every text storable in jsonb.
        A ``__str__`` or ``__repr__`` that raises, even a ``BaseException`` such as SystemExit, gives
        ``<unprintable Name>`` instead of losing the failure.
    """
    cls = type(exc)
    try:
        name = f"{cls.__module__}.{cls.__qualname__}"
    except BaseException:  # noqa: BLE001 - a metaclass with hostile attributes
        name = "<unknown exception type>"
    try:
        message = str(exc)
    except BaseException:  # noqa: BLE001 - a broken __str__ must not lose the failure (case C25)
        message = f"<unprintable {getattr(cls, '__name__', 'exception')}>"
    try:
        tb = "".join(traceback.format_exception(exc))
    except BaseException:  # noqa: BLE001 - format_exception calls the same __str__
        tb = ""
    return {"attempt": attempt, "type": storable_text(name),
            "message": storable_text(message[:MAX_MESSAGE]), "traceback": storable_text(tb[-MAX_TRACEBACK:]),
            "worker": worker}


def storable_text(text: str) -> str:
    """Make text storable in jsonb: NUL becomes U+FFFD and lone surrogates are replaced, so that
    recording a failure can never fail itself (a message with NUL would lose the error)."""
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text
