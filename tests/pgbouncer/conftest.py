"""PgBouncer processes of the test's own, in transaction and in session pooling mode.

Each one listens on a free local port, forwards every database to the shared PostgreSQL
(``PGHOST``/``PGPORT``) with ``auth_type = trust``, and is stopped after the test. PgBouncer
refuses to run as root, so under root it is started with ``-u nobody``. Tests skip, with the
reason, where no ``pgbouncer`` binary is installed (``scripts/env.sh``'s ``ensure_pgbouncer``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PGBOUNCER = shutil.which("pgbouncer") or ("/usr/sbin/pgbouncer" if os.access("/usr/sbin/pgbouncer", os.X_OK) else None)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Bouncer:
    """One running pgbouncer: its ``mode`` ("transaction" or "session"), ``port`` and process."""

    mode: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    def env(self) -> dict[str, str]:
        """Environment for a ``manage.py`` process whose settings connect through this pgbouncer."""
        return {"PGHOST": "127.0.0.1", "PGPORT": str(self.port)}

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""


@pytest.fixture
def pgbouncer() -> Iterator[Callable[[str], Bouncer]]:
    """Start pgbouncer processes: ``pgbouncer("transaction")`` or ``pgbouncer("session")``."""
    if PGBOUNCER is None:
        pytest.skip("pgbouncer is not installed (scripts/env.sh ensure_pgbouncer installs Debian's package)")
    started: list[Bouncer] = []
    workdir = Path(tempfile.mkdtemp(prefix="lq-pgbouncer-"))
    workdir.chmod(0o755)  # readable by the unprivileged user pgbouncer runs as under root

    def start(mode: str) -> Bouncer:
        port = _free_port()
        ini = workdir / f"{mode}-{port}.ini"
        users = workdir / "users.txt"
        users.write_text(f'"{os.environ.get("PGUSER", "postgres")}" ""\n')
        log = workdir / f"{mode}-{port}.log"
        ini.write_text(
            "[databases]\n"
            f"* = host={os.environ.get('PGHOST', '127.0.0.1')} port={os.environ.get('PGPORT', '5432')}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {users}\npool_mode = {mode}\n"
            "default_pool_size = 20\nmax_client_conn = 200\n"
            f"admin_users = {os.environ.get('PGUSER', 'postgres')}\n"
        )
        for path in (ini, users):
            path.chmod(0o644)
        args = [PGBOUNCER, *(["-u", "nobody"] if os.geteuid() == 0 else []), str(ini)]
        with open(log, "wb") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        bouncer = Bouncer(mode, port, proc, log)
        started.append(bouncer)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return bouncer
            except OSError:
                if proc.poll() is not None:
                    break
                time.sleep(0.05)
        pytest.fail(f"pgbouncer ({mode}) did not start on port {port}:\n{bouncer.output()}")

    yield start
    for bouncer in started:
        if bouncer.proc.poll() is None:
            bouncer.proc.terminate()
            bouncer.proc.wait(10)
    shutil.rmtree(workdir, ignore_errors=True)
