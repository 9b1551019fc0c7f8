r"""Known answers for the ``numina_*`` (prime_math) and ``hiyouga/geometry3k`` (geo3k) scorers.

Each case is ``(data_source, solution_str, ground_truth, expected)``; ``expected`` is what
verl 0.9.1's ``default_compute_score`` returns, or the exception type it raises.
``tests/unit`` checks rewardq's scorers against ``expected``; ``tests/verl`` checks that verl
itself still gives ``expected`` and that both agree, so every value here is verl's own.

``SLOW_CASES`` hit verl's 10 s sympy limit (about 10 s each, on each side).
"""

from __future__ import annotations

from typing import Any

NUMINA_SOURCES = (
    "numina_aops_forum",
    "numina_synthetic_math",
    "numina_amc_aime",
    "numina_synthetic_amc",
    "numina_cn_k12",
    "numina_olympiads",
)
GEO3K = "hiyouga/geometry3k"
PMATRIX_12 = r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}"


def _numina(i: int) -> str:
    return NUMINA_SOURCES[i % len(NUMINA_SOURCES)]


_NUMINA: list[tuple[str, Any, Any]] = [
    # right
    (r"So the answer is $\boxed{5}$.", "5", 1.0),
    ("Adding them up.\nAnswer: 12", "12", 1.0),
    ("The answer is 42.", "42", 1.0),
    # wrong
    (r"So the answer is $\boxed{6}$.", "5", 0.0),
    ("Adding them up.\nAnswer: 13", "12", 0.0),
    (r"\boxed{x - 1}", "x+1", 0.0),
    # equivalent forms: fractions and decimals
    (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
    (r"\boxed{\dfrac{3}{4}}", r"\frac34", 1.0),
    (r"\boxed{\tfrac{1}{3}}", "1/3", 1.0),
    (r"\boxed{0.75}", r"\frac{3}{4}", 1.0),
    (r"\boxed{2/4}", r"\frac{1}{2}", 0.0),
    (r"\boxed{0.3333}", r"\frac{1}{3}", 0.0),
    # units, degrees, percentages, thousands
    (r"\boxed{5\text{ cm}}", "5", 1.0),
    (r"\boxed{90^\circ}", "90", 1.0),
    (r"\boxed{10\%}", "10", 1.0),
    (r"\boxed{1,000}", "1000", 1.0),
    (r"\boxed{3 \text{ million}}", "3000000", 0.0),
    # latex spacing and symbolic forms
    (r"\boxed{\left( 1, 2 \right)}", "(1,2)", 1.0),
    (r"\boxed{ \frac {1} {2} }", r"\frac{1}{2}", 1.0),
    (r"\boxed{x + 1}", "1+x", 1.0),
    (r"\boxed{\sqrt{2}}", r"\sqrt2", 1.0),
    (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", 1.0),
    (r"\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
    # pi: compared with pi and with 3.14
    (r"\boxed{2\pi}", "6.28", 1.0),
    (r"\boxed{\frac{\pi}{2}}", "1.5708", 0.0),
    (r"\boxed{\pi/2}", "1.5708", 1.0),
    (r"\boxed{(2\pi, 3)}", r"(2\pi, 3)", 1.0),
    # intervals, tuples, choices, bases, matrices
    (r"\boxed{[1, 3)}", "[1,3)", 1.0),
    (r"\boxed{(1, 3)}", "[1,3]", 0.0),
    (r"\boxed{\text{(B)}}", "B", 1.0),
    (r"\boxed{1010_2}", "1010", 1.0),
    (r"\boxed{" + PMATRIX_12 + "}", PMATRIX_12, 1.0),
    (r"\boxed{[1, 2]}", PMATRIX_12, 0.0),
    (r"\boxed{Matrix([[1], [2]])}", PMATRIX_12, 1.0),
    # malformed
    (r"so \boxed{5", "5", 0.0),
    ("}}}{{{", "1", 0.0),
    ("", "3", 0.0),
    ("Answer: x_1", "3", 0.0),
    (r"\boxed{}", "0", 0.0),
    (r"\boxed{\frac{1}{0}}", "1", 0.0),
    (r"\boxed{3}", 3, 1.0),
    # no \boxed
    ("The result is 7", "7", 1.0),
    ("I think it is seven", "7", 0.0),
    ("so x = 4", "4", 1.0),
    ("Therefore the answer is 2 and 3. Done", "2, 3", 0.0),
]

_GEO3K: list[tuple[str, Any, Any]] = [
    (r"<think>The angles add up to 180.</think> So x = \boxed{3}", "3", 1.0),
    (r"So x = \boxed{3}", "3", 0.9),
    (r"<think>Similar triangles.</think> \boxed{4}", "3", 0.1),
    ("<think>x</think> the answer is 3", "3", 0.0),
    (r"<think>half</think>\boxed{\frac{1}{2}}", "0.5", 1.0),
    (r"<think>a</think>\boxed{\dfrac{\sqrt{3}}{2}}", r"\frac{\sqrt{3}}{2}", 1.0),
    (r"\boxed{45^\circ}", "45", 0.9),
    (r"<think>a</think> \boxed{2 \sqrt { 3 }}", r"2\sqrt{3}", 1.0),
    (r"<think>a</think> \boxed{5", "5", 0.0),
    (r"<think>a</think>\boxed{3.0}", "3", 1.0),
    (r"<think>a</think>\boxed{3 cm}", "3", 1.0),
    (r"<think>a</think>\boxed{\frac{1}{3}}", "0.33", 0.1),
    (r"<think>a</think>\boxed{3}", 3, AttributeError),
]

#: (data_source, solution_str, ground_truth, expected)
CASES: list[tuple[str, str, Any, Any]] = [(_numina(i), *case) for i, case in enumerate(_NUMINA)] + [
    (GEO3K, *case) for case in _GEO3K
]

#: Cases where sympy runs into verl's 10 s limit (the answer is then "not equal").
SLOW_CASES: list[tuple[str, str, Any, Any]] = [
    ("numina_olympiads", r"\boxed{9999999!}", r"\frac{1}{3}", 0.0),
]
