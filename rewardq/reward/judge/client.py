"""One call of an OpenAI-compatible chat-completions judge: billed once, limited fleet-wide, retried.

:meth:`ChatJudge.complete` takes a request body and returns the judge's answer
(:class:`JudgeAnswer`). In order:

1. **The cache.** The body's SHA-256 (:func:`request_digest`, over its canonical JSON) names the
   request. If some worker already got its answer, that answer is returned and nothing is sent
   (``cached=True``); if another worker is sending it right now, this call waits for its answer
   (:mod:`rewardq.queue.judge_cache`).
2. **The limits**, for each attempt: one request token (``max_rpm``), then a wait until the token
   bucket (``max_tpm``) could pay ``estimated_tokens_per_request``, then one of ``max_concurrent``
   slots, held only while the HTTP request is in flight (:mod:`rewardq.reward.ratelimit`; the
   limits hold across every worker of the fleet). When the answer arrives, the token bucket is
   charged with the tokens the server reports in ``usage`` (prompt + completion), not the estimate,
   but never more than the request could have cost (its own size for the prompt, ``n`` x
   ``max_tokens`` for the answer), so a server reporting absurd usage cannot stop the fleet; a
   ``usage`` that cannot be read (``Infinity``, a list) is charged the request's own size, and the
   answer is used and cached all the same (:mod:`rewardq.reward.judge.usage`). A limit that would
   hold the call back past the trajectory's ``score_timeout`` ends it at once with
   :class:`JudgeRateLimited`, naming the limit.
3. **Retries.** A 429, a 5xx, a 408, a connection error or a timeout is retried up to
   ``max_retries`` times. The pause is the server's ``Retry-After`` when it sends one (seconds or
   an HTTP date; one longer than ``max_retry_wait`` ends the call at once), else
   :func:`rewardq.queue.retry.backoff_delay` (exponential with jitter, ``backoff_base`` doubling up
   to ``backoff_cap``). Any other 4xx is not retried: the request itself is wrong.
4. **Failure.** A judge that stays down raises :class:`JudgeUnavailable` naming the status and the
   server's own message: the trajectory gets an error result, never a zero, and the claim is
   released so another worker may try later. An answer larger than ``max_answer_bytes`` is read no
   further than that and is an error too (:class:`JudgeAnswerTooLarge`).

The API key comes from the environment (``api_key_env``) and is sent only as the
``Authorization: Bearer`` header; it is never logged or stored.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from rewardq import defaults
from rewardq.errors import ScoringError
from rewardq.queue.retry import backoff_delay
from rewardq.reward.http import TRANSIENT_STATUSES, HttpSession, retry_after_seconds, status_failure_kind
from rewardq.reward.judge.stats import JudgeStats
from rewardq.reward.judge.usage import Usage, own_size, read_usage, usage_bounds
from rewardq.reward.ratelimit import RateLimitWait
from rewardq.reward.time_left import time_left

logger = logging.getLogger("rewardq.reward.genrm")

#: Statuses worth sending the same request again for.
RETRY_STATUSES = TRANSIENT_STATUSES
#: Largest answer kept in the cache (bytes of its JSON); a larger one is used but not kept.
MAX_CACHED_ANSWER_BYTES = 1 << 20


class JudgeUnavailable(ScoringError):
    """The judge did not answer usably: a refused request, or failures past ``max_retries``.

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


def request_digest(body: dict[str, Any]) -> str:
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


@dataclass
class RetryPolicy:
    """How :class:`ChatJudge` retries (see the module doc)."""

    max_retries: int = defaults.JUDGE_MAX_RETRIES
    backoff_base: float = defaults.JUDGE_BACKOFF_BASE
    backoff_cap: float = defaults.JUDGE_BACKOFF_CAP
    max_retry_wait: float = defaults.JUDGE_MAX_RETRY_WAIT


