"""One declaration per setting: flags, environment, config file, ``--help`` and ``rewardq config``
all come from :class:`rewardq.config.WorkerConfig`'s declarations.

Given every declared setting, each one is a flag, a ``REWARDQ_*`` variable and a config-file key
that reach the same value, its ``--help`` line shows its default and variable, and ``rewardq
config`` names where its value came from. And a setting declared in ``config.py`` alone (in a
copy of the package) shows up in all of them, and in a starting worker's ``effective config``.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from rewardq.adapter_settings import AdapterSettings
from rewardq.cli import cli, worker
from rewardq.config import ADAPTER_KEYS, WorkerConfig
from rewardq.errors import ConfigError
from rewardq.ops.worker import config_rows, load_config, worker_argv
from rewardq.queue.connection import REDIS_URL
from rewardq.queue.keys import DEAD_LETTER_BYTES, DEAD_LETTER_TTL
from rewardq.queue.results import RESULT_TTL
from rewardq.reward.codeexec.settings import CodeExecSettings
from rewardq.reward.registry import BUILTIN_NAMES, ENTRY_POINT_GROUP, known_managers, listed_managers
from rewardq.settings import NONE_GIVEN, Setting, flag_values
from tests.support.entry_points import installed_entry_points
from tests.support.seqpo_simt import ENTRY_POINT

REPO = Path(__file__).resolve().parents[2]
SETTINGS = WorkerConfig.settings()
#: redis_url_file is read when the config loads: its sample value must name a real file
URL_FILE = Path(tempfile.mkdtemp(prefix="rewardq-settings-")) / "redis-url"
URL_FILE.write_text("redis://127.0.0.1:6399/0\n")


def sample(s: Setting) -> Any:
    """A valid value of ``s`` that is not its default."""
    if s.kind is bool:
        return not s.default
    if s.spec.choices:
        return next(c for c in s.spec.choices if c != s.default)
    if s.kind is int:
        return s.default + 1 if isinstance(s.default, int) else 3
    if s.kind is float:
        return s.default + 1.5 if isinstance(s.default, (int, float)) else 7.5
    if s.kind is dict:
        return {"k": 1, "nested": {"x": "y"}}
    if s.name == "redis_url_file":
        return str(URL_FILE)
    return f"x-{s.name}"


def as_text(s: Setting, value: Any) -> str:
    """``value`` as an environment variable or flag spells it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, dict) else str(value)


def as_flags(s: Setting, value: Any) -> list[str]:
    if s.kind is bool:
        return [s.flag if value else "--no-" + s.flag[2:]]
    if s.spec.pairs:
        return [s.flag, "k=1", s.flag, "nested.x=y"]
    return [s.flag, as_text(s, value)]


def parsed(argv: list[str]) -> dict[str, Any]:
    return dict(worker.make_context("worker", list(argv)).params)


def test_every_setting_has_a_flag_an_env_var_and_a_config_key() -> None:
    assert len(SETTINGS) >= 33
    for name, s in SETTINGS.items():
        assert s.env == "REWARDQ_" + name.upper() and s.key == name
        assert s.flag.startswith("--") and s.spec.help.strip()
    flags = [s.flag for s in SETTINGS.values()]
    assert len(set(flags)) == len(flags)
    # shutdown_grace and the four others that once had no flag
    for name in ("shutdown_grace", "lease_seconds", "heartbeat_interval", "maintenance_interval", "max_record_bytes"):
        assert parsed([SETTINGS[name].flag, "9"])[name] == 9


