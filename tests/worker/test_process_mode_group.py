"""Process execution mode kills handlers at their timeout, for a handler that started a subprocess
of its own.

A subprocess the handler started (a converter, ``ffmpeg``, a shell script) must not be re-parented
and run on beside the job's retry: the child runs in a process group of its own and the worker
signals the whole group, so the handler's subprocess dies with the child at the timeout.
"""

from __future__ import annotations

import os
import time

import pytest

from django_leasequeue import enqueue
from django_leasequeue.models import Job

pytestmark = pytest.mark.process


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for its new parent to reap it does not)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_handlers_own_subprocess_is_killed_with_its_child_at_the_timeout(spawn, tmp_path):
    pidfile = tmp_path / "pid"
    job = enqueue("qa.adv_grandchild", [str(pidfile)])
    worker = spawn("runworker", "--burst", "--execution", "process", env={"LEASEQUEUE_LEASE": "5"})
    assert worker.wait(90) == 0, worker.output()
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 3
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    still = alive(pid)
    if still:
        os.kill(pid, 9)
    assert not still, "the handler's subprocess outlived the kill of its child at the timeout"
    assert Job.objects.get(pk=job.id).status == "dead"