class ChatJudge:
    """An OpenAI-compatible chat-completions endpoint as a judge (see the module doc).

    Args:
        base_url: the API root, with its version: ``http://host:8000/v1`` (vLLM, SGLang, TGI).
        api_key: the bearer token, or None (a local server without ``--api-key``).
        model: the served model's name (the ``model`` of each body; counters are kept by it).
        limiter: a rate limiter (:func:`rewardq.reward.ratelimit.open_limiter`).
        cache: a judge cache (:func:`rewardq.queue.judge_cache.open_judge_cache`).
        stats: this worker's counters (``/metrics``).
        timeout: seconds one HTTP request may take.
        estimated_tokens_per_request: what the token bucket must hold before a request is sent.
        retry: the retry policy.
        max_answer_bytes: the largest answer (HTTP body) read; a larger one is an error.
    """

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str | None,
        model: str,
        limiter: Any,
        cache: Any,
        stats: JudgeStats,
        timeout: float = defaults.JUDGE_TIMEOUT,
        estimated_tokens_per_request: float = defaults.JUDGE_ESTIMATED_TOKENS,
        retry: RetryPolicy | None = None,
        max_answer_bytes: int = defaults.JUDGE_MAX_ANSWER_BYTES,
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
        self.retry = retry or RetryPolicy()
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
            if claim.hit:
                try:
                    answer = JudgeAnswer.from_json(claim.answer, cached=True)
                except (ValueError, KeyError, TypeError) as exc:
                    raise ScoringError(f"the cached judge answer {digest[:16]} is unreadable ({exc})") from None
                await self._count(cache_hits=1)
                return answer
            answer = await self._send(body)
            text = answer.to_json()
            if len(text.encode("utf-8")) <= MAX_CACHED_ANSWER_BYTES:
                await claim.put(text)
            else:
                logger.warning("genrm: an answer of %d bytes is used but not cached", len(text))
            return answer

    async def _send(self, body: dict[str, Any]) -> JudgeAnswer:
        """Send ``body`` under the limits, retrying as the policy says."""
        payload = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        failures, last = 0, ""
        while True:
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
                    f"bytes{f' ({exc.size:,} announced)' if exc.size > self.max_answer_bytes else ''}; it was not "
                    "read further. Lower max_tokens or n, or raise max_answer_bytes",
                    status=200,
                ) from None
            if error is None and status == 200:
                answer, usage = self._read_answer(text, body, len(payload))
                await self._charge(usage)
                return answer
            failures += 1
            message = error or server_message(text)
            last = f"HTTP {status}: {message}" if status is not None else message
            refused = status is not None and status not in RETRY_STATUSES
            await self._count(requests=1, errors=1, failed=int(refused))
            if refused:
                raise JudgeUnavailable(
                    f"judge {self.model} at {self.url} refused the request with HTTP {status} (not retried): {message}",
                    status=status,
                    server_message=message,
                )
            if failures > self.retry.max_retries:
                break
            pause = (
                retry_after
                if retry_after is not None
                else backoff_delay(failures, base=self.retry.backoff_base, cap=self.retry.backoff_cap)
            )
            longest, why = _longest_pause(self.retry.max_retry_wait)
            if pause > longest:
                await self._count(failed=1)
                raise JudgeUnavailable(
                    f"judge {self.model} at {self.url} answered {last} and asked to retry after {pause:.0f}s, "
                    f"longer than {why}",
                    status=status,
                    server_message=message,
                )
            logger.warning(
                "genrm: %s answered %s; retry %d/%d in %.2fs", self.url, last, failures, self.retry.max_retries, pause
            )
            await asyncio.sleep(pause)
        await self._count(failed=1)
        raise JudgeUnavailable(
            f"judge {self.model} at {self.url} failed after {failures} attempts; last: {last}",
            status=status,
            server_message=message,
        )

    async def _attempt(self, payload: bytes) -> tuple[int | None, float | None, str, str | None]:
        """One HTTP request under the limits: ``(status, retry_after, body text, connection error)``."""
        import aiohttp

        session = await self._http.get()
        await self.limiter.acquire_request()
        await self.limiter.wait_for_tokens(self.estimated_tokens)
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

    def _read_answer(self, text: str, body: dict[str, Any], payload_bytes: int) -> tuple[JudgeAnswer, Usage]:
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
        """Charge the token bucket with what the answer is counted as, and count the answer."""
        await self.limiter.charge_tokens(usage.total)
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
    """An answer over ``max_answer_bytes``: ``size`` is what it announced, else what was read."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


async def _read_at_most(resp: Any, limit: int) -> str:
    """The body of ``resp`` as text, reading no more than ``limit`` bytes; :class:`_TooLarge` past it."""
    announced = resp.content_length
    if announced is not None and announced > limit:
        raise _TooLarge(announced)
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:
            raise _TooLarge(size)
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")  # JSON is UTF-8 (RFC 8259)


def _longest_pause(max_retry_wait: float) -> tuple[float, str]:
    """The longest pause before a retry, and why: ``max_retry_wait``, or what is left of the trajectory's
    ``score_timeout`` when that is less."""
    left = time_left()
    if left is not None and left.seconds < max_retry_wait:
        return left.seconds, f"the {left.seconds:.1f}s left of this trajectory's score_timeout ({left.budget:g}s)"
    return max_retry_wait, f"max_retry_wait={max_retry_wait:g}s"
