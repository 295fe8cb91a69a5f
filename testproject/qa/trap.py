"""A module no worker may import: a job row naming ``qa.trap.run`` must be dead-lettered as an
unknown task without importing it. Importing it creates the file named by ``QA_TRAP_FILE``."""

import os
from pathlib import Path

if os.environ.get("QA_TRAP_FILE"):
    Path(os.environ["QA_TRAP_FILE"]).write_text("imported\n")


def run(*args, **kwargs):
    if os.environ.get("QA_TRAP_FILE"):
        Path(os.environ["QA_TRAP_FILE"]).write_text("ran\n")
