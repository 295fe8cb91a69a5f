"""Griffe extension for the API reference: render the Sphinx roles the docstrings use
(``:class:`~django_leasequeue.context.JobContext```, ``:func:`enqueue```, ...) as inline code.

The package's docstrings follow the Google style with Sphinx cross-reference roles, which
mkdocstrings would otherwise print literally. A role becomes ``JobContext`` (``~`` keeps the last
component, as in Sphinx) in code formatting; functions and methods get ``()``.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Object

_ROLE = re.compile(r":(?:py:)?(class|func|meth|mod|data|attr|exc|obj|const):`(~?)([^`]+)`")


def _render(match: re.Match[str]) -> str:
    role, tilde, target = match.groups()
    target = target.strip()
    shown = target.rsplit(".", 1)[-1] if tilde else target
    if role in ("func", "meth") and not shown.endswith(")"):
        shown += "()"
    return f"`{shown}`"


class SphinxRoles(Extension):
    """Rewrite Sphinx roles in every docstring to inline code."""

    def on_object(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is not None and ":`" in obj.docstring.value:
            obj.docstring.value = _ROLE.sub(_render, obj.docstring.value)
