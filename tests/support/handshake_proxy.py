"""A TCP proxy in front of a Redis that spoils the handshake of its first connections.

Connection ``i`` (counted from 0) below ``spoiled`` answers redis-py's health-check ``PING`` (which
redis-py retries by itself), reads the handshake's first command, then either
resets the socket (``"reset"``: what a server SIGKILLed after it accepted the socket does) or
answers ``-LOADING`` and closes (a restarted server still loading its data), or answers
``-WRONGPASS`` (``"wrongpass"``: every connection, never recovering). Later connections are
forwarded to ``target`` byte for byte.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
from typing import Literal

Spoil = Literal["reset", "loading", "wrongpass"]
_REPLIES = {
    "loading": b"-LOADING Redis is loading the dataset in memory\r\n",
    "wrongpass": b"-WRONGPASS invalid username-password pair or user is disabled.\r\n",
}


class HandshakeProxy:
    def __init__(self, target: tuple[str, int], *, spoiled: int, how: Spoil) -> None:
        self.target, self.spoiled, self.how = target, spoiled, how
        self.accepted = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self._listener], [], [], 0.1)
            if not ready:
                continue
            conn, _ = self._listener.accept()
            n, self.accepted = self.accepted, self.accepted + 1
            spoil = self.how == "wrongpass" or n < self.spoiled
            t = threading.Thread(target=self._spoil if spoil else self._forward, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _spoil(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            if b"PING" in conn.recv(65536):  # redis-py's health check, retried on its own: answer it
                conn.sendall(b"+PONG\r\n")
                conn.recv(65536)
            if self.how == "reset":
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            else:
                conn.sendall(_REPLIES[self.how])
        conn.close()

    def _forward(self, conn: socket.socket) -> None:
        upstream = socket.create_connection(self.target)
        pair = {conn: upstream, upstream: conn}
        try:
            while not self._stop.is_set():
                ready, _, _ = select.select(list(pair), [], [], 0.1)
                for s in ready:
                    data = s.recv(65536)
                    if not data or not self._relay(data, src=s, to=pair[s], from_client=s is conn):
                        return
        except OSError:
            return
        finally:
            conn.close()
            upstream.close()

    def _relay(self, data: bytes, *, src: socket.socket, to: socket.socket, from_client: bool) -> bool:
        """Pass ``data`` read from ``src`` on to ``to``; False ends the connection (a subclass's hook)."""
        to.sendall(data)
        return True

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(2)
        self._listener.close()

    def __enter__(self) -> HandshakeProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
