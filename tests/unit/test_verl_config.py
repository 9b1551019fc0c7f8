"""verl's own trainer config, read as verl reads it; file values type-checked; unused keys listed, never fatal."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from rewardq.config import WorkerConfig
from rewardq.errors import ConfigError, UnknownManagerError
from rewardq.reward.factory import build_manager
from rewardq.reward.managers.dapo import DAPORewardManager
from rewardq.reward.managers.gdpo import GDPORewardManager
from rewardq.reward.managers.genrm import GenRMRewardManager
from rewardq.reward.managers.limited import LimitedRewardManager
from rewardq.reward.registry import get_manager_class, known_managers
from rewardq.verl_config import migrate_legacy, translate


def load(tmp_path: Path, text: str, env: dict[str, Any] | None = None, **overrides: Any) -> WorkerConfig:
    f = tmp_path / "cfg.yaml"
    f.write_text(textwrap.dedent(text))
    return WorkerConfig.load(config_file=str(f), env=env or {}, overrides=overrides)


# --- typed file values --------------------------------------------------------------------


def test_file_values_are_typed_like_environment_variables(tmp_path: Path) -> None:
    cfg = load(tmp_path, 'cluster: "false"\nconcurrency: "12"\nscore_timeout: 5\nshards: null\n')
    assert cfg.cluster is False  # the string "false" is not truthy
    assert cfg.concurrency == 12 and isinstance(cfg.concurrency, int)
    assert cfg.score_timeout == 5.0 and isinstance(cfg.score_timeout, float)
    assert cfg.shards is None
    assert load(tmp_path, "cluster: 'yes'\n").cluster is True


@pytest.mark.parametrize(
    "text,match",
    [
        ("cluster: maybe\n", r"cluster='maybe' is not a valid bool"),
        ("concurrency: many\n", r"concurrency='many' is not a valid int"),
        ("concurrency: true\n", r"concurrency must be a int, got bool"),
        ("cluster: 3\n", r"cluster must be a bool, got int"),
        ("manager_options: [1, 2]\n", r"manager_options must be a dict"),
        ("reward:\n  rewardq:\n    batch_size: lots\n", r"\(reward.rewardq\): batch_size='lots'"),
    ],
)
def test_bad_file_values_name_the_file_and_key(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        load(tmp_path, text)
    assert "cfg.yaml" in str(info.value)


# --- verl's generated trainer config ---------------------------------------------------------

GENERATED_LIKE = """
    trainer:
      project_name: p
      experiment_name: exp-42
      default_local_dir: checkpoints/${trainer.project_name}/${trainer.experiment_name}
    actor_rollout_ref:
      model:
        path: {policy}
      rollout:
        trace:
          experiment_name: ${oc.select:trainer.experiment_name,null}
    custom_reward_function:
      path: null
      name: null
    reward_model:
      num_workers: null
      reward_manager: null
      enable: null
      model:
        path: null
      rollout:
        name: null
    sandbox_fusion:
      url: null
    reward:
      _target_: verl.workers.config.RewardConfig
      num_workers: 8
      custom_reward_function:
        path: null
        name: compute_score
      reward_manager:
        _target_: verl.workers.config.reward.RewardManagerConfig
        source: register
        name: {manager}
        module:
          path: null
          name: custom_reward_manager
      reward_model:
        enable: false
        n_gpus_per_node: 8
        model_path: null
        rollout:
          name: ???
          dtype: bfloat16
      sandbox_fusion:
        url: null
        max_concurrent: 64
        memory_limit_mb: 1024
