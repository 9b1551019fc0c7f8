"""What one large record costs every other client of Redis: whole in one stream entry, or as a blob.

    python -m benchmarks.blob_latency [--records 40] [--mb 31]

Starts a throwaway ``redis-server --maxmemory 2gb`` and an idle control server, and a PING sampler
in its own process (``tests/support/ping_sampler.py``, every 10 ms, both servers in turn). Then,
for each way, puts ``--records`` records of ``--mb`` MB and reads each back, one at a time:

* ``entry``: one ``XADD`` holding the whole record, one ``XREADGROUP`` delivering it (how records
  travelled before :mod:`rewardq.queue.blobs`);
* ``blob``: the record as a blob of 1 MiB pieces (:func:`~rewardq.queue.blobs.write_blob`), a
  small entry naming it, and the pieces read back one command at a time
  (:func:`~rewardq.queue.blobs.resolve_entries`), as producers and workers do now.

Prints, per way, the seconds it took and the PING p99 / worst of the loaded server beside the
control's (the same machine at the same time), and their ratio. Quote the load average with it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any

from rewardq.queue.blobs import blob_fields, new_blob, resolve_entries, write_blob
from rewardq.queue.connection import connect_async
from rewardq.queue.entries import entries_from_reply
from rewardq.queue.keys import Keyspace


def _entry(r: Any, ks: Keyspace, data: bytes) -> None:
    r.xadd(ks.stream(0), {"key": "k_s_0", "data": data, "ts": "0"})
    r.xreadgroup(ks.group, "bench", {ks.stream(0): ">"}, count=1)
    r.delete(ks.stream(0))
    r.xgroup_create(ks.stream(0), ks.group, id="0", mkstream=True)


def _blob(r: Any, url: str, ks: Keyspace, data: bytes) -> None:
    name = new_blob(ks, 0)
    write_blob(r, name, data)
    r.xadd(ks.stream(0), blob_fields("k_s_0", name, data, "0"))

    async def read() -> None:
        a = connect_async(url)
        try:
            resp = await a.xreadgroup(ks.group, "bench", {ks.stream(0): ">"}, count=1)
            entries = entries_from_reply(resp, ks)
            await resolve_entries(a, ks, entries, len(data))
            assert entries and entries[0].data == data
        finally:
            await a.aclose()

    asyncio.run(read())
    r.delete(name, ks.stream(0))
    r.xgroup_create(ks.stream(0), ks.group, id="0", mkstream=True)


def main() -> None:
    from tests.support.ping_sampler import PingSampler  # the tests' sampler, in its own process
    from tests.support.redis_server import RedisServer

    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=40)
    ap.add_argument("--mb", type=int, default=31)
    args = ap.parse_args()
    data = os.urandom(args.mb * 10**6)
    ks = Keyspace("bench")
    out: dict[str, Any] = {}
    with RedisServer(extra=["--maxmemory", "2gb", "--maxmemory-policy", "noeviction"]) as srv, RedisServer() as idle:
        r = srv.client()
        r.xgroup_create(ks.stream(0), ks.group, id="0", mkstream=True)
        for way in ("entry", "blob"):
            t0 = time.perf_counter()
            with PingSampler(srv.url, control=idle.url) as s:
                for _ in range(args.records):
                    if way == "entry":
                        _entry(r, ks, data)
                    else:
                        _blob(r, srv.url, ks, data)
            took = time.perf_counter() - t0
            res, ctl = s.result, s.result["control"]
            out[way] = {
                "seconds": round(took, 2),
                "ping_p99_ms": round(res["p99_ms"], 1),
                "ping_worst_ms": round(res["worst_ms"], 1),
                "control_p99_ms": round(ctl["p99_ms"], 1),
                "control_worst_ms": round(ctl["worst_ms"], 1),
                "p99_vs_control": round(res["p99_ms"] / max(ctl["p99_ms"], 1.0), 2),
                "samples": res["samples"],
            }
        r.close()
    out["load_average"] = list(os.getloadavg())
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
