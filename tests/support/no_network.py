"""A process environment with no network reach that notices every attempt to reach it.

:class:`NetworkTrap` listens on a local port and is set as every HTTP(S) proxy of a child process
(``HTTPS_PROXY``, ``HTTP_PROXY``, ``ALL_PROXY``, both cases, ``NO_PROXY`` emptied): any request the
child makes to the Hugging Face Hub (or anywhere) connects to the trap instead, which counts the
connection and closes it at once, so the request fails fast and the test can assert that none was
tried.
"""

from __future__ import annotations

import socket
import threading


class NetworkTrap:
    """Counts the connections made to it; ``env`` makes it a child process's only way out."""

    def __init__(self) -> None:
        self.connections = 0
        self._server = socket.socket()
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(16)
        self._server.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="network-trap", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.getsockname()[1]}"

    @property
    def env(self) -> dict[str, str]:
        names = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY")
        return {
            **{n: self.url for n in names},
            **{n.lower(): self.url for n in names},
            "NO_PROXY": "",
            "no_proxy": "",
        }

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def __enter__(self) -> NetworkTrap:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._server.close()
