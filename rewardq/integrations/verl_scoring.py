"""The scoring step of a verl agent loop, done on the rewardq fleet; no verl import here.

:class:`TrajectoryScorer` is what :class:`rewardq.integrations.verl.RewardqAgentLoopWorker`
runs in ``_compute_score(outputs, kwargs)``: push the trajectory, wait for its rewards, and
leave the outputs as verl's reward loop leaves them. It needs only the producer side of rewardq
(redis, msgpack, numpy), so it runs in verl's rollout processes without torch extras.

Settings (:class:`VerlAdapterSettings`), lowest precedence first: defaults, the verl config's
``rewardq`` or ``reward.rewardq`` block, then the environment:

=========================  ==========================  ===========================================
variable                   config key                  meaning
=========================  ==========================  ===========================================
``REWARDQ_REDIS_URL``      ``redis_url``               where the workers are (rediss://, cluster)
``REWARDQ_NAMESPACE``      ``namespace``               the workers' namespace
``REWARDQ_CLUSTER``        ``cluster``                 the URL is a Redis Cluster
``REWARDQ_VERL_TIMEOUT``   ``verl_timeout``            seconds to wait for one trajectory's rewards
``REWARDQ_VERL_ON_ERROR``  ``verl_on_error``           ``zero`` (default) or ``raise``
=========================  ==========================  ===========================================
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack
import numpy as np

from rewardq.config import AdapterSettings
from rewardq.errors import ConfigError, RecordError, RewardTimeout, ScoringError
from rewardq.queue.codec import plain_value
from rewardq.queue.results import RewardResult

logger = logging.getLogger("rewardq.verl")

#: What an error result leaves in ``reward_extra_info``: only keys every ok result of the default
#: scorers has, so verl's ``_postprocess`` (which indexes every row with row 0's keys) never fails.
ERROR_EXTRA_INFO: dict[str, Any] = {"acc": 0.0}
#: Dataset columns never pushed: multimodal inputs are out of scope for the scorers.
SKIPPED_COLUMNS = frozenset({"multi_modal_data", "multi_modal_inputs"})


#: The adapter's settings, declared with the worker's in :mod:`rewardq.config` (the module table).
VerlAdapterSettings = AdapterSettings


def settings_for(config: Any, env: Mapping[str, str] | None = None) -> VerlAdapterSettings:
    """The adapter's settings for a verl config (an OmegaConf ``DictConfig``, a dict or None)."""
    block: dict[str, Any] = {}
    for path in ("rewardq", "reward.rewardq"):
        found = _select(config, path)
        if found is not None:
            if not isinstance(found, Mapping):
                raise ConfigError(f"the verl config's {path} must be a mapping of rewardq settings, got {found!r:.80}")
            block.update(found)
    return VerlAdapterSettings.load(block, os.environ if env is None else env)


def _select(config: Any, path: str) -> Any:
    node = config
    for part in path.split("."):
        if node is None:
            return None
        try:
            node = node.get(part) if hasattr(node, "get") else None
        except Exception:  # noqa: BLE001 - an OmegaConf node that cannot resolve is "not set" here
            return None
    if node is not None and hasattr(node, "_get_node"):  # an OmegaConf container: plain dict, resolved
        from omegaconf import OmegaConf

        node = OmegaConf.to_container(node, resolve=True)
    return node


def session_id_for(kwargs: Mapping[str, Any]) -> str:
    """A session id unique among the ``rollout.n`` samples of one uid, and across retries.

    verl's TransferQueue path passes the sample's index as ``session_id``; it is kept as a
    readable prefix. A random part is always added: a uid that comes back (a re-run group, a
    dataset-provided uid) must never find the previous run's rewards under the same keys.
    """
    given = kwargs.get("session_id")
    tail = uuid.uuid4().hex[:12]
    return f"{_plain_or_self(given)}.{tail}" if given is not None else tail


def _encodable(value: Any) -> bool:
    try:
        msgpack.packb(value, default=plain_value, use_bin_type=True)
    except (TypeError, ValueError, OverflowError):
        return False
    return True


def sample_columns(kwargs: Mapping[str, Any], strict: bool = False) -> dict[str, Any]:
    """The dataset row as the sample every output carries (verl's naive manager sees all columns).

    With ``strict``, columns whose values cannot go over the wire (images, arbitrary objects)
    are left out; the default scorers read only ``data_source``, ``reward_model``,
    ``extra_info`` and ``raw_prompt``.
    """
    sample = {str(k): v for k, v in kwargs.items() if k not in SKIPPED_COLUMNS}
    if strict:
        sample = {k: v for k, v in sample.items() if _encodable(v)}
    return sample


def wire_output(output: Any) -> dict[str, Any]:
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
    }


