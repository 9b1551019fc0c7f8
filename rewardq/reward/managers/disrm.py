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

Failures: a request is sent once. A connection error, a timeout, a 408, a 429 or a 5xx raises
:class:`~rewardq.errors.TransientError` (with the server's ``Retry-After``), which the worker
retries in place, with backoff, until its ``retry_for`` runs out (the one retry policy; verl's
reward-model loop retries with exponential backoff capped at 30 s, as the worker's does). Any
other 4xx is not retried (the request itself is wrong, or the fleet is: 401, 403 and 404 are
``config`` failures) and raises :class:`~rewardq.errors.ScoringError` with the status and the
start of the body, as does a 200 answer without the expected fields.

Options::

    base_url (required)  model (required)  backend="vllm" | "sglang"
    tokenizer=<the reward model's tokenizer: tokenizer.json, HF folder or Hub id>
    timeout=30.0 (per request, seconds)

``max_retries``, ``backoff_base`` and ``backoff_cap`` are accepted and ignored, with a warning
(:func:`~rewardq.reward.http.warn_retired_options`).

The options are declared once, in :class:`DisRMOptions` (type, default, bounds, help).
``tokenizer`` is also the name of the manager's first positional argument (the policy
tokenizer), so that argument is positional-only here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import TYPE_CHECKING, Any, cast

from rewardq.errors import ConfigError, ScoringError, TransientError
from rewardq.queue.states import FailureKind
from rewardq.reward.base import ManagerContext, RewardManager, ScoreFn
from rewardq.reward.http import HttpSession, retry_after_seconds, status_failure_kind, warn_retired_options
from rewardq.reward.managers.disrm_options import BACKENDS, DisRMOptions
from rewardq.reward.registry import register
from rewardq.reward.results import to_float
from rewardq.reward.rows import last_row, non_tensor, valid_response_ids
from rewardq.reward.tokenizer import Tokenizer, load_tokenizer

if TYPE_CHECKING:
    from tensordict import TensorDict

logger = logging.getLogger("rewardq.reward.disrm")


def _reward_model_tokenizer(given: object) -> Tokenizer:
    """The reward model's tokenizer, loaded when ``given`` names one (a path, a folder or a Hub id)."""
    if given is None:
        raise ConfigError(
            "manager 'disrm' needs tokenizer=<the reward model's tokenizer> (a tokenizer.json, "
            "a tokenizer folder or a Hub id): the prompt is rendered with its chat template"
        )
    loaded = load_tokenizer(given) if isinstance(given, (str, os.PathLike)) else given
    if not hasattr(loaded, "apply_chat_template"):
        raise ConfigError(f"manager 'disrm': the reward model tokenizer {loaded!r} has no apply_chat_template")
    return cast(Tokenizer, loaded)


@register("disrm")
class DisRMRewardManager(RewardManager):
    """Scores the final output with a reward model over HTTP; see the module docstring.

    Args:
        tokenizer: the policy tokenizer (positional only): decodes the response.
        compute_score: unused (a reward model replaces the scoring function).
        context: the worker's context.
        options: :class:`DisRMOptions` (the worker builds them from ``manager_options``); or
        **given: the same options as keywords, checked as the worker checks them.
    """

    reads = "final"  # run_single reads data[-1:] only
    Options = DisRMOptions

    def __init__(
        self,
        tokenizer: Tokenizer,
        compute_score: ScoreFn | None = None,
        /,
        *,
        context: ManagerContext | None = None,
        options: DisRMOptions | None = None,
        **given: object,
    ) -> None:
        super().__init__(tokenizer, compute_score, context=context)
        o = options if options is not None else DisRMOptions.from_mapping(given)
        base_url, model = o.base_url, o.model
        if not base_url or not base_url.startswith(("http://", "https://")):
            raise ConfigError(
                f"manager 'disrm' needs base_url=http://HOST:PORT of the reward model server, got {base_url!r}"
            )
        if not model:
            raise ConfigError(f"manager 'disrm' needs model=<the served model's name>, got {model!r}")
        warn_retired_options(
            "disrm", {"max_retries": o.max_retries, "backoff_base": o.backoff_base, "backoff_cap": o.backoff_cap}
        )
        self.rm_tokenizer = _reward_model_tokenizer(o.tokenizer)
        if compute_score is not None:
            logger.warning("disrm: the reward model scores every sample; the configured reward function is unused")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.backend = o.backend
        self.timeout = float(o.timeout)
        self.counters = {"requests": 0, "errors": 0}
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

    async def post(self, path: str, payload: dict[str, object]) -> Any:
        """POST ``payload`` as JSON, once (see the module docstring); returns the decoded JSON."""
        import aiohttp

        session = await self._http.get()
        url = self.base_url + path
        self.counters["requests"] += 1
        try:
            async with session.post(url, json=payload) as resp:
                text = await resp.text()
                status = resp.status
                retry_after = retry_after_seconds(resp.headers.get("Retry-After"))
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError) as exc:
            self.counters["errors"] += 1
            what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise TransientError(f"reward model at {url} did not answer ({what})") from None
        if status >= 400:
            self.counters["errors"] += 1
            kind = status_failure_kind(status)
            raise ScoringError(
                f"reward model at {url} answered HTTP {status}"
                + (" (not retried)" if kind != FailureKind.TRANSIENT else "")
                + f": {text[:300]}",
                failure_kind=kind,
                retry_after=retry_after,
            )
        try:
            return json.loads(text)
        except ValueError:
            raise ScoringError(
                f"reward model at {url} answered HTTP {status} with a body that is not JSON: {text[:200]}"
            ) from None

    def stats(self) -> dict[str, Any]:
        """HTTP counters for metrics: requests, errors."""
        return dict(self.counters)
