"""Default scoring by ``data_source``: the scorers verl picks when no reward function is given.

================================================================  =========================  ============
data_source                                                       scorer                     result
================================================================  =========================  ============
``openai/gsm8k``                                                  :mod:`.gsm8k` (strict)     1.0 / 0.0
``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval``,       :mod:`.math_boxed`         1.0 / 0.0
``HuggingFaceH4/MATH-500``
``math_dapo``, ``math``, ``math_dapo_reasoning``, ``aime*``       :mod:`.dapo_math`          ``{score, acc, pred}``
``searchR1_nq``, ``_triviaqa``, ``_popqa``, ``_hotpotqa``,        :mod:`.search_r1`          1.0 / 0.0
``_2wikimultihopqa``, ``_musique``, ``_bamboogle``
``numina_aops_forum``, ``numina_synthetic_math``,                 :mod:`.prime_math`         1.0 / 0.0
``numina_amc_aime``, ``numina_synthetic_amc``,                    (process, ``math`` extra)
``numina_cn_k12``, ``numina_olympiads``
``hiyouga/geometry3k``                                            :mod:`.geo3k`              0.0 / 0.1 /
                                                                  (process, ``math`` extra)  0.9 / 1.0
``codecontests``, ``apps``, ``codeforces``, ``taco``              :mod:`.code` (async)       ``{score, acc, ...}``
================================================================  =========================  ============

Anything else raises :class:`~rewardq.errors.UnknownDataSourceError`, which names the
data source and how to plug a scorer in. The table is :data:`EXACT_SCORERS` plus
:data:`PREFIX_SCORERS`, nothing else: adding a data source is one line there.

:mod:`.math_verify_scorer` (symbolic equivalence) is not in the table because it must
run in worker processes; ask for it explicitly through the ``remote`` manager.

Example::

    >>> default_compute_score("openai/gsm8k", "... #### 18", "18")
    1.0
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rewardq.errors import UnknownDataSourceError
from rewardq.reward.scoring import code, dapo_math, geo3k, gsm8k, math_boxed, prime_math, search_r1
from rewardq.reward.scoring.placement import PLACEMENTS, placement

__all__ = [
    "default_compute_score",
    "compute_score_async",
    "placement_of",
    "PLACEMENTS",
    "EXACT_SCORERS",
    "PREFIX_SCORERS",
    "known_data_sources",
    "scorer_name",
    "CODE_DATA_SOURCES",
]

CODE_DATA_SOURCES = code.CODE_DATA_SOURCES

Scorer = Callable[..., Any]

# Where a worker runs each scorer: rewardq.reward.scoring.placement (PLACEMENTS, place, placement);
# RewardManager.call_score_fn honours it.


def _gsm8k(solution_str: str, ground_truth: Any, method: str = "strict", **_: object) -> object:
    return gsm8k.compute_score(solution_str, ground_truth, method=method)


def _math(solution_str: str, ground_truth: Any, **_: object) -> object:
    return math_boxed.compute_score(solution_str, ground_truth)


def _dapo(solution_str: str, ground_truth: Any, **_: object) -> object:
    return dapo_math.compute_score(solution_str, ground_truth)


def _search_r1(solution_str: str, ground_truth: Any, **_: object) -> object:
    return search_r1.compute_score(solution_str, ground_truth)


#: data_source -> scorer, matched exactly.
EXACT_SCORERS: dict[str, Scorer] = {
    "openai/gsm8k": _gsm8k,
    "lighteval/MATH": _math,
    "DigitalLearningGmbH/MATH-lighteval": _math,
    "HuggingFaceH4/MATH-500": _math,
    "math_dapo": _dapo,
    "math": _dapo,
    "math_dapo_reasoning": _dapo,
    "searchR1_nq": _search_r1,
    "searchR1_triviaqa": _search_r1,
    "searchR1_popqa": _search_r1,
    "searchR1_hotpotqa": _search_r1,
    "searchR1_2wikimultihopqa": _search_r1,
    "searchR1_musique": _search_r1,
    "searchR1_bamboogle": _search_r1,
    "numina_aops_forum": prime_math.score,
    "numina_synthetic_math": prime_math.score,
    "numina_amc_aime": prime_math.score,
    "numina_synthetic_amc": prime_math.score,
    "numina_cn_k12": prime_math.score,
    "numina_olympiads": prime_math.score,
    "hiyouga/geometry3k": geo3k.score,
    **{name: code.scorer_for(name) for name in code.CODE_DATA_SOURCES},
}

#: (prefix, scorer) rules tried in order when no exact entry matches.
PREFIX_SCORERS: tuple[tuple[str, Scorer], ...] = (("aime", _dapo),)


def known_data_sources() -> list[str]:
    """Every data source the default scorer handles (prefix rules shown as ``prefix*``)."""
    return sorted(EXACT_SCORERS) + [prefix + "*" for prefix, _ in PREFIX_SCORERS]


def _scorer_for(data_source: object) -> Scorer:
    if isinstance(data_source, str):
        scorer = EXACT_SCORERS.get(data_source)
        if scorer is not None:
            return scorer
        for prefix, scorer in PREFIX_SCORERS:
            if data_source.startswith(prefix):
                return scorer
    raise UnknownDataSourceError(
        f"no default scorer for data_source {data_source!r}. Known data sources: "
        f"{', '.join(known_data_sources())}. To score it, give the worker your own function with "
        "--reward-fn FILE_OR_MODULE:FUNC (it is called as f(data_source=..., solution_str=..., "
        "ground_truth=..., extra_info=...) and returns a number or a dict with 'score'), "
        "or a custom manager with --manager package.module:Class"
    )


#: The default scorers by the name a result's provenance gives them (``default:<name>``).
_NAMES: dict[Scorer, str] = {_gsm8k: "gsm8k", _math: "math_boxed", _dapo: "dapo_math", _search_r1: "search_r1"}


def scorer_name(data_source: object) -> str:
    """The name of the default scorer of ``data_source`` (``gsm8k``, ``math_boxed``, ``prime_math``,
    ``code``...), or ``none`` when no scorer handles it."""
    try:
        scorer = _scorer_for(data_source)
    except UnknownDataSourceError:
        return "none"
    return _NAMES.get(scorer) or scorer.__module__.rsplit(".", 1)[-1]


def placement_of(data_source: object) -> str:
    """Where the worker runs the default scorer of ``data_source`` (one of :data:`PLACEMENTS`).

    Raises:
        UnknownDataSourceError: no scorer handles ``data_source``.
    """
    return placement(_scorer_for(data_source))


def default_compute_score(
    data_source: object,
    solution_str: str,
    ground_truth: object,
    extra_info: dict[str, object] | None = None,
    **kwargs: object,
) -> float | dict[str, object]:
    """Score one response with the scorer registered for its ``data_source``.

    Args:
        data_source: the sample's ``data_source`` column.
        solution_str: the decoded response.
        ground_truth: ``reward_model["ground_truth"]`` of the sample.
        extra_info: the sample's ``extra_info`` (unused by the built-in scorers).
        **kwargs: ``method="flexible"`` switches GSM8K to flexible extraction; other
            keywords (verl's sandbox settings, router addresses) are accepted and ignored.

    Returns:
        A float, or the scorer's dict (``dapo_math``) unchanged.

    Raises:
        UnknownDataSourceError: no scorer handles ``data_source``.
    """
    scorer = _scorer_for(data_source)
    if placement(scorer) == "async":
        import asyncio

        return _plain(asyncio.run(scorer(solution_str, ground_truth, extra_info=extra_info, **kwargs)))
    return _plain(scorer(solution_str, ground_truth, extra_info=extra_info, **kwargs))


async def compute_score_async(
    data_source: object,
    solution_str: str,
    ground_truth: object,
    extra_info: dict[str, object] | None = None,
    **kwargs: object,
) -> float | dict[str, Any]:
    """:func:`default_compute_score` for callers inside an event loop: an ``async`` scorer is
    awaited, any other is called directly (so only call this for ``async`` or ``inline`` ones)."""
    scorer = _scorer_for(data_source)
    result = scorer(solution_str, ground_truth, extra_info=extra_info, **kwargs)
    if placement(scorer) == "async":
        result = await result
    return _plain(result)


def _plain(result: Any) -> float | dict[str, object]:
    return result if isinstance(result, dict) else float(result)
