"""``disrm``'s options, declared once (:mod:`rewardq.reward.options`), in a module that imports no
torch: ``rewardq config`` and the scoring fingerprint read them without loading the manager."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rewardq.reward.options import ManagerOptions, option

__all__ = ["BACKENDS", "DisRMOptions"]

#: backend -> (path, whether the body carries ``use_activation: false``, the score's field in data[-1])
BACKENDS = {
    "vllm": ("/classify", True, "probs"),
    "sglang": ("/v1/embeddings", False, "embedding"),
}


@dataclass(frozen=True)
class DisRMOptions(ManagerOptions):
    """``disrm``'s options, declared once (:mod:`rewardq.reward.options`)."""

    manager: ClassVar[str] = "disrm"

    base_url: str | None = option(None, "The reward model server, e.g. http://10.0.0.5:8000 (required).")
    model: str | None = option(None, "The model name the server expects in the request's model field (required).")
    backend: str = option(
        "vllm", "The server's API: vllm (/classify) or sglang (/v1/embeddings).", choices=tuple(BACKENDS)
    )
    tokenizer: object = option(
        None, "The reward model's tokenizer (required): a tokenizer.json, a tokenizer folder, a Hub id or a loaded one."
    )
    timeout: float = option(30.0, "Seconds one HTTP request may take.", above=0)
    max_retries: object = option(None, "Ignored, with a warning: the worker's retry_for rules.")
    backoff_base: object = option(None, "Ignored, with a warning: the worker's retry_for rules.")
    backoff_cap: object = option(None, "Ignored, with a warning: the worker's retry_for rules.")
