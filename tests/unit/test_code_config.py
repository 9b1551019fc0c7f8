"""Code-execution configuration and reporting: options through the factory into the context,
validation, counters in the heartbeat, ``rewardq status`` and ``/metrics``. No processes."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from prometheus_client import generate_latest

from rewardq.consumers.metrics import WorkerMetrics
from rewardq.errors import ConfigError
from rewardq.ops.overview import code_totals
from rewardq.ops.status_view import render_status
from rewardq.reward.base import ManagerContext
from rewardq.reward.codeexec.result import CodeResult
from rewardq.reward.codeexec.settings import CodeExecSettings, pop_code_options
from rewardq.reward.codeexec.stats import CodeStats
from rewardq.reward.factory import build_manager
from rewardq.reward.scoring import EXACT_SCORERS, placement_of
from rewardq.reward.tokenizer import load_tokenizer
from tests.support.helpers import top_snapshot

TOK = load_tokenizer("builtin:demo")
URL = "http://sandbox:8080/run_code"


@pytest.mark.parametrize("manager", ["naive", "dapo", "gdpo", "limited", "remote"])
def test_every_builtin_manager_accepts_the_sandbox_options(manager: str) -> None:
    # Given verl's three sandbox settings (as the verl config maps them) plus a manager option
    options = {
        "sandbox_fusion_url": URL,
        "sandbox_fusion_max_concurrent": 4,
        "sandbox_fusion_memory_limit_mb": 512,
    }
    if manager == "gdpo":
        options["experiment_name"] = "exp"
    # When the factory builds the manager
    m = build_manager(manager, tokenizer=TOK, options=options)
    # Then the scorer's settings are in the context, and the manager got only its own options
    assert m.context.code.sandbox_fusion_url == URL
    assert m.context.code.sandbox_fusion_max_concurrent == 4
    assert m.context.code.sandbox_fusion_memory_limit_mb == 512
    assert m.context.code.backend == "sandbox_fusion"
    if manager == "gdpo":
        assert m.experiment_name == "exp"  # type: ignore[attr-defined]  # gdpo has it


def test_the_default_is_the_local_runner_and_null_means_unset() -> None:
    assert ManagerContext().code.backend == "local"
    assert pop_code_options({"sandbox_fusion_url": None, "x": 1}).backend == "local"


def test_bad_values_and_misspelt_options_fail_at_start_up() -> None:
    for bad in (
        {"sandbox_fusion_url": "sandbox:8080"},
        {"sandbox_fusion_max_concurrent": 0},
        {"sandbox_fusion_memory_limit_mb": "lots"},
        {"code_local_isolation": "chroot"},
    ):
        (name,) = bad
        with pytest.raises(ConfigError, match=f"^{name}( must be|=)"):  # refused for that option, not another
            pop_code_options(dict(bad))
    with pytest.raises(ConfigError, match="sandbox_fusion_ulr"):
        build_manager("naive", tokenizer=TOK, options={"sandbox_fusion_ulr": URL})


def test_the_retired_retry_options_load_and_are_ignored_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    # the worker retries a sandbox that is down in place (retry_for): the client sends each request once
    with caplog.at_level(logging.WARNING, logger="rewardq.reward"):
        pop_code_options({"sandbox_fusion_url": URL, "sandbox_fusion_attempts": 5, "sandbox_fusion_retry_delay": -1})
    (warned,) = [r.getMessage() for r in caplog.records if "no longer" in r.getMessage()]
    assert "sandbox_fusion_attempts, sandbox_fusion_retry_delay no longer" in warned and "retry_for" in warned


def test_code_data_sources_are_async_scorers() -> None:
    for ds in ("codecontests", "apps", "codeforces", "taco"):
        assert placement_of(ds) == "async"
        assert EXACT_SCORERS[ds].__name__ == f"score_code_{ds}"
    assert placement_of("openai/gsm8k") == "inline"


def _stats() -> CodeStats:
    st = CodeStats()
    st.record("taco", "local", 0.5, CodeResult(1.0, 2, 2, "passed", "", "local", runs=1))
    st.record("taco", "local", 1.5, CodeResult(0.0, 0, 2, "timeout", "case 0: timed out", "local", runs=3))
    st.record("apps", "sandbox_fusion", 0.25, None)
    hack = CodeResult(0.0, 0, 3, "tripwire", "case 0: the program called sys.exit(0)", "local", 3, "early_exit")
    st.record("kodcode", "local", 0.75, hack)
    st.record("kodcode", "local", 0.25, hack)
    st.record("kodcode", "local", 0.5, CodeResult(0.0, 0, 3, "tripwire", "case 1: ...", "local", 3, "tests_read"))
    return st


def test_counters_per_data_source_and_their_sum_over_workers() -> None:
    snap = _stats().snapshot()
    assert snap["taco"] == {
        "backend": "local",
        "trajectories": 2,
        "runs": 4,
        "seconds": 2.0,
        "statuses": {"passed": 1, "timeout": 1},
        "tripwires": {},
    }
    assert snap["apps"]["statuses"] == {"error": 1}
    assert snap["kodcode"]["statuses"] == {"tripwire": 3}
    assert snap["kodcode"]["tripwires"] == {"early_exit": 2, "tests_read": 1}
    # the heartbeat carries it as JSON; status sums the live workers
    workers = [{"code": json.loads(json.dumps(snap))}, {"code": {"taco": snap["taco"]}}, {"code": {}}]
    total = code_totals(workers)
    assert total["taco"]["trajectories"] == 4 and total["taco"]["runs"] == 8
    assert total["taco"]["statuses"] == {"passed": 2, "timeout": 2}
    assert total["kodcode"]["tripwires"] == {"early_exit": 2, "tests_read": 1}


def test_status_renders_a_code_table_and_names_sandbox_failures() -> None:
    from rich.console import Console

    from rewardq.ops.diagnosis import diagnose

    st: dict[str, Any] = {
        "time": 0.0,
        "namespace": "ns",
        "redis_url": "redis://x",
        "group": "g",
        "shard_count": 1,
        "shards": [],
        "workers": [],
        "waiting": [],
        "waiting_total": 0,
        "dead_letters": 0,
        "dead_letters_by_kind": {},
        "recent": {"window_s": 60, "trajectories": 0, "trajectories_per_s": 0, "errors": 0},
        "diagnosis": [],
        "code": code_totals([{"code": _stats().snapshot()}]),
    }
    st["recent"].update(latency_ms_p50=None, latency_ms_p99=None)
    st["diagnosis"] = diagnose(st)
    assert any(
        "1 code response could not be scored" in d["message"] and "apps 1" in d["message"] for d in st["diagnosis"]
    )
    console = Console(width=200, record=True)
    console.print(render_status(st))
    text = console.export_text()
    assert "code execution" in text and "taco" in text and "timeout: 1" in text and "error: 1" in text
    # reward hacks caught: a column per data source, and a diagnosis line that says what it means
    assert "early_exit: 2, tests_read: 1" in text
    assert any("3 code responses tripped a reward-hack wire (kodcode 3)" in d["message"] for d in st["diagnosis"])


def test_top_shows_the_hacks_caught_per_data_source() -> None:
    from rich.console import Console

    from rewardq.ops.top import hacks_caught, render_top

    workers = [{"code": _stats().snapshot()}, {"code": {"kodcode": {"tripwires": {"early_exit": 1}}}}]
    caught = hacks_caught(workers)
    assert caught == {"kodcode": {"early_exit": 3, "tests_read": 1}}
    snap: dict[str, Any] = {**top_snapshot(), "hacks": caught}
    console = Console(width=160, record=True)
    console.print(render_top(snap, 160))
    text = console.export_text()
    assert "reward hacks caught" in text and "kodcode" in text and "early_exit: 3, tests_read: 1" in text


def test_metrics_expose_code_counters() -> None:
    stats = _stats()
    m = WorkerMetrics("naive", code_stats=stats.snapshot)
    text = generate_latest(m.registry).decode()
    assert 'rewardq_code_runs_total{backend="local",data_source="taco"} 4.0' in text
    assert 'rewardq_code_seconds_total{backend="local",data_source="taco"} 2.0' in text
    assert 'rewardq_code_trajectories_total{backend="sandbox_fusion",data_source="apps",status="error"} 1.0' in text
    assert 'rewardq_code_tripwires_total{backend="local",data_source="kodcode",tripwire="early_exit"} 2.0' in text


def test_settings_are_frozen_and_typed() -> None:
    s = CodeExecSettings(sandbox_fusion_url=URL)
    with pytest.raises(AttributeError):
        s.sandbox_fusion_url = None  # type: ignore[misc]  # frozen: the test proves it
