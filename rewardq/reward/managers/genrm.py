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
  (:mod:`rewardq.reward.judge.cache`).
* **Across runs, opt in.** ``judge_cache=shared`` keeps answers outside the namespace, keyed by the
  request and by how its answer is read, for ``judge_cache_ttl``, at most
  ``judge_cache_max_entries`` per model (:mod:`rewardq.reward.judge.shared`): a second run with the
  same judge configuration pays nothing.
* **Deterministic by default.** ``temperature=0`` and ``seed=0`` (docs/judges.md says what still varies).
* **Fleet-wide limits.** ``max_rpm``, ``max_tpm`` and ``max_concurrent`` hold across every worker
  (:mod:`rewardq.reward.ratelimit`); ``max_tpm`` is charged with the tokens the server reports.
* **Failures.** A request is sent once. No answer, 408, 429 and 5xx are ``transient`` failures,
  which the worker retries in place (honouring ``Retry-After``) until its ``retry_for`` runs out;
  401, 403 and 404 are ``config`` failures; an answer without a readable score is a ``scorer``
  failure. Each is an error result naming why, never a zero (unless ``unparsed_score`` says what
  an unreadable answer scores).
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
    temperature=0.0  seed=0  max_tokens=1024  n=1  combine=mean|majority  extra_body={}
    per_turn=false  images=true  cache=true  judge_cache=run|shared  judge_cache_ttl=30 days
    judge_cache_max_entries=100000
    max_rpm  max_tpm  max_concurrent=64  estimated_tokens_per_request=2000  limiter_name=genrm
    lease_seconds=30  timeout=120

``max_retries``, ``backoff_base``, ``backoff_cap`` and ``max_retry_wait`` are accepted and ignored,
with a warning (:func:`~rewardq.reward.http.warn_retired_options`): the worker's ``retry_for`` rules.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rewardq.errors import ConfigError, ScoringError
from rewardq.queue.images import images_of
from rewardq.queue.keys import Keyspace
from rewardq.reward.base import ManagerContext, RewardManager, ScoreFn
from rewardq.reward.http import warn_retired_options
from rewardq.reward.judge.cache import open_judge_cache
from rewardq.reward.judge.client import ChatJudge, JudgeAnswer, JudgeUnavailable, request_digest
from rewardq.reward.judge.parsing import ScoreParser, Unparsed, Verdict, build_parser
from rewardq.reward.judge.prompt import DEFAULT_TEMPLATE, PromptTemplate, chat_messages, question_from
from rewardq.reward.judge.scores import resolve_range
from rewardq.reward.judge.shared import SharedSpace, verdict_digest
from rewardq.reward.managers.genrm_options import DEFAULT_API_KEY_ENV, GenRMOptions
from rewardq.reward.provenance import template_digest
from rewardq.reward.ratelimit import open_limiter
from rewardq.reward.registry import register
from rewardq.reward.rows import non_tensor, valid_prompt_ids
from rewardq.reward.scoring_fingerprint import without_credentials
from rewardq.reward.trace import note_judged

if TYPE_CHECKING:
    from tensordict import TensorDict

    from rewardq.reward.tokenizer import Tokenizer

logger = logging.getLogger("rewardq.reward.genrm")

#: What a refusal of ``response_format`` says, in the servers' words (vLLM, SGLang, TGI, OpenAI).
_STRUCTURED_REFUSALS = ("response_format", "json_schema", "guided", "structured", "grammar")
_ANSWER_CHARS = 1000


