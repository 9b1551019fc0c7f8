"""``rewardq produce --wait`` / ``rewardq demo``'s summary, from pushed trajectories and their results (no Redis)."""

from __future__ import annotations


def test_summary_counts_errors_missing_and_mismatches() -> None:
    from rewardq.ops.summary import Pushed, percentile, summarize
    from rewardq.queue.results import RewardResult

    def ok(key: str, score: float, worker: str = "a", latency: float = 10.0) -> RewardResult:
        return RewardResult(key, "ok", score, {"acc": score > 0}, worker=worker, latency_ms=latency)

    pushed = [
        Pushed(["u1_s_0", "u1_s_1"], "openai/gsm8k", 1.0),
        Pushed(["u2_s_0"], "openai/gsm8k", 0.0),
        Pushed(["u3_s_0"], "lighteval/MATH", 1.0),
        Pushed(["u4_s_0", "u4_s_1"], "lighteval/MATH"),
        Pushed(["u5_s_0"], "openai/gsm8k", 1.0),
    ]
    results = {
        "u1_s_0": ok("u1_s_0", 1.0),
        "u1_s_1": ok("u1_s_1", 1.0, latency=30.0),
        "u2_s_0": ok("u2_s_0", 1.0, "b"),
        "u3_s_0": RewardResult("u3_s_0", "error", None, {"error": "boom"}, error="boom", worker="b"),
        "u4_s_0": ok("u4_s_0", 0.5),
        "u4_s_1": None,
        "u5_s_0": ok("u5_s_0", 1.0, latency=20.0),
    }
    s = summarize(pushed, results, elapsed_s=2.0)
    assert (s["trajectories"], s["outputs"], s["scored"], s["errors"], s["missing"]) == (5, 7, 3, 1, 1)
    assert s["missing_keys"] == ["u4_s_1"] and s["error_samples"] == ["u3_s_0: boom"]
    assert s["by_data_source"] == {"openai/gsm8k": {"count": 3, "mean_reward": 1.0, "accuracy": 1.0}}
    assert s["expected"] == {"checked": 3, "mismatched": 1, "samples": [{"key": "u2_s_0", "expected": 0.0, "got": 1.0}]}
    assert s["by_worker"] == {"a": 2, "b": 2} and s["trajectories_per_s"] == 2.5 and s["outputs_per_s"] == 3.5
    assert s["latency_ms"] == {"p50": 20.0, "p99": 30.0}
    assert percentile([], 50) is None and percentile([5.0], 99) == 5.0 and percentile([1, 2, 3, 4], 50) == 2
