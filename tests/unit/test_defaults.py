"""Every default lives in :mod:`rewardq.defaults`; a literal default elsewhere is a finding.

Given the package's source, no function signature, dataclass field, setting declaration or click
option carries a numeric literal default other than the "nothing yet" values (0 and -1) and a few
listed below with the reason they stay, and no literal default disagrees with the
:mod:`rewardq.defaults` constant of the same name (``result_ttl=86400`` beside ``RESULT_TTL`` of
7 days was one). The scan is checked on sources that break each rule, so it cannot pass by
finding nothing.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import rewardq
from rewardq import defaults

PACKAGE = Path(rewardq.__file__).parent
#: Values a default may spell: zero ("none yet": counters, timestamps, "off") and -1 (a sentinel).
NOTHING = (0, -1)
#: Literal defaults that stay where they are, and why.
KEPT = {
    # a first delivery is delivery 1, an increment is one: counts, not settings
    ("queue/entries.py", "deliveries"): "the first delivery of an entry",
    ("queue/entries.py", "attempts"): "the first attempt at a trajectory",
    ("queue/broker.py", "by"): "one start counted",
    ("consumers/presence.py", "outputs"): "a trajectory of one output",
    # verl's scorer signatures, kept as verl spells them so that a direct call behaves the same
    ("reward/scoring/gsm8k.py", "score"): "verl's gsm8k.compute_score",
    ("reward/scoring/search_r1.py", "score"): "verl's search_r1_like_qa_em.compute_score",
    ("reward/scoring/prime_math/tora.py", "tolerance"): "verl's prime_math math_equal",
    # the example manager is written to be read and copied whole, so its knobs stay in it
    ("reward/examples/seqpo_simt.py", "latency_weight"): "example",
    ("reward/examples/simt_data.py", "latency_weight"): "example",
    ("reward/examples/simt_data.py", "error_rate"): "example",
    ("reward/examples/simt_metrics.py", "max_order"): "example (chrF's own default)",
    ("reward/examples/simt_metrics.py", "beta"): "example (chrF's own default)",
}
#: Modules that run where rewardq cannot be imported (the code sandbox's harness and the modules it
#: loads by path: standard library only).
STANDALONE_GLOB = "reward/codeexec/harness*.py"


@dataclass(frozen=True)
class Default:
    where: str  # path relative to the package, and line
    name: str  # the parameter, field or option
    value: float


def _number(node: ast.expr | None) -> float | None:
    """The value of a numeric literal (``-1``, ``7 * 86400`` too), else None; booleans are not numbers."""
    if node is None:
        return None
    if isinstance(node, ast.Constant):
        value = node.value
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _number(node.operand)
        return None if inner is None else (-inner if isinstance(node.op, ast.USub) else inner)
    if isinstance(node, ast.BinOp) and _number(node.left) is not None and _number(node.right) is not None:
        result: float | None = eval(
            compile(ast.Expression(node), "<default>", "eval")
        )  # arithmetic of two literals only
        return result
    return None


def _call_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Call):
        f = node.func
        return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    return None


def literal_defaults(source: str, rel: str) -> list[Default]:
    """Every numeric literal default in ``source``: signatures, class-level annotated fields
    (plain, ``field(default=...)``, ``setting(...)``) and ``click.option(default=...)``."""
    found: list[Default] = []

    def add(line: int, name: str, node: ast.expr | None) -> None:
        value = _number(node)
        if value is not None:
            found.append(Default(f"{rel}:{line}", name, value))

    for node in ast.walk(ast.parse(source, rel)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            positional = a.posonlyargs + a.args
            for arg, d in zip(positional[len(positional) - len(a.defaults) :], a.defaults):
                add(node.lineno, arg.arg, d)
            for arg, kd in zip(a.kwonlyargs, a.kw_defaults):
                add(node.lineno, arg.arg, kd)
        elif isinstance(node, ast.ClassDef):
            for st in node.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.value is not None:
                    value = st.value
                    if _call_name(value) in ("field", "setting") and isinstance(value, ast.Call):
                        kw = {k.arg: k.value for k in value.keywords}
                        value = kw.get("default", value.args[0] if value.args else None)  # type: ignore[assignment]
                    add(st.lineno, st.target.id, value)
        elif isinstance(node, ast.Call) and _call_name(node) == "option":
            kw = {k.arg: k.value for k in node.keywords}
            flag = next(
                (a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")), "?"
            )
            add(node.lineno, str(flag), kw.get("default"))
    return found


def findings(source: str, rel: str) -> tuple[list[Default], list[tuple[Default, float]]]:
    """(literal defaults that belong in defaults.py, literal defaults that disagree with it)."""
    misplaced, disagreeing = [], []
    for d in literal_defaults(source, rel):
        constant = getattr(defaults, d.name.lstrip("-").replace("-", "_").upper(), None)
        if isinstance(constant, (int, float)) and not isinstance(constant, bool) and constant != d.value:
            disagreeing.append((d, constant))
        if d.value not in NOTHING and (rel, d.name) not in KEPT:
            misplaced.append(d)
    return misplaced, disagreeing


def package_findings() -> tuple[list[Default], list[tuple[Default, float]]]:
    misplaced, disagreeing = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        if rel == "defaults.py" or path.match(str(PACKAGE / STANDALONE_GLOB)):
            continue
        m, d = findings(path.read_text(), rel)
        misplaced += m
        disagreeing += d
    return misplaced, disagreeing


def test_no_numeric_default_lives_outside_defaults_py() -> None:
    misplaced, _ = package_findings()
    assert not misplaced, "numeric defaults outside rewardq/defaults.py:\n" + "\n".join(
        f"  {d.where} {d.name}={d.value!r}" for d in misplaced
    )


def test_no_literal_default_disagrees_with_defaults_py() -> None:
    _, disagreeing = package_findings()
    assert not disagreeing, "\n".join(
        f"  {d.where} {d.name}={d.value!r} but defaults says {c!r}" for d, c in disagreeing
    )


def test_the_scan_sees_every_kind_of_default() -> None:
    # the scan found the package's zero defaults and the kept ones (a scan that sees nothing passes vacuously)
    seen = {
        (str(p.relative_to(PACKAGE)), d.name)
        for p in PACKAGE.rglob("*.py")
        for d in literal_defaults(p.read_text(), str(p.relative_to(PACKAGE)))
    }
    assert set(KEPT) <= seen
    source = """
