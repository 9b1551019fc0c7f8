r"""Realistic rollout data for demos and tests, and the JSONL file format for recorded rollouts.

:func:`make_trajectories` writes what a verl agent loop would push for GRPO on math:
prompts from two datasets, several sessions per prompt (one ``uid``, ``session_id`` 0…g-1),
each trajectory 1–6 outputs long, some of them calling a calculator tool. It is seeded, so the
same ``(n, seed)`` always gives the same trajectories, and it knows the reward every trajectory
must get from the default scorers (``expected``), so a test can check each reward exactly.

* ``openai/gsm8k`` word problems, solved step by step with ``<<48/2=24>>`` calculator
  annotations and a final ``#### 72`` line (sometimes written ``#### 1,234``).
* ``lighteval/MATH`` problems (algebra, fractions, geometry, probability, radicals) answered
  with ``\boxed{...}`` in the spellings the MATH normaliser accepts (``\dfrac``, ``3/4``,
  ``0.5``, ``900^\circ``).

About 60 % of trajectories end correctly (expected 1.0); the rest give a wrong number, forget
the answer format, or are cut off by the length limit (expected 0.0). A trajectory of k outputs
is one conversation cut into k segments: output i's ``prompt_ids`` are the chat prompt plus every
earlier segment (and a ``Continue.`` user turn after a segment that made no tool call), its
``response_ids`` the segment itself. In tool-using segments the model's
``<tool_call>`` is followed by the tool's ``<tool_response>``, whose tokens have
``response_mask`` 0; everything the model wrote has mask 1. The answer is always in the final
segment, because the default managers score the final output only.

A trajectory is a dict::

    {"uid": "3f2c…", "session_id": "1",
     "sample": {"data_source": "openai/gsm8k", "reward_model": {"style": "rule", "ground_truth": "72"},
                "extra_info": {...}, "raw_prompt": [...], "ability": "math", "agent_name": "tool_agent"},
     "outputs": [{"prompt_ids": [...], "response_ids": [...], "response_mask": [...],
                  "response_logprobs": [...] (some), "num_turns": 3, "extra_fields": {...}}, ...],
     "expected": 1.0}

:mod:`rewardq.producers.jsonl` writes and reads them as JSONL files.
"""

from __future__ import annotations

import copy
import json
import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rewardq.reward.tokenizer import Tokenizer

__all__ = ["make_trajectories", "GSM8K", "MATH"]

GSM8K = "openai/gsm8k"
MATH = "lighteval/MATH"

SYSTEM = "You are a helpful assistant."
GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
#: What the agent says between two segments that did not end in a tool call.
CONTINUE = f"\n{IM_START}user\nContinue.{IM_END}\n{IM_START}assistant\n"

_NAMES = [
    "Natalia",
    "Weng",
    "Betty",
    "Julie",
    "James",
    "Albert",
    "Ken",
    "Alexis",
    "Tina",
    "Randy",
    "Mark",
    "Joy",
    "Priya",
    "Chen",
    "Omar",
    "Lucia",
    "Kofi",
    "Maria",
]
_ITEMS = ["clips", "books", "pencils", "cookies", "marbles", "stickers", "cupcakes", "tickets", "flowers", "cards"]
_FILLER = [
    "Let me re-read the question to make sure I have the numbers right.",
    "I will double-check the arithmetic before answering.",
    "Let me organise what we know so far.",
    "Now I can put the pieces together.",
]


@dataclass
class Problem:
    """One generated problem: its text, a worked solution, and the answer in two spellings.

    Attributes:
        data_source: ``openai/gsm8k`` or ``lighteval/MATH``.
        question: the problem statement.
        steps: the reasoning, one sentence per step, without the final answer line.
        calcs: ``(expression, value)`` pairs a calculator tool could be asked for.
        ground_truth: what ``reward_model["ground_truth"]`` holds.
        answer_forms: correct ways to write the answer (all score 1.0).
        wrong: a wrong answer in the same notation (scores 0.0).
        extra: dataset-specific ``extra_info`` columns (``level``, ``type``, ``answer``).
    """

    data_source: str
    question: str
    steps: list[str]
    calcs: list[tuple[str, str]]
    ground_truth: str
    answer_forms: list[str]
    wrong: str
    extra: dict[str, Any]


