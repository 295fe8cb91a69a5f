"""Names that ``registry`` held before the enqueue path got its own modules still import from
there, as the same objects, with a DeprecationWarning that names the new home."""

from __future__ import annotations

import importlib

import pytest

import django_leasequeue
from django_leasequeue import registry


@pytest.mark.parametrize("name", sorted(registry.MOVED))
def test_a_moved_name_is_the_same_object_from_its_old_path(name):
    new_home = importlib.import_module(f"django_leasequeue.{registry.MOVED[name]}")
    with pytest.warns(DeprecationWarning, match=rf"registry\.{name} moved to django_leasequeue\."):
        old = getattr(registry, name)
    assert old is getattr(new_home, name)


def test_the_documented_old_imports_work():
    with pytest.warns(DeprecationWarning):
        from django_leasequeue.registry import Task, enqueue, task
    assert (Task, enqueue, task) == (django_leasequeue.Task, django_leasequeue.enqueue, django_leasequeue.task)


def test_an_unknown_name_is_still_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'nothing_here'"):
        registry.nothing_here  # noqa: B018
