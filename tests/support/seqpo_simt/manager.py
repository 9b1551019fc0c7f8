"""SeqPO-SiMT-style reward for simultaneous machine translation: a whole-trajectory manager.

In simultaneous translation (SeqPO-SiMT, Xu et al., ACL Findings 2025, arXiv:2505.20622)
the policy sees the source sentence in chunks. Each **output of the trajectory is one
step**: the partial translation the model wrote after reading some more source. The
reward fuses the *quality* of the concatenated translation against the reference with
the *latency* of the whole process, so it cannot be computed from the last output alone:
the last output holds only the last chunk of the translation and only its own delay.

Per trajectory of steps ``i = 0..n-1``:

* translation ``ŷ = join(decode(response_i))`` over all steps (empty steps = "wait");
* delays ``g(t) = source_read_i`` for every target word ``t`` written at step ``i``
  (``source_read`` comes from each output's ``extra_fields``);
* quality ``Q = chrF(ŷ, reference)`` in [0, 1] (the paper uses COMET; chrF keeps the
  example offline and deterministic — subclass and override :meth:`quality` to swap it);
* latency ``L = AL(g, |x|) / |x|``, Average Lagging normalised by the source length;
* reward ``R = Q − latency_weight · L``.

With ``per_step=True`` the manager returns one reward per output (turn-level credit):
``r_i = R(steps 0..i) − R(steps 0..i−1)`` with ``R(∅) = 0``, so the rewards of a
trajectory sum to ``R``.

Sample columns: ``reward_model.ground_truth`` = the reference translation,
``extra_info.source`` = the source sentence (whitespace-tokenised).

Run it with ``rewardq worker --manager tests.support.seqpo_simt.manager:SeqPOSiMTManager`` from a
checkout (or ``--manager seqpo_simt`` once a package declares it as an entry point, see
:data:`tests.support.seqpo_simt.ENTRY_POINT`); generate data with :mod:`tests.support.seqpo_simt.data`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from rewardq.errors import ConfigError, ScoringError
from rewardq.reward.base import ManagerContext, RewardManager, ScoreFn
from rewardq.reward.rows import non_tensor, valid_response_ids
from tests.support.seqpo_simt.metrics import average_lagging, chrf

if TYPE_CHECKING:
    from tensordict import TensorDict

    from rewardq.reward.tokenizer import Tokenizer


def fused_reward(
    chunks: list[str],
    reads: list[int],
    reference: str,
    source_len: int,
    *,
    latency_weight: float,
    quality: Callable[[str, str], float] = chrf,
) -> dict[str, Any]:
    """The SeqPO-SiMT reward of a sequence of steps (pure function; see the module doc)."""
    words: list[str] = []
    delays: list[int] = []
    for chunk, read in zip(chunks, reads):
        for w in chunk.split():
            words.append(w)
            delays.append(read)
    translation = " ".join(words)
    q = float(quality(translation, reference))
    al = average_lagging(delays, source_len)
    lag = al / source_len
    return {
        "score": q - latency_weight * lag,
        "quality": q,
        "average_lagging": al,
        "normalized_lagging": lag,
        "target_words": len(words),
    }


class SeqPOSiMTManager(RewardManager):
    """Scores a simultaneous-translation trajectory as a whole (see the module doc).

    Args:
        latency_weight: λ in ``R = Q − λ·L``.
        per_step: return one reward per output (telescoping differences) instead of one
            reward copied to every key.
        source_field: the ``extra_info`` column holding the source sentence.
        read_field: the ``extra_fields`` entry holding how much source a step had read.
    """

    name = "seqpo_simt"

    def __init__(
        self,
        tokenizer: Tokenizer,
        compute_score: ScoreFn | None = None,
        *,
        context: ManagerContext | None = None,
        latency_weight: float = 0.5,
        per_step: bool = False,
        source_field: str = "source",
        read_field: str = "source_read",
    ) -> None:
        super().__init__(tokenizer, compute_score, context=context)
        if not isinstance(latency_weight, (int, float)) or latency_weight < 0:
            raise ConfigError(f"latency_weight must be a non-negative number, got {latency_weight!r}")
        self.latency_weight = float(latency_weight)
        self.per_step = bool(per_step)
        self.source_field = source_field
        self.read_field = read_field

    def quality(self, hypothesis: str, reference: str) -> float:
        return chrf(hypothesis, reference)

    def _steps(self, data: TensorDict) -> tuple[list[str], list[int], str, int]:
        n = data.batch_size[0]
        last = data[n - 1]
        reward_model = non_tensor(last, "reward_model")
        extra_info = non_tensor(last, "extra_info") or {}
        if not isinstance(reward_model, Mapping) or not isinstance(reward_model.get("ground_truth"), str):
            raise ScoringError("SeqPO-SiMT needs reward_model['ground_truth'] = the reference translation")
        source = extra_info.get(self.source_field) if isinstance(extra_info, Mapping) else None
        if not isinstance(source, str) or not source.split():
            raise ScoringError(f"SeqPO-SiMT needs extra_info[{self.source_field!r}] = the source sentence")
        source_len = len(source.split())
        chunks, reads, previous = [], [], 0
        for i in range(n):
            row = data[i]
            fields = non_tensor(row, "tool_extra_fields") or {}
            read = fields.get(self.read_field)
            if isinstance(read, bool) or not isinstance(read, int) or not previous <= read <= source_len:
                raise ScoringError(
                    f"output {i}: extra_fields[{self.read_field!r}] must be an int between the "
                    f"previous step's value ({previous}) and the source length ({source_len}), "
                    f"got {read!r}"
                )
            previous = read
            chunks.append(self.require_tokenizer().decode(valid_response_ids(row), skip_special_tokens=True))
            reads.append(read)
        return chunks, reads, reward_model["ground_truth"], source_len

    async def run_single(self, data: TensorDict) -> dict[str, Any] | list[dict[str, Any]]:
        chunks, reads, reference, source_len = self._steps(data)

        def reward(k: int) -> dict[str, Any]:
            return fused_reward(
                chunks[:k], reads[:k], reference, source_len, latency_weight=self.latency_weight, quality=self.quality
            )

        full = reward(len(chunks))
        if not self.per_step:
            return {"reward_score": full["score"], "reward_extra_info": full}
        out, prev = [], 0.0
        for k in range(1, len(chunks) + 1):
            cur = full if k == len(chunks) else reward(k)
            out.append(
                {
                    "reward_score": cur["score"] - prev,
                    "reward_extra_info": {
                        **full,
                        "step": k - 1,
                        "step_reward": cur["score"] - prev,
                        "prefix_score": cur["score"],
                    },
                }
            )
            prev = cur["score"]
        return out
