"""A default lives beside its meaning, once, and no two places disagree about it.

A setting's default is written in its declaration (``setting(...)`` in :mod:`rewardq.config`,
``option(...)`` in a manager's options); a tunable that is not a setting is a documented module
constant beside the code that uses it. Given the package's source:

* no function signature, dataclass field or click option carries a numeric literal default other
  than the "nothing yet" values (0 and -1) and a few listed below with the reason they stay: it
  names the declaration or the constant instead;
* no constant is defined with a literal in two modules, and no literal default disagrees with a
  constant or a :class:`~rewardq.config.WorkerConfig` setting of the same name
  (``result_ttl=86400`` beside a ``RESULT_TTL`` of 7 days was one);
* every module constant that serves as a default says what it bounds (a ``#:`` comment).

The scan is checked on sources that break each rule, so it cannot pass by finding nothing.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import rewardq
from rewardq.adapter_settings import AdapterSettings
from rewardq.config import WorkerConfig
from rewardq.reward.codeexec.settings import CodeExecSettings
from rewardq.reward.managers.disrm_options import DisRMOptions
from rewardq.reward.managers.genrm_options import GenRMOptions
from rewardq.settings import settings_of

PACKAGE = Path(rewardq.__file__).parent
DOCS = [PACKAGE.parent / "README.md", *sorted((PACKAGE.parent / "docs").glob("*.md"))]
#: Every class that declares settings or manager options.
DECLARING = (WorkerConfig, AdapterSettings, CodeExecSettings, GenRMOptions, DisRMOptions)
#: Values a default may spell: zero ("none yet": counters, timestamps, "off") and -1 (a sentinel).
NOTHING = (0, -1)
#: Literal defaults that stay where they are, and why.
KEPT = {
    # a first delivery is delivery 1, an increment is one: counts, not settings
    ("queue/entries.py", "deliveries"): "the first delivery of an entry",
    ("queue/entries.py", "attempts"): "the first attempt at a trajectory",
    ("queue/attempts.py", "by"): "one start counted",
    ("consumers/presence.py", "outputs"): "a trajectory of one output",
    # verl's scorer signatures, kept as verl spells them so that a direct call behaves the same
    ("reward/scoring/gsm8k.py", "score"): "verl's gsm8k.compute_score",
    ("reward/scoring/search_r1.py", "score"): "verl's search_r1_like_qa_em.compute_score",
    ("reward/scoring/prime_math/tora.py", "tolerance"): "verl's prime_math math_equal",
}
#: Modules that run where rewardq cannot be imported (the code sandbox's harness and the modules it
#: loads by path: standard library only).
STANDALONE_GLOB = "reward/codeexec/harness*.py"
#: The calls that declare a setting or a manager option, with its default as the first argument.
DECLARATIONS = ("setting", "option")


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


def _keywords(node: ast.Call) -> dict[str | None, ast.expr]:
    return {k.arg: k.value for k in node.keywords}


def literal_defaults(source: str, rel: str) -> list[Default]:
    """Every numeric literal default in ``source`` outside a declaration: signatures, class-level
    annotated fields (plain or ``field(default=...)``) and ``click.option(default=...)``."""
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
                    if _call_name(value) in DECLARATIONS:
                        continue  # a declaration is where a setting's default lives
                    if _call_name(value) == "field" and isinstance(value, ast.Call):
                        kw = _keywords(value)
                        value = kw.get("default", value.args[0] if value.args else None)  # type: ignore[assignment]
                    add(st.lineno, st.target.id, value)
        elif isinstance(node, ast.Call) and _call_name(node) == "option" and "default" in _keywords(node):
            kw = _keywords(node)
            flag = next(
                (a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")), "?"
            )
            add(node.lineno, str(flag), kw.get("default"))
    return found


def declared_defaults(source: str, rel: str) -> dict[str, list[tuple[str, float]]]:
    """NAME -> [(where, value)]: module constants assigned a numeric literal (``MAX_OUTPUTS = 4096``)."""
    found: dict[str, list[tuple[str, float]]] = {}
    for st in ast.parse(source, rel).body:
        if not isinstance(st, (ast.Assign, ast.AnnAssign)):
            continue
        target = st.target if isinstance(st, ast.AnnAssign) else st.targets[0]
        if isinstance(target, ast.Name) and target.id.isupper():
            value = _number(st.value)
            if value is not None:
                found.setdefault(target.id, []).append((f"{rel}:{st.lineno}", value))
    return found


def undocumented_constants(source: str, rel: str, used_as_default: set[str]) -> list[str]:
    """Module constants named in ``used_as_default`` with no ``#:`` comment above their line (or
    above the run of constants their line belongs to)."""
    lines = source.splitlines()
    missing = []
    for st in ast.parse(source, rel).body:
        target = st.target if isinstance(st, ast.AnnAssign) else st.targets[0] if isinstance(st, ast.Assign) else None
        if not (isinstance(target, ast.Name) and target.id in used_as_default):
            continue
        at = st.lineno - 2  # the line above, 0-based
        while at >= 0 and lines[at][:1].isupper() and "=" in lines[at]:
            at -= 1  # a run of constants shares one comment
        if not (at >= 0 and lines[at].startswith("#:")):
            missing.append(f"{rel}:{st.lineno} {target.id}")
    return missing


def names_used_as_defaults(source: str, rel: str) -> set[str]:
    """Names (``X`` or ``module.X``) given as defaults: of parameters, fields, declarations, options."""
    out: set[str] = set()

    def add(node: ast.expr | None) -> None:
        for n in ast.walk(node) if node is not None else ():
            if isinstance(n, ast.Name) and n.id.isupper():
                out.add(n.id)
            elif isinstance(n, ast.Attribute) and n.attr.isupper():
                out.add(n.attr)

    for node in ast.walk(ast.parse(source, rel)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for d in [*node.args.defaults, *node.args.kw_defaults]:
                add(d)
        elif isinstance(node, ast.ClassDef):
            for st in node.body:
                if isinstance(st, ast.AnnAssign):
                    value = st.value
                    if isinstance(value, ast.Call) and _call_name(value) in (*DECLARATIONS, "field"):
                        add(value.args[0] if value.args else _keywords(value).get("default"))
                    else:
                        add(value)
        elif isinstance(node, ast.Call) and _call_name(node) == "option":
            add(_keywords(node).get("default"))
    return out


def _sources() -> list[tuple[str, str]]:
    return [
        (str(path.relative_to(PACKAGE)), path.read_text())
        for path in sorted(PACKAGE.rglob("*.py"))
        if not path.match(str(PACKAGE / STANDALONE_GLOB))
    ]


def _settings() -> dict[str, object]:
    """Every declared setting's default, by its name in capitals (``RESULT_TTL``)."""
    out: dict[str, object] = {}
    for cls in (WorkerConfig, AdapterSettings):
        for s in settings_of(cls).values():
            out[(s.spec.key or s.name).upper()] = s.default
    return out


