"""Checking "every key of every trajectory ends with exactly one result" after a fault.

Used by the fault tests and by ``python -m benchmarks.faults``. The verdict counts, for a
set of output keys and the reward each must get:

* ``lost``        keys without a result, or whose trajectory never finished (no ``done`` entry);
* ``duplicated``  trajectories finished more than once (two ``done`` entries), plus keys whose
                  result differs from the expected one (a second, different write);
* ``errors``      keys whose result is an error;

and the leftovers that must be empty once all is scored: unprocessed stream entries,
pending entries, trajectories waiting for outputs, dead letters.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from redis.exceptions import ResponseError

from rewardq.queue.keys import Keyspace, split_key
from rewardq.queue.results import RewardResult
from tests.support.managers import expected_reward

SAMPLE = {"data_source": "test", "reward_model": {"ground_truth": "42"}, "extra_info": {"split": "train"}}


@dataclass
class Trajectory:
    uid: str
    session_id: str
    outputs: list[dict[str, Any]]
    expected: dict[str, float]  # key -> reward EchoManager gives it


def make_trajectories(n: int, *, seed: int = 0, max_outputs: int = 4, prefix: str = "t") -> list[Trajectory]:
    """``n`` trajectories of 1..max_outputs outputs with random ids, and the reward of each key."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = int(rng.integers(1, max_outputs + 1))
        outputs = [
            {
                "prompt_ids": rng.integers(1, 1000, int(rng.integers(1, 20))),
                "response_ids": rng.integers(1, 1000, int(rng.integers(1, 30))),
            }
            for _ in range(k)
        ]
        uid, sid = f"{prefix}{i}", f"s{seed}"
        expected = {f"{uid}_{sid}_{j}": expected_reward(o["response_ids"]) for j, o in enumerate(outputs)}
        out.append(Trajectory(uid, sid, outputs, expected))
    return out


def push(client: Any, trajectories: Iterable[Trajectory]) -> list[str]:
    """Push trajectories with a blocking client; returns their keys."""
    keys: list[str] = []
    for t in trajectories:
        keys += client.put_trajectory(t.uid, t.session_id, t.outputs, SAMPLE)
    return keys


@dataclass
class Verdict:
    trajectories: int = 0
    keys: int = 0
    lost: int = 0
    duplicated: int = 0
    errors: int = 0
    wrong: list[str] = field(default_factory=list)  # keys with an unexpected value (in `duplicated`)
    unfinished: list[str] = field(default_factory=list)  # trajectories without a done entry
    missing: list[str] = field(default_factory=list)  # keys without a result
    leftovers: dict[str, int] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return self.lost == 0 and self.duplicated == 0 and self.errors == 0

    def summary(self) -> str:
        return (
            f"trajectories={self.trajectories} keys={self.keys} lost={self.lost} "
            f"duplicated={self.duplicated} errors={self.errors}"
        )

    def explain(self) -> str:
        return (
            f"{self.summary()} missing={self.missing[:5]} unfinished={self.unfinished[:5]} "
            f"wrong={self.wrong[:5]} leftovers={self.leftovers}"
        )


def done_counts(r: Any, ks: Keyspace) -> tuple[Counter[str], Counter[str]]:
    """``(finishes per trajectory, finishes per status)`` from every shard's ``done`` stream."""
    per_tid: Counter[str] = Counter()
    per_status: Counter[str] = Counter()
    for shard in range(ks.shards):
        last = "-"
        while True:
            batch = r.xrange(ks.done(shard), min=last, max="+", count=1000)
            if last != "-":
                batch = batch[1:]
            if not batch:
                break
            for _eid, f in batch:
                per_tid[f[b"tid"].decode()] += 1
                per_status[f.get(b"status", b"").decode()] += 1
            last = batch[-1][0].decode()
    return per_tid, per_status