@pytest.mark.parametrize("name", list(SETTINGS))
def test_flag_env_and_file_reach_the_same_value_and_name_their_source(name: Any, tmp_path: Path) -> None:
    s = SETTINGS[name]
    value = sample(s)
    # Given the value as a flag, an environment variable and a config-file key
    by_flag = load_config(parsed(as_flags(s, value)), env={})
    by_env = WorkerConfig.load(env={s.env: as_text(s, value)})
    f = tmp_path / "rq.yaml"
    f.write_text(yaml.safe_dump({s.key: value}))
    by_file = WorkerConfig.load(config_file=str(f), env={})
    # Then each layer set it to the same value, and says where it came from
    for cfg in (by_flag, by_env, by_file):
        assert getattr(cfg, name) == value != s.default
    assert by_flag.sources[name] == f"flag {s.flag}"
    assert by_env.sources[name] == f"env {s.env}"
    assert by_file.sources[name] == f"file {f}"
    # (redis_url_file sets redis_url too, by design: from the file it names)
    derived = {"redis_url_file": {"redis_url": f"redis_url_file {value}"}}.get(name, {})
    # (a merged dict's keys are sourced one by one, as <setting>.<key>: each from that same layer)
    keys = {n: src for n, src in by_env.sources.items() if n.startswith(f"{name}.")}
    assert all(src == f"env {s.env}" for src in keys.values()), keys
    assert all(src == derived.get(n, "default") for n, src in by_env.sources.items() if n != name and n not in keys)


def test_precedence_is_flags_over_env_over_file(tmp_path: Path) -> None:
    f = tmp_path / "rq.yaml"
    f.write_text("concurrency: 3\nbatch_size: 7\nclaim_idle: 9\nmanager_options: {a: 1, b: 1}\n")
    env = {"REWARDQ_BATCH_SIZE": "8", "REWARDQ_CLAIM_IDLE": "10", "REWARDQ_MANAGER_OPTIONS": '{"b": 2, "c": 2}'}
    params = {**parsed(["--claim-idle", "11", "--manager-option", "c=3"]), "config": str(f)}
    cfg = load_config(params, env=env)
    assert (cfg.concurrency, cfg.batch_size, cfg.claim_idle) == (3, 8, 11.0)
    assert cfg.manager_options == {"a": 1, "b": 2, "c": 3}  # option dicts merge key by key
    assert cfg.sources["manager_options"] == f"file {f} + env REWARDQ_MANAGER_OPTIONS + flag --manager-option"
    rows = {r["name"]: r for r in config_rows(cfg)}
    # every setting, then the manager's options (naive declares none: the ones given, as merged), then
    # the code-execution options every manager takes
    code = {f"manager_options.{n}" for n in CodeExecSettings.declared()}
    assert set(rows) == set(SETTINGS) | {"manager_options.a", "manager_options.b", "manager_options.c"} | code
    assert rows["manager_options.c"]["value"] == 3
    # each option from the layer that set it last
    sources = {k: rows[f"manager_options.{k}"]["source"] for k in "abc"}
    assert sources == {"a": f"file {f}", "b": "env REWARDQ_MANAGER_OPTIONS", "c": "flag --manager-option"}
    assert rows["claim_idle"] == {
        "name": "claim_idle",
        "value": 11.0,
        "source": "flag --claim-idle",
        "flag": "--claim-idle",
        "env": "REWARDQ_CLAIM_IDLE",
    }


def test_optional_settings_take_none_from_every_layer(tmp_path: Path) -> None:
    f = tmp_path / "rq.yaml"
    f.write_text("connect_timeout: 5\nscorer_processes: 2\n")
    cfg = load_config(
        {**parsed(["--connect-timeout", "none"]), "config": str(f)}, env={"REWARDQ_SCORER_PROCESSES": "null"}
    )
    assert cfg.connect_timeout is None and cfg.sources["connect_timeout"] == "flag --connect-timeout"
    assert cfg.scorer_processes is None and cfg.sources["scorer_processes"] == "env REWARDQ_SCORER_PROCESSES"
    assert parsed(["--metrics-port", "none"])["metrics_port"] is NONE_GIVEN