# ------------------------------------------------------------------------------------------
# problems
# ------------------------------------------------------------------------------------------


def _gsm8k_problem(rng: random.Random) -> Problem:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    kind = rng.randrange(5)
    if kind == 0:
        x = 2 * rng.randint(6, 60)
        h, t = x // 2, x + x // 2
        q = (
            f"{name} sold {x} {item} in April, and then she sold half as many {item} in May. "
            f"How many {item} did {name} sell altogether in April and May?"
        )
        steps = [
            f"In May {name} sold {x}/2 = <<{x}/2={h}>>{h} {item}.",
            f"Altogether {name} sold {x}+{h} = <<{x}+{h}={t}>>{t} {item} in April and May.",
        ]
        calcs = [(f"{x} / 2", str(h)), (f"{x} + {h}", str(t))]
    elif kind == 1:
        a, b = rng.randint(1, 4), rng.randint(2, 12)
        r, m = 12 * a, 5 * b
        per, t = r / 60, a * b
        q = (
            f"{name} earns ${r} an hour for babysitting. Yesterday, she just did {m} minutes of babysitting. "
            "How much did she earn?"
        )
        steps = [
            f"{name} earns {r}/60 = $<<{r}/60={per:g}>>{per:g} per minute.",
            f"Working {m} minutes, she earned {per:g} x {m} = $<<{per:g}*{m}={t}>>{t}.",
        ]
        calcs = [(f"{r} / 60", f"{per:g}"), (f"{per:g} * {m}", str(t))]
    elif kind == 2:
        y, k = rng.randint(2, 9), rng.randint(2, 6)
        x = y * k + rng.randint(1, 40)
        g, t = y * k, x - y * k
        q = (
            f"{name} has {x} {item}. {name} gives {y} {item} to each of {k} friends. "
            f"How many {item} does {name} have left?"
        )
        steps = [
            f"{name} gives away {y} x {k} = <<{y}*{k}={g}>>{g} {item}.",
            f"So {name} has {x} - {g} = <<{x}-{g}={t}>>{t} {item} left.",
        ]
        calcs = [(f"{y} * {k}", str(g)), (f"{x} - {g}", str(t))]
    elif kind == 3:
        p, n = rng.randint(3, 25), rng.randint(2, 8)
        cost = p * n
        bill = 50 * math.ceil((cost + 1) / 50)
        t = bill - cost
        q = (
            f"A box of {item} costs ${p}. {name} buys {n} boxes and pays with a ${bill} bill. "
            f"How much change does {name} get?"
        )
        steps = [
            f"The boxes cost {p} x {n} = $<<{p}*{n}={cost}>>{cost}.",
            f"The change is {bill} - {cost} = $<<{bill}-{cost}={t}>>{t}.",
        ]
        calcs = [(f"{p} * {n}", str(cost)), (f"{bill} - {cost}", str(t))]
    else:
        r, hrs, d = rng.randint(12, 40), rng.randint(4, 9), rng.randint(5, 30)
        day, t = r * hrs, r * hrs * d
        q = (
            f"{name} works {hrs} hours a day for {d} days and is paid ${r} per hour. "
            f"How much does {name} earn in total?"
        )
        steps = [
            f"Each day {name} earns {r} x {hrs} = $<<{r}*{hrs}={day}>>{day}.",
            f"Over {d} days that is {day} x {d} = $<<{day}*{d}={t}>>{t}.",
        ]
        calcs = [(f"{r} * {hrs}", str(day)), (f"{day} * {d}", str(t))]
    forms = [str(t)] + ([f"{t:,}"] if t >= 1000 else [])
    wrong = str(t + rng.choice([-10, -2, -1, 1, 2, 5, 10]) if t > 10 else t + rng.randint(1, 5))
    reference = " ".join(steps) + f"\n#### {t}"
    return Problem(GSM8K, q, steps, calcs, str(t), forms, wrong, {"answer": reference})


