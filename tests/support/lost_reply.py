"""A TCP relay between the test's connections and PostgreSQL that loses one reply on purpose.

:class:`ReplyLosingRelay` listens on a free local port and relays every connection to the real
server. Armed with a byte pattern (``lose_reply_to(b"COMMIT\\x00")``), it forwards the first message
that contains it, lets the server run it to the end (it waits for the server's ``ReadyForQuery``:
an autocommit statement is committed by then, a ``COMMIT`` too), then drops both ends of that
connection without passing the reply on. The client sees what it sees when a pooler or a server
dies at that instant: "server closed the connection unexpectedly", with the write committed.
``cut_before(pattern)`` drops the connection instead of forwarding the message: the write never
reaches the server.

The relay reads the protocol only to find the end of the reply, so the connections through it
must not use TLS or GSSAPI encryption: :meth:`ReplyLosingRelay.settings` gives a Django
``DATABASES`` entry that turns both off, and :func:`default_connection_through_relay` points the
test's ``default`` connection (and what derives its parameters from it) at a new relay.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# A ReadyForQuery message: type "Z", length 5, then the transaction status byte.
READY_FOR_QUERY = b"Z\x00\x00\x00\x05"


class ReplyLosingRelay:
    """Relay connections to ``host:port`` (default ``PGHOST``/``PGPORT``); lose one reply when armed.

    Attributes:
        port (int): the local port to connect to.
        lost (int): replies lost so far; cut (int): messages cut before the server got them.
    """

    def __init__(self, host: str | None = None, port: int | None = None) -> None:
        self.target = (host or os.environ.get("PGHOST", "127.0.0.1"), int(port or os.environ.get("PGPORT", "5432")))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.lost = 0
        self.cut = 0
        self._armed: tuple[str, bytes] | None = None
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, name="reply-losing-relay", daemon=True).start()

    def settings(self, settings_dict: dict[str, Any]) -> dict[str, Any]:
        """``settings_dict`` (a Django ``DATABASES`` entry) pointed at this relay, unencrypted."""
        options = {**settings_dict.get("OPTIONS", {}), "sslmode": "disable", "gssencmode": "disable"}
        return {**settings_dict, "HOST": "127.0.0.1", "PORT": str(self.port), "OPTIONS": options}

    def lose_reply_to(self, pattern: bytes) -> None:
        """Arm: the next message containing ``pattern`` runs on the server, its reply is lost."""
        with self._lock:
            self._armed = ("lose", pattern)

    def cut_before(self, pattern: bytes) -> None:
        """Arm: the connection drops as the next message containing ``pattern`` is sent."""
        with self._lock:
            self._armed = ("cut", pattern)

    def close(self) -> None:
        self._closed = True
        self.listener.close()
        for sock in list(self._sockets):
            _close(sock)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                _close(client)
                continue
            self._sockets += [client, server]
            losing = threading.Event()  # set by the client side once the armed message went through
            threading.Thread(target=self._to_server, args=(client, server, losing), daemon=True).start()
            threading.Thread(target=self._to_client, args=(server, client, losing), daemon=True).start()

    def _to_server(self, client: socket.socket, server: socket.socket, losing: threading.Event) -> None:
        while True:
            data = _recv(client)
            if not data:
                break
            with self._lock:
                armed = self._armed
                hit = armed is not None and armed[1] in data
                if hit:
                    self._armed = None
            if hit and armed is not None and armed[0] == "cut":
                self.cut += 1
                break
            if hit:
                losing.set()
            try:
                server.sendall(data)
            except OSError:
                break
        _close(client)
        _close(server)

    def _to_client(self, server: socket.socket, client: socket.socket, losing: threading.Event) -> None:
        held = b""
        while True:
            data = _recv(server)
            if not data:
                break
            if losing.is_set():
                # The reply to the armed message: hold it back until the server is done with the
                # message (ReadyForQuery follows its last result), then drop both ends.
                held += data
                at = held.find(READY_FOR_QUERY)
                if at >= 0 and len(held) > at + len(READY_FOR_QUERY):
                    self.lost += 1
                    break
                continue
            try:
                client.sendall(data)
            except OSError:
                break
        _close(client)
        _close(server)


@contextmanager
def default_connection_through_relay() -> Iterator[ReplyLosingRelay]:
    """Point Django's ``default`` connection at a new :class:`ReplyLosingRelay` to its server;
    restore it (and close the relay) afterwards."""
    from django.db import connection

    relay = ReplyLosingRelay(connection.settings_dict["HOST"] or None, connection.settings_dict["PORT"] or None)
    saved = connection.settings_dict
    connection.close()
    connection.settings_dict = relay.settings(saved)
    try:
        yield relay
    finally:
        connection.close()
        connection.settings_dict = saved
        relay.close()


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
