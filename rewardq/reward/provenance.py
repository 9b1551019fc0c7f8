"""What produced a result: one provenance blob per scorer, interned and named by its digest.

Every result carries a ``provenance`` digest beside its ``worker``, ``manager``, ``scored_at`` and
``latency_ms`` (and the per-key ``attempt`` and ``judge_request``). The digest names a blob that
holds what is the same for every result of one scorer in one fleet configuration::

    scoring          the namespace's scoring-configuration fingerprint (rewardq.reward.scoring_fingerprint)
    rewardq_version  the worker's rewardq version
    manager          the --manager spec
    scorer           default:<name> (the data source's default scorer), reward_fn:<file>:<fn>@sha256=<hex>,
                     manager:<spec>[@sha256=<hex>] (a custom manager scores), judge:<model>, reward_model:<model>
    judge_model, judge_template, judge_sampling   LLM judges (the manager's provenance())
    isolation        code data sources: sandbox_fusion, or local:<namespaces|rlimits|auto>

Why interned: the blob is a few hundred bytes and the same for thousands of keys; each key stores
only its 16-hex digest (the worker writes each blob once to ``<ns>:provenance``, before the first
result naming it, and ``rewardq inspect`` resolves it). :class:`ProvenanceBook` computes each
blob once per data source and keeps it, so the hot path is one dict lookup.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rewardq.reward.scoring import CODE_DATA_SOURCES, scorer_name
from rewardq.reward.scoring_fingerprint import code_identity

if TYPE_CHECKING:
    from rewardq.reward.base import RewardManager

#: The blob's keys, in the order ``rewardq inspect`` shows them.
BLOB_KEYS = (
    "scoring",
    "rewardq_version",
    "manager",
    "scorer",
    "judge_model",
    "judge_template",
    "judge_sampling",
    "isolation",
)


@dataclass(frozen=True)
class Provenance:
    """One interned blob and its digest (16 hex characters of SHA-256 over its canonical JSON)."""

    digest: str
    blob: Mapping[str, Any]

    @property
    def json(self) -> str:
        return canonical(self.blob)


def canonical(blob: Mapping[str, object]) -> str:
    return json.dumps(dict(blob), sort_keys=True, separators=(",", ":"), default=str)


def intern(blob: Mapping[str, object]) -> Provenance:
    """The :class:`Provenance` of ``blob`` (its None values dropped)."""
    clean = {k: v for k, v in blob.items() if v is not None}
    return Provenance(hashlib.sha256(canonical(clean).encode()).hexdigest()[:16], clean)


class ProvenanceBook:
    """The provenance of a worker's results, one blob per data source's scorer (see the module doc).

    Args:
        manager: the worker's manager (its :meth:`~rewardq.reward.base.RewardManager.provenance` hook).
        manager_spec: the ``--manager`` spec.
        scoring: the scoring-configuration fingerprint's digest.
        reward_fn: the ``--reward-fn`` spec, if any.
        custom: the manager is not a built-in one (its own code decides the reward).
        version: the rewardq version.
    """

    def __init__(
        self,
        manager: RewardManager,
        *,
        manager_spec: str,
        scoring: str,
        reward_fn: str | None,
        custom: bool,
        version: str,
    ) -> None:
        self.manager = manager
        self.base = {"scoring": scoring, "rewardq_version": version, "manager": manager_spec}
        self.reward_fn = f"reward_fn:{code_identity(reward_fn, default_name='compute_score')}" if reward_fn else None
        self.custom = f"manager:{code_identity(manager_spec, default_name=None)}" if custom else None
        self._by_source: dict[object, Provenance] = {}
        self.published: set[str] = set()  # digests written to Redis (the worker's business)

    def of(self, data_source: object) -> Provenance:
        """The provenance of a result for ``data_source`` (computed once, then looked up)."""
        key = data_source if isinstance(data_source, (str, int, float, type(None))) else repr(data_source)
        found = self._by_source.get(key)
        if found is None:
            found = self._by_source[key] = intern(self._blob(data_source))
        return found

    def _blob(self, data_source: object) -> dict[str, object]:
        blob: dict[str, Any] = dict(self.base)
        blob["scorer"] = self.custom or self.reward_fn or f"default:{scorer_name(data_source)}"
        if data_source in CODE_DATA_SOURCES and not self.reward_fn and not self.custom:
            blob["isolation"] = code_isolation(self.manager)
        try:
            blob.update(self.manager.provenance(data_source) or {})
        except Exception as exc:  # noqa: BLE001 - a custom manager's hook must not fail a result
            blob["provenance_error"] = f"{type(exc).__name__}: {exc}"[:200]
        return blob


def code_isolation(manager: RewardManager) -> str:
    """How code runs for this manager: ``sandbox_fusion``, or ``local:<mode>`` (the mode the local
    sandbox decided on once it ran a program, else the one asked for)."""
    context = getattr(manager, "context", None)
    code = getattr(context, "code", None)
    if code is None:
        return "local:auto"
    if code.backend == "sandbox_fusion":
        return "sandbox_fusion"
    runtime = getattr(context, "_code_runtime", None)
    sandbox = getattr(runtime, "_sandbox", None)
    decided = getattr(sandbox, "isolation", None)
    return f"local:{decided or code.code_local_isolation}"


def template_digest(*parts: str | None) -> str:
    """16 hex characters of SHA-256 over a judge's template and system prompt."""
    h = hashlib.sha256()
    for p in parts:
        h.update((p or "").encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()[:16]
