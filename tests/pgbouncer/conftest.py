"""PgBouncer processes of the test's own, in transaction and in session pooling mode.

Each one listens on a free local port, forwards every database to the shared PostgreSQL
(``PGHOST``/``PGPORT``) with ``auth_type = trust``, and is stopped after the test. PgBouncer
refuses to run as root, so under root it is started with ``-u nobody``. Tests skip, with the
reason, where no ``pgbouncer`` binary is installed (``scripts/env.sh``'s ``ensure_pgbouncer``).

The database user is also an ``admin_users`` entry: :meth:`Bouncer.admin` runs commands
(``RECONNECT``, ``PAUSE``, ``SHOW POOLS``) on the admin console, the virtual database ``pgbouncer``;
:meth:`Bouncer.restart` kills the process and starts a new one on the same port.
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

import psycopg
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
    args: list[str]

    def env(self) -> dict[str, str]:
        """Environment for a ``manage.py`` process whose settings connect through this pgbouncer
        (in transaction mode with the settings that pooling needs: server-side cursors off)."""
        pooled = {"TESTPROJECT_TRANSACTION_POOLING": "1"} if self.mode == "transaction" else {}
        return {"PGHOST": "127.0.0.1", "PGPORT": str(self.port), **pooled}

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def admin(self, command: str) -> list[tuple[object, ...]]:
        """Run ``command`` on the admin console; return its rows (none for RECONNECT, PAUSE...).

        The console speaks only the simple query protocol: a statement without parameters,
        which psycopg sends as a simple query, in autocommit (no BEGIN)."""
        user = os.environ.get("PGUSER", "postgres")
        with psycopg.connect(host="127.0.0.1", port=self.port, dbname="pgbouncer", user=user,
                             autocommit=True, connect_timeout=5) as conn:
            cur = conn.execute(command.encode())
            return cur.fetchall() if cur.description else []

    def kill(self) -> None:
        """SIGKILL the process: every client and server connection it held drops at once."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def restart(self) -> float:
        """Kill the process and start a new one with the same configuration on the same port;
        return the seconds the port was closed (from the kill until it accepts again)."""
        started = time.monotonic()
        self.kill()
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT)
        _wait_listening(self)
        return time.monotonic() - started


def _wait_listening(bouncer: Bouncer, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", bouncer.port), timeout=0.5).close()
            return
        except OSError:
            if bouncer.proc.poll() is not None:
                break
            time.sleep(0.02)
    pytest.fail(f"pgbouncer ({bouncer.mode}) did not start on port {bouncer.port}:\n{bouncer.output()}")


@pytest.fixture
def pgbouncer() -> Iterator[Callable[..., Bouncer]]:
    """Start pgbouncer processes: ``pgbouncer("transaction")`` or ``pgbouncer("session")``;
    ``pool_size`` is the number of server connections per database and user (1: every client
    shares one, so session state one client leaves behind is visible to the next)."""
    if PGBOUNCER is None:
        pytest.skip("pgbouncer is not installed (scripts/env.sh ensure_pgbouncer installs Debian's package)")
    started: list[Bouncer] = []
    workdir = Path(tempfile.mkdtemp(prefix="lq-pgbouncer-"))
    workdir.chmod(0o755)  # readable by the unprivileged user pgbouncer runs as under root

    def start(mode: str, *, pool_size: int = 20) -> Bouncer:
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
            f"default_pool_size = {pool_size}\nmax_client_conn = 200\n"
            f"admin_users = {os.environ.get('PGUSER', 'postgres')}\n"
        )
        for path in (ini, users):
            path.chmod(0o644)
        args = [PGBOUNCER, *(["-u", "nobody"] if os.geteuid() == 0 else []), str(ini)]
        with open(log, "wb") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        bouncer = Bouncer(mode, port, proc, log, args)
        started.append(bouncer)
        _wait_listening(bouncer)
        return bouncer

    yield start
    for bouncer in started:
        if bouncer.proc.poll() is None:
            bouncer.proc.terminate()
            bouncer.proc.wait(10)
    shutil.rmtree(workdir, ignore_errors=True)