class TrajectoryScorer:
    """Scores verl agent-loop outputs on the rewardq fleet (one instance per agent-loop worker).

    The Redis client is created on first use, on the event loop that uses it (a Ray actor's
    loop, or each ``asyncio.run`` of a test).
    """

    def __init__(self, settings: VerlAdapterSettings) -> None:
        self.settings = settings
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def client(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            from rewardq.producers.aio import AsyncRewardClient

            # an agent-loop worker may put thousands of trajectories at once from a busy process: a
            # put waiting for a free connection of the (single-Redis, blocking) pool waits as long as
            # it would wait for its rewards, not the pool's 30 s (a 2,048-trajectory burst on a
            # loaded 2-core machine failed with "No connection available" after them)
            pool = {} if self.settings.cluster else {"pool_timeout": self.settings.timeout}
            self._client = AsyncRewardClient.from_url(
                self.settings.redis_url, namespace=self.settings.namespace, cluster=self.settings.cluster, **pool
            )
            self._loop = loop
        return self._client

    async def aclose(self) -> None:
        if self._client is not None and self._loop is asyncio.get_running_loop():
            await self._client.aclose()
        self._client = self._loop = None

    async def score(self, outputs: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        """Push one trajectory, wait for its rewards, and write them onto ``outputs``.

        A final output that already has a ``reward_score`` (scored inside the agent loop) is
        left alone and nothing is pushed, as verl does. Failures follow ``on_error``; an
        unreachable Redis always raises (a run must not train on rewards nobody computed).
        """
        if not outputs or outputs[-1].reward_score is not None:
            return
        started = time.perf_counter()
        uid = str(_plain_or_self(kwargs.get("uid")) or uuid.uuid4().hex)
        session_id = session_id_for(kwargs)
        try:
            keys, results = await self._push_and_wait(uid, session_id, outputs, kwargs)
        except (RewardTimeout, RecordError) as exc:
            what = "timed out" if isinstance(exc, RewardTimeout) else "could not be sent"
            self._fail(outputs[-1], f"{uid}_{session_id}", f"rewardq: the trajectory {what}: {exc}")
        else:
            apply_results(outputs, keys, results, self._fail)
        outputs[-1].metrics.compute_score = time.perf_counter() - started

    async def _push_and_wait(
        self, uid: str, session_id: str, outputs: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> tuple[list[str], dict[str, RewardResult]]:
        """Push the trajectory and wait for its results (one read of them: the waiter listens
        before the put). A record refused before anything was sent for holding values msgpack
        cannot carry is sent again without them."""
        client = await self.client()
        timeout = self.settings.timeout
        try:
            # the producer reads an AgentLoopOutput's fields itself (rewardq.producers.core.OutputLike)
            return await client.put_trajectory_and_wait(uid, session_id, outputs, sample_columns(kwargs), timeout)
        except RecordError as exc:
            if "sample" not in exc.field and "extra_fields" not in exc.field:
                raise
            logger.warning("rewardq: leaving out values that cannot be sent (%s)", exc)
            strict = [wire_output(o) for o in outputs]
            return await client.put_trajectory_and_wait(
                uid, session_id, strict, sample_columns(kwargs, strict=True), timeout
            )

    def _fail(self, output: Any, where: str, message: str) -> None:
        if self.settings.on_error == "raise":
            raise ScoringError(f"{where}: {message} (REWARDQ_VERL_ON_ERROR=raise)")
        logger.warning("rewardq: %s scored 0.0: %s", where, message)
        output.reward_score = 0.0
        output.extra_fields["reward_extra_info"] = dict(ERROR_EXTRA_INFO)
        output.extra_fields["reward_error"] = message


def _plain_or_self(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def apply_results(outputs: Sequence[Any], keys: Sequence[str], results: Mapping[str, RewardResult], fail: Any) -> None:
    """Write results onto outputs as verl's reward loop does: the final output gets
    ``reward_score`` and ``extra_fields["reward_extra_info"]``; the others get theirs only when
    the manager gave per-output rewards. ``fail(output, key, message)`` handles error results."""
    final = results[keys[-1]]
    per_output = any(not _same(results[k], final) for k in keys[:-1])
    pairs = list(zip(outputs, keys)) if per_output else [(outputs[-1], keys[-1])]
    for output, key in pairs:
        result = results[key]
        if result.ok and result.reward_score is not None:
            output.reward_score = float(result.reward_score)
            output.extra_fields["reward_extra_info"] = dict(result.reward_extra_info)
            output.extra_fields["reward_error"] = None  # every row has the key: verl concatenates workers' batches
        else:
            fail(output, key, result.error or "scored as an error without a message")


def _same(a: RewardResult, b: RewardResult) -> bool:
    return (a.status, a.reward_score, a.reward_extra_info, a.error) == (
        b.status,
        b.reward_score,
        b.reward_extra_info,
        b.error,
    )


def align_reward_extra_info(extra_fields: Sequence[dict], scores: Sequence[float | None]) -> None:
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
                info[k] = float(score) if k == "score" and score is not None else _empty_like(example)
        fields["reward_extra_info"] = {k: info[k] for k in keys}


def _empty_like(value: Any) -> Any:
    for typ in (bool, int, float, str):
        if isinstance(value, typ):
            return typ()
    return None
