"""A trajectory's parked records read back from its hash, for the ledger rows of its failure.

When a trajectory fails at intake (an output that does not decode, a conflict, a delivery count run
out), the failing batch may hold none of its outputs: the earlier ones were stored ("parked") in
its hash by an earlier batch or another worker (``o:<i>``, ``lua/store.lua``). The worker reads them
back here, on the failure path only, so the failure's ledger rows keep their ids and sample
(docs/ledger.md). Nothing here writes, and nothing runs on the scoring path.

Bounds, so that one failure's read harms nobody else: at most ``max_outputs`` fields (outputs
``0..hi``, the highest index stored), at most :data:`PARKED_READ_BYTES` of records (lowest indexes
first: the rest are not read), and commands of about :data:`~rewardq.queue.blobs.BLOB_CHUNK_BYTES`
each, packed by each record's own length (one pipelined round trip of ``HSTRLEN``, O(1) a field,
before any record is read: an inline record can be up to 1 MiB, so no average can size a command,
and the byte cap holds before the bytes arrive, not after). A record kept by reference (``r:<i>``:
over 1 MiB, left in its stream entry or blob) is not read, nor anything of a trajectory already
finished (``state`` done: its records are gone). The trajectory's key is one slot, so on Redis
Cluster every command goes to the one node holding it.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from rewardq.queue.blobs import BLOB_CHUNK_BYTES

if TYPE_CHECKING:
    from rewardq.queue.clients import AsyncRedis

#: The most bytes of parked records one failure reads back (its lowest indexes first).
PARKED_READ_BYTES = 32 * 1024 * 1024


def _count(value: object) -> int:
    """A hash field's count (0 when absent or not a count)."""
    text = value.decode() if isinstance(value, bytes) else str(value or "")
    return int(text) if text.isdigit() else 0


async def parked_records(
    r: AsyncRedis,
    traj: str,
    *,
    max_outputs: int,
    skip: Collection[int] = (),
    max_bytes: int = PARKED_READ_BYTES,
) -> dict[int, bytes]:
    """The records parked inline in trajectory hash ``traj`` (``o:<i>``), by index, but those of
    ``skip`` (within the bounds of the module doc); {} when it has none."""
    hi, stored, refs, state = await r.hmget(traj, ["hi", "stored", "refs", "state"])  # type: ignore[misc]  # see rewardq.queue.clients
    inline = _count(stored) - _count(refs)
    if hi is None or inline <= 0 or not hi.isdigit() or state == b"done":
        return {}
    wanted = [i for i in range(min(int(hi) + 1, max_outputs)) if i not in skip]
    pipe = r.pipeline(transaction=False)
    for i in wanted:
        pipe.hstrlen(traj, f"o:{i}")
    sizes = await pipe.execute()
    commands: list[list[int]] = []
    taken = command_bytes = 0
    for i, size in zip(wanted, sizes):
        if not size:
            continue  # not parked inline: by reference, or not arrived
        if taken + size > max_bytes:
            break
        if not commands or command_bytes + size > BLOB_CHUNK_BYTES:
            commands.append([])
            command_bytes = 0
        commands[-1].append(i)
        command_bytes += size
        taken += size
    got: dict[int, bytes] = {}
    for chunk in commands:
        values = await r.hmget(traj, [f"o:{i}" for i in chunk])  # type: ignore[misc]  # see rewardq.queue.clients
        got.update((i, bytes(value)) for i, value in zip(chunk, values) if value is not None)
    return got