def _frac(p: int, q: int) -> str:
    return f"\\frac{{{p}}}{{{q}}}"


def _math_problem(rng: random.Random) -> Problem:
    kind = rng.randrange(5)
    if kind == 0:
        a, x, b = rng.randint(2, 9), rng.randint(-9, 15), rng.randint(1, 30)
        c = a * x + b
        q = f"Solve for $x$: ${a}x + {b} = {c}$."
        steps = [f"Subtract {b} from both sides: ${a}x = {c - b}$.", f"Divide both sides by {a}: $x = {x}$."]
        gt, forms, wrong = str(x), [str(x), f"x = {x}"], str(x + rng.choice([-1, 1, 2]))
        calcs, extra = [(f"({c} - {b}) / {a}", str(x))], {"level": "Level 2", "type": "Algebra"}
    elif kind == 1:
        p, q_ = rng.choice([(1, 2), (1, 3), (2, 3), (3, 4), (2, 5), (3, 5), (4, 7), (5, 8), (3, 7), (5, 9)])
        k = rng.randint(2, 12)
        q = f"Simplify $\\frac{{{p * k}}}{{{q_ * k}}}$."
        steps = [
            f"Both {p * k} and {q_ * k} are divisible by {k}.",
            f"Dividing numerator and denominator by {k} gives ${_frac(p, q_)}$.",
        ]
        gt = _frac(p, q_)
        forms = [f"\\dfrac{{{p}}}{{{q_}}}", gt, f"{p}/{q_}"] + (["0.5"] if (p, q_) == (1, 2) else [])
        wrong, calcs = _frac(p, q_ + 1), [(f"{p * k} / {k}", str(p)), (f"{q_ * k} / {k}", str(q_))]
        extra = {"level": "Level 1", "type": "Prealgebra"}
    elif kind == 2:
        n = rng.randint(5, 12)
        s = 180 * (n - 2)
        q = f"What is the sum of the interior angles, in degrees, of a convex polygon with {n} sides?"
        steps = [
            f"A convex polygon with {n} sides can be cut into {n} - 2 = {n - 2} triangles.",
            f"Each triangle contributes 180 degrees, so the sum is $180 \\cdot {n - 2} = {s}$.",
        ]
        gt, forms, wrong = str(s), [str(s), f"{s}^\\circ"], str(180 * n)
        calcs, extra = [(f"180 * ({n} - 2)", str(s))], {"level": "Level 2", "type": "Geometry"}
    elif kind == 3:
        total = rng.randint(3, 11)
        ways = 6 - abs(total - 7)
        g = math.gcd(ways, 36)
        p, q_ = ways // g, 36 // g
        q = (
            f"Two fair six-sided dice are rolled. What is the probability that the sum of the numbers "
            f"rolled is {total}? Express your answer as a common fraction."
        )
        steps = [
            "There are $6 \\cdot 6 = 36$ equally likely outcomes.",
            f"Exactly {ways} of them have sum {total}, so the probability is ${_frac(ways, 36)} = {_frac(p, q_)}$.",
        ]
        gt, forms, wrong = _frac(p, q_), [_frac(p, q_), f"\\dfrac{{{p}}}{{{q_}}}"], _frac(ways + 1, 36)
        calcs, extra = [(f"{ways} / 36", f"{ways / 36:.6g}")], {"level": "Level 3", "type": "Counting & Probability"}
    else:
        k, m = rng.randint(2, 9), rng.choice([2, 3, 5, 6, 7])
        q = f"Simplify $\\sqrt{{{k * k * m}}}$."
        steps = [
            f"We have ${k * k * m} = {k * k} \\cdot {m}$ and ${k * k} = {k}^2$.",
            f"So $\\sqrt{{{k * k * m}}} = \\sqrt{{{k * k}}} \\cdot \\sqrt{{{m}}} = {k}\\sqrt{{{m}}}$.",
        ]
        gt = f"{k}\\sqrt{{{m}}}"
        forms, wrong = [gt], f"{k + 1}\\sqrt{{{m}}}"
        calcs, extra = [(f"{k * k * m} / {m}", str(k * k))], {"level": "Level 3", "type": "Algebra"}
    return Problem(MATH, q, steps, calcs, gt, forms, wrong, extra)


