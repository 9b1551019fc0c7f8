"""Build ``rewardq/assets/demo-tokenizer.json``: a small byte-level BPE for demos and tests.

The demo tokenizer lets rewardq run end to end (``--tokenizer builtin:demo``) without
downloading a model. It is trained offline, in about a second, with the ``tokenizers``
library on a corpus this module generates from a fixed seed: GSM8K-style word
problems with ``#### <answer>`` lines, MATH-style LaTeX (``\\boxed{}``, ``\\frac{}{}``),
``Answer:`` lines, Search-R1 tags and chat-template text. Same seed, same corpus, same
JSON: run it again and ``git diff`` shows nothing.

Design:

* **byte-level** (GPT-2 style) pre-tokenisation and decoding, no normaliser, so every
  Unicode string round-trips exactly: ``decode(encode(s)) == s``;
* digits are split one per token (as Qwen and Llama 3 do), which keeps numbers honest;
* special tokens ``<|endoftext|>`` (id 0, so the batch pad id 0 is a special token),
  ``<|im_start|>`` and ``<|im_end|>``, removed by ``decode(..., skip_special_tokens=True)``.

Usage::

    python -m tools.make_demo_tokenizer            # rewrite the asset
    python -m tools.make_demo_tokenizer --check    # exit 1 if the asset is stale
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Iterator
from pathlib import Path

from rewardq.reward.tokenizer import DEMO_PATH

#: Special tokens, in id order.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
VOCAB_SIZE = 3000
SEED = 20240601
N_DOCUMENTS = 4000

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
    "Ali",
    "Maria",
    "Sam",
    "Priya",
    "Chen",
    "Omar",
    "Lucia",
    "Kofi",
]
_ITEMS = [
    "apples",
    "clips",
    "books",
    "pencils",
    "cookies",
    "marbles",
    "stickers",
    "eggs",
    "cupcakes",
    "tickets",
    "shirts",
    "flowers",
    "cards",
    "candies",
    "boxes",
    "pages",
    "bottles",
    "toys",
]
_VERBS = ["bought", "sold", "gave away", "found", "baked", "collected", "picked", "read", "made", "lost"]
_TIMES = ["on Monday", "in April", "every week", "in the morning", "last year", "each day", "on Sunday"]
_PROSE = (
    "Let us think step by step. First we find the total, then we subtract what is left. "
    "The question asks how many are there in all, so we add the two amounts together. "
    "We can check the answer by working backwards from the result. "
    "Therefore the final answer is the number we computed above. "
    "The capital of France is Paris and the longest river in the world is the Nile. "
    "A triangle has three sides, a square has four equal sides, and a circle has no corners. "
    "To solve the equation, isolate the variable on one side and simplify the other side. "
    "The probability of an event is the number of favorable outcomes divided by the total. "
    "Search the knowledge base for the most relevant passage, then answer the question. "
    "You are a helpful assistant. Please reason step by step, and put your final answer within "
)
#: Common English and math words; random sentences over them give BPE whole-word merges.
_WORDS = """
the of and to in is that it was for on are as with his they at be this from have or by one had not
but what all were when we there can an your which their said if do will each about how up out them
then she many some so these would other into has more her two like him see time could no make than
first been its who now people my made over did down only way find use may water long little very
after words called just where most know get through back much before go good new write our used me
man too any day same right look think also around another came come work three word must because
does part even place well such here take why things help put years different away again off went
old number great tell men say small every found still between name should home big give air line set
own under read last never us left end along while might next sound below saw something thought both
few those always looked show large often together asked house world going want school important until
form food keep children feet land side without boy once animals life enough took sometimes four head
above kind began almost live page got earth need far hand high year mother light parts country father
let night following picture being study second eyes soon times story boys since white days ever paper
hard near sentence better best across during today others sure means knew its try told young miles
sun ways thing whole hear example heard several change answer room sea against top turned learn point
city play toward five using himself usually money seen car morning ten music question numbers problem
solve solution equation equal equals value values variable variables total sum difference product
quotient fraction fractions decimal percent percentage ratio rate speed distance hours minutes seconds
price cost costs dollars cents each per half twice triple double remaining left altogether average
area perimeter volume length width height radius diameter circle square rectangle triangle angle
angles degrees integer integers positive negative even odd prime factor factors multiple multiples
divisible remainder digit digits sequence series term terms function functions polynomial root roots
real complex imaginary coefficient exponent logarithm derivative integral limit matrix vector
probability expected random choose ways arrangements combinations permutations greatest least common
divisor maximum minimum find compute determine evaluate simplify express prove show given suppose
assume therefore thus hence since because so let consider note recall define denote substitute
multiply divide add subtract plus minus times over into first second third fourth final result step
steps check verify correct incorrect answer answers question questions reasoning think search
information document documents passage relevant assistant user system helpful please format box
boxed within final born capital river mountain country city population president author wrote novel
film released album song team won championship year century war history science physics chemistry
biology company founded located largest smallest oldest youngest famous known called named member
students teacher class classroom library garden farm store market bakery kitchen party trip weekend
"""


def _sentence(rng: random.Random) -> str:
    words = _WORDS.split()
    n = rng.randint(6, 18)
    text = " ".join(rng.choice(words) for _ in range(n))
    return text[0].upper() + text[1:] + rng.choice([".", ".", "?", "!", ","])


_LATEX = [
    r"\frac{{{a}}}{{{b}}}",
    r"\sqrt{{{a}}}",
    r"{a}^{{{b}}}",
    r"\dfrac{{{a}}}{{{b}}}",
    r"{a}\pi",
    r"\left( {a}, {b} \right)",
    r"{a} \cdot {b}",
    r"\text{{{a} cm}}",
    r"{a}^\circ",
    r"x = {a}",
]


def _word_problem(rng: random.Random) -> str:
    name, other = rng.sample(_NAMES, 2)
    item = rng.choice(_ITEMS)
    a, b = rng.randint(2, 999), rng.randint(2, 99)
    verb = rng.choice(_VERBS)
    total = a + b
    price = rng.randint(1, 20)
    return (
        f"{name} {verb} {a} {item} {rng.choice(_TIMES)}, and {other} {verb} {b} more. "
        f"How many {item} do they have in total?\n"
        f"{name} has {a} {item} and {other} has {b} {item}, so together they have "
        f"{a} + {b} = <<{a}+{b}={total}>>{total} {item}. "
        f"At ${price} each, that is {total} * {price} = ${total * price:,}.\n#### {total}"
    )


def _math_solution(rng: random.Random) -> str:
    a, b = rng.randint(1, 60), rng.randint(2, 60)
    expr = rng.choice(_LATEX).format(a=a, b=b)
    style = rng.random()
    if style < 0.4:
        return f"We simplify the expression step by step to get ${expr}$. The answer is $\\boxed{{{expr}}}$."
    if style < 0.7:
        return f"Solving for $x$, we find $x = {expr}$.\nAnswer: {expr}"
    return f"Since ${a} + {b} = {a + b}$, the result is \\boxed{{{a + b}}}."


def _search_turn(rng: random.Random) -> str:
    name = rng.choice(_NAMES)
    return (
        f"<think>I need to find where {name} was born.</think>\n<search> {name} birthplace </search>\n"
        f"<information>Doc 1: {name} was born in Paris in {rng.randint(1900, 2005)}.</information>\n"
        f"<think>The document answers it.</think>\n<answer> Paris </answer>"
    )


def _chat(rng: random.Random, body: str) -> str:
    return (
        f"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        f"<|im_start|>user\n{body.splitlines()[0]}<|im_end|>\n<|im_start|>assistant\n{body}<|im_end|>\n"
    )


def corpus(seed: int = SEED, n: int = N_DOCUMENTS) -> Iterator[str]:
    """The training corpus: ``n`` documents drawn from a fixed seed."""
    rng = random.Random(seed)
    makers = (_word_problem, _math_solution, _search_turn)
    for i in range(n):
        doc = makers[i % len(makers)](rng)
        if rng.random() < 0.25:
            doc = _chat(rng, doc)
        if rng.random() < 0.3:
            start = rng.randrange(0, len(_PROSE) - 80)
            doc = _PROSE[start : start + rng.randint(40, 200)] + "\n" + doc
        doc = " ".join(_sentence(rng) for _ in range(rng.randint(1, 4))) + "\n" + doc
        yield doc


def build_json(vocab_size: int = VOCAB_SIZE) -> str:
    """Train the demo tokenizer and return its JSON (compact, deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok.to_str(pretty=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed asset differs")
    parser.add_argument("--out", type=Path, default=DEMO_PATH, help="where to write (default: the asset)")
    args = parser.parse_args(argv)
    text = build_json()
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is stale; run python -m tools.make_demo_tokenizer", file=sys.stderr)
            return 1
        print(f"{args.out} is up to date")
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out} ({len(text.encode())} bytes, vocab {VOCAB_SIZE})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
