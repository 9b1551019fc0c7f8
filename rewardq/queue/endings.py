"""How a trajectory ends without an answer: an error result for every key, and a dead letter.

:class:`~rewardq.queue.broker.StreamBroker` holds one :class:`Endings` and hands ``fail``,
``dead_letter_entry`` and ``expire_incomplete`` to it. Each is one script (``lua/fail.lua``,
``lua/deadletter.lua``, ``lua/expire.lua``), atomic with the trajectory's keys and its
acknowledgement; the dead letter is bounded by entries, bytes and age (``add_dead`` in
``lua/common.lua``), and every text in it is cut and made valid UTF-8 (:func:`dead_value`).
The blobs of the entries ``fail`` and ``dead_letter_entry`` drop are deleted here too, after the
script (:func:`~rewardq.queue.blobs.delete_blobs`): an entry's record is never read again once it
is acknowledged without being kept.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rewardq.queue.blobs import delete_blobs
from rewardq.queue.entries import Entry
from rewardq.queue.keys import Keyspace
from rewardq.queue.results import as_text, error_extra_info
from rewardq.queue.script_runner import ScriptRunner
from rewardq.queue.states import FailureKind
from rewardq.queue.text import reason_text, utf8

if TYPE_CHECKING:
    from rewardq.queue.clients import AsyncRedis

#: Trajectories one maintenance pass of one shard ends for missing outputs, at most.
EXPIRE_BATCH = 100
#: Longest ``reason`` and ``traceback`` kept in a dead letter, in characters.
DEAD_REASON_CHARS = 4000
DEAD_TRACEBACK_CHARS = 8000

_s = as_text


def _ms(value: object) -> float | None:
    """A script's latency_ms text as a number (None when empty)."""
    text = _s(value) if value is not None else ""
    return float(text) if text else None


@dataclass
class Failed:
    """What the fail script wrote: ``indexes``, the keys it gave an error result (in order; a key
    that had a result kept it); ``attempt``, the attempt those results say (0: none), the caller's
    or the attempts the trajectory's hash counted when more; ``final``, the trajectory's final index
    as its hash knew it (-1: not known)."""

    indexes: list[int]
    attempt: int = 0
    final: int = -1


@dataclass
class Expired:
    """A trajectory the expire script ended: every key below ``keys`` got an error result saying
    ``reason``; ``records``: each key's stored record (None where it never arrived), when asked for;
    ``latency_ms``: those results' latency (from its last output filed to the result); ``wrote``:
    the indexes of the keys that got it (a key that had a result kept it)."""

    tid: str
    reason: str
    keys: int
    records: list[bytes | None]
    latency_ms: float | None = None
    wrote: list[int] = field(default_factory=list)