import click
from dataclasses import dataclass, field
def f(a, result_ttl=86400, *, lease_seconds=30.0, keep_records=0.0, n=-1): ...
async def g(limit: int = 2 * 10): ...
@dataclass
class C:
    concurrency: int = 16
    batch_size: int = field(default=7)
    shutdown_grace: float = setting(12.0, "help")
    flag: bool = True
@click.option("--max-outputs", type=int, default=8)
def cmd(max_outputs): ...
"""
    misplaced, disagreeing = findings(source, "x.py")
    assert {d.name for d in misplaced} == {
        "result_ttl",
        "lease_seconds",
        "limit",
        "concurrency",
        "batch_size",
        "shutdown_grace",
        "--max-outputs",
    }
    assert {d.name: c for d, c in disagreeing} == {
        "result_ttl": defaults.RESULT_TTL,
        "concurrency": defaults.CONCURRENCY,
        "batch_size": defaults.BATCH_SIZE,
        "shutdown_grace": defaults.SHUTDOWN_GRACE,
        "--max-outputs": defaults.MAX_OUTPUTS,
    }  # lease_seconds=30.0 and keep_records=0.0 agree with defaults.py, n=-1 names no constant


@pytest.mark.parametrize("name", [n for n in dir(defaults) if n.isupper()])
def test_every_default_is_documented(name: Any) -> None:
    source = (PACKAGE / "defaults.py").read_text()
    lines = source.splitlines()
    at = next(
        i
        for i, line in enumerate(lines)
        if line.startswith(f"{name} =") or line.startswith(f"{name}:") or f" {name} =" in line
    )
    above = lines[at - 1] if at else ""
    documented = above.startswith("#:") or any(
        lines[j].startswith("#:") for j in range(max(0, at - 4), at) if lines[j].strip()
    )
    assert documented, f"defaults.{name} has no #: comment saying what it bounds"
