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
   charged with the tokens the server reports in ``usage`` (prompt + completion), not the estimate.
3. **Retries.** A 429, a 5xx, a 408, a connection error or a timeout is retried up to
   ``max_retries`` times. The pause is the server's ``Retry-After`` when it sends one (seconds or
   an HTTP date; one longer than ``max_retry_wait`` ends the call at once), else
   :func:`rewardq.queue.retry.backoff_delay` (exponential with jitter, ``backoff_base`` doubling up
   to ``backoff_cap``). Any other 4xx is not retried: the request itself is wrong.
4. **Failure.** A judge that stays down raises :class:`JudgeUnavailable` naming the status and the
   server's own message: the trajectory gets an error result, never a zero, and the claim is
   released so another worker may try later.

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
        self._http = HttpSession(self.timeout)
        self._warned_usage = False

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
            status, retry_after, text, error = await self._attempt(payload)
            if error is None and status == 200:
                answer = self._read_answer(text)
                await self._charge(answer)
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
            if pause > self.retry.max_retry_wait:
                await self._count(failed=1)
                raise JudgeUnavailable(
                    f"judge {self.model} at {self.url} answered {last} and asked to retry after {pause:.0f}s, "
                    f"longer than max_retry_wait={self.retry.max_retry_wait:g}s",
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
                    text = await resp.text()
                    return resp.status, retry_after_seconds(resp.headers.get("Retry-After")), text, None
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                if isinstance(exc, asyncio.TimeoutError):
                    what = f"no answer within timeout={self.timeout:g}s"
                return None, None, "", what

    def _read_answer(self, text: str) -> JudgeAnswer:
        try:
            body = json.loads(text)
            choices = body["choices"]
            contents = [_content_text(c["message"].get("content")) for c in choices]
        except (ValueError, KeyError, TypeError, AttributeError):
            raise JudgeUnavailable(
                f"judge {self.model} at {self.url} answered HTTP 200 without choices[].message.content: {text[:200]}",
                status=200,
            ) from None
        usage = body.get("usage") or {}
        return JudgeAnswer(
            contents=contents,
            prompt_tokens=_int(usage.get("prompt_tokens")),
            completion_tokens=_int(usage.get("completion_tokens")),
            model=str(body.get("model") or self.model),
            finish_reasons=[c.get("finish_reason") for c in choices],
        )

    async def _charge(self, answer: JudgeAnswer) -> None:
        """Charge the token bucket with the server's ``usage`` and count the answer."""
        used = answer.prompt_tokens + answer.completion_tokens
        if used <= 0:
            used = int(self.estimated_tokens)
            if not self._warned_usage:
                self._warned_usage = True
                logger.warning(
                    "genrm: %s reports no usage; charging max_tpm estimated_tokens_per_request=%d per request",
                    self.url,
                    used,
                )
        await self.limiter.charge_tokens(used)
        await self._count(
            requests=1, answers=1, prompt_tokens=answer.prompt_tokens, completion_tokens=answer.completion_tokens
        )

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


def _int(value: Any) -> int:
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0
