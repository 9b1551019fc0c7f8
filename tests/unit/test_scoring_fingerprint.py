"""The scoring fingerprint: stable across processes and paths, changed by each part that decides a reward."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from rewardq.config import WorkerConfig
from rewardq.queue.access import probe, worker_commands
from rewardq.reward.scoring_fingerprint import differences, scoring_fingerprint, shown_settings

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


def test_a_value_that_looks_like_a_credential_counts_with_its_real_value_and_is_shown_masked() -> None:
    key_one, key_two = "sk-proj-" + "a1" * 12, "sk-proj-" + "b2" * 12
    one = scoring_fingerprint(_cfg(manager_options={"extra_key": key_one, "url": "http://judge"}), TOK)
    two = scoring_fingerprint(_cfg(manager_options={"extra_key": key_two, "url": "http://judge"}), TOK)
    again = scoring_fingerprint(_cfg(manager_options={"extra_key": key_one, "url": "http://judge"}), TOK)
    # the digest counts the real value: another key is another configuration, the same key the same one
    assert one.digest != two.digest and one == again
    # and nothing shown holds the value: a keyed digest tells the two apart
    for fp in (one, two):
        assert key_one not in fp.text + str(fp.shown) and key_two not in fp.text + str(fp.shown)
        assert "masked=options.extra_key (masked: looks like a credential; its digest still counts)" in fp.text
    assert one.shown["options.extra_key"].startswith("*** <masked sha256:")
    assert one.shown["options.extra_key"] != two.shown["options.extra_key"]
    # a password in a URL: masked where shown, and each part of the URL counts
    pw = [scoring_fingerprint(_cfg(manager_options={"base_url": f"http://u:{p}@judge/v1"}), TOK) for p in "ab"]
    assert pw[0].digest != pw[1].digest and "http://u:***@judge/v1 <masked sha256:" in pw[0].text
    assert "masked=options.base_url" in pw[0].text and "http://u:a@" not in pw[0].text
    # a bearer token nested in a mapping, in reward-function kwargs
    bearer = [
        scoring_fingerprint(_cfg(reward_fn_kwargs={"headers": {"Authorization": f"Bearer {t * 20}"}}), TOK)
        for t in "xy"
    ]
    assert bearer[0].digest != bearer[1].digest and "masked=reward_kwargs.headers.Authorization" in bearer[0].text
    assert "x" * 20 not in bearer[0].text


@pytest.mark.parametrize(
    "first,second",
    [
        ("sk-strict-grading-mode-v2", "sk-lenient-grading-mode-v1"),
        ("bearer instructions-strict", "bearer instructions-lenient"),
    ],
)
def test_ordinary_values_of_a_credentials_form_still_tell_configurations_apart(first: str, second: str) -> None:
    one = scoring_fingerprint(_cfg(reward_fn_kwargs={"mode": first}), TOK)
    two = scoring_fingerprint(_cfg(reward_fn_kwargs={"mode": second}), TOK)
    assert one.digest != two.digest
    said = differences(one.shown, two.shown)
    assert (
        said.startswith("reward_kwargs.mode: ") and "(masked: looks like a credential; its digest still counts)" in said
    )
    assert first not in said + one.text and second not in said + two.text


def test_an_option_declared_a_credential_is_left_out_whatever_its_value() -> None:
    from tests.unit.test_manager_options import SPEC  # a manager declaring api_key secret

    one = scoring_fingerprint(_cfg(manager=SPEC, manager_options={"api_key": "plain-words", "rounds": 2}), TOK)
    two = scoring_fingerprint(_cfg(manager=SPEC, manager_options={"api_key": "sk-" + "z9" * 12, "rounds": 2}), TOK)
    assert one == two and "plain-words" not in one.text
    assert "secret=options.api_key (declared credentials: not counted)" in one.text and "masked=" not in one.text
    assert scoring_fingerprint(_cfg(manager=SPEC, manager_options={"api_key": "x", "rounds": 3}), TOK) != one


def test_the_shown_settings_mask_what_looks_like_a_credential_and_keep_the_rest() -> None:

    key = "sk-proj-" + "c3" * 12
    cfg = _cfg(manager_options={"base_url": "http://u:pw@judge/v1"}, reward_fn_kwargs={"token": key, "scale": 2})
    eff = shown_settings(cfg)
    assert key not in str(eff) and "pw@" not in str(eff)
    kwargs, options = eff["reward_fn_kwargs"], eff["manager_options"]
    assert isinstance(kwargs, dict) and isinstance(options, dict)
    assert kwargs["scale"] == 2 and kwargs["token"].startswith("*** <masked sha256:")
    assert options["base_url"].startswith("http://u:***@judge/v1 <masked sha256:")
    assert cfg.reward_fn_kwargs["token"] == key  # the worker itself keeps the real value


@pytest.mark.parametrize(
    "name,value",
    [
        ("max_tokens", 16),
        ("tokenizer", "/models/reward-model"),
        ("keyword_bonus", 1.0),
        ("api_key_env", "OTHER_JUDGE_KEY"),
        ("secret_sauce", "more"),
        ("auth_mode", "strict"),
        ("password_policy", 3),
    ],
)
def test_a_value_counts_whatever_its_name_says(name: str, value: object) -> None:
    base = scoring_fingerprint(_cfg(manager_options={name: 1024}, reward_fn_kwargs={name: 0.0}), TOK)
    options = scoring_fingerprint(_cfg(manager_options={name: value}, reward_fn_kwargs={name: 0.0}), TOK)
    kwargs = scoring_fingerprint(_cfg(manager_options={name: 1024}, reward_fn_kwargs={name: value}), TOK)
    assert len({base.digest, options.digest, kwargs.digest}) == 3
    assert "***" not in base.text + options.text + kwargs.text and "masked=" not in options.text


def test_ones_that_mean_the_same_count_the_same_and_a_file_counts_by_its_content(tmp_path: Path) -> None:
    assert scoring_fingerprint(_cfg(reward_fn_kwargs={"bonus": 1}), TOK) == scoring_fingerprint(
        _cfg(reward_fn_kwargs={"bonus": 1.0}), TOK
    )
    a, b = tmp_path / "a" / "rubric.txt", tmp_path / "b" / "rubric.txt"
    for p in (a, b):
        p.parent.mkdir()
        p.write_text("Give a score from 0 to 10. {format_instructions}")
    here = scoring_fingerprint(_cfg(manager_options={"prompt_template_path": str(a)}), TOK)
    there = scoring_fingerprint(_cfg(manager_options={"prompt_template_path": str(b)}), TOK)
    assert here == there and str(tmp_path) not in here.text and "rubric.txt@sha256=" in here.text
    b.write_text("Give a score from 0 to 1. {format_instructions}")  # the same path, another rubric
    assert scoring_fingerprint(_cfg(manager_options={"prompt_template_path": str(b)}), TOK) != there


def test_a_long_value_counts_whole_and_is_shown_short() -> None:
    rubric = "Grade strictly. " * 200
    one = scoring_fingerprint(_cfg(manager_options={"prompt_template": rubric, "max_tokens": 16}), TOK)
    two = scoring_fingerprint(_cfg(manager_options={"prompt_template": rubric + "!", "max_tokens": 16}), TOK)
    assert one.digest != two.digest and len(one.text) < 400 and f"<{len(rubric)} chars sha256=" in one.text
    assert one.shown["options.max_tokens"] == "16"


def test_a_conflict_names_what_differs() -> None:
    one = scoring_fingerprint(_cfg(reward_fn_kwargs={"keyword_bonus": 0.0, "scale": 2}), TOK)
    two = scoring_fingerprint(_cfg(reward_fn_kwargs={"keyword_bonus": 1.5, "scale": 2}), TOK)
    assert differences(one.shown, two.shown) == "reward_kwargs.keyword_bonus: 1.5 here, 0 recorded"
    assert differences(one.shown, one.shown) == ""
    three = scoring_fingerprint(_cfg(manager="dapo", reward_fn_kwargs={"scale": 2}), TOK)
    assert differences(one.shown, three.shown) == (
        "manager: dapo here, naive recorded; reward_kwargs.keyword_bonus: (unset) here, 0 recorded"
    )


#: Options of the built-in managers declared credentials (``secret=True``), left out of the digest.
#: None today: genrm takes its key from the environment (``api_key_env`` names the variable).
CREDENTIAL_OPTIONS: frozenset[str] = frozenset()


def _declared_options() -> list[tuple[str, str, object]]:
    """``(manager, option, default)`` for every option every built-in manager declares, and the
    code-execution options every manager takes."""
    import importlib
    import inspect

    from rewardq.reward.codeexec.settings import CodeExecSettings
    from rewardq.reward.factory import accepted_options
    from rewardq.reward.registry import BUILTIN_NAMES, get_manager_class

    out = []
    for name in sorted(set(BUILTIN_NAMES) - {"limited"}):  # an alias of rate_limited
        cls = get_manager_class(name)
        params = inspect.signature(cls).parameters
        names, _ = accepted_options(cls)
        names |= set(getattr(importlib.import_module(cls.__module__), "_EXTRA_OPTIONS", []))  # disrm's tokenizer
        for option in sorted(names):
            default = params[option].default if option in params else None
            out.append((name, option, None if default is inspect.Parameter.empty else default))
    for f in dataclasses.fields(CodeExecSettings):
        out.append(("any", f.name, f.default))
    return out


def _declared_secrets() -> frozenset[str]:
    """Every option a built-in manager (or the code-execution settings) declares a credential."""
    from rewardq.reward.codeexec.settings import CodeExecSettings
    from rewardq.reward.options import secret_option_names
    from rewardq.reward.registry import BUILTIN_NAMES, options_of

    found = set(secret_option_names(CodeExecSettings))
    for name in BUILTIN_NAMES:
        found |= secret_option_names(options_of(name))
    return frozenset(found)


def _another(value: object) -> object:
    """A value of the same kind as ``value`` that is not equal to it."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value * 2 + 3
    if isinstance(value, str):
        return value + "-other"
    if isinstance(value, dict):
        return {**value, "other": 1}
    return "other"


