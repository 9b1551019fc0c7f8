"""What one judge answer counts as against the fleet's token budget (``max_tpm``).

A server reports what an answer cost in its ``usage`` (``prompt_tokens``, ``completion_tokens``),
and the fleet's token bucket is charged with it. A server's report is not trusted blindly: one
answer reporting ``prompt_tokens = 10**15`` would put the bucket a geological age in debt.
So an answer is charged (:func:`read_usage`):

* what the server reported, each count at most what the request could have cost
  (:func:`usage_bounds`: the prompt no more tokens than its bytes, plus the chat template's own
  and an allowance per image; the answer no more than ``n`` x ``max_tokens``, or, without it, its
  bytes plus an allowance per choice for reasoning the server does not return);
* the request's own size (:func:`own_size`, about :data:`BYTES_PER_TOKEN` bytes a token) when its
  ``usage`` is there but unreadable (``Infinity``, a list, a negative count): the answer is used
  and cached all the same;
* nothing here when there is no ``usage`` at all: the caller charges its estimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: Tokens a request may hold beyond its bytes (the chat template's own tokens), per request.
PROMPT_TOKEN_SLACK = 1024
#: Tokens one image may cost a judge beyond its bytes (a small image is upscaled by some servers).
IMAGE_TOKEN_ALLOWANCE = 16384
#: Tokens one choice may cost without ``max_tokens`` beyond its bytes (hidden reasoning).
COMPLETION_TOKEN_SLACK = 32768
#: Bytes a token stands for when a request's own size is estimated (:func:`own_size`).
BYTES_PER_TOKEN = 4


@dataclass(frozen=True)
class Usage:
    """The tokens one answer is counted as: ``prompt`` and ``completion`` as the server reported them
    (bounded), or the request's own size when its ``usage`` was unreadable (``readable=False``)."""

    prompt: int
    completion: int
    readable: bool = True
    clipped: bool = False

    @property
    def total(self) -> int:
        return self.prompt + self.completion


def usage_bounds(body: dict[str, Any], payload_bytes: int, answer_bytes: int) -> tuple[int, int]:
    """The most tokens a request could have cost: ``(prompt, completion)``.

    The prompt cannot hold more tokens than its bytes (a token is at least one byte), plus the
    chat template's own tokens and an allowance per image part; the answer no more than ``n`` x
    ``max_tokens`` (or ``max_completion_tokens``), or, without either, its own bytes plus an
    allowance per choice for reasoning the server does not return.
    """
    images = sum(_image_parts(m.get("content")) for m in body.get("messages") or [] if isinstance(m, dict))
    prompt = payload_bytes + PROMPT_TOKEN_SLACK + IMAGE_TOKEN_ALLOWANCE * images
    n = _positive_int(body.get("n")) or 1
    caps = [c for c in (_positive_int(body.get("max_tokens")), _positive_int(body.get("max_completion_tokens"))) if c]
    completion = n * min(caps) if caps else answer_bytes + COMPLETION_TOKEN_SLACK * n
    return prompt, completion


def own_size(payload_bytes: int, contents: list[str]) -> tuple[int, int]:
    """A request's own size in tokens, ``(prompt, completion)``: its bytes and its answers' bytes, about
    :data:`BYTES_PER_TOKEN` to a token. What an answer whose ``usage`` is unreadable is counted as."""
    answer = sum(len(c.encode("utf-8", "replace")) for c in contents)
    return -(-payload_bytes // BYTES_PER_TOKEN), -(-answer // BYTES_PER_TOKEN)


def read_usage(usage: object, bounds: tuple[int, int], own: tuple[int, int]) -> Usage | None:
    """The :class:`Usage` of an answer's ``usage`` object: None when there is none; its counts,
    each at most ``bounds``; ``own`` when it is there but unreadable (not an object, a count that
    is not a finite non-negative number)."""
    if usage is None:
        return None
    if not isinstance(usage, dict):
        return Usage(*own, readable=False)
    counts: list[int] = []
    for name in ("prompt_tokens", "completion_tokens"):
        value = usage.get(name) or 0
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            return Usage(*own, readable=False)
        counts.append(int(value))
    prompt, completion = min(counts[0], bounds[0]), min(counts[1], bounds[1])
    return Usage(prompt, completion, clipped=(prompt, completion) != (counts[0], counts[1]))


def _positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _image_parts(content: object) -> int:
    if not isinstance(content, list):
        return 0
    return sum(1 for p in content if isinstance(p, dict) and p.get("type") in ("image_url", "input_image", "image"))