# ------------------------------------------------------------------------------------------
# conversations
# ------------------------------------------------------------------------------------------

Piece = tuple[str, int]  # (text, response_mask value)


def _final_answer(p: Problem, outcome: str, rng: random.Random) -> tuple[str, str]:
    """The last sentence of the conversation and its ``finish_reason``."""
    if outcome == "length":
        return ("Therefore, the total we are looking for is", "length")
    if p.data_source == GSM8K:
        if outcome == "correct":
            return (f"#### {rng.choice(p.answer_forms)}", "stop")
        if outcome == "wrong":
            return (f"#### {p.wrong}", "stop")
        return (f"So the answer is {p.ground_truth}, and that is my final answer", "stop")
    if outcome == "correct":
        return (f"The final answer is $\\boxed{{{rng.choice(p.answer_forms)}}}$", "stop")
    if outcome == "wrong":
        return (f"The final answer is $\\boxed{{{p.wrong}}}$", "stop")
    return (f"So the answer is ${p.ground_truth}$", "stop")


def _tool_pieces(expr: str, value: str, call_id: int) -> list[Piece]:
    call = json.dumps({"name": "calculator", "arguments": {"expression": expr}})
    return [
        (f"I will use the calculator for this step.\n<tool_call>\n{call}\n</tool_call>", 1),
        (IM_END, 1),
        (
            f'\n{IM_START}user\n<tool_response>\n{{"call_id": {call_id}, "result": "{value}"}}\n'
            f"</tool_response>{IM_END}\n{IM_START}assistant\n",
            0,
        ),
    ]


def _segments(p: Problem, k: int, use_tools: bool, outcome: str, rng: random.Random) -> tuple[list[list[Piece]], str]:
    """Split the solution into ``k`` assistant segments; the answer goes in the last one."""
    steps = list(p.steps)
    while len(steps) < k:
        steps.insert(rng.randrange(len(steps) + 1), rng.choice(_FILLER))
    cuts = sorted(rng.sample(range(1, len(steps)), k - 1)) if k > 1 else []
    bounds = [0, *cuts, len(steps)]
    calcs = list(p.calcs) if use_tools else []
    answer, finish = _final_answer(p, outcome, rng)
    segs: list[list[Piece]] = []
    for j in range(k):
        pieces: list[Piece] = [(" ".join(steps[bounds[j] : bounds[j + 1]]), 1)]
        if calcs and (j < k - 1 or rng.random() < 0.5):
            expr, value = calcs.pop(0)
            pieces[0] = (pieces[0][0] + "\n", 1)
            pieces += _tool_pieces(expr, value, call_id=len(p.calcs) - len(calcs))
        if j == k - 1:
            pieces.append((("\n" if pieces[-1][1] else "") + answer, 1))
            if finish == "stop":
                pieces.append((IM_END, 1))
        elif pieces[-1][1]:  # a turn that ends without a tool call: the agent asks the model to go on
            pieces.append((IM_END, 1))
        segs.append(pieces)
    return segs, finish


def _encode(tokenizer: Tokenizer, pieces: Iterable[Piece]) -> tuple[list[int], list[int]]:
    ids: list[int] = []
    mask: list[int] = []
    for text, m in pieces:
        got = list(tokenizer.encode(text))
        ids += got
        mask += [m] * len(got)
    return ids, mask


def _uuid(rng: random.Random) -> str:
    h = f"{rng.getrandbits(128):032x}"
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:]}"


