"""``django_leasequeue.enqueue`` is the function (the enqueue path lives in the submodule
``enqueueing``, so no submodule shadows it), and importing the package imports neither Django's
database layer nor the models."""

from __future__ import annotations

import subprocess
import sys

import pytest

ORDERS = {
    "submodule first": "import django_leasequeue.enqueueing\nfrom django_leasequeue import enqueue\n",
    "function first": "from django_leasequeue import enqueue\nimport django_leasequeue.enqueueing\n",
    "through a name": "from django_leasequeue.enqueueing import build_job\nfrom django_leasequeue import enqueue\n",
}


@pytest.mark.parametrize("imports", ORDERS.values(), ids=ORDERS.keys())
def test_enqueue_is_the_function_whatever_the_import_order(imports):
    code = imports + (
        "import sys, types, django_leasequeue\n"
        "assert callable(enqueue) and not isinstance(enqueue, types.ModuleType), enqueue\n"
        "assert django_leasequeue.enqueue is enqueue is sys.modules['django_leasequeue.enqueueing'].enqueue\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_importing_the_package_imports_no_database_layer():
    code = ("import sys, django_leasequeue\n"
            "assert not [m for m in sys.modules if m.startswith(('django.db', 'django_leasequeue.'))], "
            "sorted(sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