def findings(sources: list[tuple[str, str]], settings: dict[str, object]) -> dict[str, list[str]]:
    """What breaks each rule in ``sources`` ((path, text) pairs), given the declared settings."""
    misplaced: list[str] = []
    constants: dict[str, list[tuple[str, float]]] = {}
    used: set[str] = set()
    for rel, source in sources:
        for name, places in declared_defaults(source, rel).items():
            constants.setdefault(name, []).extend(places)
        used |= names_used_as_defaults(source, rel)
    constants = {name: places for name, places in constants.items() if name in used}  # the defaults among them
    twice = [f"{name}: {', '.join(w for w, _ in places)}" for name, places in constants.items() if len(places) > 1]
    disagreeing = []
    for rel, source in sources:
        for d in literal_defaults(source, rel):
            if d.value not in NOTHING and (rel, d.name) not in KEPT:
                misplaced.append(f"{d.where} {d.name}={d.value!r}")
            key = d.name.lstrip("-").replace("-", "_").upper()
            # a constant of the same name may mean something else where this default says "none" (0, -1)
            known: list[object] = [] if d.value in NOTHING else [v for _, v in constants.get(key, [])]
            known += [settings[key]] if key in settings else []
            for value in known:
                if isinstance(value, (int, float)) and not isinstance(value, bool) and value != d.value:
                    disagreeing.append(f"{d.where} {d.name}={d.value!r} but {key} is {value!r}")
    for name, places in constants.items():
        declared = settings.get(name)
        for where, value in places:
            if isinstance(declared, (int, float)) and not isinstance(declared, bool) and declared != value:
                disagreeing.append(f"{where} {name}={value!r} but the setting {name.lower()} is {declared!r}")
    undocumented = [m for rel, source in sources for m in undocumented_constants(source, rel, used)]
    return {"misplaced": misplaced, "twice": twice, "disagreeing": disagreeing, "undocumented": undocumented}


FINDINGS = findings(_sources(), _settings())


