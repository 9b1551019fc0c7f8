"""Manager options declared like settings (rewardq.reward.options): one declaration each, checked in
one place, shown by ``rewardq config`` with their source, and counted by the fingerprint."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from rewardq.config import WorkerConfig
from rewardq.errors import ConfigError
from rewardq.ops.worker import config_rows
from rewardq.reward.base import RewardManager
from rewardq.reward.codeexec.settings import CodeExecSettings
from rewardq.reward.factory import accepted_options
from rewardq.reward.managers.disrm import DisRMRewardManager
from rewardq.reward.managers.disrm_options import DisRMOptions
from rewardq.reward.managers.genrm import GenRMRewardManager
from rewardq.reward.managers.genrm_options import GenRMOptions
from rewardq.reward.options import (
    SECRET_SHOWN,
    ManagerOptions,
    option,
    option_rows,
    options_class,
    secret_option_names,
)
from rewardq.reward.registry import BUILTIN_NAMES, BUILTIN_OPTIONS, get_manager_class, options_of
from rewardq.reward.scoring_fingerprint import scoring_fingerprint
from tests.support.cli_procs import REPO


@dataclass(frozen=True)
class KeyedOptions(ManagerOptions):
    manager: ClassVar[str] = "keyed"

    api_key: str | None = option(None, "A credential.", secret=True)
    rounds: int = option(3, "How many rounds.", minimum=1)


class KeyedManager(RewardManager):
    """A manager with a credential option, named by module path in the tests below."""

    Options = KeyedOptions


SPEC = f"{__name__}:KeyedManager"


def test_values_are_parsed_as_declared_and_unknown_options_name_the_known_ones() -> None:
    o = DisRMOptions.from_mapping({"timeout": "12.5", "backend": "sglang"})
    assert (o.timeout, o.backend, o.model) == (12.5, "sglang", None)
    assert o.given() == {"timeout": 12.5, "backend": "sglang"}
    with pytest.raises(ConfigError, match=r"manager 'disrm' does not take option 'retries'; it takes \[.*'timeout'"):
        DisRMOptions.from_mapping({"retries": 3})


@pytest.mark.parametrize(
    "given,match",
    [
        ({"timeout": 0}, r"manager 'disrm': timeout must be a positive number, got 0"),
        ({"timeout": "soon"}, r"manager 'disrm': timeout='soon' is not a valid float"),
        ({"timeout": True}, r"manager 'disrm': timeout must be a float"),
        ({"backend": "trtllm"}, r"manager 'disrm': backend must be vllm or sglang, got 'trtllm'"),
    ],
)
def test_a_value_out_of_its_declaration_is_refused_naming_manager_and_option(
    given: dict[str, object], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        DisRMOptions.from_mapping(given)


def test_the_factory_takes_the_declared_options_as_the_accepted_ones() -> None:
    assert accepted_options(DisRMRewardManager) == (set(DisRMOptions.declared()), False)


def test_rewardq_config_lists_every_option_of_the_manager_with_its_source() -> None:
    cfg = WorkerConfig.load(
        env={"REWARDQ_MANAGER_OPTIONS": '{"base_url": "http://h:1", "timeout": "7"}'}, overrides={"manager": "disrm"}
    )
    rows = {r["name"]: r for r in config_rows(cfg) if r["name"].startswith("manager_options.")}
    # disrm's own options, then the code-execution options every manager takes
    assert set(rows) == {f"manager_options.{n}" for n in [*DisRMOptions.declared(), *CodeExecSettings.declared()]}
    assert rows["manager_options.timeout"]["value"] == 7.0  # parsed as declared
    assert rows["manager_options.timeout"]["source"] == "env REWARDQ_MANAGER_OPTIONS"
    assert (rows["manager_options.backend"]["value"], rows["manager_options.backend"]["source"]) == ("vllm", "default")


def test_each_option_names_the_layer_that_set_it(tmp_path: Path) -> None:
    # Given genrm's options from a config file, the environment and a flag, one option each
    file = tmp_path / "c.yaml"
    file.write_text("manager_options:\n  max_tokens: 64\n  temperature: 0.1\n")
    cfg = WorkerConfig.load(
        config_file=str(file),
        env={"REWARDQ_MANAGER_OPTIONS": '{"temperature": 0.5}'},
        overrides={
            "manager": ("genrm", "flag --manager"),
            "manager_options": ({"base_url": "http://u:pw@judge/v1"}, "flag --manager-option"),
        },
    )
    rows = {r["name"]: r for r in config_rows(cfg)}
    # Then each option says where its value came from: the highest layer that set it
    assert rows["manager_options.max_tokens"]["source"] == f"file {file}"
    assert rows["manager_options.temperature"]["source"] == "env REWARDQ_MANAGER_OPTIONS"
    assert rows["manager_options.base_url"]["source"] == "flag --manager-option"
    assert rows["manager_options.seed"]["source"] == "default"
    # And the merged setting names every layer, with the URL's password masked wherever it is shown
    assert rows["manager_options"]["source"] == f"file {file} + env REWARDQ_MANAGER_OPTIONS + flag --manager-option"
    assert "pw" not in str(rows["manager_options"]["value"]) and "pw" not in str(rows["manager_options.base_url"])


def test_a_credential_option_shows_and_counts_as_masked_whatever_its_value() -> None:
    assert secret_option_names(KeyedOptions) == {"api_key"} and secret_option_names(None) == frozenset()
    rows = {r["name"]: r for r in option_rows(KeyedOptions, {"api_key": "plain-words"}, "flag --manager-option")}
    assert rows["manager_options.api_key"]["value"] == SECRET_SHOWN
    assert rows["manager_options.rounds"] == {
        "name": "manager_options.rounds",
        "value": 3,
        "source": "default",
        "help": "How many rounds.",
    }
    # the fingerprint: two keys that no value pattern recognises count alike, and neither is shown
    one = WorkerConfig.load(env={}, overrides={"manager": SPEC, "manager_options": {"api_key": "plain-words"}})
    two = WorkerConfig.load(env={}, overrides={"manager": SPEC, "manager_options": {"api_key": "other-words"}})
    a, b = scoring_fingerprint(one, None), scoring_fingerprint(two, None)
    assert a.digest == b.digest and "plain-words" not in a.text and "secret=options.api_key" in a.text


def test_options_made_directly_are_checked_against_the_same_declarations() -> None:
    with pytest.raises(ConfigError, match=r"^sandbox_fusion_max_concurrent must be a positive integer, got 0"):
        CodeExecSettings(sandbox_fusion_max_concurrent=0)
    with pytest.raises(ConfigError, match=r"^manager 'disrm': timeout must be a positive number, got -1"):
        DisRMOptions(timeout=-1)
    with pytest.raises(ConfigError, match=r"^manager 'keyed': rounds must be an integer >= 1, got 0"):
        KeyedOptions(rounds=0)


def test_genrm_takes_one_typed_options_object_built_from_its_declarations() -> None:
    assert accepted_options(GenRMRewardManager) == (set(GenRMOptions.declared()), False)
    o = GenRMOptions.from_mapping(
        {"base_url": "http://h:1/v1", "model": "j", "n": "3", "structured_output": True, "score_parser": "json"}
    )
    m = GenRMRewardManager(None, options=o)  # type: ignore[arg-type]  # a judge decodes nothing here
    assert (m.n, m.structured_required, m.options is o) == (3, True, True)
    with pytest.raises(ConfigError, match=r"^manager 'genrm': max_answer_bytes must be an integer >= 1024, got 10"):
        GenRMOptions.from_mapping({"max_answer_bytes": 10})


def test_the_built_in_declarations_are_found_without_importing_their_managers() -> None:
    # rewardq config and the fingerprint read BUILTIN_OPTIONS (modules without torch); each entry is
    # the very class its manager takes, and every built-in manager that declares options is listed
    for name in BUILTIN_NAMES:
        declared = options_class(get_manager_class(name))
        assert options_of(name) is declared, name
    assert set(BUILTIN_OPTIONS) == {"genrm", "disrm"}
    for where in BUILTIN_OPTIONS.values():
        tree = ast.parse((REPO / (where.partition(":")[0].replace(".", "/") + ".py")).read_text())
        imported = {
            n.module if isinstance(n, ast.ImportFrom) else a.name
            for n in ast.walk(tree)
            if isinstance(n, (ast.Import, ast.ImportFrom))
            for a in n.names
        }
        roots = {str(m).split(".")[0] for m in imported}
        assert roots <= {"rewardq", "__future__", "dataclasses", "typing"}, imported
        assert not any(str(m).startswith("rewardq.reward.managers.") for m in imported), imported
