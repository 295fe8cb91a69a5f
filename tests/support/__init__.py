"""Support code of the tests (not tests themselves).

``tests.support.jobs`` holds the helpers most tests share (run a claimed job in-process, read job
rows, wait for a condition); they are importable from here too (``from tests.support import claim``).
They load on first use, so that ``tests.support.chaos.report`` runs without Django settings.
``tests.support.chaos`` is the chaos suite's harness, throwaway cluster and report.
"""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    """Forward ``tests.support.<name>`` to :mod:`tests.support.jobs` (imported on first use).

    Raises:
        AttributeError: when ``tests.support.jobs`` has no such name.
    """
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(importlib.import_module("tests.support.jobs"), name)