def test_no_numeric_literal_default_outside_a_declaration() -> None:
    assert not FINDINGS["misplaced"], "numeric literal defaults outside a declaration or constant:\n  " + "\n  ".join(
        FINDINGS["misplaced"]
    )


def test_no_default_constant_is_written_twice() -> None:
    assert not FINDINGS["twice"], "constants defined in two places:\n  " + "\n  ".join(FINDINGS["twice"])


def test_no_two_places_disagree_about_a_default() -> None:
    assert not FINDINGS["disagreeing"], "\n  ".join(FINDINGS["disagreeing"])


def test_every_default_constant_says_what_it_bounds() -> None:
    assert not FINDINGS["undocumented"], "constants used as defaults without a #: comment:\n  " + "\n  ".join(
        FINDINGS["undocumented"]
    )


def test_there_is_no_hub_of_defaults() -> None:
    assert not (PACKAGE / "defaults.py").exists()
    assert not any("rewardq.defaults" in text or "import defaults" in text for _, text in _sources())


def test_the_scan_sees_every_kind_of_finding() -> None:
    # the scan found the package's kept defaults (a scan that sees nothing passes vacuously)
    seen = {(rel, d.name) for rel, source in _sources() for d in literal_defaults(source, rel)}
    assert set(KEPT) <= seen
    assert len(names_used_as_defaults((PACKAGE / "queue/broker.py").read_text(), "b.py")) > 3
    a = """
import click
from dataclasses import dataclass, field
#: Seconds results are kept.
RESULT_TTL = 7 * 86400.0

LEASE_SECONDS = 30.0
GRACE = 5.0
def f(a, result_ttl=86400, *, lease_seconds=LEASE_SECONDS, keep_records=0.0, n=-1, grace=GRACE, ttl=RESULT_TTL): ...
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
    b = """
#: Seconds results are kept, again.
RESULT_TTL = 86400.0
"""
    found = findings([("a.py", a), ("b.py", b)], {"CONCURRENCY": 32, "SHUTDOWN_GRACE": 30.0, "LEASE_SECONDS": 30.0})
    assert {m.split()[1].split("=")[0] for m in found["misplaced"]} == {
        "result_ttl",
        "limit",
        "concurrency",
        "batch_size",
        "--max-outputs",
    }  # the declaration setting(12.0, ...) is a default's home, n=-1 and keep_records=0.0 mean "none"
    assert found["twice"] == ["RESULT_TTL: a.py:5, b.py:3"]
    assert sorted(m.split()[1] for m in found["disagreeing"]) == [
        "concurrency=16",
        "result_ttl=86400",  # disagrees with a.py's RESULT_TTL (b.py's agrees: it is the finding above)
    ]
    assert found["undocumented"] == ["a.py:7 LEASE_SECONDS", "a.py:8 GRACE"]  # RESULT_TTL has its comment


# -- the documentation's tables of defaults ----------------------------------------------------
UNITS = {"": 1, "s": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "days": 86400, "day": 86400}
ROW = re.compile(r"^\| `([a-z_0-9]+)` \| ([0-9][0-9,.]*) ?(KiB|MiB|GiB|s|days?)? \|", re.M)


def documented_defaults(text: str) -> list[tuple[str, float]]:
    """(name, value) of each table row ``| `name` | 16 MiB | ...`` (a number, with a unit or none)."""
    return [(m[1], float(m[2].replace(",", "")) * UNITS[m[3] or ""]) for m in ROW.finditer(text)]


def test_the_documented_defaults_are_the_declared_ones() -> None:
    declared: dict[str, list[object]] = {}
    for cls in DECLARING:
        for setting in settings_of(cls).values():
            declared.setdefault(setting.name, []).append(setting.default)
    rows = [(page.name, name, value) for page in DOCS for name, value in documented_defaults(page.read_text())]
    checked = [(page, name, value) for page, name, value in rows if name in declared]
    assert len(checked) >= 15, checked  # the limits, ledger, code-execution and judge tables
    wrong = [
        f"{page}: {name} = {value:g}, declared {declared[name]}"
        for page, name, value in checked
        if value not in declared[name]
    ]
    assert not wrong, "\n".join(wrong)


def test_the_docs_scan_reads_units() -> None:
    text = "| `max_record_bytes` | 32 MiB | x |\n| `max_outputs` | 4,096 | y |\n| `dead_letter_ttl` | 7 days | z |\n"
    assert documented_defaults(text) == [
        ("max_record_bytes", 32 * 1024**2),
        ("max_outputs", 4096.0),
        ("dead_letter_ttl", 604800.0),
    ]
