"""The pipeline's state read back from Redis: shards, workers, waiting and finished trajectories.

Each read decodes what the keys hold into plain dicts of JSON-able values; what the operator
commands make of them is :mod:`rewardq.ops`'s (``rewardq status``, ``inspect``, ``top``), and the
fleet's backlog figure (:func:`backlog_status`) is what the worker's gauge and the autoscaler read.
Nothing here writes to Redis.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from rewardq.queue.checks import MAX_OUTPUTS
from rewardq.queue.keys import Keyspace, split_key
from rewardq.queue.results import as_text

if TYPE_CHECKING:
    from rewardq.queue.clients import AsyncRedis, SyncRedis


#: Waiting trajectories ``rewardq status`` lists.
STATUS_WAITING_LIMIT = 20
#: Seconds of finished trajectories ``rewardq status`` measures its rates over.
STATUS_RATE_WINDOW = 60.0
#: Seconds of finished trajectories ``rewardq top`` reads back when it starts, and the most done
#: entries it reads per shard in one refresh.
DONE_FEED_SINCE_S = 300.0
DONE_FEED_READ_LIMIT = 20_000

_META_FIELDS = (
    "state",
    "final",
    "stored",
    "first_seen",
    "last_seen",
    "lease",
    "lease_until",
    "worker",
    "status",
    "error",
    "done_at",
    "n",
)


_s = as_text


def as_number(v: object, default: float = 0.0) -> float:
    """A stored number as a float (``default`` when absent or not a number)."""
    try:
        return float(_s(v))
    except (TypeError, ValueError):
        return default


_f = as_number


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def shard_status(r: SyncRedis, ks: Keyspace, shard: int) -> dict[str, Any]:
    """Length, consumer-group lag, pending count and backlog of one shard's stream (:func:`shard_figures`)."""
    stream = ks.stream(shard)
    try:
        groups = r.xinfo_groups(stream)
    except ResponseError:
        groups = None
    return shard_figures(shard, stream, int(r.xlen(stream)), groups, ks.group)


def shard_figures(shard: int, stream: str, length: int, groups: list[Any] | None, group: str) -> dict[str, object]:
    """One shard's status from its XLEN and XINFO GROUPS (None: the stream has no groups).

    ``backlog`` is the entries no worker has been given yet: the group's lag when Redis knows it,
    else (``backlog_exact`` False) the entries still in the stream that no consumer holds. Redis
    reports no lag once entries after the last delivered one may have been deleted, which is
    nearly always so, because workers delete the entries whose records they stored.
    """
    out: dict[str, Any] = {
        "shard": shard,
        "stream": stream,
        "length": length,
        "lag": None,
        "pending": 0,
        "consumers": 0,
        "group": False,
    }
    for g in groups or ():
        if _s(g.get("name")) == group:
            lag = g.get("lag")
            out.update(
                group=True,
                pending=int(g.get("pending", 0)),
                consumers=int(g.get("consumers", 0)),
                lag=None if lag is None else int(lag),
                last_delivered=_s(g.get("last-delivered-id", "")),
            )
    out["backlog"] = out["lag"] if out["lag"] is not None else max(0, out["length"] - out["pending"])
    out["backlog_exact"] = out["lag"] is not None
    return out


def drain_estimate(backlog: int, outputs_per_s: float) -> float | None:
    """Seconds the fleet needs to take ``backlog`` entries at ``outputs_per_s``: 0 with no backlog,
    None when there is a backlog and nothing is being scored (it never drains at that rate)."""
    if backlog <= 0:
        return 0.0
    if outputs_per_s <= 0:
        return None
    return round(backlog / outputs_per_s, 1)