@pytest.mark.parametrize(
    "argv,env,match",
    [
        (["--concurrency", "0"], {}, r"concurrency must be a positive integer, got 0 \(from flag --concurrency\)"),
        ([], {"REWARDQ_RESULT_TTL": "-1"}, r"result_ttl must be a non-negative number, got -1.0 \(from env"),
        (["--max-outputs", "2000000"], {}, "max_outputs must be an integer from 1 to 1e[+]06, got 2000000.*Lua"),
        ([], {"REWARDQ_LOG_LEVEL": "loud"}, "log_level must be DEBUG, INFO, WARNING, ERROR or CRITICAL, got 'loud'"),
        ([], {"REWARDQ_SHUTDOWN_GRACE": "soon"}, "REWARDQ_SHUTDOWN_GRACE='soon' is not a valid float"),
        (["--reward-kwargs", "[1]"], {}, "--reward-kwargs must be a JSON object, got list"),
        (["--manager-option", "oops"], {}, "--manager-option 'oops' is not KEY=VALUE"),
    ],
)
def test_bad_values_name_the_setting_and_where_they_came_from(argv: Any, env: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(parsed(argv), env=env)


def test_choices_are_stored_as_declared_from_any_layer(tmp_path: Path) -> None:
    f = tmp_path / "rq.yaml"
    f.write_text("log_level: warning\n")
    assert WorkerConfig.load(config_file=str(f), env={}).log_level == "WARNING"
    assert load_config(parsed(["--log-level", "debug"]), env={}).log_level == "DEBUG"


def test_worker_help_shows_every_flag_with_its_default_and_variable() -> None:
    # Given the real command's --help, wide enough that click wraps no line
    out = CliRunner().invoke(cli, ["worker", "--help"], terminal_width=400).output
    lines = out.splitlines()
    for s in SETTINGS.values():
        at = next((i for i, x in enumerate(lines) if re.match(rf"\s*{re.escape(s.flag)}[ ,/]", x)), None)
        assert at is not None, f"{s.flag} missing from --help"
        line = " ".join(lines[at : at + 2])  # a long option column puts the help on the next line
        assert f"[default: {s.default_text()}; env: {s.env}]" in line, line
    assert "[default: 32; env: REWARDQ_CONCURRENCY]" in out
    assert "[default: 30; env: REWARDQ_SHUTDOWN_GRACE]" in out
    assert "[default: forever; env: REWARDQ_CONNECT_TIMEOUT]" in out


def test_manager_help_lists_every_manager_including_entry_points(tmp_path: Path) -> None:
    with installed_entry_points(tmp_path, ENTRY_POINT_GROUP, ENTRY_POINT):
        out = CliRunner().invoke(cli, ["worker", "--help"], terminal_width=400).output
        every = set(known_managers()), set(listed_managers())
    line = next(x for x in out.splitlines() if x.strip().startswith("--manager "))
    listed = re.search(r"One of: ([^;]+);", line)
    assert listed is not None, line
    names = [n.strip() for n in listed.group(1).split(",")]
    assert "seqpo_simt" in names  # an entry-point manager (an installed package's rewardq.managers group)
    assert every == (set(names), set(names))


def test_the_wheel_ships_no_example_manager() -> None:
    """The example (tests/support/seqpo_simt) is the tests': no module of the package and no entry
    point of rewardq's own names it."""
    assert f'[project.entry-points."{ENTRY_POINT_GROUP}"]' not in (REPO / "pyproject.toml").read_text()
    assert not [p for p in (REPO / "rewardq").rglob("*") if "example" in p.name or "simt" in p.name]


def test_builtin_names_are_what_the_builtin_managers_register() -> None:
    from rewardq.reward import registry

    registry._load_builtins()
    builtin = {n for n, cls in registry._REGISTRY.items() if cls.__module__ in registry.BUILTIN_MODULES}
    assert builtin == set(BUILTIN_NAMES)


def test_supervisor_children_get_the_given_flags_back() -> None:
    argv = ["--concurrency", "4", "--no-cluster", "--manager-option", "a=1", "--scorer-processes", "none"]
    params = parsed([*argv, "--name", "w", "--metrics-port", "9100"])
    assert worker_argv(params, leave_out=("name", "metrics_port")) == [
        "--no-cluster",
        "--manager-option",
        "a=1",
        "--scorer-processes",
        "none",
        "--concurrency",
        "4",
    ]
    assert flag_values(WorkerConfig, parsed(worker_argv(params))) == flag_values(WorkerConfig, params)


def test_rewardq_config_prints_each_value_and_its_source(tmp_path: Path) -> None:
    f = tmp_path / "rq.yaml"
    f.write_text("concurrency: 3\n")
    r = CliRunner().invoke(
        cli,
        ["config", "--config", str(f), "--batch-size", "9", "--json"],
        env={"REWARDQ_REDIS_URL": "redis://u:hunter2@h:1/0", "REWARDQ_SHUTDOWN_GRACE": "12"},
    )
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    assert set(rows) == set(SETTINGS) | {f"manager_options.{n}" for n in CodeExecSettings.declared()}
    assert rows["concurrency"]["value"] == 3 and rows["concurrency"]["source"] == f"file {f}"
    assert rows["batch_size"]["source"] == "flag --batch-size"
    assert rows["shutdown_grace"]["value"] == 12.0 and rows["shutdown_grace"]["source"] == "env REWARDQ_SHUTDOWN_GRACE"
    assert rows["redis_url"]["value"] == "redis://u:***@h:1/0" and "hunter2" not in r.output
    assert rows["result_ttl"] == {**rows["result_ttl"], "value": RESULT_TTL, "source": "default"}
    text = CliRunner().invoke(cli, ["config"], env={"REWARDQ_MAX_CRASHES": "4"}).output
    assert re.search(r"^max_crashes +4 +\(env REWARDQ_MAX_CRASHES\)$", text, re.M), text


def test_broker_arguments_come_from_the_declarations() -> None:
    cfg = WorkerConfig(result_ttl=5.0, keep_records=2.0)
    assert cfg.arguments_for("broker") == {
        "lease_seconds": cfg.lease_seconds,
        "incomplete_timeout": cfg.incomplete_timeout,
        "result_ttl": 5.0,
        "keep_records": 2.0,
        "dead_letter_bytes": DEAD_LETTER_BYTES,
        "dead_letter_ttl": DEAD_LETTER_TTL,
        "max_trajectory_bytes": cfg.max_trajectory_bytes,
        "max_record_bytes": cfg.max_record_bytes,
        "max_result_bytes": cfg.max_result_bytes,
        "max_outputs": cfg.max_outputs,
    }


# -- the verl adapter's settings share the worker's declarations ---------------------------------


def test_the_adapter_reads_the_workers_declarations_and_its_own() -> None:
    adapter, worker_settings = AdapterSettings.settings(), WorkerConfig.settings()
    for name in ("redis_url", "namespace", "cluster"):
        assert adapter[name].spec is worker_settings[name].spec and adapter[name].env == worker_settings[name].env
    assert (adapter["timeout"].key, adapter["timeout"].env) == ("verl_timeout", "REWARDQ_VERL_TIMEOUT")
    # fleet: the Ray fleet block the adapter starts (rewardq.integrations.verl.fleet), read by the adapter only
    assert ADAPTER_KEYS == {"verl_timeout", "verl_on_error", "verl_max_error_rate", "verl_error_window", "fleet"}
    # and the keys written out in rewardq.config are the adapter's declarations beyond the worker's
    assert ADAPTER_KEYS - {"fleet"} == {s.key for s in adapter.values()} - {s.key for s in worker_settings.values()}


def test_adapter_settings_block_then_environment() -> None:
    block = {"namespace": "cfg-ns", "verl_timeout": 30, "verl_on_error": "RAISE", "cluster": "false", "other": 1}
    s = AdapterSettings.load(block, {"REWARDQ_NAMESPACE": "env-ns", "REWARDQ_REDIS_URL": ""})
    assert (s.redis_url, s.namespace, s.cluster, s.timeout, s.on_error) == (
        REDIS_URL,  # an empty variable counts as unset
        "env-ns",
        False,
        30.0,
        "raise",
    )
    assert s.sources == {
        "namespace": "env REWARDQ_NAMESPACE",
        "timeout": "rewardq config verl_timeout",
        "on_error": "rewardq config verl_on_error",
        "cluster": "rewardq config cluster",
    }


@pytest.mark.parametrize(
    ("block", "env", "match"),
    [
        (
            {},
            {"REWARDQ_VERL_ON_ERROR": "ignore"},
            "verl_on_error must be mask, zero or raise, got 'ignore'.*stops the run",
        ),
        (
            {"verl_timeout": 0},
            {},
            r"verl_timeout must be a positive number, got 0.0 \(from rewardq config verl_timeout",
        ),
        ({"verl_timeout": "soon"}, {}, "verl_timeout='soon' is not a valid float"),
        ({"cluster": "maybe"}, {}, "cluster='maybe' is not a valid bool"),
        ({"namespace": " "}, {}, "namespace must be a non-empty string"),
    ],
)
def test_bad_adapter_settings_name_the_key(block: dict[str, Any], env: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        AdapterSettings.load(block, env)
