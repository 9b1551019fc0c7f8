"""The Redis database one test run writes to, held by that run alone, and the check that it is left empty.

Every developer's test runs share the Redis at 127.0.0.1:6379. A run that wants Redis claims one of
its numbered databases (1 .. ``databases - 1``; 0 is left to people and benchmarks), and every test
of the run writes there: ``tests.conftest.REDIS_URL`` names it, and the worker processes, Ray
actors and CLI commands the tests start get that URL. Since nothing else writes to a claimed
database, "the run left no key behind" is exact: at the end of the run every key in it except the
claim is a leftover, and fails the run (``tests/conftest.py``, ``pytest_sessionfinish``) with the
keys listed. Concurrent runs of other developers write to their own databases and never trip it.

The claim is one key, :data:`CLAIM_KEY`, holding who holds the database (host, pid, a heartbeat
taken from the server's clock, refreshed every :data:`BEAT_SECONDS`) and whether the run is still
going. A database may be claimed when it is empty and unclaimed, when its run ended, or when its
holder is dead (its pid gone on this host, or no heartbeat for :data:`STALE_SECONDS`); the claimer
then deletes whatever a finished or killed run left there (test keys, by construction) before
starting. A database with keys and no claim belongs to somebody else and is never touched.
Claims are taken with WATCH/MULTI, so two runs never get the same database.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

import redis

CLAIM_KEY = "rewardq-tests:claim"
BEAT_SECONDS = 10.0
STALE_SECONDS = 600.0


class NoDatabaseFree(RuntimeError):
    """Every numbered database is held by a live run or holds somebody else's keys."""


def with_db(url: str, db: int) -> str:
    """``url`` with its database number replaced by ``db`` (``redis://h:6379/0`` -> ``redis://h:6379/7``)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, parts.fragment))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class ClaimedDb:
    """One database held by this process until :meth:`release`, with a heartbeat thread keeping it."""

    url: str
    db: int
    cleaned: list[str] = field(default_factory=list)
    """Keys a finished or killed run had left in it, deleted when this run claimed it."""
    _holder: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def leftovers(self) -> list[str]:
        """Every key in the database except the claim, sorted."""
        r = _client(self.url)
        try:
            return sorted(k for k in cast(list[str], list(r.scan_iter(count=1000))) if k != CLAIM_KEY)
        finally:
            r.close()

    def delete(self, keys: list[str]) -> None:
        r = _client(self.url)
        try:
            for i in range(0, len(keys), 500):
                r.delete(*keys[i : i + 500])
        finally:
            r.close()

    def release(self) -> None:
        """Mark the run ended, so a later run may take the database over (it deletes any straggler key)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        r = _client(self.url)
        try:
            _swap(r, self._holder, _holder_value(r, state="ended"))
        finally:
            r.close()

    def _beat(self) -> None:
        while not self._stop.wait(BEAT_SECONDS):
            try:
                r = _client(self.url)
                try:
                    fresh = _holder_value(r, state="running")
                    if _swap(r, self._holder, fresh):
                        self._holder = fresh
                finally:
                    r.close()
            except redis.RedisError:
                continue  # the next beat tries again; a run without Redis fails in its tests

    def start_beating(self) -> None:
        self._thread = threading.Thread(target=self._beat, name="claimed-db-heartbeat", daemon=True)
        self._thread.start()


def _client(url: str) -> Any:
    return redis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=2, socket_timeout=10)


def _holder_value(r: Any, *, state: str) -> str:
    seconds, _ = r.time()
    return json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "beat": seconds, "state": state})


def _swap(r: Any, old: str, new: str) -> bool:
    """Set the claim to ``new`` only while it still reads ``old``."""
    with r.pipeline() as pipe:
        try:
            pipe.watch(CLAIM_KEY)
            if pipe.get(CLAIM_KEY) != old:
                return False
            pipe.multi()
            pipe.set(CLAIM_KEY, new)
            pipe.execute()
            return True
        except redis.WatchError:
            return False


def _free(holder: str | None, size: int, now: float) -> bool:
    """May a run take this database: unclaimed and empty, or held by a run that ended or died."""
    if holder is None:
        return size == 0
    try:
        h = json.loads(holder)
    except ValueError:
        return False
    if h.get("state") == "ended":
        return True
    if h.get("host") == socket.gethostname() and not _pid_alive(int(h.get("pid", 0))):
        return True
    return now - float(h.get("beat", 0)) > STALE_SECONDS


def _try_claim(url: str, db: int) -> ClaimedDb | None:
    target = with_db(url, db)
    r = _client(target)
    try:
        with r.pipeline() as pipe:
            try:
                pipe.watch(CLAIM_KEY)
                holder = pipe.get(CLAIM_KEY)
                now = float(pipe.time()[0])
                if not _free(holder, int(pipe.dbsize()), now):
                    return None
                mine = _holder_value(r, state="running")
                pipe.multi()
                pipe.set(CLAIM_KEY, mine)
                pipe.execute()
            except redis.WatchError:
                return None  # another run claimed it first
        claimed = ClaimedDb(target, db, _holder=mine)
        claimed.cleaned = claimed.leftovers()
        claimed.delete(claimed.cleaned)
        claimed.start_beating()
        return claimed
    finally:
        r.close()


def claim(url: str, *, wait: float = 120.0) -> ClaimedDb:
    """Claim a free numbered database on the server of ``url``, waiting up to ``wait`` s for one."""
    r = _client(url)
    try:
        try:
            count = int(r.config_get("databases")["databases"])
        except redis.ResponseError:
            count = 16  # CONFIG may be refused by an ACL; 16 is Redis's default
    finally:
        r.close()
    deadline = time.monotonic() + wait
    while True:
        for db in range(1, count):
            got = _try_claim(url, db)
            if got is not None:
                return got
        if time.monotonic() > deadline:
            raise NoDatabaseFree(
                f"no free database on {url} among 1..{count - 1}: each is held by a running test run or holds "
                f"keys without a {CLAIM_KEY!r} key. Set REWARDQ_TEST_REDIS_URL to a Redis of your own."
            )
        time.sleep(1.0)