def backlog_status(shards: list[dict[str, Any]], workers: list[dict[str, Any]]) -> dict[str, Any]:
    """The fleet's backlog (entries not yet given to a worker, over every shard), its measured rate
    (outputs scored per second by the live workers over their last 10 s) and the drain time."""
    entries = sum(int(sh["backlog"]) for sh in shards)
    rate = round(sum(float(w.get("outputs_per_s", 0.0)) for w in workers), 3)
    return {
        "entries": entries,
        "exact": all(sh["backlog_exact"] for sh in shards),
        "outputs_per_s": rate,
        "seconds": drain_estimate(entries, rate),
        "workers": len(workers),
    }


async def fleet_backlog_async(r: AsyncRedis, ks: Keyspace) -> dict[str, Any]:
    """:func:`backlog_status` read from Redis on an asyncio client: one XLEN and XINFO GROUPS per
    shard, and every live worker's heartbeat (a worker's ``rewardq_backlog_seconds`` gauge)."""
    shards = []
    for shard in range(ks.shards):
        stream = ks.stream(shard)
        try:
            groups = await r.xinfo_groups(stream)
        except ResponseError:
            groups = None
        shards.append(shard_figures(shard, stream, int(await r.xlen(stream)), groups, ks.group))
    workers = []
    for name in await r.zrange(ks.workers, 0, -1):
        rates = await r.hmget(ks.worker(_s(name)), ["outputs_rate", "rate"])  # type: ignore[misc]  # redis-py types asyncio hash commands as blocking ones
        if any(v is not None for v in rates):
            workers.append({"outputs_per_s": _outputs_rate(*rates)})
    return backlog_status(shards, workers)


def _outputs_rate(outputs_rate: object, rate: object) -> float:
    """A heartbeat's outputs per second (a worker that does not publish it: its trajectories per second)."""
    return _f(outputs_rate) if outputs_rate not in (None, b"", "") else _f(rate)


def workers_status(r: SyncRedis, ks: Keyspace, now: float | None = None) -> list[dict[str, Any]]:
    """Live workers (their heartbeat hash still exists), with their counters."""
    now = time.time() if now is None else now
    out = []
    for name, beat in r.zrange(ks.workers, 0, -1, withscores=True):
        h = r.hgetall(ks.worker(_s(name)))
        if not h:
            continue  # heartbeat expired: the worker is gone
        d = {_s(k): _s(v) for k, v in h.items()}
        out.append(
            {
                "name": _s(name),
                "host": d.get("host", ""),
                "pid": int(_f(d.get("pid"))),
                "in_flight": int(_f(d.get("in_flight"))),
                "idle_s": round(now - _f(d.get("last_beat"), beat), 1),
                "scored": int(_f(d.get("scored"))),
                "errors": int(_f(d.get("errors"))),
                "dead_letters": int(_f(d.get("dead_letters"))),
                "reclaimed": int(_f(d.get("reclaimed"))),
                "rate_per_s": _f(d.get("rate")),
                "outputs_per_s": _outputs_rate(d.get("outputs_rate"), d.get("rate")),
                "manager": d.get("manager", ""),
                "scoring": d.get("scoring", ""),
                "uptime_s": round(now - _f(d.get("started_at"), now), 1),
                "started_at": _f(d.get("started_at")),  # this life's start (its clock); 0 when unknown
                # seconds from a beat that found another live process's heartbeat under this name
                # to the last beat (liveness.py; both the worker's clock; None: never)
                "shared_name_s_ago": (
                    round(_f(d.get("last_beat"), beat) - _f(d.get("shared_name_at")), 1)
                    if d.get("shared_name_at")
                    else None
                ),
                "in_flight_tids": [t for t in d.get("in_flight_tids", "").split(",") if t],
                "code": _json_dict(d.get("code")),
                "sources": _json_dict(d.get("sources")),
                "retries": int(_f(d.get("retries"))),
                "retrying": _json_dict(d.get("retrying")),
                "failures": _json_dict(d.get("failures")),
                "ledger": _json_dict(d.get("ledger")),
                "health": _json_dict(d.get("health")),
            }
        )
    out.sort(key=lambda w: str(w["name"]))
    return out


