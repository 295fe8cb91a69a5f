"""A module the worker must never import: importing it records that it happened."""

import os

os.environ["LEASEQUEUE_TEST_NEVER_IMPORTED"] = "imported"


def boom(*args, **kwargs):
    raise AssertionError("never_imported.boom ran")