"""


def generated(manager: str = "naive", policy: str = "~/models/none") -> str:
    return GENERATED_LIKE.replace("{manager}", manager).replace("{policy}", policy)


@pytest.mark.parametrize("name", ["naive", "dapo", "gdpo", "rate_limited", "remote"])
def test_every_manager_verl_registers_loads_from_the_generated_layout(tmp_path: Path, name: str) -> None:
    cfg = load(tmp_path, generated(name))
    assert cfg.manager == name
    assert cfg.unused_keys == []  # verl's defaults for a disabled reward model / sandbox are not "unused"
    assert cfg.manager_options["num_workers"] == 8
    assert cfg.manager_options["experiment_name"] == "exp-42"
    assert "sandbox_fusion_url" not in cfg.manager_options  # no url: no sandbox options at all
    manager = build_manager(cfg.manager, tokenizer=None, options=cfg.manager_options)
    assert get_manager_class(name) is type(manager)
    if name == "gdpo":
        assert isinstance(manager, GDPORewardManager)
        assert manager.experiment_name == "exp-42"  # trainer.experiment_name reaches gdpo


def test_limited_stays_an_alias_of_rate_limited() -> None:
    assert get_manager_class("limited") is get_manager_class("rate_limited") is LimitedRewardManager
    assert LimitedRewardManager.name == "rate_limited"
    assert {"limited", "rate_limited"} <= set(known_managers())


def test_the_tokenizer_is_found_as_verl_finds_it(tmp_path: Path) -> None:
    folder = tmp_path / "policy"
    folder.mkdir()
    cfg = load(tmp_path, generated(policy=str(folder)))
    assert cfg.tokenizer == str(folder)
    assert cfg.sources["tokenizer"] == f"file {tmp_path / 'cfg.yaml'} (actor_rollout_ref.model.path)"
    # a Hub id and verl's own default path are taken as given: loading them decides (and names them)
    assert load(tmp_path, generated(policy="Qwen/Qwen2.5-7B")).tokenizer == "Qwen/Qwen2.5-7B"
    assert load(tmp_path, generated()).tokenizer == "~/models/none"
    # model.tokenizer_path wins over model.path, as in verl's workers
    with_path = generated(policy="Qwen/Qwen2.5-7B").replace(
        "        path: Qwen/Qwen2.5-7B\n", "        path: Qwen/Qwen2.5-7B\n        tokenizer_path: my/tok\n", 1
    )
    cfg = load(tmp_path, with_path)
    assert cfg.tokenizer == "my/tok"
    assert cfg.sources["tokenizer"].endswith("(actor_rollout_ref.model.tokenizer_path)")
    # a flag, the environment or a rewardq key beside verl's sections wins, and then no verl key is named
    flagged = load(tmp_path, generated(policy=str(folder)), tokenizer="builtin:demo")
    assert (flagged.tokenizer, flagged.sources["tokenizer"].startswith("file")) == ("builtin:demo", False)
    env = load(tmp_path, generated(policy=str(folder)), env={"REWARDQ_TOKENIZER": "builtin:demo"})
    assert (env.tokenizer, env.sources["tokenizer"]) == ("builtin:demo", "env REWARDQ_TOKENIZER")
    beside = load(tmp_path, generated(policy=str(folder)) + "    tokenizer: builtin:demo\n")
    assert beside.tokenizer == "builtin:demo" and "model.path" not in beside.sources["tokenizer"]
    # no model.path at all: nothing is implied (the worker then asks for --tokenizer)
    assert load(tmp_path, "reward:\n  reward_manager:\n    name: naive\n").tokenizer is None


def test_the_hook_in_a_verl_config_means_the_manager_reward_rewardq_names(tmp_path: Path) -> None:
    hook = (
        generated()
        .replace("source: register", "source: importlib")
        .replace("path: null\n          name: custom_reward_manager", "path: pkg://rewardq.integrations.verl")
    )
    hook = hook.replace("name: naive", "name: RewardqRewardManager")
    assert load(tmp_path, hook).manager == "naive"
    chosen = hook.replace("    reward:\n", "    reward:\n      rewardq:\n        manager: dapo\n", 1)
    assert load(tmp_path, chosen).manager == "dapo"
    slashed = hook.replace("pkg://rewardq.integrations.verl", "pkg://rewardq/integrations/verl")
    assert load(tmp_path, slashed).manager == "naive"


def test_the_name_rewardq_is_the_hook_under_verls_default_source(tmp_path: Path) -> None:
    """``reward.reward_manager.name=rewardq`` (the name rewardq's verl plugin registers)."""
    named = generated().replace("name: naive", "name: rewardq")
    assert load(tmp_path, named).manager == "naive"
    chosen = named.replace("    reward:\n", "    reward:\n      rewardq:\n        manager: dapo\n", 1)
    assert load(tmp_path, chosen).manager == "dapo"
    assert load(tmp_path, "reward:\n  reward_manager: rewardq\n").manager == "naive"  # the plain-string form


def test_top_level_rewardq_keys_and_blocks_are_honoured_beside_a_reward_block(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        """
        redis_url: redis://from-top-level:6379/0
        concurrency: 9
        rewardq:
          namespace: from-block
        reward:
          reward_manager: {name: rate_limited}
          max_rpm: 120
          rewardq:
            batch_size: 17
            verl_timeout: 30
        """,
    )
    assert cfg.redis_url == "redis://from-top-level:6379/0"  # not silently the default any more
    assert (cfg.concurrency, cfg.namespace, cfg.batch_size) == (9, "from-block", 17)
    assert cfg.manager == "rate_limited" and cfg.manager_options == {"max_rpm": 120}
    assert cfg.unused_keys == []  # verl_timeout belongs to the verl adapter: accepted, not listed


def test_environment_and_flags_still_win_over_the_file(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        "redis_url: redis://file:1/0\nreward: {reward_manager: {name: dapo}}\n",
        env={"REWARDQ_REDIS_URL": "redis://env:2/0"},
        manager="rate_limited",
    )
    assert (cfg.redis_url, cfg.manager) == ("redis://env:2/0", "rate_limited")


def test_unused_keys_are_listed_once_by_content_and_never_fatal(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        """
        concurency: 4
        my_team_setting: 1
        trainer: {experiment_name: e}
        reward:
          reward_manager: {name: naive}
          custom_reward_function: {path: /opt/r.py, name: score}
          future_verl_knob: 3
          reward_model:
            enable: true
            model_path: /models/genrm
            rollout: {name: vllm, tensor_model_parallel_size: 2}
        """,
    )
    # a custom reward function with the reward model on is verl's generative-RM layout: the
    # function is what scores, so the reward model's settings are unused here
    assert cfg.manager == "naive" and cfg.reward_fn == "/opt/r.py:score"
    assert sorted(cfg.unused_keys) == sorted(
        [
            "concurency (did you mean concurrency?)",
            "my_team_setting",
            "reward.future_verl_knob",
            "reward.reward_model.model_path",
            "reward.reward_model.rollout",
        ]
    )
    assert len(cfg.unused_keys) == len(set(cfg.unused_keys))  # each listed once


def test_importlib_source_loads_the_manager_from_a_file_or_module(tmp_path: Path) -> None:
    mod = tmp_path / "my_managers.py"
    mod.write_text(
        "from rewardq.reward import RewardManager\n"
        "class Judge(RewardManager):\n"
        "    async def run_single(self, data):\n"
        "        return {'reward_score': 1.0, 'reward_extra_info': {}}\n"
    )
    text = """
        reward:
          reward_manager:
            source: importlib
            name: Judge
            module: {path: PATH, name: null}
    """
    cfg = load(tmp_path, text.replace("PATH", str(mod)))
    assert cfg.manager == f"{mod}:Judge"
    assert get_manager_class(cfg.manager).__name__ == "Judge"
    cfg = load(
        tmp_path, text.replace("PATH", "pkg://rewardq.reward.managers.naive").replace("Judge", "NaiveRewardManager")
    )
    assert get_manager_class(cfg.manager).__name__ == "NaiveRewardManager"
    with pytest.raises(ConfigError, match="module.path"):
        load(tmp_path, text.replace("PATH", "null"))


def test_importlib_source_refuses_a_verl_manager_with_the_way_out(tmp_path: Path) -> None:
    mod = tmp_path / "verl_style.py"
    mod.write_text("class MyVerlManager:\n    pass\n")
    with pytest.raises(UnknownManagerError, match="port it by subclassing"):
        get_manager_class(f"{mod}:MyVerlManager")


def test_sandbox_fusion_options_only_when_a_url_is_set() -> None:
    out = translate(
        {"reward": {"sandbox_fusion": {"url": "http://sb:8080", "max_concurrent": 8, "memory_limit_mb": None}}}
    )
    assert out.values["manager_options"] == {"sandbox_fusion_url": "http://sb:8080", "sandbox_fusion_max_concurrent": 8}


def test_legacy_layout_is_migrated_as_verl_migrates_it() -> None:
    legacy = {
        "reward_model": {
            "num_workers": 3,
            "reward_manager": "dapo",
            "enable": False,
            "model": {"path": None},
            "reward_kwargs": {
                "overlong_buffer_cfg": {"enable": True, "len": 4, "penalty_factor": 1.0},
                "max_resp_len": 16,
            },
            "rollout": {"name": None},
        },
        "custom_reward_function": {"path": "/opt/r.py", "name": "f"},
        "sandbox_fusion": {"url": None},
        "reward": {"reward_manager": {"name": "naive"}, "num_workers": 8},
    }
    migrated = migrate_legacy(legacy)
    assert "reward_model" not in migrated and "custom_reward_function" not in migrated
    assert migrated["reward"]["reward_manager"]["name"] == "dapo"
    out = translate(legacy).values
    assert out["manager"] == "dapo" and out["reward_fn"] == "/opt/r.py:f"
    assert out["manager_options"] == {
        "overlong_buffer": {"enable": True, "len": 4, "penalty_factor": 1.0},
        "max_resp_len": 16,
        "num_workers": 3,
    }
    m = build_manager(out["manager"], tokenizer=None, options=out["manager_options"])
    assert isinstance(m, DAPORewardManager) and m.overlong_buffer is not None
    assert m.max_resp_len == 16 and m.overlong_buffer.len == 4


def test_genrm_takes_its_model_from_the_reward_model_block_and_its_limits_from_reward(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        """
        reward:
          reward_manager: {name: genrm}
          reward_model: {enable: false, model_path: Qwen/Qwen2.5-7B-Instruct}
          max_rpm: 600
          max_concurrent: 16
          rewardq:
            manager_options: {base_url: "http://judge:8000/v1", score_parser: json}
        """,
    )
    assert cfg.manager == "genrm"
    assert cfg.manager_options == {
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "max_rpm": 600,
        "max_concurrent": 16,
        "base_url": "http://judge:8000/v1",
        "score_parser": "json",
    }
    assert "reward.reward_model" not in " ".join(cfg.unused_keys)
    m = build_manager(cfg.manager, tokenizer=None, options=cfg.manager_options)
    assert isinstance(m, GenRMRewardManager)
    assert (m.model, m.limits["max_rpm"], m.limits["max_concurrent"]) == ("Qwen/Qwen2.5-7B-Instruct", 600, 16)
    # an enabled reward model does not turn genrm into the discriminative disrm
    enabled = translate(
        {"reward": {"reward_manager": {"name": "genrm"}, "reward_model": {"enable": True, "model_path": "m"}}}
    )
    assert enabled.values["manager"] == "genrm" and enabled.values["manager_options"] == {"model": "m"}