def _json_dict(text: str | None) -> dict[str, object]:
    """A heartbeat field holding a JSON object ({} when absent or unreadable)."""
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def missing_outputs(h: dict[str, Any]) -> tuple[list[int], list[int], int | None]:
    """Stored indices, missing indices (at most ``MAX_OUTPUTS`` of them listed) and the final index."""
    # o:<i> a record in the hash, r:<i> one kept in its stream entry (lua/store.lua)
    have = sorted({int(k[2:]) for k in h if k[:2] in ("o:", "r:") and k[2:].isdigit()})
    final = h.get("final")
    final_i = int(final) if final not in (None, "") and str(final).isdigit() else None
    if final_i is None:
        return have, [], None
    stored = set(have)
    missing = [i for i in range(min(final_i + 1, MAX_OUTPUTS)) if i not in stored]
    return have, missing, final_i


def waiting_status(
    r: SyncRedis, ks: Keyspace, limit: int = STATUS_WAITING_LIMIT, now: float | None = None
) -> list[dict[str, Any]]:
    """Trajectories still collecting outputs, oldest first, with what they are waiting for."""
    now = time.time() if now is None else now
    items: list[dict[str, Any]] = []
    for s in range(ks.shards):
        for raw_tid, deadline in r.zrange(ks.waiting(s), 0, limit - 1, withscores=True):
            tid = _s(raw_tid)
            fields = r.hkeys(ks.traj(s, tid))
            meta = dict(zip(_META_FIELDS, r.hmget(ks.traj(s, tid), _META_FIELDS)))
            h = {_s(k): "" for k in fields}
            h.update({k: _s(v) for k, v in meta.items() if v is not None})
            have, missing, final = missing_outputs(h)
            first = _f(h.get("first_seen"), now)
            items.append(
                {
                    "tid": tid,
                    "shard": s,
                    "have": have,
                    "final": final,
                    "missing": missing,
                    "waiting_for": (
                        f"outputs {','.join(map(str, missing))}"
                        if missing
                        else "the final output"
                        if final is None
                        else "scoring"
                    ),
                    "waited_s": round(now - first, 1),
                    "expires_in_s": round(deadline - now, 1),
                }
            )
    items.sort(key=lambda x: -x["waited_s"])
    return items[:limit]


def recent_activity(
    r: SyncRedis, ks: Keyspace, window: float = STATUS_RATE_WINDOW, now: float | None = None
) -> dict[str, Any]:
    """Finished trajectories in the last ``window`` seconds: rate, errors, cancelled (by their
    producers, never scored), latency p50/p99."""
    now = time.time() if now is None else now
    start = f"{int((now - window) * 1000)}-0"
    done, errors, cancelled, lat = 0, 0, 0, []
    for s in range(ks.shards):
        for _, f in r.xrange(ks.done(s), min=start, max="+"):
            done += 1
            if f.get(b"status") == b"error":
                errors += 1
            elif f.get(b"status") == b"cancelled":
                cancelled += 1
            v = _f(f.get(b"latency_ms"), -1.0)
            if v >= 0:
                lat.append(v)
    return {
        "window_s": window,
        "trajectories": done,
        "errors": errors,
        "cancelled": cancelled,
        "trajectories_per_s": round(done / window, 3),
        "latency_ms_p50": _percentile(lat, 50),
        "latency_ms_p99": _percentile(lat, 99),
    }