@dataclass
class Endings:
    """Error results and dead letters written for the consumer ``worker`` (the broker's bounds)."""

    r: AsyncRedis
    ks: Keyspace
    scripts: ScriptRunner
    worker: str
    result_ttl: int
    incomplete_timeout: float
    done_maxlen: int
    dead_maxlen: int
    keep_records: float
    max_outputs: int
    dead_letter_bytes: int
    dead_letter_ttl: float

    async def fail(
        self,
        shard: int,
        tid: str,
        message: str,
        *,
        index: int | str = -1,
        entry: Entry | None = None,
        dead: Mapping[str, object] | None = None,
        also_ack: Sequence[Entry] = (),
        kind: FailureKind,
        extra_info: Mapping[str, Any] | None = None,
        provenance: str = "",
        attempt: int = 0,
    ) -> Failed:
        """Finish a trajectory with an error result for all its keys; dead-letter and ack ``entry``.

        ``index`` is the output the failure is about (-1: none; digits beyond ``max_outputs`` name
        that one key only). Keys that already have a result keep it. ``also_ack``: more entries of
        the trajectory to acknowledge with it (at most ``max_outputs``). ``kind`` is every error
        result's ``failure_kind``; ``extra_info`` goes into their ``reward_extra_info`` beside
        ``error`` (:func:`~rewardq.queue.results.error_extra_info`); ``provenance`` and ``attempt``
        say what failed (:mod:`rewardq.reward.provenance`) and on which attempt. The message is cut to
        :data:`~rewardq.queue.text.MAX_REASON_BYTES` and every text made valid UTF-8, so no string
        a reward function produced can make the failure itself fail. The trajectory's stored records
        are deleted (kept ``keep_records`` seconds when set), and so are the blobs of ``entry`` and
        ``also_ack``. Returns which keys got an error result, with which attempt: ``attempt``, or
        the scoring attempts the trajectory's hash counted when more (:class:`Failed`); the same
        reply when the call is sent again after its reply was lost (:func:`call_nonce`).
        """
        keys = [
            self.ks.traj(shard, tid),
            self.ks.stream(shard),
            self.ks.waiting(shard),
            self.ks.done(shard),
            self.ks.dead(shard),
            self.ks.records(shard, tid),
        ]
        acks = [e.id for e in also_ack if entry is None or e.id != entry.id][: self.max_outputs]
        reason = reason_text(message)
        args: list[Any] = [
            self.ks.group,
            tid,
            self.ks.reward_prefix(shard),
            self.result_ttl,
            reason,
            self.worker,
            str(index),
            entry.id if entry else "",
            self.done_maxlen,
            self.dead_maxlen,
            self.max_outputs,
            self.keep_records,
            FailureKind(kind).value,
            error_extra_info(reason, extra_info),
            provenance,
            str(attempt) if attempt else "",
            *self._dead_bounds()[1:],
            call_nonce(),
            len(acks),
            *acks,
        ]
        for k, v in (dead or {}).items():
            args.extend([k, dead_value(k, v)])
        out = await self.scripts.run("fail", keys, args)
        await delete_blobs(self.r, self.ks, [*([entry] if entry else []), *also_ack])
        return Failed([int(i) for i in out[2:]], _int(out[0], 0), _int(out[1], -1))

    async def dead_letter_entry(self, entry: Entry, dead: Mapping[str, object]) -> None:
        """Dead-letter an entry that names no trajectory at all, and ack it (``lua/deadletter.lua``);
        then delete its blob."""
        keys = [self.ks.dead(entry.shard), self.ks.stream(entry.shard)]
        args: list[Any] = [self.ks.group, entry.id, *self._dead_bounds()]
        for k, v in dead.items():
            args.extend([k, dead_value(k, v)])
        await self.scripts.run("deadletter", keys, args)
        await delete_blobs(self.r, self.ks, [entry])

    def _dead_bounds(self) -> list[int]:
        """The dead-letter stream's bounds as the scripts take them: entries, bytes, retention in ms."""
        return [self.dead_maxlen, self.dead_letter_bytes, int(self.dead_letter_ttl * 1000)]

    async def expire_incomplete(
        self, shard: int, limit: int = EXPIRE_BATCH, *, records_bytes: int = 0
    ) -> list[Expired]:
        """End trajectories of ``shard`` whose outputs stopped arriving. ``records_bytes`` > 0: each
        ended trajectory comes with the records it had (for the worker's ledger), within that many
        bytes per call (the first trajectory's always; the others past it wait for the next call).
        Sent again after its reply was lost, it returns the same trajectories (:func:`call_nonce`)."""
        nonce = call_nonce()
        keys = [
            self.ks.waiting(shard),
            self.ks.stream(shard),
            self.ks.done(shard),
            self.ks.dead(shard),
            self.ks.expired_reply(shard, self.worker),
        ]
        args = [
            self.ks.group,
            self.ks.traj_prefix(shard),
            self.ks.reward_prefix(shard),
            self.result_ttl,
            self.worker,
            limit,
            f"{self.incomplete_timeout:g}",
            self.done_maxlen,
            self.dead_maxlen,
            self.max_outputs,
            self.ks.records_prefix(shard),
            self.keep_records,
            *self._dead_bounds()[1:],
            records_bytes,
            nonce,
        ]
        out = await self.scripts.run("expire", keys, args)
        return [
            Expired(
                _s(out[i]),
                _s(out[i + 1]),
                int(out[i + 2]),
                list(out[i + 3] or ()),
                _ms(out[i + 4]),
                [int(w) for w in out[i + 5] or ()],
            )
            for i in range(0, len(out), 6)
        ]


def call_nonce() -> str:
    """A new nonce for one script call: the ``fail`` and ``expire`` scripts keep their reply under
    it, so the same call sent again after its reply was lost (:mod:`rewardq.queue.retry`: the
    policy resends the same arguments) gets the first run's reply back and writes nothing."""
    return secrets.token_hex(8)


def _int(value: object, default: int) -> int:
    """A script's integer text (``default`` when empty)."""
    text = _s(value) if value is not None else ""
    return int(text) if text else default


def dead_value(name: str, value: object) -> object:
    """A dead letter's field as written: bytes as they are (the raw record), text as valid UTF-8,
    the reason and traceback cut (so user code's text can never make the dead letter fail)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    text = value if isinstance(value, str) else str(value)
    if name == "reason":
        text = text[:DEAD_REASON_CHARS]
    elif name == "traceback":
        text = text[-DEAD_TRACEBACK_CHARS:]
    return utf8(text)
