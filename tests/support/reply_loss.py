"""A TCP proxy in front of a Redis that loses the reply of chosen commands after Redis ran them.

Every connection is forwarded byte for byte, except that the first time a client sends a request
holding ``marker`` (a script's SHA, say) that it has not sent before, the proxy passes the request
on, waits for Redis's reply, and resets the client's socket instead of relaying it: the command
ran, and the client sees a dropped connection (what ``CLIENT KILL`` or a reset proxy does to a
client whose reply is still on its way). The same request sent again is forwarded normally.
``lost`` counts the replies lost.
"""

from __future__ import annotations

import socket
import struct
import threading

from tests.support.handshake_proxy import HandshakeProxy


class ReplyLossProxy(HandshakeProxy):
    """Listening, forwarding and closing as :class:`HandshakeProxy` (no handshake spoiled); its
    :meth:`_relay` loses the replies (see the module doc)."""

    def __init__(self, target: tuple[str, int], *, marker: bytes) -> None:
        self.marker = marker
        self.lost = 0
        self._seen: set[bytes] = set()
        self._doomed: set[socket.socket] = set()
        self._lock = threading.Lock()
        super().__init__(target, spoiled=0, how="reset")

    def _first_time(self, request: bytes) -> bool:
        new = self.marker in request and request not in self._seen
        self._seen.add(request)
        return new

    def _relay(self, data: bytes, *, src: socket.socket, to: socket.socket, from_client: bool) -> bool:
        with self._lock:
            if from_client and self._first_time(data):
                self._doomed.add(to)  # the upstream socket whose next reply is lost
            elif not from_client and src in self._doomed:
                self._doomed.discard(src)
                self.lost += 1
                to.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return False  # the reply dies here; closing the client's socket resets it
        to.sendall(data)
        return True

    def __enter__(self) -> ReplyLossProxy:
        return self
