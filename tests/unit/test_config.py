"""Settings: defaults < config file < environment < CLI; verl `reward:` blocks translate."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from rewardq.config import WorkerConfig
from rewardq.errors import ConfigError
from rewardq.reward.factory import build_manager
from rewardq.verl_config import translate_verl_reward

VERL_YAML = textwrap.dedent("""
    trainer:
      total_epochs: 3
    reward:
      reward_manager:
        name: dapo
      custom_reward_function:
        path: /opt/rewards/my_reward.py
        name: my_score
        reward_kwargs:
          strict: true
      reward_kwargs:
        overlong_buffer_cfg:
          enable: true
          len: 512
          penalty_factor: 1.0
          log: true
        max_resp_len: 4096
      max_concurrent: 8
      max_rpm: 120
      max_tpm: 100000
      timeout: 60
      num_workers: 4
""")


def test_verl_reward_block_maps_onto_worker_settings(tmp_path: Path) -> None:
    f = tmp_path / "verl.yaml"
    f.write_text(VERL_YAML)
    cfg = WorkerConfig.load(config_file=str(f), env={})
    assert cfg.manager == "dapo"
    assert cfg.reward_fn == "/opt/rewards/my_reward.py:my_score"
    assert cfg.reward_fn_kwargs == {"strict": True}
    assert cfg.manager_options == {
        "overlong_buffer": {"enable": True, "len": 512, "penalty_factor": 1.0, "log": True},
        "max_resp_len": 4096,
        "max_concurrent": 8,
        "max_rpm": 120,
        "max_tpm": 100000,
        "timeout": 60,
        "num_workers": 4,
    }


def test_verl_options_a_manager_does_not_take_are_dropped_not_fatal() -> None:
    opts = translate_verl_reward(
        {
            "reward_manager": {"name": "dapo"},
            "max_rpm": 60,
            "num_workers": 2,
            "reward_kwargs": {"overlong_buffer_cfg": {"enable": False}, "max_resp_len": 64},
        }
    )
    m = build_manager("dapo", tokenizer=None, options=opts["manager_options"])
    assert type(m).__name__.lower().startswith("dapo")
    with pytest.raises(ConfigError, match="does not take option 'max_rmp'"):
        build_manager("naive", tokenizer=None, options={"max_rmp": 60})


def test_reward_model_block_selects_disrm_with_verls_keys() -> None:
    out = translate_verl_reward(
        {"reward_model": {"enable": True, "model_path": "/models/rm", "rollout": {"name": "vllm", "dtype": "bf16"}}}
    )
    assert out["manager"] == "disrm"
    assert out["manager_options"] == {"model": "/models/rm", "tokenizer": "/models/rm", "backend": "vllm"}


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    f = tmp_path / "rq.yaml"
    f.write_text("namespace: from-file\nconcurrency: 3\nbatch_size: 7\nmanager: gdpo\n")
    env = {"REWARDQ_CONCURRENCY": "5", "REWARDQ_NAMESPACE": "from-env", "REWARDQ_CLUSTER": "true"}
    cfg = WorkerConfig.load(config_file=str(f), env=env, overrides={"namespace": "from-flag", "batch_size": None})
    assert (cfg.namespace, cfg.concurrency, cfg.batch_size, cfg.manager, cfg.cluster) == (
        "from-flag",
        5,
        7,
        "gdpo",
        True,
    )


@pytest.mark.parametrize(
    "env,match",
    [
        ({"REWARDQ_CONCURRENCY": "many"}, "REWARDQ_CONCURRENCY='many' is not a valid int"),
        (
            {"REWARDQ_CONCURRENCY": "0"},
            "concurrency must be a positive integer, got 0 \\(from env REWARDQ_CONCURRENCY\\)",
        ),
        ({"REWARDQ_LOG_FORMAT": "xml"}, "log_format must be text or json, got 'xml' \\(from env REWARDQ_LOG_FORMAT\\)"),
        ({"REWARDQ_MANAGER_OPTIONS": "[1]"}, "REWARDQ_MANAGER_OPTIONS"),
        ({"REWARDQ_LEASE_SECONDS": "1", "REWARDQ_HEARTBEAT_INTERVAL": "2"}, "lease_seconds"),
    ],
)
def test_bad_settings_name_the_setting(env: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        WorkerConfig.load(env=env)


def test_unknown_file_setting_is_listed_not_fatal_and_missing_file_is(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("concurency: 3\n")
    cfg = WorkerConfig.load(config_file=str(f), env={})
    assert cfg.unused_keys == ["concurency (did you mean concurrency?)"]
    assert cfg.concurrency == WorkerConfig().concurrency
    with pytest.raises(ConfigError, match="does not exist"):
        WorkerConfig.load(config_file=str(tmp_path / "nope.yaml"), env={})


def test_dapo_config_errors_surface_at_start() -> None:
    with pytest.raises(ConfigError, match="max_resp_len"):
        build_manager("dapo", tokenizer=None, options={"overlong_buffer": {"enable": True, "len": 4}})


def test_secret_files_are_the_url_file_the_config_file_and_a_tls_key(tmp_path: Path) -> None:
    url_file, config = tmp_path / "url", tmp_path / "rewardq.yaml"
    url_file.write_text("rediss://:pw@host:6380/0?ssl_keyfile=/etc/rq/client.key&ssl_ca_certs=/etc/rq/ca.pem\n")
    config.write_text("namespace: x\n")
    cfg = WorkerConfig.load(config_file=str(config), env={"REWARDQ_REDIS_URL_FILE": str(url_file)})
    # no sandboxed program may read them (the CA certificate is no secret)
    assert cfg.secret_files() == (str(url_file), str(config), "/etc/rq/client.key")
    assert WorkerConfig.load(env={}).secret_files() == ()
