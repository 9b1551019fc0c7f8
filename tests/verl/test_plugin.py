"""``reward.reward_manager.name=rewardq``: rewardq's verl plugin, verl's registry and verl's Hydra configs.

verl 0.9.1 loads every ``verl.plugins`` entry point when it is imported; rewardq declares
``rewardq.integrations.verl.plugin`` there (pyproject.toml), which registers the name ``rewardq``.
The switch README.md documents (three overrides, or one YAML block) is read from README and
composed with verl's own Hydra configs for the PPO, one-step-off and fully-async trainers; the
workers read the composed config as a run saves it. The hook behind the name is what
tests/verl/test_trainers.py drives through verl's ``RewardLoopManager`` on a local Ray.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import verl
import yaml
from omegaconf import OmegaConf

from rewardq.config import WorkerConfig
from tests.support.cli_procs import REPO
from tests.support.install_docs import shell_commands, yaml_blocks
from tests.verl.harness import IMPORTLIB_HOOK

VERL = Path(verl.__file__).parent
TRAINERS = [
    ("trainer/config", "ppo_trainer"),
    ("experimental/one_step_off_policy/config", "one_step_off_ppo_trainer"),
    ("experimental/fully_async_policy/config", "fully_async_ppo_trainer"),
]

FRESH = """
import json, sys
import verl
light = ("rewardq.integrations.verl.entrypoints", "verl.experimental.reward_loop.reward_manager")
out = {"light": not any(m in sys.modules for m in light)}  # import verl loads neither the hook nor verl's managers
from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls
try:
    cls = get_reward_manager_cls("rewardq")
except ValueError as exc:
    out["error"] = str(exc)
else:
    from omegaconf import OmegaConf
    from rewardq.integrations.verl import RewardqRewardManager
    config = OmegaConf.create({"reward": {"rewardq": {"namespace": "t-plugin", "verl_on_error": "zero"}}})
    built = cls(config=config, tokenizer=None, compute_score=None)
    out["built"] = type(built).__name__
    out["is_hook"] = isinstance(built, RewardqRewardManager)
    out["class_method"] = cls.assemble_rm_scores.__func__ is RewardqRewardManager.assemble_rm_scores.__func__
print(json.dumps(out))
"""


def _fresh_python(**env: str) -> dict[str, Any]:
    """``import verl`` in a new interpreter (where verl discovers its plugins), and what it then knows."""
    run = subprocess.run(
        [sys.executable, "-c", FRESH],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    return result


def test_importing_verl_registers_the_name_rewardq_for_the_hook() -> None:
    seen = _fresh_python()
    assert seen == {"light": True, "built": "RewardqRewardManager", "is_hook": True, "class_method": True}


def test_with_verls_plugins_off_the_name_is_unknown() -> None:
    seen = _fresh_python(VERL_USE_EXTERNAL_PLUGINS="none")
    assert seen == {"light": True, "error": "Unknown reward manager: rewardq"}


def _compose(folder: str, name: str, overrides: list[str], config_dir: Path | None = None) -> Any:
    """A trainer config as verl's entry point composes it (its defaults name paths relative to verl's parent)."""
    from hydra import compose, initialize_config_dir

    cwd = os.getcwd()
    os.chdir(VERL.parent)
    try:
        with initialize_config_dir(config_dir=str(config_dir or VERL / folder), version_base=None):
            return compose(config_name=name, overrides=overrides)
    finally:
        os.chdir(cwd)


def _readme_overrides() -> list[str]:
    """The overrides of README's ``python -m verl.trainer.main_ppo ...`` line."""
    (line,) = [c for c in shell_commands("README.md") if c[:3] == ["python", "-m", "verl.trainer.main_ppo"]]
    return [w for w in line[3:] if "=" in w]


def _check_switched(cfg: Any, tmp_path: Path) -> None:
    from verl.trainer.ppo.reward import resolve_reward_manager_cls

    from rewardq.integrations.verl.plugin import reward_class

    assert (cfg.reward.reward_manager.source, cfg.reward.reward_manager.name) == ("register", "rewardq")
    assert resolve_reward_manager_cls(cfg) is reward_class()  # what every verl process resolves
    saved = tmp_path / "config.yaml"
    saved.write_text(OmegaConf.to_yaml(cfg))  # as Hydra saves .hydra/config.yaml for the run
    worker = WorkerConfig.load(config_file=str(saved), env={}, overrides={"tokenizer": "builtin:demo"})
    assert (worker.manager, worker.redis_url, worker.namespace) == ("naive", "redis://HOST:6379/0", "my-run")
    assert worker.unused_keys == []


def test_readme_lists_three_overrides() -> None:
    overrides = _readme_overrides()
    assert overrides == [
        "reward.reward_manager.name=rewardq",
        "+reward.rewardq.redis_url=redis://HOST:6379/0",
        "+reward.rewardq.namespace=my-run",
    ]


@pytest.mark.parametrize(("folder", "name"), TRAINERS, ids=[n for _, n in TRAINERS])
def test_readmes_overrides_switch_every_trainers_config(folder: str, name: str, tmp_path: Path) -> None:
    _check_switched(_compose(folder, name, _readme_overrides()), tmp_path)


def test_readmes_yaml_block_switches_a_config_of_ones_own(tmp_path: Path) -> None:
    (block,) = [b for b in yaml_blocks("README.md") if "rewardq" in b]
    own = {"hydra": {"searchpath": ["pkg://verl.trainer.config"]}, "defaults": ["ppo_trainer", "_self_"]}
    (tmp_path / "my_ppo.yaml").write_text(yaml.safe_dump(own) + block)
    _check_switched(_compose("", "my_ppo", [], config_dir=tmp_path), tmp_path)


def test_without_the_plugin_the_importlib_keys_name_the_same_hook() -> None:
    from verl.trainer.ppo.reward import resolve_reward_manager_cls

    from rewardq.integrations.verl import RewardqRewardManager

    cfg = _compose("trainer/config", "ppo_trainer", [])
    cfg.reward.reward_manager = OmegaConf.merge(cfg.reward.reward_manager, IMPORTLIB_HOOK)
    assert resolve_reward_manager_cls(cfg) is RewardqRewardManager
