"""The ``commit`` script copies one shared result from key 0 to the other keys (``COPY``) only when the
user may; the hashes, their field order and TTLs are the same either way, and a user without
``COPY`` or ``OBJECT`` passes the worker's access check. A throwaway password-protected redis-server."""

from __future__ import annotations

import re
from typing import Any

from rewardq.queue import access, scripts
from rewardq.queue.connection import connect_async
from rewardq.queue.keys import Keyspace
from rewardq.queue.results import RESULT_FIELDS
from tests.support.redis_server import RedisServer
from tests.support.sync_client import connect

#: (outputs, one row for every key?, extra-info value, result TTL): listpack and hashtable results.
CASES = (
    (4, True, '{"acc":1.0}', 1000),
    (3, True, "x" * 100, 1000),
    (3, False, '{"acc":0.0}', 1000),
    (2, True, "{}", 0),
)


def commit_all(r: Any, ns: str) -> dict[str, Any]:
    """Claim and commit CASES under namespace ``ns``; what they leave in Redis, normalised."""
    stream, group = f"{ns}:{{s0}}:stream", "g"
    r.xgroup_create(stream, group, id="0", mkstream=True)
    claim, commit = r.script_load(scripts.source("claim")), r.script_load(scripts.source("commit"))
    for t, (n, shared, extra, ttl) in enumerate(CASES):
        traj = f"{ns}:{{s0}}:traj:t{t}"
        ids = [r.xadd(stream, {"data": f"d{i}"}) for i in range(n)]
        r.xreadgroup(group, "w0", {stream: ">"}, count=100)
        r.hset(f"{ns}:{{s0}}:reward:t{t}_0", mapping={"failure_kind": "x"})  # a stale result: replaced whole
        digests = [f"x{i:016x}" for i in range(n)]
        assert r.evalsha(claim, 1, traj, "w0", "life0", 30, 4096, n, *ids, *digests) == [b"complete"]
        rows = [["ok", str(k), extra, "", "w0", "naive", "1.5", "2.5", "p", "1", ""] for k in range(1 if shared else n)]
        keys = [traj, stream, f"{ns}:{{s0}}:waiting", f"{ns}:{{s0}}:done", f"{ns}:{{s0}}:records:t{t}"]
        args = [group, f"t{t}", "w0", ttl, 1000, n, 0, n - 1, "", 600, f"{ns}:{{s0}}:reward:", "ok", 0, 4096, 1 << 22]
        args += [len(RESULT_FIELDS), *RESULT_FIELDS, len(rows), *(v for row in rows for v in row)]
        assert r.evalsha(commit, len(keys), *keys, *args) == 1

    def norm(x: Any) -> str:
        text = x.decode() if isinstance(x, bytes) else str(x)
        return re.sub(r"\d{13}-\d+", "ID", re.sub(r"\d{10}\.\d{6}", "TS", text)).replace(ns, "NS")

    out: dict[str, Any] = {}
    for k in sorted(r.scan_iter(f"{ns}:*")):
        kind = r.type(k).decode()
        values = r.hgetall(k).items() if kind == "hash" else [(e[0], sorted(e[1].items())) for e in r.xrange(k)]
        out[norm(k)] = (kind, r.ttl(k), r.object("encoding", k), [(norm(a), norm(b)) for a, b in values])
    return out


async def test_copied_results_read_as_written_ones() -> None:
    with RedisServer(password="admin-pw") as srv:
        admin = srv.client()
        for user, rules in (("full", ("+@all",)), ("nocopy", ("+@all", "-copy"))):
            admin.execute_command("ACL", "SETUSER", user, "on", ">pw", "~*", "&*", *rules)
        dumps, copies = {}, {}
        for user in ("full", "nocopy"):
            admin.execute_command("CONFIG", "RESETSTAT")
            r = connect(srv.url_for(user, "pw"))
            dumps[user] = commit_all(r, f"cc-{user}")
            copies[user] = admin.info("commandstats").get("cmdstat_copy", {}).get("calls", 0)
        assert copies == {"full": 3 + 1, "nocopy": 0}  # the 4- and 2-key listpack cases; not the hashtable one
        assert dumps["full"] == dumps["nocopy"]
        results = {k: v for k, v in dumps["full"].items() if ":reward:" in k}
        assert len(results) == sum(n for n, *_ in CASES)
        assert all(v[1] == (1000 if not k.startswith("NS:{s0}:reward:t3") else -1) for k, v in results.items())
        assert all("failure_kind" not in dict(v[3]) for v in results.values())

        assert not {"COPY", "OBJECT"} & set(access.worker_commands())
        client = connect_async(srv.url_for("nocopy", "pw"))
        try:
            await access.check_worker_access(client, Keyspace("cc-check"), srv.url_for("nocopy", "pw"))
        finally:
            await client.aclose()
