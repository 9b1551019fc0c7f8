"""A throwaway local Redis Cluster (3 masters, no replicas) for the cluster tests.

:class:`LocalCluster` follows the "Local Redis Cluster" recipe of the project notes:
three ``redis-server --cluster-enabled yes`` daemons on free ports ``P`` (their cluster
bus on ``P + 10000``), each with its own pidfile and log in a fresh temporary directory,
joined by ``redis-cli --cluster create ... --cluster-replicas 0 --cluster-yes``, ready once
every node reports ``cluster_state:ok``. :meth:`LocalCluster.stop` ends exactly the
processes named in those pidfiles; nothing is ever killed by name.

>>> with LocalCluster() as c:                # doctest: +SKIP
...     url = c.url                          # 'redis+cluster://127.0.0.1:<P>'

Also here, for the tests on it: :data:`SHARDS`, the shards of their namespaces, :func:`uid_on_shard`
and :func:`assert_drained`.
"""

from __future__ import annotations

import functools
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rewardq.queue.keys import Keyspace
    from tests.support.sync_client import ClusterClient

logger = logging.getLogger("rewardq.tests.support.cluster")

BUS_OFFSET = 10000
#: The shards of a cluster test's namespace: two on each of the three masters.
SHARDS = 6


def uid_on_shard(ks: Keyspace, shard: int, prefix: str) -> str:
    """A uid whose trajectory ``<uid>_s`` routes to ``shard``."""
    for i in range(10_000):
        if ks.shard_of(f"{prefix}{i}_s") == shard:
            return f"{prefix}{i}"
    raise AssertionError(f"no uid for shard {shard}")


def assert_drained(rc: ClusterClient, ks: Keyspace) -> None:
    """Every shard's stream of ``ks`` is empty, and nothing is pending in its group."""
    for s in range(ks.shards):
        assert rc.xlen(ks.stream(s)) == 0, f"shard {s} stream not empty"
        assert rc.xpending(ks.stream(s), ks.group)["pending"] == 0, f"shard {s} has pending entries"


class ClusterStartError(RuntimeError):
    """The local cluster did not come up; the message carries the redis log tails."""


