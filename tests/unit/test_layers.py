"""The package's layers point one way: checked on the import graph drawn from the source.

Every ``import``/``from ... import`` in ``rewardq/`` (function-level imports included) is an
arrow between components: a subpackage (``queue``, ``reward``, ``consumers``, ...) or a
top-level module (``cli``, ``config``, ``errors``, ...).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.support.cli_procs import REPO

PACKAGE = REPO / "rewardq"
#: Top-level modules everything may use: they import nothing of rewardq's above themselves
#: (``backoff``: the one pause computation of every retrying loop, standard library only).
FOUNDATION = {"errors", "defaults", "backoff"}


def _component(module: str) -> str | None:
    """``rewardq.queue.keys`` -> ``queue``; ``rewardq.cli`` -> ``cli``; ``rewardq`` -> ``rewardq``."""
    parts = module.split(".")
    if parts[0] != "rewardq":
        return None
    return parts[1] if len(parts) > 1 else "rewardq"


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(path: Path) -> set[str]:
    """Absolute names of the rewardq modules ``path`` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text(), str(path))
    here = _module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:  # `from rewardq import defaults` imports the module rewardq.defaults
                sub = f"{module}.{alias.name}"
                out.add(sub if _is_module(sub) else module)
    return {m for m in out if m == "rewardq" or m.startswith("rewardq.")}


def _graph() -> dict[str, set[str]]:
    """component -> components it imports (self-arrows left out)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        src = _component(_module_name(path))
        assert src is not None
        graph[src]
        for target in _imports(path):
            dst = _component(target)
            if dst and dst != src and not (target == "rewardq" and path.parent == PACKAGE):
                graph[src].add(dst)
    return graph


GRAPH = _graph()


def test_the_graph_sees_every_subpackage() -> None:
    assert {"queue", "reward", "consumers", "producers", "ops", "demo", "cli", "errors", "defaults", "backoff"} <= set(
        GRAPH
    )
    assert "queue" in GRAPH["consumers"] and "reward" in GRAPH["consumers"]  # the graph is not empty


def test_queue_imports_nothing_above_it() -> None:
    assert GRAPH["queue"] <= FOUNDATION, GRAPH["queue"]


def test_foundation_modules_import_no_other_component() -> None:
    for name in FOUNDATION:
        assert GRAPH[name] <= FOUNDATION - {name}, (name, GRAPH[name])


def test_reward_never_imports_consumers_or_the_doors() -> None:
    assert not GRAPH["reward"] & {"consumers", "ops", "cli", "demo", "producers"}, GRAPH["reward"]


def test_producers_never_import_the_worker_side() -> None:
    assert not GRAPH["producers"] & {"consumers", "reward", "ops", "cli", "demo", "config"}, GRAPH["producers"]


def test_only_the_entry_point_imports_the_cli() -> None:
    importers = {src for src, dsts in GRAPH.items() if "cli" in dsts}
    assert importers <= {"__main__"}, importers


def test_no_cycles_between_components() -> None:
    # Tarjan's strongly connected components: any component of size > 1 is a cycle
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.add(w)
                if w == v:
                    break
            if len(scc) > 1:
                cycles.append(scc)

    for v in list(GRAPH):
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_only_the_queue_layer_imports_redis_py() -> None:
    speakers = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            if any(n == "redis" or n.startswith("redis.") for n in names):
                speakers.add(_component(_module_name(path)))
    assert speakers == {"queue"}, speakers
