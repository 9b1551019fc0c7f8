"""The smoke-size run of ``python -m benchmarks.verl_loop``: both systems, every scorer, real processes.

verl's own ``RewardLoopManager`` actors and ``rewardq worker`` processes score the same
trajectories (real 128k-vocabulary tokenizer ids) through verl's ``_compute_score``; every reward
is checked against the reference. Nothing here asserts a time: the full size is a benchmark.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.verl_loop.trajectories import SCORERS

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)
def test_smoke_run_scores_every_trajectory_right_in_both_systems(tmp_path: Path) -> None:
    out = tmp_path / "verl-loop.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.verl_loop", "--smoke", "--sizes", "1", "--json", str(out)],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=850,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    results = report["results"]
    assert all("phase" in r for r in results), [r for r in results if "phase" not in r]
    seen = {(r["system"], r["scorer"], r["phase"]) for r in results}
    assert seen == {(s, c, p) for s in ("verl", "rewardq") for c in SCORERS for p in ("burst", "steady")}
    for r in results:
        c = r["check"]
        assert c["ok"] + c["padding_bug"] + c["wrong"] + c["missing"] == r["trajectories"]
        assert c["wrong"] == c["missing"] == 0, r  # verl's only deviation is its padding arithmetic
        if r["system"] == "rewardq":
            assert c["ok"] == r["trajectories"] and c["errors"] == 0, r
        assert r["wall_s"] > 0 and set(r["cpu_s"]) == {"scorers", "broker", "producer"}
        assert r["cpu_s"]["scorers"] > 0  # the scorers' processes were found and measured
    # the smoke trajectories are built so that verl's padding arithmetic cuts some final responses
    assert sum(r["check"]["padding_bug"] for r in results if r["system"] == "verl") > 0
    names = [t["name"] for t in report["targets"]]
    assert "every rewardq reward equals the reference" in names
    assert next(t for t in report["targets"] if t["name"].startswith("every"))["verdict"] == "PASS"
    assert report["baselines"]["math_verify"]["calls"] == 16  # the bare ProcessPoolExecutor ran


def test_the_real_tokenizer_folder_decodes_in_batches_exactly_as_transformers_does(tmp_path: Path) -> None:
    import numpy as np
    from transformers import AutoTokenizer

    from benchmarks.verl_loop.tokenizer import tokenizer_folder
    from rewardq.reward.tokenizer import load_tokenizer
    from rewardq.reward.tokenizer_backends import TransformersTokenizer, batch_decoder

    folder = tokenizer_folder(tmp_path)
    tok = load_tokenizer(str(folder))
    assert isinstance(tok, TransformersTokenizer) and tok.vocab_size > 128_000
    native = batch_decoder(tok)
    assert native is not None
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, tok.vocab_size, int(rng.integers(1, 3000))).tolist() for _ in range(20)]
    for skip in (True, False):
        assert native(seqs, skip) == [tok.decode(s, skip_special_tokens=skip) for s in seqs]
    # a tokenizer that post-processes its decode keeps decoding through transformers
    cleaning = TransformersTokenizer(AutoTokenizer.from_pretrained(str(folder), clean_up_tokenization_spaces=True), "x")
    assert batch_decoder(cleaning) is None
