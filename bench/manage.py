#!/usr/bin/env python
"""``manage.py`` of the benchmark project (``bench/lqbench``): migrate, runworker, ...

The benchmark runner (``bench/run.py``) starts workers through this file; it puts the repository
root on ``sys.path`` so the benchmark always measures the working tree's ``django_leasequeue``.
"""

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parent)]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lqbench.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
