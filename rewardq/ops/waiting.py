"""Waiting for many rewards at once, with progress, without hammering Redis.

Workers append one entry per finished trajectory to each shard's ``done`` stream. To follow
thousands of trajectories we read those streams from a mark taken *before* pushing
(:func:`done_marks`), instead of polling every key: one blocking ``XREAD`` per round. Every two
seconds, and once at the start, the trajectories still missing are checked directly (does the
final key's result exist?), which also covers trajectories finished earlier (a replay of
the same file) and ``done`` streams trimmed by their cap.

Used by ``rewardq demo`` and ``rewardq produce --wait``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from rewardq.ops.summary import Pushed

if TYPE_CHECKING:
    from rewardq.producers.client import RewardClient

__all__ = ["done_marks", "wait_for_results", "fetch_results"]

CHUNK = 1000


def done_marks(client: RewardClient) -> dict[int, bytes]:
    """The last entry id of every shard's ``done`` stream (take it before pushing)."""
    ks = client.keyspace
    marks = {}
    for s in range(ks.shards):
        got = client.r.xrevrange(ks.done(s), count=1)
        marks[s] = got[0][0] if got else b"0-0"
    return marks


def _existing(client: RewardClient, keys: list[str]) -> set[str]:
    ks = client.keyspace
    found: set[str] = set()
    for i in range(0, len(keys), CHUNK):
        chunk = keys[i : i + CHUNK]
        pipe = client.r.pipeline(transaction=False)
        for k in chunk:
            pipe.exists(ks.reward_key(k))
        found.update(k for k, n in zip(chunk, pipe.execute()) if n)
    return found


def fetch_results(client: RewardClient, keys: Iterable[str]) -> dict[str, object]:
    """``{key: RewardResult or None}`` for any number of keys, in chunks."""
    keys = list(keys)
    out: dict[str, Any] = {}
    for i in range(0, len(keys), CHUNK):
        out.update(client.get_rewards(keys[i : i + CHUNK]))
    return out


def wait_for_results(
    client: RewardClient,
    pushed: list[Pushed],
    marks: dict[int, bytes],
    timeout: float,
    on_progress: Callable[[int], None] | None = None,
) -> tuple[dict[str, Any], float]:
    """Wait until every pushed trajectory is finished, or ``timeout`` seconds pass.

    Args:
        client: a :class:`~rewardq.producers.client.RewardClient`.
        pushed: the trajectories to wait for.
        marks: from :func:`done_marks`, taken before the first push.
        timeout: seconds to wait at most; on expiry, whatever exists is returned.
        on_progress: called with the number of finished trajectories whenever it grows.

    Returns:
        ``({key: RewardResult or None}, finished_at)``: every key's result, and the
        ``time.perf_counter()`` at which the last trajectory was seen finished (or the
        time waiting stopped).
    """
    final_of = {p.keys[-1].rpartition("_")[0]: p.keys[-1] for p in pushed}
    pending = set(final_of)
    deadline = time.monotonic() + timeout
    next_check = time.monotonic()
    finished_at = time.perf_counter()
    while pending and time.monotonic() < deadline:
        before = len(pending)
        if time.monotonic() >= next_check:
            pending -= {k.rpartition("_")[0] for k in _existing(client, [final_of[t] for t in pending])}
            next_check = time.monotonic() + 2.0
        if pending:
            wait_ms = int(max(1, min(500, (deadline - time.monotonic()) * 1000)))
            pending.difference_update(client.read_done(marks, wait_ms))
        if len(pending) < before:
            finished_at = time.perf_counter()
            if on_progress is not None:
                on_progress(len(final_of) - len(pending))
    if pending:
        finished_at = time.perf_counter()
    return fetch_results(client, [k for p in pushed for k in p.keys]), finished_at
