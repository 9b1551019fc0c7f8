"""A throwaway ``redis-server`` for tests that restart, kill or lock down Redis.

The shared Redis at 6379 is never restarted by tests; tests that need to restart the
server, turn AOF on, set a password, add ACL users or speak TLS start their own::

    with RedisServer(appendonly=True) as srv:          # a free port, a fresh temp dir
        client = RewardClient.from_url(srv.url, namespace="x")
        ...
        srv.restart(kill=True)                          # SIGKILL, then the same port and data dir

The server is a child process of the test (``--daemonize no``), stopped by its PID only.
With ``tls=True`` a throwaway CA and a server certificate for ``127.0.0.1``/``localhost``
are made by ``openssl`` in the temp dir; :attr:`RedisServer.url` then is a ``rediss://``
URL carrying ``ssl_ca_certs``.
"""

from __future__ import annotations

import atexit
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any
from urllib.parse import quote

import redis

from tests.support.sync_client import SyncClient, connect

_LIVE: weakref.WeakSet[RedisServer] = weakref.WeakSet()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def make_certificates(directory: Path) -> dict[str, Path]:
    """A throwaway CA and a server certificate (SAN ``127.0.0.1``, ``localhost``), valid one day."""
    d = Path(directory)
    ca_key, ca_crt = d / "ca.key", d / "ca.crt"
    key, csr, crt, ext = d / "server.key", d / "server.csr", d / "server.crt", d / "server.ext"
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    run(
        "req",
        "-x509",
        *ec,
        "-keyout",
        str(ca_key),
        "-out",
        str(ca_crt),
        "-days",
        "1",
        "-subj",
        "/CN=rewardq throwaway test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    )
    run("req", "-new", *ec, "-keyout", str(key), "-out", str(csr), "-subj", "/CN=localhost")
    ext.write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
        "authorityKeyIdentifier=keyid,issuer\nsubjectKeyIdentifier=hash\n"
    )
    run(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca_crt),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-out",
        str(crt),
        "-days",
        "1",
        "-extfile",
        str(ext),
    )
    return {"ca": ca_crt, "cert": crt, "key": key}


class RedisServer:
    """One ``redis-server`` child process on a free port, in its own temp dir.

    Args:
        appendonly: turn on AOF with ``appendfsync always`` (a restart loses nothing acknowledged).
        password: ``requirepass`` for the default user.
        users: ACL users created at start, ``{name: password}`` (all keys, channels, commands).
        tls: serve TLS only, with a throwaway CA (see :func:`make_certificates`).
        port: default: a free one, kept across restarts.
        extra: more ``redis-server`` arguments.
    """

    def __init__(
        self,
        *,
        appendonly: bool = False,
        password: str | None = None,
        users: dict[str, str] | None = None,
        tls: bool = False,
        port: int | None = None,
        extra: list[str] | None = None,
    ) -> None:
        self.appendonly = appendonly
        self.password = password
        self.users = dict(users or {})
        self.tls = tls
        self.port = port or free_port()
        self.extra = list(extra or [])
        self.dir = Path(tempfile.mkdtemp(prefix="rewardq-redis-"))
        self.certs = make_certificates(self.dir) if tls else {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    # -- addresses -------------------------------------------------------------------------
    def url_for(self, username: str | None = None, password: str | None = None, db: int = 0) -> str:
        """A URL for this server with the given credentials (TLS query string included)."""
        auth = ""
        if password is not None:
            auth = f"{quote(username or '', safe='')}:{quote(password, safe='')}@"
        elif username:
            auth = f"{quote(username, safe='')}@"
        if self.tls:
            return f"rediss://{auth}127.0.0.1:{self.port}/{db}?ssl_ca_certs={self.certs['ca']}"
        return f"redis://{auth}127.0.0.1:{self.port}/{db}"

    @property
    def url(self) -> str:
        """The default user's URL (with the password, if one is set)."""
        return self.url_for(password=self.password)

    def client(self, **kwargs: Any) -> SyncClient:
        """A plain blocking client as the default user."""
        return connect(self.url, socket_connect_timeout=2, **kwargs)

    # -- life cycle ----------------------------------------------------------------------------
    def _args(self) -> list[str]:
        args = [
            "redis-server",
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
            "--daemonize",
            "no",
            "--logfile",
            str(self.dir / "redis.log"),
            "--save",
            "",
            "--protected-mode",
            "no",
            "--pidfile",
            str(self.dir / "redis.pid"),
        ]
        if self.tls:
            args += [
                "--port",
                "0",
                "--tls-port",
                str(self.port),
                "--tls-cert-file",
                str(self.certs["cert"]),
                "--tls-key-file",
                str(self.certs["key"]),
                "--tls-ca-cert-file",
                str(self.certs["ca"]),
                "--tls-auth-clients",
                "no",
            ]
        else:
            args += ["--port", str(self.port)]
        if self.appendonly:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        if self.password is not None:
            args += ["--requirepass", self.password]
        for name, pw in self.users.items():
            args += ["--user", name, "on", f">{pw}", "~*", "&*", "+@all"]
        return args + self.extra

    def start(self, timeout: float = 20.0) -> RedisServer:
        """Start the server and wait until it answers PING."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        self.proc = subprocess.Popen(
            self._args(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        _LIVE.add(self)
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                c = self.client()
                try:
                    if c.ping():
                        return self
                finally:
                    c.close()
            except redis.BusyLoadingError as exc:  # replaying the AOF
                last = exc
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                last = exc
            time.sleep(0.05)
        self.stop(kill=True)
        raise RuntimeError(f"redis-server on port {self.port} not ready after {timeout}s ({last}):\n{self.log_tail()}")

    def stop(self, *, kill: bool = False, timeout: float = 20.0) -> None:
        """Stop the server by its PID: SIGTERM (a clean shutdown) or SIGKILL (a crash)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    def restart(self, *, kill: bool = False, down_for: float = 0.0) -> None:
        """Stop (``kill``: SIGKILL), stay down ``down_for`` seconds, start again on the same port and dir."""
        self.stop(kill=kill)
        if down_for:
            time.sleep(down_for)
        self.start()
        self.restarts += 1

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join((self.dir / "redis.log").read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def cleanup(self) -> None:
        """Stop the server and remove its temp dir."""
        self.stop(kill=True)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.cleanup()


@atexit.register
def _stop_leftovers() -> None:  # a test that died half-way must not leave servers behind
    for srv in list(_LIVE):
        try:
            srv.cleanup()
        except Exception:  # noqa: BLE001 - best effort at exit: the other servers still stop
            pass
