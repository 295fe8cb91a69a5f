"""Throwaway PostgreSQL clusters for the restart and failover tests: ``initdb`` into a temporary
directory, started on a free port of 127.0.0.1, restarted at will, removed at the end; for the
failover test, a streaming standby of it made by ``pg_basebackup -R`` (:func:`throwaway_pair`),
on a free port of its own, promoted at will. A prepared cluster (databases created and migrated)
can be kept stopped as a template (:func:`throwaway_template`) and copied for each test, instead
of an ``initdb`` and a migration per test.

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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg


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
    running: bool = False

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

    def init_from(self, template: Path) -> None:
        """Make this cluster's data directory a copy of ``template``, the data directory of a
        cluster shut down cleanly (:func:`throwaway_template`): its databases come with it.

        Raises:
            RuntimeError: the copy failed.
        """
        # cp -a keeps the owner (the postgres user, when we are root) and the 0700 mode the server
        # insists on.
        result = subprocess.run(["cp", "-a", str(template), str(self.data)], capture_output=True, text=True,
                                timeout=120)
        if result.returncode:
            raise RuntimeError(f"copying the template {template} failed: {result.stderr}")

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
        self.running = True

    def restart(self) -> None:
        """Fast shutdown (every session terminated, open transactions rolled back), then start."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", self.options, "-m", "fast", "-w",
                  "-t", "60", "restart")

    def stop(self) -> None:
        """Immediate shutdown: every server process ends at once, as in a crash of the server."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "-t", "60", "stop")
        self.running = False

    def shut_down(self) -> None:
        """Fast shutdown: sessions terminated, a checkpoint written; the data directory is then
        clean, to be copied (:meth:`init_from`)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")
        self.running = False

    def promote(self) -> None:
        """Promote this standby to a primary; returns once it accepts writes (``pg_ctl promote -w``)."""
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "promote")

    def sql(self, statement: str, params: tuple[object, ...] = (),
            dbname: str = "postgres") -> list[tuple[object, ...]]:
        """Run one statement in autocommit on this server (as ``postgres``); return its rows (none
        for a statement without a result)."""
        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=dbname, autocommit=True,
                             connect_timeout=10) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

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


def _new_cluster(parent: Path | None = None, name: str = "") -> Cluster:
    """A :class:`Cluster` in a new directory (under ``parent``, else a temporary one), owned by the
    user the server will run as; nothing is initialised or started yet."""
    bindir = find_bindir()
    if bindir is None:
        raise RuntimeError("no PostgreSQL server binaries")
    if parent is None:
        root = Path(tempfile.mkdtemp(prefix="leasequeue-chaos-pg-"))
    else:
        root = parent / name
        root.mkdir()
    user = None
    if os.geteuid() == 0:
        user = "postgres"
        entry = pwd.getpwnam(user)
        os.chown(root, entry.pw_uid, entry.pw_gid)
    return Cluster(bindir=bindir, root=root, port=free_port(), user=user)


def _stop_quietly(cluster: Cluster) -> None:
    if cluster.running:
        try:
            cluster.stop()
        except (RuntimeError, subprocess.TimeoutExpired):
            time.sleep(1)


@contextmanager
def throwaway_cluster() -> Iterator[Cluster]:
    """Create, start, yield, and finally stop and delete a cluster (see the module docstring).

    Call :func:`unavailable` first (the caller skips with its reason).
    """
    reason = unavailable()
    if reason:
        raise RuntimeError(reason)
    cluster = _new_cluster()
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        _stop_quietly(cluster)
        shutil.rmtree(cluster.root, ignore_errors=True)


@contextmanager
def throwaway_template(prepare: Callable[[Cluster], None]) -> Iterator[Path]:
    """A cluster started, handed to ``prepare`` (create and migrate its databases), shut down
    cleanly; yields its data directory, for :func:`throwaway_pair` to copy; deleted at the end.

    Call :func:`unavailable` first (the caller skips with its reason).
    """
    with throwaway_cluster() as cluster:
        prepare(cluster)
        cluster.shut_down()
        yield cluster.data


