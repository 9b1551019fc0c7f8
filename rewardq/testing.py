"""Test your reward manager or scoring function without Redis and without a worker process.

What dramatiq's ``StubBroker`` and rq's testing page give a task author, for rewardq: the very
steps a worker runs between reading a trajectory and writing its rewards, callable from a test
(``docs/testing.md`` walks through them).

* :func:`output` and :func:`make_batch`: the batch a worker hands ``run_single``, built from
  outputs as a producer pushes them (each one goes through the producer's encoder and the
  worker's decoder, so a bad field fails here as it would there);
* :class:`ManagerRunner` and :func:`score_trajectory`: a manager run on a trajectory as the worker
  runs it (``setup``, ``prepare_scoring``, ``run_single`` under ``score_timeout``, the checks of
  its answer, one :class:`~rewardq.queue.results.RewardResult` per output key, ``close``);
* :func:`worker_manager`: the manager ``rewardq worker --manager ... --reward-fn ...`` builds, by the
  worker's own factory (the tokenizer, the scoring function loaded by its spec, its options checked);
* :func:`score_response`: one response text scored by a scoring function as a worker scores it
  (decoded by the tokenizer, called with ``data_source``, ``solution_str``, ``ground_truth`` and
  ``extra_info`` in a scorer process, its return value normalised as verl does).

Scoring errors are raised, not turned into error results: a test wants the traceback. Needs the
``worker`` extra (torch, tensordict), as a worker does.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from rewardq.config import WorkerConfig
from rewardq.queue.codec import encode_output
from rewardq.queue.results import RewardResult
from rewardq.reward.execution.settings import REWARD_FN_PLACEMENT

if TYPE_CHECKING:
    from tensordict import TensorDict

    from rewardq.reward.base import RewardManager
    from rewardq.reward.tokenizer import Tokenizer

__all__ = [
    "DEMO_TOKENIZER",
    "output",
    "make_batch",
    "ManagerRunner",
    "score_trajectory",
    "score_trajectory_sync",
    "worker_manager",
    "score_response",
]

#: Scorer processes per function of the managers ``rewardq.testing`` builds (a test needs one).
TESTING_SCORER_PROCESSES = 1


#: The tokenizer bundled with rewardq (byte-level BPE, round-trips any text): the default here.
DEMO_TOKENIZER = "builtin:demo"
#: The uid and session id of the trajectories these helpers build unless told otherwise.
TEST_UID, TEST_SESSION = "test-uid", "0"


def _tokenizer(tokenizer: Tokenizer | str | None) -> Tokenizer:
    from rewardq.reward.tokenizer import load_tokenizer

    return load_tokenizer(tokenizer or DEMO_TOKENIZER) if tokenizer is None or isinstance(tokenizer, str) else tokenizer


def output(
    prompt: str | Sequence[int] = "",
    response: str | Sequence[int] = "",
    *,
    tokenizer: Tokenizer | str | None = None,
    **fields: object,
) -> dict[str, Any]:
    """One output as a producer pushes it: text is encoded with ``tokenizer`` (default the bundled
    one), ids are taken as they are; ``fields`` adds any other output field (``response_mask``,
    ``num_turns``, ``extra_fields``, ``reward_score``, ...)."""
    tok = _tokenizer(tokenizer) if isinstance(prompt, str) or isinstance(response, str) else None

    def ids(value: str | Sequence[int]) -> list[int]:
        if isinstance(value, str):
            assert tok is not None
            return list(tok.encode(value, add_special_tokens=False))
        return [int(i) for i in value]

    return {"prompt_ids": ids(prompt), "response_ids": ids(response), **fields}


def make_batch(
    outputs: Sequence[Mapping[str, object] | object],
    sample: Mapping[str, object] | None = None,
    *,
    uid: str = TEST_UID,
    session_id: str = TEST_SESSION,
    vocab_size: int | None = None,
) -> TensorDict:
    """The batch a worker builds for a trajectory of these ``outputs`` (in index order) and its
    dataset row ``sample`` (``data_source``, ``reward_model``, ``extra_info``, ...).

    Each output is encoded as ``RewardClient.put_trajectory`` encodes it and decoded as a worker
    decodes it (``vocab_size``: the worker's tokenizer's, checked as the worker checks it), so a
    field the pipeline would refuse raises :class:`~rewardq.errors.RecordError` naming it.
    """
    from rewardq.consumers.assembly import trajectory_sample
    from rewardq.consumers.batch import build_batch

    records = _records(outputs, sample, uid=uid, session_id=session_id, vocab_size=vocab_size)
    return build_batch(records, trajectory_sample(records))


def _records(
    outputs: Sequence[object], sample: Mapping[str, object] | None, *, uid: str, session_id: str, vocab_size: int | None
) -> list[Any]:
    from rewardq.consumers.assembly import assemble

    n = len(outputs)
    payloads: list[bytes | None] = [
        encode_output(uid, session_id, i, out, dict(sample or {}), final=(i == n - 1)) for i, out in enumerate(outputs)
    ]
    return assemble(f"{uid}_{session_id}", payloads, vocab_size=vocab_size)


class ManagerRunner:
    """Run a manager on trajectories as a worker runs it, without Redis.

    ``async with ManagerRunner(manager) as run:`` calls ``setup`` and ``prepare_scoring`` (scorer
    processes start here), then ``await run.score(outputs, sample)`` per trajectory, and ``close``
    (scorer processes stop) on the way out.

    Args:
        manager: a :class:`~rewardq.reward.base.RewardManager` (e.g. from :func:`worker_manager`).
        timeout: seconds one ``run_single`` may take (the worker's ``score_timeout``).
        worker_name: written into each result's ``worker`` field.
    """

    def __init__(
        self, manager: RewardManager, *, timeout: float = WorkerConfig.score_timeout, worker_name: str = "test-worker"
    ) -> None:
        from rewardq.consumers.scorer import TrajectoryScorer

        self.manager = manager
        name = manager.name or type(manager).__name__
        self.scorer = TrajectoryScorer(manager, manager_name=name, worker_name=worker_name, timeout=timeout)
        self._open = False

    async def __aenter__(self) -> ManagerRunner:
        await self.manager.setup()
        self._open = True
        await self.manager.prepare_scoring()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the manager, its context and its scorer processes (as a stopping worker does)."""
        if self._open:
            from rewardq.consumers.resources import close_manager

            self._open = False
            await close_manager(self.manager)

    async def score(
        self,
        outputs: Sequence[Mapping[str, object] | object],
        sample: Mapping[str, object] | None = None,
        *,
        uid: str = TEST_UID,
        session_id: str | None = None,
    ) -> list[RewardResult]:
        """One result per output key, in index order, as the worker writes them.

        Raises what the manager raised, or :class:`~rewardq.errors.ScoringError` when its answer
        is unusable (a missing ``reward_score``, NaN, the wrong number of results) or it took
        longer than ``timeout``: the worker would write that as an error result for every key.
        """
        if not self._open:
            raise RuntimeError("use ManagerRunner as `async with ManagerRunner(manager) as run:`")
        vocab = getattr(self.manager.tokenizer, "vocab_size", None)
        sid = session_id if session_id is not None else uuid.uuid4().hex[:8]
        records = _records(outputs, sample, uid=uid, session_id=sid, vocab_size=vocab)
        return list((await self.scorer.score(records)).results)


async def score_trajectory(
    manager: RewardManager,
    outputs: Sequence[Mapping[str, object] | object],
    sample: Mapping[str, object] | None = None,
    *,
    timeout: float = WorkerConfig.score_timeout,
) -> list[RewardResult]:
    """Set ``manager`` up, score one trajectory as a worker does, close it (see :class:`ManagerRunner`)."""
    async with ManagerRunner(manager, timeout=timeout) as run:
        return await run.score(outputs, sample)


def score_trajectory_sync(
    manager: RewardManager,
    outputs: Sequence[Mapping[str, object] | object],
    sample: Mapping[str, object] | None = None,
    *,
    timeout: float = WorkerConfig.score_timeout,
) -> list[RewardResult]:
    """:func:`score_trajectory` from synchronous code (it runs its own event loop)."""
    return asyncio.run(score_trajectory(manager, outputs, sample, timeout=timeout))


def worker_manager(
    manager: str = WorkerConfig.manager,
    *,
    tokenizer: str | None = DEMO_TOKENIZER,
    reward_fn: str | None = None,
    reward_fn_kwargs: Mapping[str, object] | None = None,
    reward_fn_placement: str = REWARD_FN_PLACEMENT,
    scorer_processes: int | None = TESTING_SCORER_PROCESSES,
    manager_options: Mapping[str, object] | None = None,
) -> RewardManager:
    """The manager ``rewardq worker`` builds from these settings (same names as its flags), by the
    worker's own factory: ``manager`` by name, entry point or ``module:Class``; the tokenizer
    loaded; ``reward_fn`` (``FILE.py[:FUNC]`` or ``package.module[:FUNC]``) loaded by its spec, so
    scorer processes load it as they do in a worker; a misspelt option raises ConfigError.
    ``scorer_processes`` is 1 here (a test needs no more), the worker's default one per core."""
    from rewardq.consumers.compose import prepare_worker

    cfg = WorkerConfig(
        manager=manager,
        tokenizer=tokenizer,
        reward_fn=reward_fn,
        reward_fn_kwargs=dict(reward_fn_kwargs or {}),
        reward_fn_placement=reward_fn_placement,
        scorer_processes=scorer_processes,
        manager_options=dict(manager_options or {}),
        namespace="test",
        name="test-worker",
    ).validate()
    return prepare_worker(cfg, standalone=True).manager


async def score_response(
    response: str,
    sample: Mapping[str, object],
    *,
    reward_fn: str | None = None,
    prompt: str = "",
    manager: str = WorkerConfig.manager,
    reward_fn_kwargs: Mapping[str, object] | None = None,
    reward_fn_placement: str = REWARD_FN_PLACEMENT,
    tokenizer: str | None = DEMO_TOKENIZER,
) -> RewardResult:
    """Score one ``response`` text for the dataset row ``sample`` as a worker does.

    The response is encoded with ``tokenizer`` and decoded back by the manager (with
    ``skip_special_tokens``), the scoring function ``reward_fn`` (None: the default scorer of
    ``sample["data_source"]``) is loaded by its spec and called where the worker calls it
    (``reward_fn_placement``: a scorer process by default), and its return value is normalised
    (a number gives ``{"acc": number}``, a dict must hold ``score``). Returns the result the
    worker would write for the output's key.
    """
    built = worker_manager(
        manager,
        tokenizer=tokenizer,
        reward_fn=reward_fn,
        reward_fn_kwargs=reward_fn_kwargs,
        reward_fn_placement=reward_fn_placement,
    )
    out = output(prompt, response, tokenizer=built.tokenizer)
    (result,) = await score_trajectory(built, [out], sample)
    return result
