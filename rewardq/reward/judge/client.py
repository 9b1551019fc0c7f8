"""One call of an OpenAI-compatible chat-completions judge: billed once, limited fleet-wide, one request.

:meth:`ChatJudge.complete` takes a request body and returns the judge's answer
(:class:`JudgeAnswer`). In order:

1. **The cache.** The body's SHA-256 (:func:`request_digest`, over its canonical JSON) names the
   request. If some worker already got its answer, that answer is returned and nothing is sent
   (``cached=True``); if another worker is sending it right now, this call waits for its answer
   (:mod:`rewardq.reward.judge.cache`).
2. **The limits**, for each attempt: one request token (``max_rpm``), then
   ``estimated_tokens_per_request`` taken from the token bucket (``max_tpm``; waiting until it
   holds them, so calls started together go out as the bucket refills, not all at once), then one
   of ``max_concurrent`` slots, held only while the HTTP request is in flight
   (:mod:`rewardq.reward.ratelimit`; the limits hold across every worker of the fleet). When the
   answer arrives, the bucket is settled to the tokens the server reports in ``usage`` (prompt +
   completion): charged what they exceed the estimate by, or given back what the estimate
   exceeds them by; a call cancelled before its answer gives the estimate back, one that failed
   keeps it spent. Never charged more than the request could have cost (its own size for the prompt, ``n`` x
   ``max_tokens`` for the answer), so a server reporting absurd usage cannot stop the fleet; a
   ``usage`` that cannot be read (``Infinity``, a list) is charged the request's own size, and the
   answer is used and cached all the same (:mod:`rewardq.reward.judge.usage`). A limit that would
   hold the call back past the trajectory's ``score_timeout`` ends it at once with
   :class:`JudgeRateLimited`, naming the limit.
3. **One request.** The call never sleeps and sends again itself: a judge that does not answer
   usably raises :class:`JudgeUnavailable` naming the status and the server's own message, of the
   failure kind its status says (:func:`~rewardq.reward.http.status_failure_kind`: no answer,
   408, 429 or 5xx are ``transient`` and carry the server's ``Retry-After``; 401, 403 and 404
   ``config``; any other 4xx ``scorer``). The worker retries a transient failure in place, after a
   pause honouring ``Retry-After``, until ``retry_for`` runs out (:mod:`rewardq.consumers.retries`:
   the one retry policy, so no two stack), and every try passes the fleet's limits again. The
   claim is released, so another worker may send the request meanwhile; nothing is cached, and
   the trajectory never gets a zero. An answer larger than ``max_answer_bytes`` is read no further
   than that and is an error too (:class:`JudgeAnswerTooLarge`).

The API key comes from the environment (``api_key_env``) and is sent only as the
``Authorization: Bearer`` header; it is never logged or stored.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rewardq.errors import ScoringError
from rewardq.queue.states import FailureKind
from rewardq.reward.http import HttpSession, retry_after_seconds, status_failure_kind
from rewardq.reward.judge.stats import JudgeStats
from rewardq.reward.judge.usage import Usage, own_size, read_usage, usage_bounds
from rewardq.reward.ratelimit import RateLimitWait

if TYPE_CHECKING:
    from rewardq.reward.judge.cache import _CacheBase
    from rewardq.reward.ratelimit.limiter import _LimiterBase

#: Tokens the fleet's token bucket must hold before a judge request goes (the request is then
#: charged what the server reports in ``usage``).
JUDGE_ESTIMATED_TOKENS = 2000
#: Seconds one judge HTTP request may take.
JUDGE_TIMEOUT = 120.0
#: Largest judge answer read, in bytes (the HTTP body: every choice, its usage, any logprobs); a
#: larger one is an error result, and the worker never holds more of it than this.
JUDGE_MAX_ANSWER_BYTES = 4 * 1024 * 1024


logger = logging.getLogger("rewardq.reward.genrm")

#: Largest answer kept in the cache (bytes of its JSON); a larger one is used but not kept.
MAX_CACHED_ANSWER_BYTES = 1 << 20


class JudgeUnavailable(ScoringError):
    """The judge did not answer usably: a refused request, an error status, or no answer at all.

    Its failure kind is its status's (:func:`~rewardq.reward.http.status_failure_kind`): no answer,
    408, 429 or 5xx are ``transient`` (``retry_after``: the server's ``Retry-After``), 401, 403 and
    404 ``config``, any other answer ``scorer``.

    Attributes:
        status: the last HTTP status (None: no HTTP answer, e.g. a connection error).
        server_message: the server's own error message (``error.message`` of its JSON body).
    """

    def __init__(
        self, message: str, *, status: int | None = None, server_message: str = "", retry_after: float | None = None
    ) -> None:
        self.status = status
        self.server_message = server_message
        super().__init__(message, failure_kind=status_failure_kind(status), retry_after=retry_after)


class JudgeRateLimited(JudgeUnavailable):
    """The judge was not called: the rate limiter would have held the call back past ``score_timeout``
    (``transient``; ``retry_after``: the wait the limiter asked for)."""


class JudgeAnswerTooLarge(JudgeUnavailable):
    """The judge's answer was larger than ``max_answer_bytes``; it was not read further (``scorer``:
    HTTP 200)."""


@dataclass
class JudgeAnswer:
    """What the judge answered to one request.

    Attributes:
        contents: the text of each choice (``n`` of them).
        prompt_tokens / completion_tokens: the server's ``usage`` (0 when it reported none).
        model: the model the server says answered.
        cached: True when the answer came from the cache (no request was sent for it now).
    """

    contents: list[str]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model: str = ""
    finish_reasons: list[str | None] = field(default_factory=list)
    cached: bool = False

    def to_json(self) -> str:
        return json.dumps(
            {
                "contents": self.contents,
                "usage": {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens},
                "model": self.model,
                "finish_reasons": self.finish_reasons,
            },
            ensure_ascii=False,
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str, *, cached: bool) -> JudgeAnswer:
        d = json.loads(text)
        usage = d.get("usage") or {}
        return cls(
            contents=[str(c) for c in d["contents"]],
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            model=str(d.get("model") or ""),
            finish_reasons=list(d.get("finish_reasons") or []),
            cached=cached,
        )


def request_digest(body: Mapping[str, object]) -> str:
    """The SHA-256 of a request body's canonical JSON (sorted keys, no spaces): equal bodies, one key."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def server_message(text: str) -> str:
    """The server's own error message: ``error.message`` (OpenAI), ``message`` (vLLM), else the body's start."""
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()[:300]
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:300]
        if isinstance(err, str) and err:
            return err[:300]
        if body.get("message"):
            return str(body["message"])[:300]
        if body.get("detail"):
            return str(body["detail"])[:300]
    return text.strip()[:300]


