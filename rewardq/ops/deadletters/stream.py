"""Dead letters: list, show, retry and purge them (the Redis commands ``rewardq dead-letters`` sends).

A dead letter is an entry of a shard's ``<ns>:{s}:dead`` stream. Its fields: ``kind`` (a
:class:`~rewardq.queue.states.DeadLetterKind`: ``invalid`` undecodable or invalid record;
``conflict`` contradicting records; ``scoring`` the manager failed; ``crashed`` its scoring took
the worker process down ``max_crashes`` times while scored alone; ``exhausted`` delivered
``max_deliveries`` times; ``incomplete`` outputs never arrived), ``reason``, ``traceback``,
``tid``, ``key``, ``entry_id``, ``deliveries``, ``worker``, ``time``, ``ts`` and ``data`` (the
raw record, when there was one: whole up to 1 MiB, else its first 64 KiB, with ``data_bytes``
its full size and ``truncated`` = 1).

**Bounds.** Each shard's stream keeps at most ``dead_letter_bytes`` (64 MiB by default) of dead
letters, at most ``DEAD_MAXLEN`` of them, none older than ``dead_letter_ttl`` (7 days): the worker
trims the oldest as it adds one (``add_dead`` in ``lua/common.lua``), counting the bytes in
``<dead>:bytes``; deleting one here keeps that count right.

**Retry** puts a dead letter back to work: the trajectory it names is reopened (its error
results are deleted, the records workers kept with ``keep_records`` restored) and the raw record is
added to the stream again, so a worker re-assembles and re-scores it -- after you fixed the
scorer, raised a limit or upgraded the workers. A dead letter that keeps only the first 64 KiB of
its record cannot put the record back (retry says so): the trajectory is reopened, its kept
records restored when there are any; else put the trajectory again. Records are deleted when a
trajectory ends, so without kept records a trajectory of several outputs waits for its other
outputs (retry says so: put the trajectory again). An ``incomplete`` trajectory is reopened to
wait for its missing outputs for another ``incomplete_timeout``. The dead letter is removed once
it has been put back.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rewardq.queue.broker import INCOMPLETE_TIMEOUT
from rewardq.queue.checks import MAX_OUTPUTS
from rewardq.queue.codec import peek_identity
from rewardq.queue.keys import Keyspace, parse_key
from rewardq.queue.results import as_text

if TYPE_CHECKING:
    from rewardq.queue.clients import SyncRedis


#: Dead letters of one shard ``rewardq status`` still reads to count them by kind (beyond: the total only).
STATUS_DEAD_LETTER_SCAN = 10_000

#: Lua: reopen a finished trajectory so that a retried record is scored again. Its kept records
#: (``records``, kept ``keep_records`` seconds) come back by one RENAME: the trajectory hash's own
#: fields (at most 2 * max_outputs + 32 small ones) are copied into the records hash, which then
#: replaces it; no record byte is copied.
#: Budget: deletes at most max_outputs (ARGV[4]) result keys, whatever the hash's ``n`` says.
#: Returns {results cleared, records restored, outputs the trajectory has (0: unknown)}, or -1.
_REOPEN = """
local traj, waiting, records = KEYS[1], KEYS[2], KEYS[3]
local rprefix, tid, deadline = ARGV[1], ARGV[2], tonumber(ARGV[3])
local max_out = tonumber(ARGV[4])
if redis.call('EXISTS', traj) == 0 then return -1 end
local n = math.min(tonumber(redis.call('HGET', traj, 'n') or '0') or 0, max_out)
for i = 0, n - 1 do redis.call('DEL', rprefix .. tid .. '_' .. i) end
local restored = 0
if redis.call('EXISTS', records) == 1 and redis.call('HLEN', traj) <= 2 * max_out + 32 then
  local names = redis.call('HKEYS', traj)
  local values = {}
  for a = 1, #names, 1000 do
    for _, v in ipairs(redis.call('HMGET', traj, unpack(names, a, math.min(#names, a + 999)))) do
      values[#values + 1] = v
    end
  end
  local pairs_ = {}
  for j = 1, #names do
    if string.sub(names[j], 1, 2) ~= 'o:' then
      pairs_[#pairs_ + 1] = names[j]
      pairs_[#pairs_ + 1] = values[j]
    end
  end
  restored = math.min(redis.call('HLEN', records), max_out)
  for a = 1, #pairs_, 1000 do redis.call('HSET', records, unpack(pairs_, a, math.min(#pairs_, a + 999))) end
  redis.call('RENAME', records, traj)
else
  redis.call('HSET', traj, 'bytes', 0)
end
redis.call('HDEL', traj, 'status', 'error', 'failure_kind', 'done_at', 'n', 'worker', 'lease', 'lease_until',
           'lease_life', 'acks',
           'attempts', 'solo', 'shared', 'unfinished', 'last_failure', 'handbacks',
           'retries', 'retry_since', 'retry_at', 'retry_reason')
redis.call('HSET', traj, 'state', 'collecting', 'stored', restored)
redis.call('PERSIST', traj)
local final = redis.call('HGET', traj, 'final')
if not (final and restored == tonumber(final) + 1) then
  redis.call('ZADD', waiting, deadline, tid)
end
return {n, restored, final and (tonumber(final) + 1) or 0}
"""


#: Lua: delete dead letters (ARGV: their ids) and take their bytes off the stream's count.
_REMOVE = """
local dead, counter = KEYS[1], KEYS[2]
local removed = 0
for j = 1, #ARGV do
  local got = redis.call('XRANGE', dead, ARGV[j], ARGV[j])
  if #got == 1 then
    local size = 0
    for _, v in ipairs(got[1][2]) do size = size + #v end
    redis.call('XDEL', dead, ARGV[j])
    redis.call('HINCRBY', counter, 'n', -size)
    removed = removed + 1
  end
end
return removed
"""

_s = as_text


@dataclass
class DeadLetter:
    """One dead letter. ``ref`` (``<shard>:<id>``) names it on the command line."""

    shard: int
    id: str
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def ref(self) -> str:
        return f"{self.shard}:{self.id}"

    def text(self, name: str) -> str:
        return _s(self.fields.get(name, b""))

    @property
    def kind(self) -> str:
        return self.text("kind")

    @property
    def time(self) -> float:
        try:
            return float(self.text("time") or 0)
        except ValueError:
            return 0.0

    @property
    def truncated(self) -> bool:
        """Whether it keeps only the first bytes of its record (which then cannot be put back)."""
        return self.text("truncated") == "1"

    def summary(self) -> dict[str, Any]:
        """Everything but the raw bytes, as plain JSON-able values."""
        out: dict[str, Any] = {k: _s(v) for k, v in self.fields.items() if k not in ("data",)}
        data = self.fields.get("data") or b""
        out["data_bytes"] = int(self.text("data_bytes") or len(data))
        out["truncated"] = self.truncated
        if self.truncated:
            out["data_kept_bytes"] = len(data)
        ident = peek_identity(data) if data else None
        if ident:
            out["record"] = {"uid": ident[0], "session_id": ident[1], "index": ident[2]}
        out["ref"] = self.ref
        return out


@dataclass(frozen=True)
class Retried:
    """What :meth:`DeadLetters.retry` did (``rewardq dead-letters retry`` words it)."""

    #: The trajectory the dead letter names ("" when it names none).
    tid: str = ""
    #: Whether that trajectory was reopened (its error results cleared, kept records restored).
    reopened: bool = False
    #: Results deleted, kept records restored, and outputs the trajectory has.
    cleared: int = 0
    restored: int = 0
    outputs: int = 0
    #: Whether the raw record was added to the stream again.
    requeued: bool = False
    #: The dead letter kept only the first bytes of its record (of ``record_bytes``): not requeued.
    truncated: bool = False
    record_bytes: int = 0


class DeadLetters:
    """Dead-letter operations on a blocking client (``decode_responses=False``)."""

    def __init__(
        self,
        client: SyncRedis,
        ks: Keyspace,
        *,
        incomplete_timeout: float = INCOMPLETE_TIMEOUT,
        max_outputs: int = MAX_OUTPUTS,
    ) -> None:
        self.r = client
        self.ks = ks
        self.incomplete_timeout = incomplete_timeout
        self.max_outputs = max_outputs

    def count(self) -> int:
        return sum(int(self.r.xlen(self.ks.dead(s))) for s in range(self.ks.shards))

    def tally(self, max_scan: int = STATUS_DEAD_LETTER_SCAN) -> tuple[int, dict[str, int]]:
        """``(total, by kind)`` over every shard; a shard holding more than ``max_scan`` dead
        letters counts toward the total only (its kinds are not read)."""
        total = 0
        by_kind: dict[str, int] = {}
        for s in range(self.ks.shards):
            n = int(self.r.xlen(self.ks.dead(s)))
            total += n
            if n and n <= max_scan:
                for _, f in self.r.xrange(self.ks.dead(s)):
                    k = _s(f.get(b"kind", b"?"))
                    by_kind[k] = by_kind.get(k, 0) + 1
        return total, by_kind

    def iter(
        self, *, kind: str | None = None, newest_first: bool = True, limit: int | None = None
    ) -> Iterator[DeadLetter]:
        """Dead letters of every shard, merged by time (newest first: only the newest ``limit``
        of each shard are read when no ``kind`` is asked for)."""
        items: list[DeadLetter] = []
        for s in range(self.ks.shards):
            if newest_first and limit is not None and kind is None:
                got = self.r.xrevrange(self.ks.dead(s), count=limit)
            else:
                got = self.r.xrange(self.ks.dead(s))
            for eid, fields in got:
                dl = DeadLetter(s, _s(eid), {_s(k): v for k, v in fields.items()})
                if kind is None or dl.kind == kind:
                    items.append(dl)
        items.sort(key=lambda d: (d.time, d.id), reverse=newest_first)
        yield from items[:limit] if limit is not None else items

    def get(self, ref: str) -> DeadLetter:
        """A dead letter by ``<shard>:<id>`` (or a bare id, searched on every shard)."""
        shard_s, sep, eid = ref.partition(":")
        shards = [int(shard_s)] if sep and shard_s.isdigit() else range(self.ks.shards)
        eid = eid if sep and shard_s.isdigit() else ref
        for s in shards:
            if not 0 <= s < self.ks.shards:
                break
            got = self.r.xrange(self.ks.dead(s), min=eid, max=eid, count=1)
            if got:
                return DeadLetter(s, _s(got[0][0]), {_s(k): v for k, v in got[0][1].items()})
        raise KeyError(f"no dead letter {ref!r}; list them with `rewardq dead-letters list`")

    def retry(self, dl: DeadLetter) -> Retried:
        """Put one dead letter back to work (see the module doc); returns what was done."""
        tid = dl.text("tid")
        data = dl.fields.get("data") or b""
        cut = dl.truncated
        record_bytes = int(dl.text("data_bytes") or len(data))
        if not tid and data:
            ident = peek_identity(data)
            if ident:
                tid = f"{ident[0]}_{ident[1]}"
        if not tid and dl.text("key"):
            named = parse_key(dl.text("key"))
            tid = f"{named[0]}_{named[1]}" if named else ""
        requeue = bool(data) and not cut
        done = Retried(tid=tid, requeued=requeue, truncated=cut, record_bytes=record_bytes)
        if tid:
            shard = self.ks.shard_of(tid)
            reopened = self.r.eval(
                _REOPEN,
                3,
                self.ks.traj(shard, tid),
                self.ks.waiting(shard),
                self.ks.records(shard, tid),
                self.ks.reward_prefix(shard),
                tid,
                time.time() + self.incomplete_timeout,
                self.max_outputs,
            )
            if reopened != -1:
                cleared, restored, outputs = (int(x) for x in reopened)
                done = Retried(tid, True, cleared, restored, outputs, requeue, cut, record_bytes)
        else:
            shard = dl.shard
        if requeue:
            self.r.xadd(self.ks.stream(shard), {"key": dl.text("key"), "data": data, "ts": f"{time.time():.6f}"})
        self._remove(dl.shard, [dl.id])
        return done

    def _remove(self, shard: int, ids: list[str]) -> None:
        """Delete dead letters of ``shard``, keeping the stream's byte count right."""
        for a in range(0, len(ids), 1000):
            self.r.eval(_REMOVE, 2, self.ks.dead(shard), self.ks.dead_bytes(shard), *ids[a : a + 1000])

    def purge(self, refs: list[str] | None = None, *, kind: str | None = None, older_than: float | None = None) -> int:
        """Delete dead letters: the given ones, or all matching ``kind`` / ``older_than`` seconds."""
        if refs:
            targets = [self.get(r) for r in refs]
        else:
            cutoff = time.time() - older_than if older_than is not None else None
            targets = [d for d in self.iter(kind=kind) if cutoff is None or d.time <= cutoff]
        by_shard: dict[int, list[str]] = {}
        for d in targets:
            by_shard.setdefault(d.shard, []).append(d.id)
        for shard, ids in by_shard.items():
            self._remove(shard, ids)
        return len(targets)