@register("genrm")
class GenRMRewardManager(RewardManager):
    """Scores trajectories with an LLM judge; see the module docstring.

    Args:
        tokenizer: the policy tokenizer (decodes responses and, when needed, the prompt).
        compute_score: unused (the judge replaces the scoring function).
        context: the worker's context (Redis, namespace, result_ttl, judge counters).
        options: :class:`GenRMOptions` (the worker builds them from ``manager_options``), or
            ``**given``: the same options as keywords, checked as the worker checks them. They are:
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
        seed: the ``seed`` of every request (default 0: deterministic judging where the server
            honours it, with ``temperature`` 0); None sends none. ``extra_body`` may override it.
        combine: ``mean`` of the ``n`` scores, or ``majority`` (the most frequent; a tie is the
            mean of the tied scores).
        extra_body: more fields for the request body (``seed``, ``top_p``, vLLM's
            ``chat_template_kwargs``, ...).
        per_turn: judge every output (one reward each) instead of the final one.
        images: send the outputs' images to the judge (a vision-language model).
        cache: reuse answers across re-scoring and workers (billed once); false sends every request.
        judge_cache: ``run`` keeps answers in the run's namespace for ``result_ttl``; ``shared`` keeps
            them across runs (namespaces) on the same Redis, keyed by everything that decides the
            verdict (:mod:`rewardq.reward.judge.shared`).
        judge_cache_ttl, judge_cache_max_entries: how long a shared answer is kept, and how many
            per judge model (the least recently used go first).
        max_rpm, max_tpm, max_concurrent, estimated_tokens_per_request, limiter_name,
            lease_seconds: the fleet-wide limits (see :mod:`rewardq.reward.ratelimit`); ``lease_seconds``
            also bounds how long a dead worker's claim on a request holds others back.
        timeout: seconds one HTTP request may take.
        max_retries, backoff_base, backoff_cap, max_retry_wait: ignored, with a warning (module doc).
    """

    Options = GenRMOptions

    def __init__(
        self,
        tokenizer: Tokenizer,
        compute_score: ScoreFn | None = None,
        *,
        context: ManagerContext | None = None,
        options: GenRMOptions | None = None,
        **given: object,
    ) -> None:
        super().__init__(tokenizer, compute_score, context=context)
        o = options if options is not None else GenRMOptions.from_mapping(given)
        self.options = o
        self.base_url, self.model, self.api_key = _endpoint(o)
        self._read_rubric(o)
        if o.unparsed_score is not None and not self.range.contains(o.unparsed_score):
            raise ConfigError(
                f"manager 'genrm': unparsed_score={o.unparsed_score:g} is outside score_range {self.range}"
            )
        self.unparsed_score = o.unparsed_score
        self.temperature = float(o.temperature)
        self.seed = o.seed
        self.max_tokens = o.max_tokens
        self.n = o.n
        self.combine = o.combine
        self.extra_body = dict(o.extra_body or {})
        self.per_turn = o.per_turn
        self.send_images = o.images
        self.reuse = o.cache
        self.judge_cache = o.judge_cache
        self.shared_ttl = float(o.judge_cache_ttl)
        self.shared_entries = o.judge_cache_max_entries
        #: everything beside the request body that decides the verdict (part of a shared key)
        self.reading = {
            "score_parser": o.score_parser,
            "score_regex": o.score_regex,
            "score_field": o.score_field,
            "choices": o.choices,
            "score_marker": o.score_marker,
            "score_range": [self.range.lo, self.range.hi],
            "clamp_score": self.range.clamp,
            "unparsed_score": o.unparsed_score,
            "combine": o.combine,
            "max_answer_bytes": o.max_answer_bytes,
        }
        warn_retired_options(
            "genrm",
            {
                "max_retries": o.max_retries,
                "backoff_base": o.backoff_base,
                "backoff_cap": o.backoff_cap,
                "max_retry_wait": o.max_retry_wait,
            },
        )
        self.max_answer_bytes = o.max_answer_bytes
        if compute_score is not None:
            logger.warning("genrm: the judge scores every trajectory; the configured reward function is unused")
        self.limits = {"max_rpm": o.max_rpm, "max_tpm": o.max_tpm, "max_concurrent": o.max_concurrent}
        self.estimated_tokens = float(o.estimated_tokens_per_request)
        self.limiter_name = o.limiter_name
        self.lease_seconds = float(o.lease_seconds)
        self.timeout = float(o.timeout)
        self.judge: ChatJudge | None = None

    def _read_rubric(self, o: GenRMOptions) -> None:
        """The prompt, the system message, and how a score is read out of an answer and bounded."""
        template = o.prompt_template
        if o.prompt_template_path is not None:
            try:
                template = Path(os.path.expanduser(o.prompt_template_path)).read_text()
            except OSError as exc:
                raise ConfigError(f"manager 'genrm': cannot read prompt_template_path ({exc})") from None
        self.template = PromptTemplate(template if template is not None else DEFAULT_TEMPLATE)
        self.system_prompt = o.system_prompt
        self.structured = o.structured_output == "true" or (o.structured_output == "auto" and o.score_parser != "regex")
        self.structured_required = o.structured_output == "true"
        self.range, self.range_source = resolve_range(
            o.score_range, choices=_choice_scores(o.choices), rubric=self.template.text, clamp=o.clamp_score
        )
        self.parser: ScoreParser = build_parser(
            o.score_parser,
            score_regex=o.score_regex,
            score_field=o.score_field,
            choices=o.choices,
            structured=self.structured,
            verdict=Verdict(o.score_marker, self.range.words()),
        )

    def __repr__(self) -> str:
        return f"GenRMRewardManager(base_url={self.base_url!r}, model={self.model!r})"

    # -- lifecycle -------------------------------------------------------------------
    async def setup(self) -> None:
        """Open the fleet limiter, the answer cache and the HTTP session."""
        if self.judge is not None:
            return

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
        shared = None
        if self.judge_cache == "shared":
            shared = SharedSpace(self.model, verdict_digest(self.reading), self.shared_ttl, self.shared_entries)
        cache = open_judge_cache(
            ctx.redis_url,
            ks,
            cluster=ctx.cluster,
            shared=shared,
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
            _kept(self.reuse, self.judge_cache, ctx.result_ttl, self.shared_ttl),
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

    async def judge_output(self, data: TensorDict, index: int) -> dict[str, object]:
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
        if self.seed is not None:
            body["seed"] = self.seed
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
                "seed": self.seed,
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


def _kept(reuse: bool, judge_cache: str, result_ttl: float, shared_ttl: float) -> str:
    if not reuse:
        return "never"
    if judge_cache == "shared":
        return f"{shared_ttl:g}s across runs (judge_cache=shared)"
    return f"{result_ttl:g}s"


def combine_scores(scores: list[float], how: str) -> float:
    """``mean``, or ``majority``: the most frequent score (a tie: the mean of the tied scores)."""
    if how == "mean":
        return sum(scores) / len(scores)
    counts = Counter(scores)
    top = max(counts.values())
    tied = [s for s, c in counts.items() if c == top]
    return sum(tied) / len(tied)


def _endpoint(o: GenRMOptions) -> tuple[str, str, str | None]:
    """The judge's API root, its model, and the API key from ``api_key_env`` (None: none sent)."""
    if not o.base_url or not o.base_url.startswith(("http://", "https://")):
        raise ConfigError(
            "manager 'genrm' needs base_url=http://HOST:PORT/v1, the judge's OpenAI-compatible API root "
            f"(requests go to base_url + '/chat/completions'), got {o.base_url!r}"
        )
    if not o.model:
        raise ConfigError(f"manager 'genrm' needs model=<the served model's name>, got {o.model!r}")
    if o.api_key_env != DEFAULT_API_KEY_ENV and not os.environ.get(o.api_key_env):
        raise ConfigError(
            f"manager 'genrm': api_key_env={o.api_key_env} names an environment variable that is not set; "
            "export it where the worker runs (the key is never taken from the command line or a config file)"
        )
    return o.base_url, o.model, os.environ.get(o.api_key_env) or None


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