STANDBY_NAME = "standby1"  # the standby's application_name, which synchronous_standby_names names


@dataclass
class Pair:
    """A primary and its streaming standby (:func:`throwaway_pair`)."""

    primary: Cluster
    standby: Cluster
    synchronous: bool

    def env(self, dbname: str) -> dict[str, str]:
        """Environment for ``manage.py`` processes that reach ``dbname`` on whichever of the two
        accepts writes: libpq's multi-host list, primary first, with ``target_session_attrs=read-write``
        (read by the test project's settings)."""
        return {**self.primary.env(dbname), "PGHOST": "127.0.0.1,127.0.0.1",
                "PGPORT": f"{self.primary.port},{self.standby.port}",
                "LEASEQUEUE_DB_TARGET_SESSION_ATTRS": "read-write"}

    def attach_standby(self, timeout: float = 60) -> None:
        """Take a base backup of the primary as it is now (its databases included), start it as a
        streaming standby, and wait until it streams; with :attr:`synchronous`, make it the
        primary's synchronous standby and wait until the primary reports it ``sync``, so that from
        then on every commit the primary acknowledges has been flushed by the standby too.

        Raises:
            RuntimeError: the backup or the start failed, or the standby did not stream in time.
        """
        # -R writes standby.signal and a primary_conninfo; ours, written after it, wins and names the
        # standby, so that synchronous_standby_names can refer to it.
        self.standby._run("pg_basebackup", "-h", "127.0.0.1", "-p", str(self.primary.port), "-U", "postgres",
                          "-D", str(self.standby.data), "-R", "-X", "stream", "--no-sync", "-c", "fast")
        conninfo = f"host=127.0.0.1 port={self.primary.port} user=postgres application_name={STANDBY_NAME}"
        with open(self.standby.data / "postgresql.auto.conf", "a") as fh:
            fh.write(f"primary_conninfo = '{conninfo}'\n")
        self.standby.start()
        wanted = "sync" if self.synchronous else "async"
        if self.synchronous:
            # Set after the backup: the standby's copy of the configuration must not wait for a
            # standby of its own once it is promoted.
            self.primary.sql(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'")
            self.primary.sql("SELECT pg_reload_conf()")
        deadline = time.monotonic() + timeout
        while True:
            rows = self.primary.sql("SELECT sync_state FROM pg_stat_replication WHERE application_name = %s "
                                    "AND state = 'streaming'", (STANDBY_NAME,))
            if rows and rows[0][0] == wanted:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the standby is not streaming ({wanted}) after {timeout} s: {rows}\n"
                                   f"{self.standby.log.read_text() if self.standby.log.exists() else ''}")
            time.sleep(0.1)


@contextmanager
def throwaway_pair(*, synchronous: bool, template: Path | None = None) -> Iterator[Pair]:
    """A started throwaway primary and an empty standby cluster beside it, in one temporary
    directory; the caller creates its databases on the primary (or they come with ``template``, a
    data directory from :func:`throwaway_template` the primary starts as a copy of), then calls
    :meth:`Pair.attach_standby`. Both are stopped and deleted at the end.

    Call :func:`unavailable` first (the caller skips with its reason).
    """
    reason = unavailable()
    if reason:
        raise RuntimeError(reason)
    parent = Path(tempfile.mkdtemp(prefix="leasequeue-chaos-pair-"))
    os.chmod(parent, 0o755)
    pair = Pair(primary=_new_cluster(parent, "primary"), standby=_new_cluster(parent, "standby"),
                synchronous=synchronous)
    while pair.standby.port == pair.primary.port:  # neither listens yet, so free_port() may repeat
        pair.standby.port = free_port()
    try:
        if template is None:
            pair.primary.init()
        else:
            pair.primary.init_from(template)
        pair.primary.start()
        yield pair
    finally:
        _stop_quietly(pair.standby)
        _stop_quietly(pair.primary)
        shutil.rmtree(parent, ignore_errors=True)
