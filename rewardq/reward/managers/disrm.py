"""``disrm``: a discriminative reward model served over HTTP by vLLM or SGLang.

For each trajectory the final output is scored by the reward model, as verl's reward-model loop does:

1. the response is decoded with the *policy* tokenizer and its EOS token string removed;
2. the chat is the sample's ``raw_prompt`` (a list of ``{"role", "content"}`` messages)
   plus ``{"role": "assistant", "content": <response>}``;
3. it is rendered with the *reward model's* chat template
   (``apply_chat_template(chat, tokenize=False, add_generation_prompt=False)``) and a
   leading BOS string is stripped (the server adds its own);
4. the prompt is posted to the server:

   * vLLM: ``POST {base_url}/classify`` with ``{"model", "input", "use_activation": false}``;
     score = ``data[-1]["probs"][-1]``;
   * SGLang: ``POST {base_url}/v1/embeddings`` with ``{"model", "input"}``;
     score = ``data[-1]["embedding"][-1]``.

The result is ``{"reward_score": score, "reward_extra_info": {}}``.

Failures: connection errors, timeouts and 5xx answers are retried up to ``max_retries``
times, sleeping ``min(backoff_cap, backoff_base * 2**(attempt-1))`` (less up to 20 % jitter;
:func:`rewardq.backoff.compute_backoff`) between attempts; a 4xx answer is not retried (the
request itself is wrong) and raises
:class:`~rewardq.errors.ScoringError` with the status and the start of the body, as does a
200 answer without the expected fields, or running out of retries.

Options::

    base_url (required)  model (required)  backend="vllm" | "sglang"
    tokenizer=<the reward model's tokenizer: tokenizer.json, HF folder or Hub id>
    max_retries=5  timeout=30.0 (per request, seconds)  backoff_base=0.5  backoff_cap=30.0

``tokenizer`` is also the name of the manager's first positional argument (the policy
tokenizer), so that argument is positional-only here and the option arrives through
``**options``, as it does from verl's ``reward_model`` config block.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import TYPE_CHECKING, Any

from rewardq import defaults
from rewardq.backoff import compute_backoff
from rewardq.errors import ConfigError, ScoringError, TransientError
from rewardq.reward.base import ManagerContext, RewardManager, ScoreFn
from rewardq.reward.http import HttpSession, status_failure_kind
from rewardq.reward.registry import register
from rewardq.reward.results import reject_unknown_options, to_float

if TYPE_CHECKING:
    from tensordict import TensorDict

    from rewardq.reward.tokenizer import Tokenizer

logger = logging.getLogger("rewardq.reward.disrm")

#: backend -> (path, whether the body carries ``use_activation: false``, the score's field in data[-1])
BACKENDS = {
    "vllm": ("/classify", True, "probs"),
    "sglang": ("/v1/embeddings", False, "embedding"),
}
#: The only option that arrives through ``**options``.
_EXTRA_OPTIONS = ["tokenizer"]


def _check_number(name: str, value: object, *, integer: bool = False) -> None:
    """Integers must be >= 0 (a retry count); other numbers > 0 (times)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int if integer else (int, float))
        or (value < 0 if integer else not value > 0)
    ):
        raise ConfigError(
            f"manager 'disrm': {name} must be {'an integer >= 0' if integer else 'a number > 0'}, got {value!r}"
        )