def pending(r: Any, ks: Keyspace, shard: int) -> int:
    """Entries of ``shard``'s stream delivered to the group's workers and not acknowledged.

    A stream that does not exist holds nothing, pending or not: 0. Any error (the group is
    missing from an existing stream, Redis is unreachable) is raised: a count that cannot be
    read is never reported as "nothing pending".
    """
    stream = ks.stream(shard)
    if not r.exists(stream):
        return 0
    try:
        return int(r.xpending(stream, ks.group)["pending"])
    except ResponseError as exc:
        if "NOGROUP" not in str(exc):
            raise
        raise AssertionError(
            f"{stream} has no consumer group {ks.group!r}: no worker read it, or the group was deleted ({exc})"
        ) from exc


def leftovers(r: Any, ks: Keyspace) -> dict[str, int]:
    """What must be empty once every trajectory is scored: entries still in the streams, pending
    entries, trajectories waiting for outputs, dead letters (every shard's, added up)."""
    out = {"stream": 0, "pending": 0, "waiting": 0, "dead": 0}
    for s in range(ks.shards):
        out["stream"] += int(r.xlen(ks.stream(s)))
        out["pending"] += pending(r, ks, s)
        out["waiting"] += int(r.zcard(ks.waiting(s)))
        out["dead"] += int(r.xlen(ks.dead(s)))
    return out


def verify(
    r: Any,
    ks: Keyspace,
    expected: dict[str, Any],
    *,
    tolerance: float = 0.0,
    expected_extra: dict[str, dict[str, Any]] | None = None,
) -> Verdict:
    """Compare what Redis holds with ``expected`` (key -> reward, or None for "any ok value").

    ``expected_extra`` (key -> dict) also requires those entries in each key's
    ``reward_extra_info`` (e.g. the trajectory's own index: a result written to the
    wrong key shows up as ``wrong``).
    """
    keys = list(expected)
    tids = sorted({split_key(k)[0] for k in keys})
    per_tid, _ = done_counts(r, ks)
    v = Verdict(trajectories=len(tids), keys=len(keys))
    v.unfinished = [t for t in tids if per_tid[t] == 0]
    v.duplicated = sum(1 for t in tids if per_tid[t] > 1)
    unfinished = set(v.unfinished)
    lost: set[str] = set()
    for i in range(0, len(keys), 500):
        chunk = keys[i : i + 500]
        pipe = r.pipeline(transaction=False)
        for k in chunk:
            pipe.hgetall(ks.reward_key(k))
        for k, h in zip(chunk, pipe.execute()):
            if not h:
                v.missing.append(k)
                lost.add(k)
                continue
            res = RewardResult.from_hash(k, h)
            if not res.ok:
                v.errors += 1
            elif expected[k] is not None and (
                res.reward_score is None or abs(res.reward_score - expected[k]) > tolerance
            ):
                v.wrong.append(k)
            elif expected_extra and any(
                res.reward_extra_info.get(f) != val for f, val in expected_extra.get(k, {}).items()
            ):
                v.wrong.append(k)
            if split_key(k)[0] in unfinished:
                lost.add(k)
    v.lost = len(lost)
    v.duplicated += len(v.wrong)
    v.leftovers = leftovers(r, ks)
    return v


def settle(r: Any, ks: Keyspace, expected: dict[str, Any], timeout: float = 60.0, **kw: Any) -> Verdict:
    """:func:`verify` until the verdict is clean with nothing left over, or ``timeout`` passes.

    ``wait_rewards`` returns once every key has *a* result; a trajectory's ``done`` entry
    and the removal of its stream entries follow in the same commit, but a test faking a
    half-finished write-back can see results before that commit: so settle, then judge.
    """
    deadline = time.monotonic() + timeout
    while True:
        v = verify(r, ks, expected, **kw)
        if (v.clean and not any(v.leftovers.values())) or time.monotonic() >= deadline:
            return v
        time.sleep(0.2)
