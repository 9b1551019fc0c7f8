"""The scoring fingerprint: stable across processes and paths, changed by each part that decides a reward."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from rewardq.config import WorkerConfig
from rewardq.queue.access import probe, worker_commands
from rewardq.reward.scoring_fingerprint import scoring_fingerprint

REPO = Path(__file__).resolve().parents[2]
TOK = "sha256=0123456789abcdef vocab=2933 name=/models/a"


def _cfg(**kw: object) -> WorkerConfig:
    return WorkerConfig(tokenizer="builtin:demo", **kw)  # type: ignore[arg-type]


def _reward_file(folder: Path, body: str = "return 1.0") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "reward.py"
    path.write_text(f"def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    {body}\n")
    return path


def test_same_config_same_fingerprint_whatever_differs_between_processes_of_one_fleet(tmp_path: Path) -> None:
    a = _reward_file(tmp_path / "node-a")
    b = _reward_file(tmp_path / "node-b")  # the same file in another folder (a Ray worker's own copy)
    one = scoring_fingerprint(_cfg(reward_fn=str(a), name="w1", metrics_port=9001, namespace="x"), TOK)
    two = scoring_fingerprint(_cfg(reward_fn=f"{b}:compute_score", name="w2", metrics_port=9002, namespace="x"), TOK)
    # the tokenizer's name is a path: another path is the same vocabulary
    three = scoring_fingerprint(_cfg(reward_fn=str(a), concurrency=3), TOK.replace("/models/a", "/mnt/b"))
    assert one == two == three
    assert str(tmp_path) not in one.text and "w1" not in one.text


@pytest.mark.parametrize(
    "change",
    [
        {"manager": "dapo"},
        {"manager_options": {"max_resp_len": 8}},
        {"reward_fn_kwargs": {"scale": 2}},
        {"reward_fn": "rewardq.reward.scoring.gsm8k:compute_score"},
    ],
)
def test_each_part_changes_it(change: dict[str, Any]) -> None:
    base = scoring_fingerprint(_cfg(), TOK)
    other = scoring_fingerprint(dataclasses.replace(_cfg(), **change), TOK)
    assert other.digest != base.digest
    key = next(iter(change))
    shown = {"manager": "manager=dapo", "manager_options": "max_resp_len", "reward_fn_kwargs": "scale"}
    assert shown.get(key, "gsm8k") in other.text, other.text


def test_reward_file_content_function_name_and_tokenizer_change_it(tmp_path: Path) -> None:
    path = _reward_file(tmp_path)
    before = scoring_fingerprint(_cfg(reward_fn=str(path)), TOK)
    assert "reward.py:compute_score@sha256=" in before.text
    assert scoring_fingerprint(_cfg(reward_fn=f"{path}:other"), TOK).digest != before.digest
    other_vocab = TOK.replace("0123456789abcdef", "fedcba9876543210")
    assert scoring_fingerprint(_cfg(reward_fn=str(path)), other_vocab).digest != before.digest
    assert scoring_fingerprint(_cfg(reward_fn=str(path)), None).digest != before.digest
    _reward_file(tmp_path, body="return 0.5")  # the same path, new content
    assert scoring_fingerprint(_cfg(reward_fn=str(path)), TOK).digest != before.digest


def test_secrets_are_masked_and_do_not_change_it() -> None:
    one = scoring_fingerprint(_cfg(manager_options={"api_key": "sk-one", "url": "http://judge"}), TOK)
    two = scoring_fingerprint(_cfg(manager_options={"api_key": "sk-two", "url": "http://judge"}), TOK)
    assert one == two
    assert "sk-one" not in one.text and '"api_key":"***"' in one.text
    assert scoring_fingerprint(_cfg(manager_options={"api_key": "k", "url": "http://other"}), TOK) != one


def test_every_command_the_worker_sends_has_a_harmless_probe() -> None:
    commands = worker_commands()
    assert {"EVALSHA", "XCLAIM", "XREADGROUP", "HSET", "SCRIPT LOAD", "RENAME", "ZRANGEBYSCORE"} <= set(commands)
    for command in commands:
        args = probe(command, "k:a", "k:b", "k:h", "k:z", group="g")
        assert " ".join(str(a) for a in args).upper().startswith(command), (command, args)