def _port_free(port: int) -> bool:
    """True when nothing listens on 127.0.0.1:``port`` and we may bind it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def find_free_ports(n: int = 3, lo: int = 20000, hi: int = 29000, attempts: int = 200) -> list[int]:
    """``n`` consecutive ports ``P..P+n-1`` such that they and ``P+10000..`` are all free."""
    rng = random.Random(os.getpid() ^ time.time_ns())
    for _ in range(attempts):
        base = rng.randrange(lo, hi - n)
        ports = list(range(base, base + n))
        if all(_port_free(p) and _port_free(p + BUS_OFFSET) for p in ports):
            return ports
    raise ClusterStartError(f"no {n} free consecutive ports (and their +{BUS_OFFSET} bus ports) in [{lo}, {hi})")


def _pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (an exited but not yet reaped zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] != "Z"


class LocalCluster:
    """Start and stop a 3-master Redis Cluster on 127.0.0.1.

    Args:
        masters: number of master nodes (3 is the minimum ``redis-cli --cluster create`` accepts).
        node_timeout_ms: ``--cluster-node-timeout``.
        ready_timeout: seconds to wait for ``cluster_state:ok`` on every node.

    Attributes:
        ports: client ports of the nodes.
        dir: the temporary directory holding configs, pidfiles and logs.
        startup_seconds: how long :meth:`start` took.
    """

    def __init__(self, masters: int = 3, node_timeout_ms: int = 2000, ready_timeout: float = 30.0) -> None:
        self.masters = masters
        self.node_timeout_ms = node_timeout_ms
        self.ready_timeout = ready_timeout
        self.ports: list[int] = []
        self.dir: Path | None = None
        self.startup_seconds = 0.0

    # -- addresses -------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:<first port>``: what rewardq clients and workers take."""
        return f"redis+cluster://127.0.0.1:{self.ports[0]}"

    def pidfile(self, port: int) -> Path:
        assert self.dir is not None
        return self.dir / f"redis-{port}.pid"

    def logfile(self, port: int) -> Path:
        assert self.dir is not None
        return self.dir / f"redis-{port}.log"

    # -- life cycle ------------------------------------------------------------------------
    def start(self) -> LocalCluster:
        """Start the nodes, create the cluster, wait until it serves every slot.

        Raises ClusterStartError (with the log tails) on any failure, after stopping
        whatever it started.
        """
        t0 = time.perf_counter()
        self.dir = Path(tempfile.mkdtemp(prefix="rewardq-cluster-"))
        self.ports = find_free_ports(self.masters)
        try:
            for port in self.ports:
                self._start_node(port)
            for port in self.ports:
                self._wait(functools.partial(self._answers_ping, port), f"node {port} to answer PING", 10)
            create = subprocess.run(
                [
                    "redis-cli",
                    "--cluster",
                    "create",
                    *(f"127.0.0.1:{p}" for p in self.ports),
                    "--cluster-replicas",
                    "0",
                    "--cluster-yes",
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
            if create.returncode != 0:
                raise ClusterStartError(
                    f"redis-cli --cluster create failed ({create.returncode}):\n"
                    f"{create.stdout[-2000:]}\n{create.stderr[-2000:]}"
                )
            self._wait(self._ready, "cluster_state:ok on every node", self.ready_timeout)
        except BaseException as exc:
            tails = self.log_tails()
            self.stop()
            if isinstance(exc, ClusterStartError):
                raise ClusterStartError(f"{exc}\n{tails}") from None
            raise ClusterStartError(f"local cluster failed to start: {exc!r}\n{tails}") from exc
        self.startup_seconds = time.perf_counter() - t0
        logger.info("local cluster ready on ports %s in %.2fs (dir %s)", self.ports, self.startup_seconds, self.dir)
        return self

    def _start_node(self, port: int) -> None:
        assert self.dir is not None
        cmd = [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            str(self.dir / f"nodes-{port}.conf"),
            "--cluster-node-timeout",
            str(self.node_timeout_ms),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.dir),
            "--daemonize",
            "yes",
            "--pidfile",
            str(self.pidfile(port)),
            "--logfile",
            str(self.logfile(port)),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        if proc.returncode != 0:
            raise ClusterStartError(
                f"redis-server on port {port} exited {proc.returncode}: {proc.stdout[-1000:]} {proc.stderr[-1000:]}"
            )
        self._wait(lambda: self._read_pid(port) is not None, f"pidfile of node {port}", 10)

    def _ready(self) -> bool:
        for port in self.ports:
            info = self._cli(port, "cluster", "info")
            if "cluster_state:ok" not in info or "cluster_slots_ok:16384" not in info:
                return False
        return True

    def stop(self) -> None:
        """SIGTERM each node by the PID in its pidfile (SIGKILL after 5 s); remove the directory."""
        if self.dir is None:
            return
        pids = [pid for pid in (self._read_pid(p) for p in self.ports) if pid is not None]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5.0
        while any(_pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in pids:
            if _pid_alive(pid):
                logger.warning("redis node pid %d ignored SIGTERM; sending SIGKILL", pid)
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- helpers -----------------------------------------------------------------------------
    def pids(self) -> list[int]:
        """PIDs of the running nodes, from their pidfiles."""
        return [pid for pid in (self._read_pid(p) for p in self.ports) if pid is not None]

    def _read_pid(self, port: int) -> int | None:
        try:
            text = self.pidfile(port).read_text().strip()
        except (OSError, AssertionError):
            return None
        return int(text) if text.isdigit() else None

    def _cli(self, port: int, *args: str) -> str:
        try:
            proc = subprocess.run(
                ["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args], capture_output=True, text=True, timeout=5
            )
        except subprocess.TimeoutExpired:
            return ""
        return proc.stdout

    def log_tails(self, lines: int = 30) -> str:
        """The last ``lines`` lines of every node's log, for failure messages."""
        out = []
        for port in self.ports:
            try:
                tail = self.logfile(port).read_text(errors="replace").splitlines()[-lines:]
            except (OSError, AssertionError):
                tail = ["<no log>"]
            out.append(f"--- redis {port} log tail ---\n" + "\n".join(tail))
        return "\n".join(out)

    def _answers_ping(self, port: int) -> bool:
        return self._cli(port, "ping").strip() == "PONG"

    @staticmethod
    def _wait(cond: Callable[[], object], what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if cond():
                return
            if time.monotonic() >= deadline:
                raise ClusterStartError(f"timed out after {timeout:g}s waiting for {what}")
            time.sleep(0.05)