def test_every_declared_option_of_every_built_in_manager_moves_the_digest() -> None:
    declared = _declared_options()
    assert len(declared) > 60 and {"genrm", "disrm", "dapo", "rate_limited", "remote", "gdpo"} <= {
        m for m, _, _ in declared
    }
    # the named list is every option a built-in manager declares a credential, no more, no less
    assert _declared_secrets() == CREDENTIAL_OPTIONS
    unmoved = []
    for manager, option, default in declared:
        if option in CREDENTIAL_OPTIONS:
            continue
        first = default if default is not None else "/models/a" if option == "tokenizer" else 7
        spec = manager if manager != "any" else "naive"
        unset = scoring_fingerprint(_cfg(manager=spec), TOK).digest
        # another value of its kind, and (for text) two values of an API key's form
        others = [_another(first)] + (["sk-" + "a1" * 10, "sk-" + "b2" * 10] if isinstance(first, str) else [])
        digests = {unset} | {
            scoring_fingerprint(_cfg(manager=spec, manager_options={option: v}), TOK).digest for v in [first, *others]
        }
        if len(digests) != 2 + len(others):
            unmoved.append(f"{manager}.{option}")
    assert unmoved == [], f"options that do not move the fingerprint: {unmoved}"


def test_every_command_the_worker_sends_has_a_harmless_probe() -> None:
    commands = worker_commands()
    assert {"EVALSHA", "XCLAIM", "XREADGROUP", "HSET", "SCRIPT LOAD", "RENAME", "ZRANGEBYSCORE"} <= set(commands)
    for command in commands:
        args = probe(command, "k:a", "k:b", "k:h", "k:z", group="g")
        assert " ".join(str(a) for a in args).upper().startswith(command), (command, args)
