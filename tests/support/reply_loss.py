"""A TCP proxy in front of a Redis that loses the reply of chosen commands after Redis ran them.

Every connection is forwarded byte for byte, except that the first time a client sends a request
holding ``marker`` (a script's SHA, say) that it has not sent before, the proxy passes the request
on, waits for Redis's reply, and resets the client's socket instead of relaying it: the command
ran, and the client sees a dropped connection (what ``CLIENT KILL`` or a reset proxy does to a
client whose reply is still on its way). The same request sent again is forwarded normally.
``lost`` counts the replies lost.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading


class ReplyLossProxy:
    def __init__(self, target: tuple[str, int], *, marker: bytes) -> None:
        self.target, self.marker = target, marker
        self.lost = 0
        self._seen: set[bytes] = set()
        self._lock = threading.Lock()
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
            t = threading.Thread(target=self._forward, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _first_time(self, request: bytes) -> bool:
        if self.marker not in request:
            return False
        with self._lock:
            new = request not in self._seen
            self._seen.add(request)
            return new

    def _forward(self, conn: socket.socket) -> None:
        upstream = socket.create_connection(self.target)
        pair = {conn: upstream, upstream: conn}
        doomed = False  # the next reply to this client is lost
        try:
            while not self._stop.is_set():
                ready, _, _ = select.select(list(pair), [], [], 0.1)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    if s is conn and self._first_time(data):
                        doomed = True
                    elif s is upstream and doomed:
                        with self._lock:
                            self.lost += 1
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        return  # the reply dies here; the close below resets the client
                    pair[s].sendall(data)
        except OSError:
            return
        finally:
            with contextlib.suppress(OSError):
                conn.close()
            upstream.close()

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(2)
        self._listener.close()

    def __enter__(self) -> ReplyLossProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