class ChatJudge:
    """An OpenAI-compatible chat-completions endpoint as a judge (see the module doc).

    Args:
        base_url: the API root, with its version: ``http://host:8000/v1`` (vLLM, SGLang, TGI).
        api_key: the bearer token, or None (a local server without ``--api-key``).
        model: the served model's name (the ``model`` of each body; counters are kept by it).
        limiter: a rate limiter (:func:`rewardq.reward.ratelimit.open_limiter`).
        cache: a judge cache (:func:`rewardq.reward.judge.cache.open_judge_cache`).
        stats: this worker's counters (``/metrics``).
        timeout: seconds one HTTP request may take.
        estimated_tokens_per_request: what the token bucket must hold before a request is sent.
        max_answer_bytes: the largest answer (HTTP body) read; a larger one is an error.
    """

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str | None,
        model: str,
        limiter: _LimiterBase,
        cache: _CacheBase,
        stats: JudgeStats,
        timeout: float = JUDGE_TIMEOUT,
        estimated_tokens_per_request: float = JUDGE_ESTIMATED_TOKENS,
        max_answer_bytes: int = JUDGE_MAX_ANSWER_BYTES,
    ) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self.model = model
        self.limiter = limiter
        self.cache = cache
        self.stats = stats
        self.timeout = float(timeout)
        self.estimated_tokens = float(estimated_tokens_per_request)
        self.max_answer_bytes = int(max_answer_bytes)
        self._http = HttpSession(self.timeout)
        self._warned: set[str] = set()

    def __repr__(self) -> str:  # never the headers: they hold the key
        return f"ChatJudge(url={self.url!r}, model={self.model!r})"

    async def setup(self) -> None:
        """Open the HTTP session (one connection pool for every request of this worker)."""
        await self._http.get()

    async def close(self) -> None:
        await self._http.close()

    # -- one judge call ------------------------------------------------------------------
    async def complete(self, body: dict[str, Any]) -> JudgeAnswer:
        """The answer to ``body``: from the cache, or sent once (see the module doc)."""
        digest = request_digest(body)
        async with self.cache.claim(digest) as claim:
            if claim.answer is not None:  # a hit
                try:
                    answer = JudgeAnswer.from_json(claim.answer, cached=True)
                except (ValueError, KeyError, TypeError) as exc:
                    raise ScoringError(f"the cached judge answer {digest[:16]} is unreadable ({exc})") from None
                shared = int(getattr(self.cache, "shared", None) is not None)
                saved = answer.prompt_tokens + answer.completion_tokens
                await self._count(cache_hits=1, shared_hits=shared, saved_tokens=saved)
                return answer
            answer = await self._send(body)
            text = answer.to_json()
            if len(text.encode("utf-8")) <= MAX_CACHED_ANSWER_BYTES:
                await claim.put(text)
            else:
                logger.warning("genrm: an answer of %d bytes is used but not cached", len(text))
            return answer

    async def _send(self, body: dict[str, Any]) -> JudgeAnswer:
        """Send ``body`` once, under the limits; a failure is raised with its kind (module doc)."""
        payload = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        try:
            status, retry_after, text, error = await self._attempt(payload)
        except RateLimitWait as exc:
            raise JudgeRateLimited(
                f"judge {self.model} at {self.url} was not called: {exc}", retry_after=exc.retry_after
            ) from None
        except _TooLarge as exc:
            await self._charge(Usage(*usage_bounds(body, len(payload), exc.size), readable=False))
            await self._count(requests=1, errors=1, failed=1)
            raise JudgeAnswerTooLarge(
                f"judge {self.model} at {self.url} answered more than max_answer_bytes={self.max_answer_bytes:,} "
                f"bytes ({exc.said()}); it was not read further. Lower max_tokens or n, or raise max_answer_bytes",
                status=200,
            ) from None
        if error is None and status == 200:
            answer, usage = self._read_answer(text, body, len(payload))
            await self._charge(usage)
            return answer
        message = error or server_message(text)
        failure = JudgeUnavailable(
            f"judge {self.model} at {self.url} "
            + (f"answered HTTP {status}: {message}" if status is not None else f"did not answer: {message}")
            + (f" (Retry-After: {retry_after:g}s)" if retry_after is not None else ""),
            status=status,
            server_message=message,
            retry_after=retry_after,
        )
        # `failed` counts calls that end as error results: a transient failure is tried again
        await self._count(requests=1, errors=1, failed=int(failure.failure_kind != FailureKind.TRANSIENT))
        raise failure

    async def _attempt(self, payload: bytes) -> tuple[int | None, float | None, str, str | None]:
        """One HTTP request under the limits: ``(status, retry_after, body text, connection error)``."""
        import aiohttp

        session = await self._http.get()
        await self.limiter.acquire_request()
        reserved = 0.0
        try:
            # the estimate is taken before the call, so calls started together wait their turn in
            # the bucket; the answer's usage settles the difference (:meth:`_charge`)
            await self.limiter.acquire_tokens(self.estimated_tokens)
            reserved = self.estimated_tokens
            async with self.limiter.slot():  # held only while the request is in flight
                try:
                    async with session.post(self.url, data=payload, headers=self._headers) as resp:
                        text = await _read_at_most(resp, self.max_answer_bytes)
                        return resp.status, retry_after_seconds(resp.headers.get("Retry-After")), text, None
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                    if isinstance(exc, asyncio.TimeoutError):
                        what = f"no answer within timeout={self.timeout:g}s"
                    return None, None, "", what
        except asyncio.CancelledError:
            # the trajectory was cancelled (or the worker stops): the request is aborted (the
            # connection closes, and vLLM aborts a request whose client went away), its slot was
            # released on the way out, and its request token goes back to the fleet's bucket
            await _shielded(self._abandoned(reserved))
            raise

    async def _abandoned(self, reserved: float) -> None:
        """A call given up before its answer: the request token and the ``reserved`` tokens back,
        and counted as ``aborted``."""
        try:
            await self.limiter.give_back_request()
            await self.limiter.charge_tokens(-reserved)
            await self._count(aborted=1)
        except Exception as exc:  # noqa: BLE001 - the call is being cancelled; the bucket refills anyway
            logger.debug("genrm: could not give an aborted call's request token back: %s", exc)

    def _read_answer(self, text: str, body: dict[str, object], payload_bytes: int) -> tuple[JudgeAnswer, Usage]:
        """The answer in a 200 body, and the tokens it is counted as (see :func:`read_usage`)."""
        try:
            reply = json.loads(text)
            choices = reply["choices"]
            contents = [_content_text(c["message"].get("content")) for c in choices]
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            raise JudgeUnavailable(
                f"judge {self.model} at {self.url} answered HTTP 200 without choices[].message.content: {text[:200]}",
                status=200,
            ) from None
        bounds = usage_bounds(body, payload_bytes, len(text.encode("utf-8", "replace")))
        usage = read_usage(reply.get("usage"), bounds, own_size(payload_bytes, contents))
        if usage is None:
            self._warn_once("none", "reports no usage; charging max_tpm estimated_tokens_per_request per request")
            usage = Usage(int(self.estimated_tokens), 0, readable=False)
        elif not usage.readable:
            self._warn_once(
                "unreadable",
                f"reported an unreadable usage ({_short(reply.get('usage'))}); charging "
                f"the request's own size ({usage.total:,} tokens) instead",
            )
        elif usage.clipped:
            self._warn_once(
                "clipped",
                f"reported usage {_short(reply.get('usage'))}, more than the request could "
                f"cost; charging at most {bounds[0]:,} prompt + {bounds[1]:,} completion tokens",
            )
        answer = JudgeAnswer(
            contents=contents,
            prompt_tokens=usage.prompt if usage.readable else 0,
            completion_tokens=usage.completion if usage.readable else 0,
            model=str(reply.get("model") or self.model),
            finish_reasons=[c.get("finish_reason") if isinstance(c, dict) else None for c in choices],
        )
        return answer, usage

    async def _charge(self, usage: Usage) -> None:
        """Charge the token bucket with what the answer is counted as beyond the estimate its call
        reserved (below it: the rest is given back), and count the answer."""
        await self.limiter.charge_tokens(usage.total - self.estimated_tokens)
        await self._count(requests=1, answers=1, prompt_tokens=usage.prompt, completion_tokens=usage.completion)

    def _warn_once(self, kind: str, what: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            logger.warning("genrm: %s %s", self.url, what)

    async def _count(self, **increments: int) -> None:
        """This worker's counters and the fleet's (in Redis); a failed fleet count is logged, not raised."""
        increments = {k: v for k, v in increments.items() if v}
        if not increments:
            return
        self.stats.add(self.model, **increments)
        try:
            await self.cache.count(self.model, **increments)
        except Exception as exc:  # noqa: BLE001 - counting must never cost a trajectory its reward
            logger.warning("genrm: could not update the fleet's judge counters: %s", exc)


def _content_text(content: object) -> str:
    """A message's content as text (a string, or a list of ``{"type": "text", "text": ...}`` parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    raise TypeError(f"unexpected content {type(content).__name__}")


def _short(value: object) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text[:80]


class _TooLarge(Exception):
    """An answer over ``max_answer_bytes``: ``size`` is what its ``Content-Length`` announced
    (``announced``), else the bytes read when the limit was passed (a chunked answer announces none)."""

    def __init__(self, size: int, *, announced: bool) -> None:
        super().__init__(size)
        self.size = size
        self.announced = announced

    def said(self) -> str:
        """What the error says of the size."""
        if self.announced:
            return f"its Content-Length announced {self.size:,}"
        return f"it announced no length; {self.size:,} had been read when the limit was passed"


async def _shielded(job: Any) -> None:
    """Run ``job`` to its end from a task being cancelled, even if it is cancelled again meanwhile."""
    task = asyncio.ensure_future(job)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        pass


async def _read_at_most(resp: Any, limit: int) -> str:
    """The body of ``resp`` as text, reading no more than ``limit`` bytes; :class:`_TooLarge` past it."""
    announced = resp.content_length
    if announced is not None and announced > limit:
        raise _TooLarge(announced, announced=True)
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:
            raise _TooLarge(size, announced=False)
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")  # JSON is UTF-8 (RFC 8259)
