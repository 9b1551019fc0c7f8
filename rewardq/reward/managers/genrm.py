"""``genrm``: a generative reward model (LLM-as-judge) over an OpenAI-compatible chat-completions endpoint.

vLLM, SGLang, TGI and hosted providers all serve ``POST {base_url}/chat/completions``. For each
trajectory the manager renders a prompt (the question, the final response, the ground truth and,
if the template asks, the whole trajectory; the output's images as ``image_url`` data URLs), asks
the judge for ``n`` answers, reads a score out of each and combines them. See docs/judges.md.

Why a manager and not a scoring function: a scoring function sees one decoded response and its
ground truth; a judge needs the whole trajectory (every output, the question, the images), a
fleet-wide limiter and answer cache that live in the pipeline's Redis, and an HTTP session opened
in ``setup`` and closed in ``close``. The manager has all of that; its judge
(:class:`~rewardq.reward.judge.client.ChatJudge`) is a public class for custom managers.

* **Billed once.** Each request is keyed by the SHA-256 of its full body and its answer kept in
  Redis for ``result_ttl``: a trajectory scored again (after a crash, a reclaim, a redelivery)
  reuses it, and two workers holding one request make one HTTP request
  (:mod:`rewardq.queue.judge_cache`).
* **Fleet-wide limits.** ``max_rpm``, ``max_tpm`` and ``max_concurrent`` hold across every worker
  (:mod:`rewardq.reward.ratelimit`); ``max_tpm`` is charged with the tokens the server reports.
* **Failures.** 429, 5xx, timeouts and connection errors are retried (``Retry-After`` honoured);
  a judge that stays down, or an answer without a readable score, is an error result naming why,
  never a zero (unless ``unparsed_score`` says what an unreadable answer scores).
* **Bounded scores.** A score outside ``score_range`` (the range the rubric asks for:
  :mod:`rewardq.reward.judge.scores`) is an error result naming the value and the range, never a
  reward, unless ``clamp_score`` is set. The verdict is read where the instructions put it (the
  first match, or the first after ``score_marker``), so a prompt injection the judge quotes
  afterwards does not decide it (:mod:`rewardq.reward.judge.parsing`).
* **Per turn.** ``per_turn=true`` asks the judge about every output (the trajectory up to it),
  giving each key its own reward.

Each result's ``reward_extra_info``: ``acc`` (the score), ``judge_prompt_tokens`` and
``judge_completion_tokens`` (the server's usage for that answer), ``judge_cached`` (True when the
answer was reused instead of paid for now), ``judge_votes`` (answers that gave a score) and
``judge_answer`` (the first answer's text, cut to 1,000 characters).

Options (``--manager-option`` / config)::

    base_url (required, with /v1)  model (required)  api_key_env=REWARDQ_JUDGE_API_KEY
    prompt_template | prompt_template_path  system_prompt=None
    score_parser=regex|json|choice  score_regex  score_field=score  choices  score_marker=None
    score_range=[0, 1] (or the rubric's, or the choices')  clamp_score=false
    structured_output=auto|true|false  unparsed_score=None  max_answer_bytes=4 MiB
    temperature=0.0  max_tokens=1024  n=1  combine=mean|majority  extra_body={}
    per_turn=false  images=true  cache=true
    max_rpm  max_tpm  max_concurrent=64  estimated_tokens_per_request=2000  limiter_name=genrm
    lease_seconds=30  timeout=120  max_retries=5  backoff_base=0.5  backoff_cap=30  max_retry_wait=120
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rewardq import defaults
from rewardq.errors import ConfigError, ScoringError
from rewardq.queue.images import images_of
from rewardq.reward.base import ManagerContext, RewardManager, ScoreFn
from rewardq.reward.judge.client import ChatJudge, JudgeAnswer, JudgeUnavailable, RetryPolicy, request_digest
from rewardq.reward.judge.parsing import PARSERS, ScoreParser, Unparsed, Verdict, build_parser
from rewardq.reward.judge.prompt import DEFAULT_TEMPLATE, PromptTemplate, chat_messages, question_from
from rewardq.reward.judge.scores import resolve_range
from rewardq.reward.provenance import template_digest
from rewardq.reward.registry import register
from rewardq.reward.results import to_float
from rewardq.reward.scoring_fingerprint import without_credentials
from rewardq.reward.trace import note_judged

if TYPE_CHECKING:
    from tensordict import TensorDict

    from rewardq.reward.tokenizer import Tokenizer

logger = logging.getLogger("rewardq.reward.genrm")

COMBINE = ("mean", "majority")
STRUCTURED = ("auto", "true", "false")
#: The environment variable the API key is read from unless ``api_key_env`` names another.
DEFAULT_API_KEY_ENV = "REWARDQ_JUDGE_API_KEY"
#: What a refusal of ``response_format`` says, in the servers' words (vLLM, SGLang, TGI, OpenAI).
_STRUCTURED_REFUSALS = ("response_format", "json_schema", "guided", "structured", "grammar")
_ANSWER_CHARS = 1000


def _number(name: str, value: Any, *, at_least: float | None = None, integer: bool = False, none: bool = False) -> None:
    """A number > 0 (or >= ``at_least``; an integer when ``integer``), or None when ``none``."""
    if value is None and none:
        return
    ok = not isinstance(value, bool) and isinstance(value, int if integer else (int, float))
    ok = ok and (value > 0 if at_least is None else value >= at_least)
    if not ok:
        what = "an integer" if integer else "a number"
        bound = "> 0" if at_least is None else f">= {at_least:g}"
        raise ConfigError(f"manager 'genrm': {name} must be {what} {bound}{' or None' if none else ''}, got {value!r}")


def _flag(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ConfigError(f"manager 'genrm': {name} must be true or false, got {value!r}")


@register("genrm")
class GenRMRewardManager(RewardManager):
    """Scores trajectories with an LLM judge; see the module docstring.

    Args:
        tokenizer: the policy tokenizer (decodes responses and, when needed, the prompt).
        compute_score: unused (the judge replaces the scoring function).
        context: the worker's context (Redis, namespace, result_ttl, judge counters).
        base_url: the API root with its version, e.g. ``http://10.0.0.5:8000/v1``.
        model: the served model's name (vLLM: the model path, or ``--served-model-name``).
        api_key_env: the environment variable holding the API key (unset: no key is sent).
        prompt_template / prompt_template_path: the user prompt (see :mod:`rewardq.reward.judge.prompt`).
        system_prompt: an optional system message.
        score_parser, score_regex, score_field, choices: how a score is read (see
            :mod:`rewardq.reward.judge.parsing`).
        score_marker: the text the judge writes before its verdict (after its reasoning); None:
            the verdict begins the answer.
        score_range: ``[lo, hi]``, the scores the rubric asks for (default: the choices', else the
            range the prompt template states, else ``[0, 1]``; :mod:`rewardq.reward.judge.scores`).
        clamp_score: move a score outside ``score_range`` to the nearer end instead of failing.
        max_answer_bytes: the largest answer (HTTP body) read; a larger one is an error result.
        structured_output: ``auto`` (for the json and choice parsers, ask for a JSON schema with
            ``response_format`` and fall back to plain text if the server refuses it), ``true``
            or ``false``.
        unparsed_score: what an answer without a readable score counts as (None: an error result).
        temperature, max_tokens, n: sampling; ``n`` answers come from one request.
        combine: ``mean`` of the ``n`` scores, or ``majority`` (the most frequent; a tie is the
            mean of the tied scores).
        extra_body: more fields for the request body (``seed``, ``top_p``, vLLM's
            ``chat_template_kwargs``, ...).
        per_turn: judge every output (one reward each) instead of the final one.
        images: send the outputs' images to the judge (a vision-language model).
        cache: reuse answers across re-scoring and workers (billed once); false sends every request.
        max_rpm, max_tpm, max_concurrent, estimated_tokens_per_request, limiter_name,
            lease_seconds: the fleet-wide limits (see :mod:`rewardq.reward.ratelimit`); ``lease_seconds``
            also bounds how long a dead worker's claim on a request holds others back.
        timeout: seconds one HTTP request may take.
        max_retries, backoff_base, backoff_cap, max_retry_wait: the retry policy
            (:class:`~rewardq.reward.judge.client.RetryPolicy`).
    """

    def __init__(  # noqa: C901 - one check per option
        self,
        tokenizer: Tokenizer,
        compute_score: ScoreFn | None = None,
        *,
        context: ManagerContext | None = None,
        base_url: str | None = None,
        model: str | None = None,
        api_key_env: str = DEFAULT_API_KEY_ENV,
        prompt_template: str | None = None,
        prompt_template_path: str | None = None,
        system_prompt: str | None = None,
        score_parser: str = "regex",
        score_regex: str | None = None,
        score_field: str = "score",
        choices: object = None,
        score_marker: str | None = None,
        score_range: object = None,
        clamp_score: object = False,
        structured_output: object = "auto",
        unparsed_score: float | None = None,
        temperature: float = 0.0,
        max_tokens: int | None = defaults.JUDGE_MAX_TOKENS,
        n: int = defaults.JUDGE_ANSWERS,
        combine: str = "mean",
        extra_body: dict[str, Any] | None = None,
        per_turn: object = False,
        images: object = True,
        cache: object = True,
        max_rpm: float | None = None,
        max_tpm: float | None = None,
        max_concurrent: int | None = defaults.JUDGE_MAX_CONCURRENT,
        estimated_tokens_per_request: float = defaults.JUDGE_ESTIMATED_TOKENS,
        limiter_name: str = "genrm",
        lease_seconds: float = defaults.JUDGE_LEASE_SECONDS,
        timeout: float = defaults.JUDGE_TIMEOUT,
        max_retries: int = defaults.JUDGE_MAX_RETRIES,
        backoff_base: float = defaults.JUDGE_BACKOFF_BASE,
        backoff_cap: float = defaults.JUDGE_BACKOFF_CAP,
        max_retry_wait: float = defaults.JUDGE_MAX_RETRY_WAIT,
        max_answer_bytes: int = defaults.JUDGE_MAX_ANSWER_BYTES,
    ) -> None:
        super().__init__(tokenizer, compute_score, context=context)
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ConfigError(
                "manager 'genrm' needs base_url=http://HOST:PORT/v1, the judge's OpenAI-compatible API root "
                f"(requests go to base_url + '/chat/completions'), got {base_url!r}"
            )
        if not isinstance(model, str) or not model:
            raise ConfigError(f"manager 'genrm' needs model=<the served model's name>, got {model!r}")
        if not isinstance(api_key_env, str) or not api_key_env:
            raise ConfigError(f"manager 'genrm': api_key_env must name an environment variable, got {api_key_env!r}")
        if api_key_env != DEFAULT_API_KEY_ENV and not os.environ.get(api_key_env):
            raise ConfigError(
                f"manager 'genrm': api_key_env={api_key_env} names an environment variable that is not set; "
                "export it where the worker runs (the key is never taken from the command line or a config file)"
            )
        self.api_key = os.environ.get(api_key_env) or None
        if prompt_template is not None and prompt_template_path is not None:
            raise ConfigError("manager 'genrm': give prompt_template or prompt_template_path, not both")
        if prompt_template_path is not None:
            try:
                prompt_template = Path(os.path.expanduser(prompt_template_path)).read_text()
            except OSError as exc:
                raise ConfigError(f"manager 'genrm': cannot read prompt_template_path ({exc})") from None
        self.template = PromptTemplate(prompt_template if prompt_template is not None else DEFAULT_TEMPLATE)
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise ConfigError(f"manager 'genrm': system_prompt must be text, got {system_prompt!r}")
        self.system_prompt = system_prompt
        structured = (
            str(structured_output).strip().lower()
            if not isinstance(structured_output, bool)
            else ("true" if structured_output else "false")
        )
        if structured not in STRUCTURED:
            raise ConfigError(
                f"manager 'genrm': structured_output must be one of {STRUCTURED}, got {structured_output!r}"
            )
        if score_parser not in PARSERS:
            raise ConfigError(
                f"manager 'genrm': score_parser must be one of {', '.join(PARSERS)}, got {score_parser!r}"
            )
        self.structured = structured == "true" or (structured == "auto" and score_parser != "regex")
        self.structured_required = structured == "true"
        if score_marker is not None and (not isinstance(score_marker, str) or not score_marker.strip()):
            raise ConfigError(f"manager 'genrm': score_marker must be non-empty text, got {score_marker!r}")
        self.range, range_source = resolve_range(
            score_range,
            choices=_choice_scores(choices),
            rubric=self.template.text,
            clamp=_flag("clamp_score", clamp_score),
        )
        self.range_source = range_source
        self.parser: ScoreParser = build_parser(
            score_parser,
            score_regex=score_regex,
            score_field=score_field,
            choices=choices,
            structured=self.structured,
            verdict=Verdict(score_marker, self.range.words()),
        )
        if unparsed_score is not None:
            unparsed_score = to_float(unparsed_score, "unparsed_score")
            if not self.range.contains(unparsed_score):
                raise ConfigError(
                    f"manager 'genrm': unparsed_score={unparsed_score:g} is outside score_range {self.range}"
                )
        self.unparsed_score = unparsed_score
        _number("temperature", temperature, at_least=0)
        _number("max_tokens", max_tokens, at_least=1, integer=True, none=True)
        _number("n", n, at_least=1, integer=True)
        if combine not in COMBINE:
            raise ConfigError(f"manager 'genrm': combine must be one of {COMBINE}, got {combine!r}")
        if extra_body is not None and not isinstance(extra_body, dict):
            raise ConfigError(f"manager 'genrm': extra_body must be a mapping, got {extra_body!r}")
        self.temperature = float(temperature)
        self.max_tokens = max_tokens
        self.n = n
        self.combine = combine
        self.extra_body = dict(extra_body or {})
        self.per_turn = _flag("per_turn", per_turn)
        self.send_images = _flag("images", images)
        self.reuse = _flag("cache", cache)
        for name, value in (("max_rpm", max_rpm), ("max_tpm", max_tpm)):
            _number(name, value, none=True)
        _number("max_concurrent", max_concurrent, at_least=1, integer=True, none=True)
        for name, value in (
            ("estimated_tokens_per_request", estimated_tokens_per_request),
            ("lease_seconds", lease_seconds),
            ("timeout", timeout),
            ("backoff_base", backoff_base),
            ("backoff_cap", backoff_cap),
            ("max_retry_wait", max_retry_wait),
        ):
            _number(name, value)
        _number("max_retries", max_retries, at_least=0, integer=True)
        _number("max_answer_bytes", max_answer_bytes, at_least=1024, integer=True)
        self.max_answer_bytes = max_answer_bytes
        if not isinstance(limiter_name, str) or not limiter_name or any(c in limiter_name for c in "{} \n"):
            raise ConfigError(
                f"manager 'genrm': limiter_name must be a name without braces or spaces, got {limiter_name!r}"
            )
        if compute_score is not None:
            logger.warning("genrm: the judge scores every trajectory; the configured reward function is unused")
        self.base_url = base_url
        self.model = model
        self.limits = {"max_rpm": max_rpm, "max_tpm": max_tpm, "max_concurrent": max_concurrent}
        self.estimated_tokens = float(estimated_tokens_per_request)
        self.limiter_name = limiter_name
        self.lease_seconds = float(lease_seconds)
        self.timeout = float(timeout)
        self.retry = RetryPolicy(max_retries, float(backoff_base), float(backoff_cap), float(max_retry_wait))
        self.judge: ChatJudge | None = None

    def __repr__(self) -> str:
        return f"GenRMRewardManager(base_url={self.base_url!r}, model={self.model!r})"

    # -- lifecycle -------------------------------------------------------------------
    async def setup(self) -> None:
        """Open the fleet limiter, the answer cache and the HTTP session."""
        if self.judge is not None:
            return
        from rewardq.queue.judge_cache import open_judge_cache
        from rewardq.queue.keys import Keyspace
        from rewardq.reward.ratelimit import open_limiter

        ctx = self.context
        ks = Keyspace(ctx.namespace)
        holder = f"{ctx.worker_name}:{os.getpid()}"
        limiter = open_limiter(
            ctx.redis_url,
            ks.ratelimit(self.limiter_name),
            cluster=ctx.cluster,
            lease_seconds=self.lease_seconds,
            holder_prefix=holder,
            **self.limits,
        )
        cache = open_judge_cache(
            ctx.redis_url,
            ks,
            cluster=ctx.cluster,
            ttl=ctx.result_ttl,
            lease_seconds=self.lease_seconds,
            holder_prefix=holder,
            reuse=self.reuse,
        )
        self.judge = ChatJudge(
            base_url=self.base_url,
            api_key=self.api_key,
            model=self.model,
            limiter=limiter,
            cache=cache,
            stats=ctx.judge_stats,
            timeout=self.timeout,
            estimated_tokens_per_request=self.estimated_tokens,
            retry=self.retry,
            max_answer_bytes=self.max_answer_bytes,
        )
        await self.judge.setup()
        logger.info(
            "genrm: judge %s at %s, scores in %s (from %s; %s) (rpm=%s tpm=%s concurrent=%s, %s, answers kept %s)",
            self.model,
            self.base_url,
            self.range,
            self.range_source,
            "clamped" if self.range.clamp else "outside it: an error",
            self.limits["max_rpm"],
            self.limits["max_tpm"],
            self.limits["max_concurrent"],
            "fleet-wide" if ctx.redis_url else "this process only",
            f"{ctx.result_ttl:g}s" if self.reuse else "never",
        )

    async def close(self) -> None:
        judge, self.judge = self.judge, None
        if judge is not None:
            await judge.close()
            await judge.limiter.close()
            await judge.cache.close()

    # -- scoring ---------------------------------------------------------------------
    async def run_single(self, data: TensorDict) -> dict[str, Any] | list[dict[str, Any]]:
        if self.judge is None:
            await self.setup()
        n = data.batch_size[0]
        if not self.per_turn:
            return await self.judge_output(data, n - 1)
        return list(await asyncio.gather(*(self.judge_output(data, i) for i in range(n))))

    async def judge_output(self, data: TensorDict, index: int) -> dict[str, Any]:
        """Ask the judge about output ``index`` of the trajectory ``data``; one result."""
        assert self.judge is not None
        text, image_urls = self.prompt_for(data, index)
        body = self.request_body(text, image_urls)
        try:
            answer = await self.judge.complete(body)
        except JudgeUnavailable as exc:
            if not (self.structured and not self.structured_required and _refuses_structured(exc)):
                raise
            logger.warning(
                "genrm: %s does not take response_format (%s); asking for JSON in plain text from now on",
                self.base_url,
                exc.server_message,
            )
            self.structured = False
            body = self.request_body(text, image_urls)
            answer = await self.judge.complete(body)
        note_judged(index, request_digest(body), answer.to_json())  # provenance and the ledger
        return self.result_of(answer)

    def request_body(self, text: str, image_urls: list[str]) -> dict[str, Any]:
        """The chat-completions request body for one rendered prompt."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": chat_messages(self.system_prompt, text, image_urls),
            "temperature": self.temperature,
        }
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        if self.n != 1:
            body["n"] = self.n
        response_format = self.parser.response_format() if self.structured else None
        if response_format is not None:
            body["response_format"] = response_format
        body.update(self.extra_body)
        return body

    def prompt_for(self, data: TensorDict, index: int) -> tuple[str, list[str]]:
        """The rendered prompt about output ``index``, and its images as data URLs."""
        from rewardq.reward.rows import non_tensor, valid_prompt_ids

        row = data[index : index + 1]
        used = self.template.used
        values: dict[str, Any] = {"turn": index, "format_instructions": self.parser.format_instructions()}
        if "response" in used:
            values["response"] = self.decode_response(row)
        if used & {"ground_truth", "question", "data_source", "extra_info"}:
            reward_model = non_tensor(row, "reward_model") or {}
            values["ground_truth"] = reward_model.get("ground_truth", "") if isinstance(reward_model, dict) else ""
            values["data_source"] = non_tensor(row, "data_source", "")
            values["extra_info"] = non_tensor(row, "extra_info") or {}
        if "question" in used:
            first = data[0:1]
            values["question"] = question_from(
                non_tensor(row, "raw_prompt"),
                values["extra_info"],
                lambda: self.require_tokenizer().decode(valid_prompt_ids(first), skip_special_tokens=True),
            )
        if "trajectory" in used:
            values["trajectory"] = "\n\n".join(
                f"[output {i}]\n{self.decode_response(data[i : i + 1])}" for i in range(index + 1)
            )
        urls = [img.data_url() for img in images_of(non_tensor(row, "multi_modal_data"))] if self.send_images else []
        return self.template.render(values), urls

    def result_of(self, answer: JudgeAnswer) -> dict[str, Any]:
        """Score and extra info of one answer (its ``n`` choices combined). Any choice's score outside
        ``score_range`` makes the whole answer an error (:class:`ScoreOutOfRange`) unless clamped."""
        scores: list[float] = []
        reasons: list[str] = []
        clamped = 0
        for content in answer.contents:
            parsed = self.parser.parse(content)
            if isinstance(parsed, Unparsed):
                reasons.append(parsed.reason)
                if self.unparsed_score is not None:
                    scores.append(self.unparsed_score)
            else:
                score, moved = self.range.check(parsed, content)
                scores.append(score)
                clamped += moved
        if not scores:
            first = answer.contents[0] if answer.contents else ""
            raise ScoringError(
                f"the judge's answer has no readable score ({reasons[0] if reasons else 'no choices'}); it began "
                f"{first[:200]!r}. Fix score_parser / the prompt, or set unparsed_score to score such answers"
            )
        info: dict[str, Any] = {
            "acc": combine_scores(scores, self.combine),
            "judge_prompt_tokens": answer.prompt_tokens,
            "judge_completion_tokens": answer.completion_tokens,
            "judge_cached": answer.cached,
            "judge_votes": len(answer.contents) - len(reasons),
            "judge_answer": (answer.contents[0] if answer.contents else "")[:_ANSWER_CHARS],
        }
        if clamped:
            info["judge_clamped"] = clamped
        return {"reward_score": info["acc"], "reward_extra_info": info}

    def provenance(self, data_source: object) -> dict[str, Any]:
        """The judge: model, digest of the prompt template and system prompt, sampling parameters."""
        return {
            "scorer": f"judge:{self.model}",
            "judge_model": self.model,
            "judge_template": template_digest(self.template.text, self.system_prompt),
            "judge_sampling": {
                "temperature": self.temperature,
                "max_tokens": self.max_tokens,
                "n": self.n,
                "combine": self.combine,
                "parser": type(self.parser).__name__,
                "score_range": [self.range.lo, self.range.hi],
                "clamp_score": self.range.clamp,
                "extra_body": without_credentials(self.extra_body),  # a header's key is not kept
            },
        }

    def stats(self) -> dict[str, Any]:
        """The limiter's wait counters for metrics (``{kind: {"waits", "wait_seconds"}}``)."""
        return self.judge.limiter.stats() if self.judge is not None else {}


def combine_scores(scores: list[float], how: str) -> float:
    """``mean``, or ``majority``: the most frequent score (a tie: the mean of the tied scores)."""
    if how == "mean":
        return sum(scores) / len(scores)
    counts = Counter(scores)
    top = max(counts.values())
    tied = [s for s, c in counts.items() if c == top]
    return sum(tied) / len(tied)


def _choice_scores(choices: object) -> list[float] | None:
    """The scores ``choices`` allow (checked by the parser; None when there are none or they are malformed)."""
    values = list(choices.values()) if isinstance(choices, dict) else choices
    if not isinstance(values, (list, tuple)) or not values:
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return None
    return [float(v) for v in values]


def _refuses_structured(exc: JudgeUnavailable) -> bool:
    return exc.status in (400, 422) and any(w in exc.server_message.lower() for w in _STRUCTURED_REFUSALS)
