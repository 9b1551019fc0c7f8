"""The judge cache shared across runs (genrm ``judge_cache=shared``): where it lives, how it is
keyed, and the operator's view of it (``rewardq judge-cache list|clear``).

Why: a judge's answer to a question does not depend on the run that asks it. Two runs (two
namespaces) that judge the same responses with the same judge configuration should pay once. So
with ``judge_cache=shared`` an answer is kept outside any namespace, content-addressed: its key
is the SHA-256 of the request digest (the full request body: the model, the rendered prompt with
its rubric text, the system prompt, the sampling parameters with the seed, the response schema,
the images) together with the digest of how the answer is read (the parser and its pattern, field
or choices, ``score_marker``, ``score_range``, ``clamp_score``, ``unparsed_score``, ``combine``,
``max_answer_bytes``). A change to any of them is another key: a miss.

Keys, one hash tag per judge model (``<tag>`` = the first 16 hex digits of the model name's
SHA-256), so every script call stays in one slot on Redis Cluster::

    rewardq-judge-cache:{<tag>}:a:<sha256>   HASH   one answer (``a``) and its send claim (``c``, ``cu``),
                                                    as ``<ns>:judge:<sha256>`` holds them; lives
                                                    ``judge_cache_ttl``
    rewardq-judge-cache:{<tag>}:index        ZSET   that model's answers by last use: the size bound
                                                    (``judge_cache_max_entries``) drops the least
                                                    recently used, at most 100 per answer stored
    rewardq-judge-cache:models               HASH   ``<tag>`` -> the model's name (for ``list`` and
                                                    ``clear --model``)
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rewardq.queue.results import as_text

if TYPE_CHECKING:
    from rewardq.queue.clients import SyncRedis

#: The prefix of every key of the shared judge cache (outside every namespace).
PREFIX = "rewardq-judge-cache"
#: Answers dropped per ``clear`` round trip.
CLEAR_BATCH = 500


def model_tag(model: str) -> str:
    """The hash tag of a judge model's shared answers."""
    return hashlib.sha256(model.encode("utf-8")).hexdigest()[:16]


def verdict_digest(reading: dict[str, object]) -> str:
    """The digest of how answers are read (the parser, the range, ...): part of a shared key."""
    text = json.dumps(reading, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class SharedSpace:
    """Where one judge's shared answers live, and their bounds.

    Attributes:
        model: the judge model (its answers share one hash tag).
        verdict: :func:`verdict_digest` of how this judge reads answers.
        ttl: seconds an answer is kept (0: for ever).
        max_entries: the most answers of this model kept; past it the least recently used go.
    """

    model: str
    verdict: str
    ttl: float
    max_entries: int

    @property
    def tag(self) -> str:
        return model_tag(self.model)

    def key(self, digest: str) -> str:
        """The shared key of request ``digest`` read this judge's way."""
        both = hashlib.sha256(f"{digest}:{self.verdict}".encode()).hexdigest()
        return f"{PREFIX}:{{{self.tag}}}:a:{both}"

    @property
    def index(self) -> str:
        return index_key(self.tag)


def index_key(tag: str) -> str:
    return f"{PREFIX}:{{{tag}}}:index"


def models_key() -> str:
    return f"{PREFIX}:models"


def shared_models(r: SyncRedis, model: str | None = None) -> list[dict[str, Any]]:
    """The judge models with shared answers: ``[{model, tag, entries}]`` (``model``: that one only)."""
    out = []
    for raw_tag, raw_name in sorted(r.hgetall(models_key()).items()):
        tag, name = as_text(raw_tag), as_text(raw_name)
        if model is not None and name != model:
            continue
        out.append({"model": name, "tag": tag, "entries": int(r.zcard(index_key(tag)))})
    return out


def clear_shared(r: SyncRedis, model: str | None = None) -> dict[str, int]:
    """Delete the shared answers of ``model`` (None: of every model); ``{model: answers deleted}``.

    Answers go :data:`CLEAR_BATCH` at a time (one slot per model: a multi-key ``DEL`` is legal on a
    cluster), so no call blocks the server for long.
    """
    cleared: dict[str, int] = {}
    for m in shared_models(r, model):
        index, n = index_key(m["tag"]), 0
        while True:
            keys = r.zrange(index, 0, CLEAR_BATCH - 1)
            if not keys:
                break
            r.delete(*keys)
            r.zrem(index, *keys)
            n += len(keys)
        r.delete(index)
        r.hdel(models_key(), m["tag"])
        cleared[m["model"]] = n
    return cleared
