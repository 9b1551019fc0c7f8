"""Every key verl 0.9.1 itself writes into a trainer config is known to rewardq's config reader.

The known set is derived here from verl's own files: the top-level keys of every shipped trainer
YAML (the generated ``_generated_ppo_*trainer.yaml`` and the Hydra sources), and of the configs
Hydra composes for the PPO, Megatron, one-step-off and fully-async trainers (what a run saves as
``.hydra/config.yaml``, where Hydra's ``model_engine`` group appears). Each composed config, saved
as a run saves it, loads with no key listed as unused.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import verl
import yaml
from omegaconf import OmegaConf

from rewardq.config import WorkerConfig
from rewardq.verl_config import VERL_SECTIONS

VERL = Path(verl.__file__).parent
TRAINER_YAMLS = sorted(
    [
        *(VERL / "trainer" / "config").glob("*ppo*trainer*.yaml"),
        *(VERL / "experimental").glob("*/config/*trainer*.yaml"),
    ]
)
COMPOSED = [
    ("trainer/config", "ppo_trainer"),
    ("trainer/config", "ppo_megatron_trainer"),
    ("experimental/one_step_off_policy/config", "one_step_off_ppo_trainer"),
    ("experimental/fully_async_policy/config", "fully_async_ppo_trainer"),
]


def compose(folder: str, name: str) -> Any:
    """``name`` as verl's own entry point composes it (its defaults name paths relative to verl's parent)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    cwd = os.getcwd()
    os.chdir(VERL.parent)
    try:
        with initialize_config_dir(config_dir=str(VERL / folder), version_base=None):
            return hydra_compose(config_name=name)
    finally:
        os.chdir(cwd)


def test_verl_ships_the_trainer_configs_read_here() -> None:
    names = {p.name for p in TRAINER_YAMLS}
    assert {"_generated_ppo_trainer.yaml", "ppo_trainer.yaml", "fully_async_ppo_trainer.yaml"} <= names
    assert "one_step_off_ppo_trainer.yaml" in names


def test_every_top_level_key_of_verls_trainer_configs_is_a_known_section() -> None:
    found: set[str] = set()
    for path in TRAINER_YAMLS:
        data = yaml.safe_load(path.read_text()) or {}
        found |= set(data)
    for folder, name in COMPOSED:
        found |= set(compose(folder, name))
    assert "model_engine" in found  # Hydra's engine group: what a run's saved config.yaml holds
    assert found <= VERL_SECTIONS, sorted(found - VERL_SECTIONS)


@pytest.mark.parametrize(("folder", "name"), COMPOSED, ids=[n for _, n in COMPOSED])
def test_a_runs_saved_config_loads_with_no_unused_key(tmp_path: Path, folder: Any, name: Any) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(OmegaConf.to_yaml(compose(folder, name)))  # as Hydra saves .hydra/config.yaml
    cfg = WorkerConfig.load(config_file=str(path), env={}, overrides={"tokenizer": "builtin:demo"})
    assert cfg.unused_keys == []
    assert cfg.manager == "naive" and cfg.tokenizer == "builtin:demo"


@pytest.mark.parametrize("path", [p for p in TRAINER_YAMLS if p.name.startswith("_generated")], ids=lambda p: p.name)
def test_the_generated_configs_load_with_no_unused_key(path: Any) -> None:
    cfg = WorkerConfig.load(config_file=str(path), env={})
    assert cfg.unused_keys == []
    assert cfg.tokenizer == "~/models/deepseek-llm-7b-chat"  # verl's default model.path, as verl would read it