def make_trajectories(n: int, seed: int = 0, tokenizer: Tokenizer | None = None) -> list[dict[str, Any]]:
    """``n`` trajectories of a GRPO math rollout, each with the reward it must get.

    Args:
        n: how many trajectories (sessions) to make.
        seed: same ``(n, seed)``, same trajectories, token for token.
        tokenizer: anything with ``encode(text) -> list[int]``; default the bundled demo
            tokenizer (``rewardq.reward.tokenizer.load_tokenizer("builtin:demo")``). Workers must
            decode with the same tokenizer (``--tokenizer builtin:demo``).

    Returns:
        A list of trajectory dicts (see the module docstring) with ``expected`` set to the
        reward the default scorers give its final output (1.0 or 0.0).
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if tokenizer is None:
        from rewardq.reward.tokenizer import load_tokenizer

        tokenizer = load_tokenizer("builtin:demo")
    rng = random.Random(seed)
    continue_ids = list(tokenizer.encode(CONTINUE))
    out: list[dict[str, Any]] = []
    index = 0
    while len(out) < n:
        make: Callable[[random.Random], Problem] = _gsm8k_problem if rng.random() < 0.55 else _math_problem
        p = make(rng)
        uid, use_tools_prompt = _uuid(rng), rng.random() < 0.4
        instruction = GSM8K_INSTRUCTION if p.data_source == GSM8K else MATH_INSTRUCTION
        raw_prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{p.question} {instruction}"}]
        prompt_text = (
            "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in raw_prompt) + f"{IM_START}assistant\n"
        )
        prompt_ids = list(tokenizer.encode(prompt_text))
        extra_info = {"split": "train", "index": index, "question": p.question, **p.extra}
        if use_tools_prompt:
            extra_info["need_tools_kwargs"] = True
            extra_info["tools_kwargs"] = {"calculator": {"create_kwargs": {"ground_truth": p.ground_truth}}}
        sample = {
            "data_source": p.data_source,
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": p.ground_truth},
            "extra_info": extra_info,
            "raw_prompt": raw_prompt,
            "agent_name": "tool_agent" if use_tools_prompt else "single_turn_agent",
        }
        index += 1
        for session in range(min(rng.choice([1, 2, 2, 4]), n - len(out))):
            roll = rng.random()
            outcome = "correct" if roll < 0.6 else "wrong" if roll < 0.85 else "format" if roll < 0.95 else "length"
            k = rng.randint(1, 6)
            segs, finish = _segments(p, k, use_tools_prompt and rng.random() < 0.8, outcome, rng)
            outputs, history, turns, tool_calls = [], list(prompt_ids), 1, 0
            with_logprobs = rng.random() < 0.5
            for j, pieces in enumerate(segs):
                ids, mask = _encode(tokenizer, pieces)
                calls = sum(1 for _, m in pieces if m == 0)
                tool_calls += calls
                turns += 1 + calls
                last = j == len(segs) - 1
                o: dict[str, Any] = {
                    "prompt_ids": list(history),
                    "response_ids": ids,
                    "response_mask": mask,
                    "num_turns": turns,
                    "extra_fields": {
                        "turn_scores": [],
                        "tool_rewards": [0.0] * calls,
                        "tool_calls": tool_calls,
                        "finish_reason": finish if last else ("tool_calls" if calls else "stop"),
                        "request_id": f"req-{uid[:8]}-{session}-{j}",
                    },
                }
                if with_logprobs:
                    o["response_logprobs"] = [round(-rng.expovariate(4.0), 4) if m else 0.0 for m in mask]
                outputs.append(o)
                history += ids
                if not last and mask and mask[-1] == 1:
                    history += continue_ids
                    turns += 1
            out.append(
                {
                    "uid": uid,
                    "session_id": str(session),
                    "sample": copy.deepcopy(sample),
                    "outputs": outputs,
                    "expected": 1.0 if outcome == "correct" else 0.0,
                }
            )
    return out