class DoneFeed:
    """Every shard's ``done`` stream, read incrementally: the trajectories finished since the last
    :meth:`poll` (``rewardq top``'s rates and sparklines), from ``since_s`` seconds ago at first."""

    def __init__(self, r: SyncRedis, ks: Keyspace, since_s: float = DONE_FEED_SINCE_S) -> None:
        self.r, self.ks = r, ks
        start = f"{int((time.time() - since_s) * 1000)}-0"
        self._last = dict.fromkeys(range(ks.shards), start)
        self._first = True

    def poll(self, limit: int = DONE_FEED_READ_LIMIT) -> list[dict[str, Any]]:
        """``[{"time", "tid", "status", "worker", "n"}]`` finished since the last call (at most
        ``limit`` per shard and call; the rest come with the next calls), oldest first."""
        out: list[dict[str, Any]] = []
        for shard in range(self.ks.shards):
            start = self._last[shard] if self._first else "(" + self._last[shard]
            entries = self.r.xrange(self.ks.done(shard), min=start, max="+", count=limit)
            for raw_id, f in entries:
                eid = _s(raw_id)
                out.append(
                    {
                        "time": int(eid.partition("-")[0]) / 1000.0,
                        "tid": _s(f.get(b"tid", b"")),
                        "status": _s(f.get(b"status", b"")),
                        "worker": _s(f.get(b"worker", b"")),
                        "n": int(_f(f.get(b"n"), 1)),
                        "shard": shard,
                    }
                )
            if entries:
                self._last[shard] = _s(entries[-1][0])
        self._first = False
        out.sort(key=lambda d: d["time"])
        return out

    def error_of(self, shard: int, tid: str) -> tuple[str, str]:
        """``(worker, error)`` of a trajectory that finished with an error (its hash, else its last key's result)."""
        worker, error, n = (_s(v) if v is not None else "" for v in self.r.hmget(self.ks.traj(shard, tid), _ERR))
        if not error and n.isdigit() and int(n) > 0:
            error = _s(self.r.hget(self.ks.reward(shard, f"{tid}_{int(n) - 1}"), "error") or "")
        return worker, error


_ERR = ("worker", "error", "n")


def waiting_count(r: SyncRedis, ks: Keyspace) -> int:
    """Trajectories still collecting outputs, over every shard."""
    return sum(int(r.zcard(ks.waiting(s))) for s in range(ks.shards))


def resolve_ref(r: SyncRedis, ks: Keyspace, ref: str) -> tuple[str, int | None]:
    """``(tid, index)`` of ``ref``: a ref that names an existing trajectory is taken as one
    (index None); otherwise as an output key ``<uid>_<sid>_<i>`` when it parses as one."""
    if not r.exists(ks.traj_key(ref)):
        try:
            return split_key(ref)
        except ValueError:
            pass
    return ref, None


def trajectory_fields(r: SyncRedis, ks: Keyspace, shard: int, tid: str) -> tuple[dict[str, Any], dict[int, Any]]:
    """A trajectory's hash (field names as text, values as stored) and the records workers kept
    (``keep_records``) by output index."""
    h = {_s(k): v for k, v in r.hgetall(ks.traj(shard, tid)).items()}
    kept = {int(_s(k)[2:]): v for k, v in r.hgetall(ks.records(shard, tid)).items()}
    return h, kept


def worker_life(r: SyncRedis, ks: Keyspace, name: str) -> str | None:
    """The process life worker ``name``'s heartbeat publishes (None: it does not beat, or wrote none):
    a lease whose ``lease_life`` differs was taken by an earlier process under that name."""
    life = r.hget(ks.worker(name), "life")
    return _s(life) if life is not None else None


def reward_exists(r: SyncRedis, ks: Keyspace, shard: int, key: str) -> bool:
    """Whether ``key`` has a result hash."""
    return bool(r.exists(ks.reward(shard, key)))


def reward_hash(r: SyncRedis, ks: Keyspace, shard: int, key: str) -> tuple[dict[Any, Any], int | None]:
    """``key``'s result hash ({} when none) and the seconds it still lives (None: no expiry)."""
    res = r.hgetall(ks.reward(shard, key))
    if not res:
        return {}, None
    ttl = r.ttl(ks.reward(shard, key))
    return res, ttl if ttl >= 0 else None