@register("disrm")
class DisRMRewardManager(RewardManager):
    """Scores the final output with a reward model over HTTP; see the module docstring.

    Args:
        tokenizer: the policy tokenizer (positional only): decodes the response.
        compute_score: unused (a reward model replaces the scoring function).
        context: the worker's context.
        base_url: the server, e.g. ``http://10.0.0.5:8000``.
        model: the model name the server expects in ``"model"``.
        backend: ``"vllm"`` or ``"sglang"``.
        max_retries: retries after the first attempt (connection errors, timeouts, 5xx).
        timeout: seconds per HTTP request.
        backoff_base, backoff_cap: the retry sleep is ``min(cap, base * 2**attempt)``.
        **options: ``tokenizer`` = the reward model's tokenizer (a path or a loaded tokenizer).
    """

    reads = "final"  # run_single reads data[-1:] only

    def __init__(
        self,
        tokenizer: Tokenizer,
        compute_score: ScoreFn | None = None,
        /,
        *,
        context: ManagerContext | None = None,
        base_url: str | None = None,
        model: str | None = None,
        backend: str = "vllm",
        max_retries: int = defaults.DISRM_MAX_RETRIES,
        timeout: float = defaults.DISRM_TIMEOUT,
        backoff_base: float = defaults.DISRM_BACKOFF_BASE,
        backoff_cap: float = defaults.DISRM_BACKOFF_CAP,
        **options: object,
    ) -> None:
        super().__init__(tokenizer, compute_score, context=context)
        reject_unknown_options(
            "disrm",
            options,
            _EXTRA_OPTIONS + ["base_url", "model", "backend", "max_retries", "timeout", "backoff_base", "backoff_cap"],
        )
        if not base_url or not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ConfigError(
                f"manager 'disrm' needs base_url=http://HOST:PORT of the reward model server, got {base_url!r}"
            )
        if not model or not isinstance(model, str):
            raise ConfigError(f"manager 'disrm' needs model=<the served model's name>, got {model!r}")
        if backend not in BACKENDS:
            raise ConfigError(f"manager 'disrm': backend must be one of {sorted(BACKENDS)}, got {backend!r}")
        _check_number("max_retries", max_retries, integer=True)
        for name, value in (("timeout", timeout), ("backoff_base", backoff_base), ("backoff_cap", backoff_cap)):
            _check_number(name, value)
        rm_tokenizer = options.get("tokenizer")
        if rm_tokenizer is None:
            raise ConfigError(
                "manager 'disrm' needs tokenizer=<the reward model's tokenizer> (a tokenizer.json, "
                "a tokenizer folder or a Hub id): the prompt is rendered with its chat template"
            )
        if isinstance(rm_tokenizer, (str, os.PathLike)):
            from rewardq.reward.tokenizer import load_tokenizer

            rm_tokenizer = load_tokenizer(rm_tokenizer)
        if not hasattr(rm_tokenizer, "apply_chat_template"):
            raise ConfigError(
                f"manager 'disrm': the reward model tokenizer {rm_tokenizer!r} has no apply_chat_template"
            )
        if compute_score is not None:
            logger.warning("disrm: the reward model scores every sample; the configured reward function is unused")
        self.rm_tokenizer = rm_tokenizer
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.backend = backend
        self.max_retries = max_retries
        self.timeout = float(timeout)
        self.backoff_base = float(backoff_base)
        self.backoff_cap = float(backoff_cap)
        self.counters = {"requests": 0, "retries": 0, "backoff_seconds": 0.0}
        self._http = HttpSession(self.timeout)

    # -- lifecycle ---------------------------------------------------------------------
    async def setup(self) -> None:
        """Open the HTTP session (one connection pool for every request of this worker)."""
        await self._http.get()

    async def close(self) -> None:
        await self._http.close()

    # -- scoring -----------------------------------------------------------------------
    def build_prompt(self, data: TensorDict) -> str:
        """The reward model's input for the final output of ``data`` (steps 1-3 above)."""
        from rewardq.reward.rows import last_row, non_tensor, valid_response_ids

        row = last_row(data)  # data[-1:], built cheaper
        raw_prompt = non_tensor(row, "raw_prompt")
        if not isinstance(raw_prompt, (list, tuple)) or not all(isinstance(m, dict) for m in raw_prompt):
            raise ScoringError(
                "disrm needs the sample's raw_prompt as a list of chat messages "
                f"({{'role': ..., 'content': ...}}), got {raw_prompt!r:.100}"
            )
        response = self.require_tokenizer().decode(valid_response_ids(row), skip_special_tokens=False)
        eos = getattr(self.tokenizer, "eos_token", None)
        if eos:
            response = response.replace(eos, "")
        chat = [dict(m) for m in raw_prompt] + [{"role": "assistant", "content": response}]
        prompt = self.rm_tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=False)
        if not isinstance(prompt, str):
            raise ScoringError("the reward model's chat template returned token ids, not text")
        bos = getattr(self.rm_tokenizer, "bos_token", None)
        if bos and prompt.startswith(bos):
            prompt = prompt[len(bos) :]
        return prompt

    def provenance(self, data_source: object) -> dict[str, Any]:
        """``scorer``: the reward model."""
        return {"scorer": f"reward_model:{self.model}"}

    async def run_single(self, data: TensorDict) -> dict[str, Any]:
        prompt = self.build_prompt(data)  # reads the final row only (data[-1:])
        path, activation_flag, field = BACKENDS[self.backend]
        payload: dict[str, Any] = {"model": self.model, "input": prompt}
        if activation_flag:
            payload["use_activation"] = False
        body = await self.post(path, payload)
        try:
            value = body["data"][-1][field][-1]
        except (KeyError, IndexError, TypeError):
            raise ScoringError(
                f"reward model answer from {self.base_url}{path} has no data[-1].{field}[-1]: {json.dumps(body)[:200]}"
            ) from None
        return {"reward_score": to_float(value, "the reward model's score"), "reward_extra_info": {}}

    async def post(self, path: str, payload: dict[str, Any]) -> Any:
        """POST ``payload`` as JSON with retries (see the module docstring); returns the decoded JSON."""
        import aiohttp

        session = await self._http.get()
        url = self.base_url + path
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                delay = compute_backoff(attempt, base=self.backoff_base, cap=self.backoff_cap, jitter=0.2)
                logger.warning(
                    "disrm: %s failed (%s); retry %d/%d in %.2fs", url, last, attempt, self.max_retries, delay
                )
                self.counters["retries"] += 1
                self.counters["backoff_seconds"] += delay
                await asyncio.sleep(delay)
            self.counters["requests"] += 1
            try:
                async with session.post(url, json=payload) as resp:
                    text = await resp.text()
                    status = resp.status
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError) as exc:
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                continue
            if status >= 500:
                last = f"HTTP {status}: {text[:200]}"
                continue
            if status >= 400:
                raise ScoringError(
                    f"reward model at {url} refused the request with HTTP {status} (not retried): {text[:300]}",
                    failure_kind=status_failure_kind(status),
                )
            try:
                return json.loads(text)
            except ValueError:
                raise ScoringError(
                    f"reward model at {url} answered HTTP {status} with a body that is not JSON: {text[:200]}"
                ) from None
        raise TransientError(f"reward model at {url} failed after {self.max_retries + 1} attempts; last: {last}")

    def stats(self) -> dict[str, Any]:
        """HTTP counters for metrics: requests, retries, backoff_seconds."""
        return dict(self.counters)
