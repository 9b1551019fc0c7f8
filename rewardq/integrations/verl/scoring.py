"""The scoring step of a verl agent loop or reward loop, done on the rewardq fleet; no verl import here.

:class:`VerlScorer` is what both of rewardq's verl entry points run:

* :class:`rewardq.integrations.verl.RewardqAgentLoopWorker` in ``_compute_score(outputs, kwargs)``
  (:meth:`VerlScorer.score`): push the trajectory, wait for its rewards, and leave the
  outputs as verl's reward loop leaves them;
* :class:`rewardq.integrations.verl.RewardqRewardManager` in ``run_single(data)``
  (:meth:`VerlScorer.score_trajectory`): the same, returning what verl's reward managers
  return (``{"reward_score", "reward_extra_info"}``).

Both share the error policy (``verl_on_error``), the timeout (``verl_timeout``), the failure budget
(:mod:`rewardq.integrations.verl.budget`), the trainer's tokenizer fingerprint sent with every
record, and one place where they first connect (:meth:`VerlScorer.client`). An unreachable
Redis raises :class:`~rewardq.errors.RedisUnavailable` naming the URL (password hidden) and the
setting that set it. Settings: :mod:`rewardq.integrations.verl.settings`.

It needs only the producer side of rewardq (redis, msgpack, numpy), so it runs in verl's rollout
processes without torch extras.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np

import rewardq.queue.connection as rx
from rewardq.adapter_settings import AdapterSettings
from rewardq.errors import RecordError, RedisUnavailable, RewardqError, RewardTimeout, RunStopped, SampleMasked
from rewardq.integrations.verl.budget import CANCELLED, LABELS, UNKNOWN, Failure, FleetBudget, current_run
from rewardq.integrations.verl.media import has_media, wire_media, wire_sample_media
from rewardq.integrations.verl.policy import V1, hook_on_v1_note, masking_refusal, trainer_kind
from rewardq.integrations.verl.settings import settings_for, where
from rewardq.integrations.verl.stop import stop_run
from rewardq.queue.codec import plain_value
from rewardq.queue.results import RewardResult
from rewardq.queue.states import FailureKind

if TYPE_CHECKING:
    from rewardq.producers.aio import AsyncRewardClient
    from rewardq.queue.failure_budget import OutcomeWindow
    from rewardq.reward.tokenizer import Tokenizer

__all__ = [
    "ERROR_EXTRA_INFO",
    "Failure",
    "VerlScorer",
    "align_reward_extra_info",
    "apply_results",
    "sample_columns",
    "session_id_for",
    "settings_for",
]

logger = logging.getLogger("rewardq.verl")

#: What an error result leaves in ``reward_extra_info``: only keys every ok result of the default
#: scorers has, so verl's ``_postprocess`` (which indexes every row with row 0's keys) never fails.
ERROR_EXTRA_INFO: dict[str, Any] = {"acc": 0.0}
#: Dataset columns never pushed: the processor's tensors (``pixel_values``, ...); the images themselves
#: go as ``multi_modal_data`` (:mod:`rewardq.integrations.verl.media`).
SKIPPED_COLUMNS = frozenset({"multi_modal_inputs"})
#: What a ``config`` failure's stop says to do: it is the fleet's configuration, not the sample.
CONFIG_FIX = (
    "This is a `config` failure: the fleet cannot score it as configured, so the run stops at the first "
    "trajectory that meets it instead of training without it. Fix the workers' configuration (what the "
    "message names), restart them, and restart the run"
)


def session_id_for(kwargs: Mapping[str, object]) -> str:
    """A session id unique among the ``rollout.n`` samples of one uid, and across retries.

    verl's TransferQueue path passes the sample's index as ``session_id``; it is kept as a
    readable prefix. A random part is always added: a uid that comes back (a re-run group, a
    dataset-provided uid) must never find the previous run's rewards under the same keys.
    """
    given = kwargs.get("session_id")
    tail = secrets.token_hex(6)  # 12 random hex digits, as uuid4().hex[:12] gave, at a third of its cost
    return f"{_plain_or_self(given)}.{tail}" if given is not None else tail


def _encodable(value: object) -> bool:
    try:
        msgpack.packb(value, default=plain_value, use_bin_type=True)
    except (TypeError, ValueError, OverflowError):
        return False
    return True


def sample_columns(kwargs: Mapping[str, object], strict: bool = False) -> dict[str, object]:
    """The dataset row as the sample every output carries (verl's naive manager sees all columns).

    Its images go as the record carries them (:func:`~rewardq.integrations.verl.media.wire_sample_media`).
    With ``strict``, other columns whose values cannot go over the wire (arbitrary objects) are
    left out; the default scorers read only ``data_source``, ``reward_model``, ``extra_info`` and
    ``raw_prompt``.
    """
    sample = wire_sample_media({str(k): v for k, v in kwargs.items() if k not in SKIPPED_COLUMNS})
    return encodable_only(sample) if strict else sample


def encodable_only(sample: Mapping[str, object]) -> dict[str, object]:
    """The columns of ``sample`` whose values msgpack can carry (``multi_modal_data`` goes as the
    record's images, :mod:`rewardq.queue.images`, not as plain msgpack)."""
    return {k: v for k, v in sample.items() if k == "multi_modal_data" or _encodable(v)}


def wire_output(output: Any) -> dict[str, object]:
    """The fields of an ``AgentLoopOutput`` rewardq pushes, with the extra fields msgpack cannot carry left out."""
    extra = getattr(output, "extra_fields", None) or {}
    return {
        "prompt_ids": output.prompt_ids,
        "response_ids": output.response_ids,
        "response_mask": getattr(output, "response_mask", None),
        "response_logprobs": getattr(output, "response_logprobs", None),
        "num_turns": getattr(output, "num_turns", None),
        "extra_fields": {str(k): v for k, v in extra.items() if _encodable(v)},
        "reward_score": getattr(output, "reward_score", None),
        "multi_modal_data": wire_media(getattr(output, "multi_modal_data", None)),
    }


class VerlScorer:
    """Scores verl trajectories on the rewardq fleet (one instance per agent-loop worker or reward-loop actor).

    Args:
        settings: where the workers are, the error policy, the timeout and the failure budget.
        tokenizer: the trainer's tokenizer that made the ids; its fingerprint
            (:func:`rewardq.reward.tokenizer_fingerprint.tokenizer_fingerprint`, computed once per process)
            goes with every record, so a worker with another vocabulary answers with an error.
        config: the trainer's config (verl's ``self.config``): which trainer runs, hence how a
            failed sample is masked and how the run is stopped (:mod:`rewardq.integrations.verl.policy`).

    Every trajectory's outcome goes to the run's failure budget in Redis
    (:mod:`rewardq.integrations.verl.budget`). A failure then follows, in this order: a ``config``
    failure stops the run; ``on_error=raise`` stops the run; ``zero`` scores 0.0; ``mask`` leaves the
    sample out of training (the reward NaN on DataProto trainers, :class:`~rewardq.errors.SampleMasked`
    on V1). A configuration that cannot mask stops the run at its first trajectory (at its first
    failed one without a config). Stopping goes through :func:`~rewardq.integrations.verl.stop.stop_run`.

    The Redis client is created on first use, on the event loop that uses it (a Ray actor's
    loop, or each ``asyncio.run`` of a test).
    """

    def __init__(
        self,
        settings: AdapterSettings,
        tokenizer: Tokenizer | None = None,
        config: object = None,
        *,
        hook: bool = False,
    ) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        self.config = config
        self.on_v1 = trainer_kind(config) == V1
        #: on V1 with ``mask``: a prompt's scored sessions are stored only if at least two are
        #: (:mod:`rewardq.integrations.verl.groups`)
        self.drops_lone_sessions = self.on_v1 and settings.on_error == "mask"
        #: said once, at the first masked sample: what masking through the hook costs on V1
        self.hook_note = hook_on_v1_note(config) if hook and self.on_v1 else None
        self.refusal = masking_refusal(settings, config)
        self.budget = FleetBudget(
            settings.max_error_rate,
            settings.error_window,
            settings_hint=f"{where(settings, 'max_error_rate')}; verl_error_window={settings.error_window} from "
            f"{where(settings, 'error_window')}",
        )
        self._client: AsyncRewardClient | None = None
        self._window: OutcomeWindow | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def client(self) -> AsyncRewardClient:
        """The producer client: the one place where the adapter and the hook first connect."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            from rewardq.producers.aio import AsyncRewardClient
            from rewardq.queue.failure_budget import OutcomeWindow
            from rewardq.queue.keys import Keyspace
            from rewardq.reward.tokenizer_fingerprint import tokenizer_fingerprint

            s = self.settings
            # an agent-loop worker may put thousands of trajectories at once from a busy process: a
            # put waiting for a free connection of the (single-Redis, blocking) pool waits as long as
            # it would wait for its rewards, not the pool's 30 s (a 2,048-trajectory burst on a
            # loaded 2-core machine failed with "No connection available" after them)
            pool = {} if s.cluster else {"pool_timeout": s.timeout}
            self._client = AsyncRewardClient.from_url(
                s.redis_url,
                namespace=s.namespace,
                cluster=s.cluster,
                tokenizer=tokenizer_fingerprint(self.tokenizer),
                **pool,
            )
            key = Keyspace(s.namespace).verl_budget(current_run())
            self._window = OutcomeWindow(self._client.r, key, LABELS)
            self._loop = loop
        return self._client

    async def aclose(self) -> None:
        if self._client is not None and self._loop is asyncio.get_running_loop():
            await self._client.aclose()
        self._client = self._window = self._loop = None

    async def score(self, outputs: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        """Push one trajectory of verl ``AgentLoopOutput`` s, wait for its rewards, and write them onto ``outputs``.

        A final output that already has a ``reward_score`` (scored inside the agent loop) is
        left alone and nothing is pushed, as verl does. A failed output gets 0.0 (``zero``) or NaN
        (``mask`` on a DataProto trainer), with ``extra_fields["reward_error"]`` and
        ``["reward_failure_kind"]``; every other outcome of the policy raises (class docstring).
        """
        if not outputs or outputs[-1].reward_score is not None:
            return
        started = time.perf_counter()
        uid, session_id = trajectory_names(kwargs)
        failed: list[tuple[Any, Failure]] = []

        def fail(output: object, key: str, failure: Failure) -> None:
            failed.append((output, Failure(f"{key}: {failure.message}", failure.kind)))

        keys, results, failure = await self._fetch(uid, session_id, outputs, sample_columns(kwargs))
        if results is None:
            fail(outputs[-1], f"{uid}_{session_id}", failure or Failure("no result"))
        else:
            apply_results(outputs, keys, results, fail)
        outputs[-1].metrics.compute_score = time.perf_counter() - started
        reward = await self.settle(failed[0][1] if failed else None)
        for output, why in failed:
            output.reward_score = reward
            output.extra_fields["reward_extra_info"] = dict(ERROR_EXTRA_INFO)
            output.extra_fields["reward_error"] = why.message
            output.extra_fields["reward_failure_kind"] = why.kind

    async def score_trajectory(
        self, uid: str, session_id: str, outputs: Sequence[object], sample: Mapping[str, object]
    ) -> tuple[RewardResult | None, Failure | None, float]:
        """Push one trajectory, wait, and return the final output's result, or the failure and the
        reward the policy gives it (0.0 or NaN; every other outcome raises): what the hook needs."""
        keys, results, failure = await self._fetch(uid, session_id, outputs, sample)
        final = None if results is None else results[keys[-1]]
        if final is not None and not (final.ok and final.reward_score is not None):
            failure = result_failure(final)
        if failure is not None:
            failure = Failure(f"{keys[-1] if keys else f'{uid}_{session_id}'}: {failure.message}", failure.kind)
        reward = await self.settle(failure)
        return (final if failure is None else None), failure, reward

    async def settle(self, failure: Failure | None) -> float:
        """Count one trajectory against the run's budget and apply the policy to its failure: the reward
        a failed sample gets (0.0 for ``zero``, NaN for ``mask``), or a raise (class docstring)."""
        if self.refusal is not None and (self.config is not None or failure is not None):
            await self._stop(RunStopped(self.refusal))
        assert self._window is not None  # made by client(), which _fetch called
        try:
            await self.budget.record(self._window, failure)
        except RunStopped as exc:
            await self._stop(exc)
        except (rx.ConnectionError, rx.TimeoutError, OSError) as exc:
            await self._stop(self._unreachable(exc))
        if failure is None:
            return 0.0
        if failure.kind == CANCELLED:
            return self._left_out(failure)
        if failure.kind == FailureKind.CONFIG:
            await self._stop(RunStopped(f"rewardq: {failure.message}. {CONFIG_FIX}"))
        if self.settings.on_error == "raise":
            origin = where(self.settings, "on_error")
            await self._stop(RunStopped(f"rewardq: {failure.message} (verl_on_error=raise from {origin})"))
        if self.settings.on_error == "zero":
            logger.warning("rewardq: %s scored 0.0 (verl_on_error=zero): %s", failure.kind, failure.message)
            return 0.0
        logger.warning("rewardq: %s left out of training (verl_on_error=mask): %s", failure.kind, failure.message)
        if self.hook_note is not None:
            logger.warning("%s", self.hook_note)
            self.hook_note = None
        if self.on_v1:
            raise SampleMasked(f"rewardq: left out of training (verl_on_error=mask, {failure.kind}): {failure.message}")
        return math.nan

    def _left_out(self, failure: Failure) -> float:
        """A trajectory cancelled by its producer: never trained on, never a failure (not in the budget).
        Masked as a failed sample is (``SampleMasked`` on V1, NaN on a DataProto trainer with
        ``verl_on_error=mask``); a DataProto trainer that cannot mask gets 0.0, with a warning."""
        if self.on_v1:
            raise SampleMasked(f"rewardq: left out of training (cancelled): {failure.message}")
        if self.settings.on_error == "mask" and self.refusal is None:
            return math.nan
        logger.warning("rewardq: a cancelled trajectory scored 0.0 (only verl_on_error=mask leaves it out)")
        return 0.0

    async def drop_lone(self, uid: object, scored: int, n: int) -> None:
        """Leave a scored V1 session out of training with its group (``scored`` of its ``n`` sessions
        got a reward): counted for the step metrics, then :class:`~rewardq.errors.SampleMasked`."""
        assert self._window is not None  # made by client(), which scoring the session called
        try:
            await self._window.count_dropped(1)
        except (rx.ConnectionError, rx.TimeoutError, OSError):
            logger.warning("rewardq: could not count a dropped session of prompt %s for the step metrics", uid)
        raise SampleMasked(
            f"rewardq: left out of training with its group: {scored} of the {n} sessions of prompt {uid} got a "
            "reward, and verl's GRPO would train a lone session on its raw score (verl_on_error=mask)"
        )

    async def _stop(self, error: RewardqError) -> None:
        await stop_run(error, self.on_v1)

    async def _fetch(
        self, uid: str, session_id: str, outputs: Sequence[object], sample: Mapping[str, object]
    ) -> tuple[list[str], Mapping[str, RewardResult] | None, Failure | None]:
        """Push and wait: the keys, their results, or why there are none (a timeout, a record not sent)."""
        keys: list[str] = []
        try:
            keys, results = await self._push_and_wait(uid, session_id, outputs, sample)
            return keys, results, None
        except RewardTimeout as exc:
            return keys, None, Failure(f"rewardq: the trajectory timed out: {exc}", FailureKind.TRANSIENT.value)
        except RecordError as exc:
            return keys, None, Failure(f"rewardq: the trajectory could not be sent: {exc}", FailureKind.INPUT.value)
        except (rx.ConnectionError, rx.TimeoutError, OSError) as exc:
            await self._stop(self._unreachable(exc))
            raise AssertionError("unreachable") from exc  # _stop always raises

    def _unreachable(self, exc: BaseException) -> RedisUnavailable:
        from rewardq.queue.connection import redact_url

        s = self.settings
        # a put's error says what to check itself (rewardq.queue.put_errors): keep what happened, one advice
        happened = str(exc).partition(". Check ")[0]
        err = RedisUnavailable(
            f"rewardq: cannot reach the workers' Redis at {redact_url(s.redis_url)} "
            f"({type(exc).__name__}: {happened}); the URL comes from {where(s, 'redis_url')}. Check that this "
            "Redis runs and is reachable from this node, and that it is the one the `rewardq worker` fleet uses. "
            "No reward was computed for this trajectory"
        )
        err.retryable = True
        return err

    async def _push_and_wait(
        self, uid: str, session_id: str, outputs: Sequence[Any], sample: Mapping[str, Any]
    ) -> tuple[list[str], dict[str, RewardResult]]:
        """Push the trajectory and wait for its results (one read of them: the waiter listens
        before the put). A record refused before anything was sent for holding values msgpack
        cannot carry is sent again without them."""
        client = await self.client()
        timeout = self.settings.timeout
        try:
            # the producer reads an AgentLoopOutput's fields itself (rewardq.producers.core.OutputLike);
            # outputs with images go as wire_output gives them: images and video paths only
            pushed = [wire_output(o) for o in outputs] if has_media(outputs) else outputs
            return await client.put_trajectory_and_wait(uid, session_id, pushed, sample, timeout)
        except RecordError as exc:
            if "sample" not in exc.field and "extra_fields" not in exc.field:
                raise
            logger.warning("rewardq: leaving out values that cannot be sent (%s)", exc)
            strict = [wire_output(o) for o in outputs]
            return await client.put_trajectory_and_wait(uid, session_id, strict, encodable_only(sample), timeout)


def result_failure(result: RewardResult) -> Failure:
    """Why an error result got no reward, with the kind the worker gave it (``cancelled`` for a
    trajectory its producer cancelled: not a failure, never counted in the budget)."""
    if result.cancelled:
        return Failure("cancelled by its producer before it was scored", CANCELLED)
    kind = result.failure_kind.value if result.failure_kind is not None else UNKNOWN
    return Failure(result.error or "scored as an error without a message", kind)


def trajectory_names(columns: Mapping[str, object]) -> tuple[str, str]:
    """The uid (the dataset row's, shared by its ``rollout.n`` samples) and a fresh session id."""
    uid = str(_plain_or_self(columns.get("uid")) or secrets.token_hex(16))
    return uid, session_id_for(columns)


def _plain_or_self(value: object) -> object:
    return value.item() if isinstance(value, np.generic) else value


def apply_results(
    outputs: Sequence[Any],
    keys: Sequence[str],
    results: Mapping[str, RewardResult],
    fail: Callable[[Any, str, Failure], None],
) -> None:
    """Write results onto outputs as verl's reward loop does: the final output gets
    ``reward_score`` and ``extra_fields["reward_extra_info"]``; the others get theirs only when
    the manager gave per-output rewards. ``fail(output, key, failure)`` handles error results."""
    final = results[keys[-1]]
    per_output = any(not _same(results[k], final) for k in keys[:-1])
    pairs = list(zip(outputs, keys)) if per_output else [(outputs[-1], keys[-1])]
    for output, key in pairs:
        result = results[key]
        if result.ok and result.reward_score is not None:
            output.reward_score = float(result.reward_score)
            output.extra_fields["reward_extra_info"] = dict(result.reward_extra_info)
            output.extra_fields["reward_error"] = None  # every row has the key: verl concatenates workers' batches
            output.extra_fields["reward_failure_kind"] = None
        else:
            fail(output, key, result_failure(result))


def _same(a: RewardResult, b: RewardResult) -> bool:
    return (a.status, a.reward_score, a.reward_extra_info, a.error) == (
        b.status,
        b.reward_score,
        b.reward_extra_info,
        b.error,
    )


def align_reward_extra_info(extra_fields: Sequence[dict[str, Any]], scores: Sequence[float | None]) -> None:
    """Give every row's ``reward_extra_info`` the same keys in the same order, in place.

    verl's ``_postprocess`` reads the keys of row 0 and looks each up in every row, so rows
    with different keys (an error next to a DAPO result, two data sources) raise KeyError
    there. A missing ``score`` becomes the row's reward; any other missing key the empty value
    of its type in the rows that have it (0, 0.0, False, ""; None otherwise). The order is that
    of the first ok row (then keys only other rows have), so a batch with errors lists its keys
    as an all-ok batch of the same scorer does, and verl can concatenate the two.
    """
    infos = [dict(f.get("reward_extra_info") or {}) for f in extra_fields]
    ok_first = sorted(range(len(infos)), key=lambda i: extra_fields[i].get("reward_error") is not None)
    keys: dict[str, Any] = {}
    for i in ok_first:
        for k, v in infos[i].items():
            keys.setdefault(k, v)
    if all(list(info) == list(keys) for info in infos):
        return
    for fields, info, score in zip(extra_fields, infos, scores):
        for k, example in keys.items():
            if k not in info:
                info[k] = float(score) if k == "score" and score is not None else empty_like(example)
        fields["reward_extra_info"] = {k: info[k] for k in keys}


def empty_like(value: object) -> object:
    for typ in (bool, int, float, str):
        if isinstance(value, typ):
            return typ()
    return None
