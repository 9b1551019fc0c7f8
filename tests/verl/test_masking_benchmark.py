"""``python -m benchmarks.verl_masking`` at a small size: its routes agree with the arithmetic.

With independent failures at rate ``p`` in groups of ``n``: masking trains every scored sample but
the rare lone survivor (``1 - p`` of the batch); dropping failed groups keeps ``(1 - p)^n`` of it;
refilling them costs ``1 / (1 - p)^n`` generated rollouts per trained one.
"""

from __future__ import annotations

import pytest

from benchmarks.verl_masking import main, measure


def test_the_routes_agree_with_the_arithmetic() -> None:
    p, n = 0.05, 8
    got = measure(p, n, groups=4000, seed=1)
    assert got["mask"]["batch"] == pytest.approx(1 - p, abs=0.01)
    assert got["mask"]["healthy_trained"] > 0.999
    assert got["group-drop"]["batch"] == pytest.approx((1 - p) ** n, abs=0.02)
    assert got["group-refill"]["batch"] == 1.0
    assert got["group-refill"]["cost"] == pytest.approx(1 / (1 - p) ** n, rel=0.03)
    assert got["mask"]["cost"] < got["group-refill"]["cost"]


def test_the_command_prints_its_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--groups", "200", "--sizes", "8", "--rates", "0.05"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 5% | 8 |")]
    assert [r.split("|")[3].strip() for r in rows] == ["mask", "group-drop", "group-refill"]
