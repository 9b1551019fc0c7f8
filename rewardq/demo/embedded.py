"""A Redis stand-in inside the demo process: fakeredis served over TCP on 127.0.0.1.

``rewardq demo`` without ``--redis-url`` needs a server that separate worker *processes* can
reach, so an in-memory ``FakeRedis`` object is not enough. :class:`EmbeddedRedis` runs
``fakeredis.TcpFakeServer`` (a threading TCP server speaking RESP2/RESP3) on a free port in a
background thread; workers connect to ``redis://127.0.0.1:<port>/0`` like to any Redis.

It runs rewardq's Lua scripts through ``lupa`` (store, commit, fail, expire, renew, release
all work; see TRAPS.md for the few commands fakeredis lacks). It is a demo server: data lives
in this process's memory, every command runs under the GIL of the demo process, and it is
gone when :meth:`EmbeddedRedis.stop` returns.

>>> with EmbeddedRedis() as server:          # doctest: +SKIP
...     print(server.url)
redis://127.0.0.1:40123/0
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any

logger = logging.getLogger("rewardq.demo")

__all__ = ["EmbeddedRedis"]


def _server_class() -> type:
    """``TcpFakeServer`` with ``TCP_NODELAY`` on every client socket.

    fakeredis writes each reply of a pipeline separately; with Nagle's algorithm on, the
    second small write waits for the client's delayed ACK (~40 ms), which made a two-command
    pipeline take 45 ms instead of 0.1 ms.
    """
    from fakeredis import TcpFakeServer

    class NoDelayFakeServer(TcpFakeServer):
        def get_request(self) -> tuple[socket.socket, Any]:
            sock, addr = super().get_request()
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock, addr

    return NoDelayFakeServer


class EmbeddedRedis:
    """fakeredis on ``host:port`` (port 0: the OS picks a free one) in a daemon thread."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def start(self) -> EmbeddedRedis:
        """Bind, start serving, and return self. The port is known once this returns."""
        self._server = _server_class()((self.host, self.port), server_type="redis")
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"embedded-redis-{self.port}",
            daemon=True,
        )
        self._thread.start()
        logger.info("embedded Redis stand-in (fakeredis) listening on %s", self.url)
        return self

    def stop(self) -> None:
        """Stop serving, close every client connection and the listening socket."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        logger.info("embedded Redis stand-in stopped")

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
