"""The provenance book: one interned blob per scorer, looked up, never rebuilt per trajectory."""

from __future__ import annotations

from rewardq.reward.base import ManagerContext
from rewardq.reward.codeexec.settings import CodeExecSettings
from rewardq.reward.managers.naive import NaiveRewardManager
from rewardq.reward.provenance import ProvenanceBook, intern
from tests.support.records import TOK


def book(manager: NaiveRewardManager, **kw: object) -> ProvenanceBook:
    settings: dict[str, object] = dict(
        manager_spec="naive", scoring="f" * 16, reward_fn=None, custom=False, version="9"
    )
    return ProvenanceBook(manager, **{**settings, **kw})  # type: ignore[arg-type]  # keyword arguments of mixed types


def test_each_data_source_gets_its_default_scorer_once() -> None:
    b = book(NaiveRewardManager(TOK))
    gsm = b.of("openai/gsm8k")
    assert b.of("openai/gsm8k") is gsm  # looked up: the same object, nothing built again
    assert gsm.blob == {"scoring": "f" * 16, "rewardq_version": "9", "manager": "naive", "scorer": "default:gsm8k"}
    assert b.of("lighteval/MATH").blob["scorer"] == "default:math_boxed"
    assert b.of("nobody-knows").blob["scorer"] == "default:none"
    assert len({b.of(d).digest for d in ("openai/gsm8k", "lighteval/MATH", "aime24")}) == 3
    assert gsm.digest == intern(dict(gsm.blob)).digest and len(gsm.digest) == 16


def test_code_data_sources_name_their_isolation() -> None:
    local = book(NaiveRewardManager(TOK, context=ManagerContext(code=CodeExecSettings(code_local_isolation="rlimits"))))
    assert local.of("apps").blob["isolation"] == "local:rlimits" and local.of("apps").blob["scorer"] == "default:code"
    fusion = CodeExecSettings(sandbox_fusion_url="http://127.0.0.1:1/run_code")
    assert book(NaiveRewardManager(TOK, context=ManagerContext(code=fusion))).of("taco").blob["isolation"] == (
        "sandbox_fusion"
    )
    assert "isolation" not in local.of("openai/gsm8k").blob


def test_a_reward_function_or_a_custom_manager_is_the_scorer_by_its_content(tmp_path: object) -> None:
    from pathlib import Path

    fn = Path(str(tmp_path)) / "rf.py"
    fn.write_text("def compute_score(**kw):\n    return 1.0\n")
    with_fn = book(NaiveRewardManager(TOK), reward_fn=str(fn)).of("openai/gsm8k").blob["scorer"]
    assert with_fn.startswith("reward_fn:rf.py:compute_score@sha256=")
    fn.write_text("def compute_score(**kw):\n    return 0.0\n")
    assert book(NaiveRewardManager(TOK), reward_fn=str(fn)).of("openai/gsm8k").blob["scorer"] != with_fn
    custom = book(NaiveRewardManager(TOK), manager_spec="tests.support.managers:LengthManager", custom=True)
    assert custom.of("x").blob["scorer"].startswith("manager:tests.support.managers:LengthManager@sha256=")
