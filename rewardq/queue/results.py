"""The result of one output key, as stored in its ``reward`` hash and returned to clients.

Everything in the hash is readable text, so ``redis-cli HGETALL`` shows it as is::

    status             ok | error | cancelled
    reward_score       "1.0"            (empty for errors)
    reward_extra_info  '{"acc": 1.0}'   (JSON; for errors {"error": reason, ...})
    error              ""               (the reason, for errors)
    failure_kind       transient | timeout | scorer | config | input   (errors only)
    worker, manager, scored_at, latency_ms   (errors too: from the failed entry's put, or an
                                          incomplete trajectory's last output; empty when unknown)
    provenance         "3f2a9c0d1e4b5a67"   what produced it: the digest of a blob in ``<ns>:provenance``
                                          (rewardq.reward.provenance; ``rewardq inspect`` resolves it)
    attempt            "1"              the trajectory's scoring attempt (more after a crash, also one
                                          restarted under the same name, or a lost lease)
    judge_request      ""               LLM judges: the digest of the request, the key of its cached answer

Results are written by the ``commit`` script (``ok``, the fields of :data:`RESULT_FIELDS`), by
the ``fail`` and ``expire`` scripts (``error``, with ``failure_kind``) and by the ``cancel`` script
(``cancelled``, ``worker`` empty): only an error hash holds a ``failure_kind`` field.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rewardq.errors import ResultError
from rewardq.queue.extra_info import encode_extra_info
from rewardq.queue.states import FailureKind, ResultStatus
from rewardq.queue.text import MAX_REASON_BYTES, reason_text, utf8

#: Largest result of one output key, in bytes as stored (``reward_extra_info``'s JSON and the other
#: fields of its hash). A larger one becomes an error result naming this limit and the size. The
#: default extra info of every built-in scorer is under 1 KiB; 1 MiB leaves room for a full decoded
#: response (a 256k-token answer) or a code run's captured output in ``reward_extra_info``, while a
#: 300-output trajectory of maximal results (one result copied to every key) still costs Redis
#: at most 300 MiB, written in bounded chunks.
MAX_RESULT_BYTES = 1024 * 1024
#: Seconds results and finished trajectories live in Redis; 0 keeps them forever.
RESULT_TTL = 7 * 86400.0


#: The statuses by their older names (:class:`~rewardq.queue.states.ResultStatus`).
STATUS_OK = ResultStatus.OK
STATUS_ERROR = ResultStatus.ERROR
STATUS_CANCELLED = ResultStatus.CANCELLED
#: The fields of a result hash, in the order the ``commit`` script receives their values.
RESULT_FIELDS = (
    "status",
    "reward_score",
    "reward_extra_info",
    "error",
    "worker",
    "manager",
    "scored_at",
    "latency_ms",
    "provenance",
    "attempt",
    "judge_request",
)
#: Bytes the field names of one result hash take (counted in a result's size, as Redis stores them).
_NAMES_BYTES = sum(len(f) for f in RESULT_FIELDS)
#: What :meth:`RewardResult.to_hash` allows when no limit is given (the worker always gives one).
_UNBOUNDED = 2**62
#: The most an error result's ``reward_extra_info`` takes beside its reason, in bytes of JSON: it is
#: written to every key of the trajectory by one script call, so it is bounded like the reason.
MAX_ERROR_EXTRA_BYTES = 2 * MAX_REASON_BYTES
#: Values a copy of ``reward_extra_info`` may share (immutable).
_PLAIN = (str, int, float, bool, type(None))


def as_text(value: object) -> str:
    """A Redis reply value as text (bytes decoded as UTF-8, undecodable bytes replaced)."""
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


@dataclass
class RewardResult:
    """The reward of one output key.

    Attributes:
        key: ``<uid>_<session_id>_<i>``.
        status: a :class:`~rewardq.queue.states.ResultStatus` (``"ok"``, ``"error"``, or ``"cancelled"``:
            the producer cancelled it before it was scored).
        reward_score: the reward (a plain float), None for errors.
        reward_extra_info: the manager's extra metrics (``acc``, ``pred``, ...); for
            errors ``{"error": reason}`` so downstream filters never meet a missing dict.
        error: why scoring failed, None when ok.
        failure_kind: what kind of failure an error is (:class:`~rewardq.queue.states.FailureKind`),
            None when ok.
        provenance: the digest of the provenance blob of what produced it (:mod:`rewardq.reward.provenance`).
        attempt: the trajectory's scoring attempt that produced it (0: not recorded).
        judge_request: for LLM judges, the digest of the request whose (cached) answer gave the reward.
    """

    key: str
    status: str
    reward_score: float | None
    reward_extra_info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    worker: str = ""
    manager: str = ""
    scored_at: float = 0.0
    latency_ms: float | None = None
    failure_kind: FailureKind | None = None
    provenance: str = ""
    attempt: int = 0
    judge_request: str = ""

    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK

    @property
    def cancelled(self) -> bool:
        """Cancelled by the producer (``RewardClient.cancel``): no reward, and no failure either."""
        return self.status == STATUS_CANCELLED

    def extra_info_json(self, limit: int = _UNBOUNDED) -> bytes:
        """``reward_extra_info`` as stored: compact JSON in UTF-8 (see :mod:`rewardq.queue.extra_info`);
        raises :class:`~rewardq.errors.ResultError` when it cannot be stored or is over ``limit`` bytes."""
        return encode_extra_info(self.reward_extra_info, limit)

    def row(self, extra_info_json: bytes | None = None) -> list[bytes]:
        """The values of :data:`RESULT_FIELDS`, as written to Redis (UTF-8 text; a lone surrogate in a
        name or reason becomes U+FFFD, so no string can fail the commit). ``extra_info_json``:
        :meth:`extra_info_json`, when the caller already has it (one dict shared by every key)."""
        return [
            self.status.encode(),
            b"" if self.reward_score is None else repr(float(self.reward_score)).encode(),
            self.extra_info_json() if extra_info_json is None else extra_info_json,
            reason_text(self.error).encode() if self.error else b"",
            utf8(self.worker),
            utf8(self.manager),
            f"{self.scored_at:.6f}".encode(),
            b"" if self.latency_ms is None else f"{self.latency_ms:.3f}".encode(),
            self.provenance.encode(),
            str(self.attempt).encode() if self.attempt else b"",
            self.judge_request.encode(),
        ]

    def to_hash(self, extra_info_json: bytes | None = None) -> dict[str, str]:
        """The fields of its result hash, as text (:meth:`row` by field name, and ``failure_kind``
        for an error, as the ``fail`` script writes it)."""
        fields = {f: v.decode() for f, v in zip(RESULT_FIELDS, self.row(extra_info_json))}
        if self.failure_kind is not None:
            fields["failure_kind"] = FailureKind(self.failure_kind).value
        return fields

    @classmethod
    def from_hash(cls, key: str, h: Mapping[Any, Any]) -> RewardResult:
        d = {
            (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in h.items()
        }
        return cls.from_text(key, d)

    @classmethod
    def from_text(cls, key: str, d: Mapping[str, Any]) -> RewardResult:
        """:meth:`from_hash` of a hash already read as text (field names and values ``str``)."""
        score = d.get("reward_score") or ""
        latency = d.get("latency_ms") or ""
        try:
            extra = json.loads(d.get("reward_extra_info") or "{}")
        except ValueError:
            extra = {"raw": d.get("reward_extra_info")}
        return cls(
            key=key,
            status=_status(d.get("status")),
            reward_score=float(score) if score else None,
            reward_extra_info=extra,
            error=d.get("error") or None,
            worker=d.get("worker", ""),
            manager=d.get("manager", ""),
            scored_at=float(d.get("scored_at") or 0.0),
            latency_ms=float(latency) if latency else None,
            failure_kind=_failure_kind(d.get("failure_kind")),
            provenance=d.get("provenance", ""),
            attempt=int(d.get("attempt") or 0) if (d.get("attempt") or "").isdigit() else 0,
            judge_request=d.get("judge_request", ""),
        )

    def for_key(self, key: str) -> RewardResult:
        """The same result for another key (one row shared by a trajectory's keys), with a
        ``reward_extra_info`` of its own, so a caller changing one key's leaves the others alone."""
        clone = object.__new__(RewardResult)
        clone.__dict__.update(self.__dict__)
        clone.key = key
        clone.reward_extra_info = {
            k: v if isinstance(v, _PLAIN) else copy.deepcopy(v) for k, v in self.reward_extra_info.items()
        }
        return clone

    def as_dict(self) -> dict[str, object]:
        return {
            "key": self.key,
            "status": self.status,
            "reward_score": self.reward_score,
            "reward_extra_info": self.reward_extra_info,
            "error": self.error,
            "worker": self.worker,
            "manager": self.manager,
            "scored_at": self.scored_at,
            "latency_ms": self.latency_ms,
            "failure_kind": self.failure_kind,
            "provenance": self.provenance,
            "attempt": self.attempt,
            "judge_request": self.judge_request,
        }


def error_extra_info(reason: str, extra: Mapping[str, object] | None) -> bytes:
    """An error result's ``reward_extra_info`` as the ``fail`` script stores it: ``extra`` (the
    fields a manager gives such a failure, ``{"timeout": True, "acc": 0.0}`` say) with ``error``
    set to ``reason``; empty (the script then writes ``{"error": reason}``) when there is no extra,
    or it cannot be stored within :data:`MAX_ERROR_EXTRA_BYTES` beside the reason."""
    if not extra:
        return b""
    try:
        return encode_extra_info({**extra, "error": reason}, len(utf8(reason)) + MAX_ERROR_EXTRA_BYTES)
    except ResultError:
        return b""


def _status(text: str | None) -> str:
    """A stored status as its :class:`ResultStatus` (an unknown word is kept as it is)."""
    try:
        return ResultStatus(text or ResultStatus.ERROR)
    except ValueError:
        return str(text)


def _failure_kind(text: str | None) -> FailureKind | None:
    """A stored ``failure_kind`` as its :class:`FailureKind` (None when empty or unknown)."""
    try:
        return FailureKind(text) if text else None
    except ValueError:
        return None


def same_fields(a: RewardResult, b: RewardResult) -> bool:
    """Whether ``a`` and ``b`` store the same hash fields (their keys aside): the same values
    and the very same extra-info dict, as when one manager result is copied to every key."""
    return (
        a.reward_extra_info is b.reward_extra_info
        and a.status == b.status
        and a.reward_score == b.reward_score
        and a.error == b.error
        and a.worker == b.worker
        and a.manager == b.manager
        and a.scored_at == b.scored_at
        and a.latency_ms == b.latency_ms
        and a.failure_kind == b.failure_kind
        and a.provenance == b.provenance
        and a.attempt == b.attempt
        and a.judge_request == b.judge_request
    )


@dataclass
class EncodedResults:
    """A trajectory's results, checked and encoded for the ``commit`` script (:func:`encode_results`).

    Attributes:
        results: the results, one per output key in index order.
        rows: the field values (:data:`RESULT_FIELDS` order) of each distinct row: one row for every
            key when every key gets the same result (``shared``), else one per key.
        sizes: the bytes each row takes in Redis (field names and values).
    """

    results: Sequence[RewardResult]
    rows: list[list[bytes]]
    sizes: list[int]

    @property
    def n(self) -> int:
        return len(self.results)

    @property
    def shared(self) -> bool:
        return len(self.rows) == 1 and self.n > 1

    @property
    def written_bytes(self) -> int:
        """Bytes the commit writes: every key's result."""
        return self.sizes[0] * self.n if len(self.rows) == 1 else sum(self.sizes)


def encode_results(results: Sequence[RewardResult], max_result_bytes: int) -> EncodedResults:
    """Check and encode a trajectory's results once, before its commit.

    When every key gets the same result (a manager's one dict copied to every key, the built-in
    managers' case) it is encoded once. Per-output results sharing one extra-info dict encode it
    once too. Raises :class:`~rewardq.errors.ResultError` naming the key when a result cannot be
    stored (see :mod:`rewardq.queue.extra_info`) or takes more than ``max_result_bytes``: only
    that trajectory fails, never the commits it would have been sent with.
    """
    if not results:
        raise ValueError("a trajectory has at least one result")
    first = results[0]
    distinct = results[:1] if all(same_fields(first, r) for r in results[1:]) else results
    rows: list[list[bytes]] = []
    sizes: list[int] = []
    encoded: dict[int, bytes] = {}  # per-output results may still share one extra-info dict
    for r in distinct:
        whose = (
            r.key
            if len(distinct) > 1 or len(results) == 1
            else f"all {len(results)} keys of {r.key.rpartition('_')[0]}"
        )
        js = encoded.get(id(r.reward_extra_info))
        if js is None:
            try:
                js = encoded[id(r.reward_extra_info)] = r.extra_info_json(max_result_bytes)
            except ResultError as exc:
                raise ResultError(f"the result of {whose} cannot be stored: {exc}") from None
        row = r.row(js)
        size = _NAMES_BYTES + sum(len(v) for v in row)
        if size > max_result_bytes:
            raise ResultError(
                f"the result of {whose} is {size:,} bytes ({len(js):,} of them reward_extra_info), "
                f"over max_result_bytes={max_result_bytes:,}; return less reward_extra_info, or raise "
                "max_result_bytes on the workers"
            )
        rows.append(row)
        sizes.append(size)
    return EncodedResults(results, rows, sizes)
