"""``genrm``'s options, declared once (:mod:`rewardq.reward.options`), in a module that imports no
torch: ``rewardq config`` and the scoring fingerprint read them without loading the manager."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from rewardq.errors import ConfigError
from rewardq.reward.judge.cache import JUDGE_LEASE_SECONDS
from rewardq.reward.judge.client import JUDGE_ESTIMATED_TOKENS, JUDGE_MAX_ANSWER_BYTES, JUDGE_TIMEOUT
from rewardq.reward.judge.parsing import PARSERS
from rewardq.reward.options import ManagerOptions, option

__all__ = [
    "COMBINE",
    "DEFAULT_API_KEY_ENV",
    "DEFAULT_SEED",
    "DEFAULT_SHARED_ENTRIES",
    "DEFAULT_SHARED_TTL",
    "JUDGE_CACHES",
    "STRUCTURED",
    "GenRMOptions",
]

COMBINE = ("mean", "majority")
STRUCTURED = ("auto", "true", "false")
#: The environment variable the API key is read from unless ``api_key_env`` names another.
DEFAULT_API_KEY_ENV = "REWARDQ_JUDGE_API_KEY"
#: ``judge_cache``: answers reused within the run (its namespace), or across runs as well.
JUDGE_CACHES = ("run", "shared")
#: How long a shared answer is kept (``judge_cache_ttl``): 30 days.
DEFAULT_SHARED_TTL = 30 * 86400.0
#: The most shared answers kept per judge model (``judge_cache_max_entries``); at up to a few KB each
#: (the answer's JSON), a few hundred MB at most.
DEFAULT_SHARED_ENTRIES = 100_000
#: The ``seed`` every request carries unless ``seed`` says otherwise: with temperature 0 it changes
#: nothing on a server that decodes greedily, and it fixes the sampling of one that does not.
DEFAULT_SEED = 0


@dataclass(frozen=True)
class GenRMOptions(ManagerOptions):
    """``genrm``'s options, declared once (:mod:`rewardq.reward.options`): the class docstring of
    :class:`~rewardq.reward.managers.genrm.GenRMRewardManager` says what each one does."""

    manager: ClassVar[str] = "genrm"

    base_url: str | None = option(None, "The API root with its version, e.g. http://10.0.0.5:8000/v1 (required).")
    model: str | None = option(None, "The served model's name (required).")
    api_key_env: str = option(DEFAULT_API_KEY_ENV, "The environment variable holding the API key.")
    prompt_template: str | None = option(None, "The user prompt (the default rubric when unset).")
    prompt_template_path: str | None = option(None, "A file holding the user prompt.")
    system_prompt: str | None = option(None, "A system message.")
    score_parser: str = option("regex", "How a score is read: regex, json or choice.", choices=tuple(PARSERS))
    score_regex: str | None = option(None, "The regex parser's pattern.")
    score_field: str = option("score", "The json parser's field.")
    choices: object = option(None, "The choice parser's labels and their scores.")
    score_marker: str | None = option(None, "The text the judge writes before its verdict.")
    score_range: object = option(None, "[lo, hi]: the scores the rubric asks for.")
    clamp_score: bool = option(False, "Move a score outside score_range to the nearer end instead of failing.")
    structured_output: str = option("auto", "Ask for a JSON schema: auto, true or false.", choices=STRUCTURED)
    unparsed_score: float | None = option(None, "What an answer without a readable score counts as (unset: an error).")
    temperature: float = option(0.0, "Sampling temperature.", minimum=0)
    seed: int | None = option(DEFAULT_SEED, "The seed every request carries (None: send none).")
    max_tokens: int | None = option(1024, "Most tokens of one answer.", minimum=1)
    n: int = option(1, "Answers asked for in one request.", minimum=1)
    combine: str = option("mean", "How n scores combine: mean or majority.", choices=COMBINE)
    extra_body: dict[str, Any] | None = option({}, "More fields for the request body.")
    per_turn: bool = option(False, "Judge every output (one reward each) instead of the final one.")
    images: bool = option(True, "Send the outputs' images to the judge.")
    cache: bool = option(True, "Reuse answers across re-scoring and workers (billed once).")
    judge_cache: str = option(
        "run", "Where answers are reused: run (this namespace) or shared (across runs).", choices=JUDGE_CACHES
    )
    judge_cache_ttl: float = option(DEFAULT_SHARED_TTL, "Seconds a shared answer is kept.", minimum=0)
    judge_cache_max_entries: int = option(
        DEFAULT_SHARED_ENTRIES, "The most shared answers kept per judge model.", minimum=1
    )
    max_rpm: float | None = option(None, "Requests per minute across the fleet.", above=0)
    max_tpm: float | None = option(None, "Tokens per minute across the fleet.", above=0)
    max_concurrent: int | None = option(64, "Requests in flight across the fleet.", minimum=1)
    estimated_tokens_per_request: float = option(
        JUDGE_ESTIMATED_TOKENS, "Tokens charged to max_tpm before the server reports usage.", above=0
    )
    limiter_name: str = option("genrm", "The fleet limiter's name (judges that share limits share it).")
    lease_seconds: float = option(
        JUDGE_LEASE_SECONDS, "How long a dead worker's limiter slot or claim holds others back.", above=0
    )
    timeout: float = option(JUDGE_TIMEOUT, "Seconds one HTTP request may take.", above=0)
    max_answer_bytes: int = option(JUDGE_MAX_ANSWER_BYTES, "The largest answer (HTTP body) read.", minimum=1024)
    max_retries: object = option(None, "Ignored, with a warning: the worker's retry_for rules.")
    backoff_base: object = option(None, "Ignored, with a warning: the worker's retry_for rules.")
    backoff_cap: object = option(None, "Ignored, with a warning: the worker's retry_for rules.")
    max_retry_wait: object = option(None, "Ignored, with a warning: the worker's retry_for rules.")

    def __post_init__(self) -> None:
        super().__post_init__()
        name = self.limiter_name
        if any(c in name for c in "{} \n"):
            raise ConfigError(f"manager 'genrm': limiter_name must be a name without braces or spaces, got {name!r}")
        if self.score_marker is not None and not self.score_marker.strip():
            raise ConfigError(f"manager 'genrm': score_marker must be non-empty text, got {self.score_marker!r}")
        if self.prompt_template is not None and self.prompt_template_path is not None:
            raise ConfigError("manager 'genrm': give prompt_template or prompt_template_path, not both")
        if self.judge_cache == "shared" and not self.cache:
            raise ConfigError("manager 'genrm': judge_cache=shared reuses answers, which cache=false turns off")
