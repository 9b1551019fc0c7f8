"""Metrics for simultaneous translation: chrF (quality) and Average Lagging (latency).

Both are plain Python, dependency-free and deterministic, so the SeqPO-SiMT example runs
anywhere. chrF follows Popović (2015) with character n-grams up to 6 and β = 2 (spaces
removed, as sacreBLEU does by default); Average Lagging follows Ma et al. (2019).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence


def _ngrams(text: str, n: int) -> Counter[str]:
    return Counter(text[i : i + n] for i in range(len(text) - n + 1))


def chrf(hypothesis: str, reference: str, *, max_order: int = 6, beta: float = 2.0) -> float:
    """Sentence chrF in [0, 1]: the F-beta of character n-gram precision and recall.

    >>> chrf("the cat sat", "the cat sat")
    1.0
    >>> chrf("", "the cat") == 0.0
    True
    """
    hyp, ref = hypothesis.replace(" ", ""), reference.replace(" ", "")
    if not hyp or not ref:
        return 1.0 if hyp == ref else 0.0
    precisions: list[float] = []
    recalls: list[float] = []
    for n in range(1, max_order + 1):
        h, r = _ngrams(hyp, n), _ngrams(ref, n)
        if not h or not r:
            continue
        overlap = sum((h & r).values())
        precisions.append(overlap / sum(h.values()))
        recalls.append(overlap / sum(r.values()))
    if not precisions:
        return 0.0
    p: float = sum(precisions) / len(precisions)
    r_: float = sum(recalls) / len(recalls)
    if p == 0 and r_ == 0:
        return 0.0
    b2 = beta * beta
    return (1 + b2) * p * r_ / (b2 * p + r_)


def average_lagging(delays: Sequence[int], source_len: int) -> float:
    """Average Lagging (Ma et al., 2019) of a simultaneous translation.

    Args:
        delays: ``g(t)`` for every target token ``t = 1..|y|``: how many source tokens
            had been read when target token ``t`` was written (non-decreasing).
        source_len: ``|x|``, the number of source tokens.

    ``AL = 1/τ · Σ_{t=1..τ} (g(t) − (t−1)/γ)`` with ``γ = |y| / |x|`` and ``τ`` the first
    target index at which the whole source had been read (``|y|`` if never). An empty
    translation lags by the whole source: ``AL = |x|``.

    >>> average_lagging([3, 3, 3], 3)      # wait for everything, then translate
    3.0
    >>> average_lagging([1, 2, 3], 3)      # wait-1: one token behind the ideal policy
    1.0
    """
    if source_len <= 0:
        raise ValueError("source_len must be positive")
    if not delays:
        return float(source_len)
    gamma = len(delays) / source_len
    tau = next((t for t, g in enumerate(delays, start=1) if g >= source_len), len(delays))
    return sum(delays[t - 1] - (t - 1) / gamma for t in range(1, tau + 1)) / tau
