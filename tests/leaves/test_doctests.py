"""The examples in the package's docstrings run and print what they show.

Every module of ``django_leasequeue`` whose source holds a ``>>>`` example is run through
:func:`doctest.testmod`; each must attempt at least one example (an example doctest cannot find,
for instance in a string that is not a docstring, would otherwise never run) and fail none.
"""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "django_leasequeue"


def modules_with_examples() -> list[str]:
    """Dotted names of the package's modules whose source holds a ``>>>`` example, sorted."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" in path.parts or ">>>" not in path.read_text():
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


MODULES = modules_with_examples()


def test_the_package_has_examples_to_run():
    assert "django_leasequeue.retry" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_the_examples_of_a_module_pass(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.attempted > 0, f"{name} holds '>>>' but doctest found no example in its docstrings"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} failed (output above)"
