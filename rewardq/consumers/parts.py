"""Every part a worker holds, built once by :mod:`rewardq.consumers.compose`.

:class:`~rewardq.consumers.worker.Worker` and its scoring round
(:class:`~rewardq.consumers.scoring_round.ScoringRound`) both take their parts from here: the loop
and the round it calls are handed the same collaborators, and the round needs nothing of the
worker's module but the one check it is given (``refused``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rewardq.config import WorkerConfig
from rewardq.consumers.accounting import Accounting
from rewardq.consumers.assembly import RecordDecoder
from rewardq.consumers.commits import CommitCoalescer
from rewardq.consumers.failures import FailureHandler
from rewardq.consumers.inflight import InFlightTable
from rewardq.consumers.metrics import Metrics
from rewardq.consumers.presence import Presence
from rewardq.consumers.quarantine import Quarantine
from rewardq.consumers.retries import Retries
from rewardq.consumers.scorer import TrajectoryScorer
from rewardq.consumers.scoring_gate import ScoringGate
from rewardq.queue.broker import StreamBroker
from rewardq.reward.base import RewardManager

if TYPE_CHECKING:
    from rewardq.queue.clients import AsyncRedis
    from rewardq.reward.tokenizer import Tokenizer


@dataclass(frozen=True)
class WorkerParts:
    """Every part a :class:`Worker` holds, built by :mod:`rewardq.consumers.compose`.

    ``owns_client``: the worker closes ``client`` when it stops (it connected itself);
    ``metrics_port``: where the metrics are served (None: not served); ``stopping``: set to stop.
    """

    cfg: WorkerConfig
    name: str
    client: AsyncRedis
    owns_client: bool
    broker: StreamBroker
    manager: RewardManager
    tokenizer: Tokenizer | None
    tokenizer_fingerprint: str | None
    gate: ScoringGate
    metrics: Metrics
    metrics_port: int | None
    stopping: asyncio.Event
    stats: dict[str, int]
    flights: InFlightTable
    presence: Presence
    failures: FailureHandler
    retries: Retries  # transient failures retried in place (rewardq.consumers.retries)
    scorer: TrajectoryScorer
    commits: CommitCoalescer
    quarantine: Quarantine
    accounting: Accounting  # provenance and the ledger (rewardq.consumers.accounting)

    decoder: RecordDecoder  # the intake's and the failures' (rewardq.consumers.assembly)

    @property
    def vocab_size(self) -> int | None:
        """The tokenizer's vocabulary size, which bounds a record's token ids (None: unchecked),
        read once into the worker's decoder (:func:`~rewardq.consumers.compose.record_decoder`)."""
        return self.decoder.vocab_size
