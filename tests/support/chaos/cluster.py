"""A throwaway PostgreSQL cluster for the restart test: ``initdb`` into a temporary directory,
started on a free port of 127.0.0.1, restarted at will, removed at the end.

The shared server at 127.0.0.1:5432 is never touched (other people's test runs use it). The
binaries are the newest ``/usr/lib/postgresql/<version>/bin``; :func:`find_bindir` returns None
where there are none, and the test skips with that reason. As root, the server runs as the
``postgres`` system user (PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


def find_bindir() -> Path | None:
    """The newest ``/usr/lib/postgresql/*/bin`` holding ``initdb`` and ``pg_ctl``, or None."""
    candidates = []
    for bindir in Path("/usr/lib/postgresql").glob("*/bin"):
        if (bindir / "initdb").exists() and (bindir / "pg_ctl").exists() and bindir.parent.name.isdigit():
            candidates.append((int(bindir.parent.name), bindir))
    return max(candidates)[1] if candidates else None


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    bindir: Path
    root: Path
    port: int
    user: str | None  # run the server as this system user (None: as ourselves)

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def log(self) -> Path:
        return self.root / "server.log"

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self.user:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if result.returncode:
            log = self.log.read_text() if self.log.exists() else ""
            raise RuntimeError(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout}{result.stderr}\n{log}")
        return result

    def init(self) -> None:
        # No fsync: the cluster lives for one test; a restart (fast shutdown) still writes a
        # checkpoint, so nothing committed is lost by it.
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync",
                  "--locale=C.UTF-8")

    @property
    def options(self) -> str:
        # fsync and full-page writes off: they protect against a crash of the machine, which these
        # tests never cause. synchronous_commit stays on: with it off, ``pg_ctl stop -m immediate``
        # (a crash of the server, which the tests do cause) loses commits it had acknowledged, and
        # a completion the worker saw committed would vanish: a re-run the queue cannot prevent.
        return (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c full_page_writes=off -c max_connections=100")

    def start(self) -> None:
        # -l: the server's output goes to a file, not to our pipe (which would never close).
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", self.options, "-w", "-t", "60", "start")

    def restart(self) -> None:
        """Fast shutdown (every session terminated, open transactions rolled back), then start."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", self.options, "-m", "fast", "-w",
                  "-t", "60", "restart")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "-t", "60", "stop")

    def createdb(self, name: str) -> None:
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name)

    def env(self, dbname: str) -> dict[str, str]:
        """Environment for ``manage.py`` processes using database ``dbname`` of this cluster."""
        return {"PGHOST": "127.0.0.1", "PGPORT": str(self.port), "PGUSER": "postgres", "PGPASSWORD": "",
                "LEASEQUEUE_DB_NAME": dbname}


def unavailable() -> str | None:
    """Why no throwaway cluster can be made here, or None if one can."""
    if find_bindir() is None:
        return "no PostgreSQL server binaries (initdb, pg_ctl) under /usr/lib/postgresql/*/bin"
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            return "running as root without runuser to start the server as the postgres user"
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' system user to run the server"
    return None


@contextmanager
def throwaway_cluster() -> Iterator[Cluster]:
    """Create, start, yield, and finally stop and delete a cluster (see the module docstring).

    Call :func:`unavailable` first (the caller skips with its reason).
    """
    reason = unavailable()
    bindir = find_bindir()
    if reason or bindir is None:
        raise RuntimeError(reason or "no PostgreSQL server binaries")
    user = None
    root = Path(tempfile.mkdtemp(prefix="leasequeue-chaos-pg-"))
    if os.geteuid() == 0:
        user = "postgres"
        entry = pwd.getpwnam(user)
        os.chown(root, entry.pw_uid, entry.pw_gid)
    cluster = Cluster(bindir=bindir, root=root, port=free_port(), user=user)
    started = False
    try:
        cluster.init()
        cluster.start()
        started = True
        yield cluster
    finally:
        if started:
            try:
                cluster.stop()
            except (RuntimeError, subprocess.TimeoutExpired):
                time.sleep(1)
        shutil.rmtree(root, ignore_errors=True)
