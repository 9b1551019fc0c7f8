"""The package's layers point one way: checked on the import graph drawn from the source.

Every ``import``/``from ... import`` in ``rewardq/`` (function-level imports included) is an
arrow between components: a subpackage (``queue``, ``reward``, ``consumers``, ...) or a
top-level module (``cli``, ``config``, ``errors``, ...). The same arrows, drawn between modules
and between the folders inside every package, have no cycles either (there, imports under
``if TYPE_CHECKING:`` are left out: they never run).

Each feature that keeps state in Redis (rate limits, the judge, dead letters) lives in one folder
with its Lua and the code that sends its commands: no Lua, no key of it, is used outside that
folder (docs/architecture.md states the rule).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.support.cli_procs import REPO

PACKAGE = REPO / "rewardq"
#: Top-level modules everything may use: they import nothing of rewardq's above themselves
#: (``backoff``: the one pause computation of every retrying loop, standard library only).
FOUNDATION = {"errors", "backoff"}


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


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
            if name == "TYPE_CHECKING":
                out.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return out


def _imports(path: Path, *, typing_only: bool = True) -> set[str]:
    """Absolute names of the rewardq modules ``path`` imports (relative imports resolved), at
    module level or in any function; ``typing_only=False`` leaves out ``TYPE_CHECKING`` imports."""
    tree = ast.parse(path.read_text(), str(path))
    here = _module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    skip = set() if typing_only else _type_checking_nodes(tree)
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:  # `from rewardq import errors` imports the module rewardq.errors
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
    assert {"queue", "reward", "consumers", "producers", "ops", "demo", "cli", "errors", "backoff"} <= set(GRAPH)
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


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components of more than one node: each one is a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
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

    for v in list(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_cycles_between_components() -> None:
    assert not _cycles(GRAPH), _cycles(GRAPH)


def _module_graph() -> dict[str, set[str]]:
    """module -> the rewardq modules it imports when it runs (``TYPE_CHECKING`` imports left out)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        here = _module_name(path)
        graph[here] = {m for m in _imports(path, typing_only=False) if m != here and _is_module(m)}
    return graph


MODULES = _module_graph()


def test_no_cycles_between_modules() -> None:
    """No two modules import each other, directly or round a loop, at module level or in a function."""
    assert len(MODULES) > 100 and "rewardq.reward.execution.isolation" in MODULES
    assert not _cycles(MODULES), _cycles(MODULES)


def _packages() -> list[str]:
    return sorted(_module_name(p) for p in PACKAGE.rglob("__init__.py"))


def _child(package: str, module: str) -> str | None:
    """The child of ``package`` that holds ``module`` (a module or a subpackage), None outside it;
    the package's own ``__init__`` is the child ``__init__``."""
    if module == package:
        return "__init__"
    if not module.startswith(package + "."):
        return None
    return module[len(package) + 1 :].split(".")[0]


def test_no_cycles_between_the_folders_of_any_package() -> None:
    """Inside every package, its modules and subfolders (each folder taken whole) import one way:
    ``reward/`` may use ``reward/execution/`` and ``reward/execution/`` ``reward/tokenizer.py``, but
    nothing in ``execution/`` may import back what imports it."""
    seen = 0
    for package in _packages():
        graph: dict[str, set[str]] = defaultdict(set)
        for src, targets in MODULES.items():
            a = _child(package, src)
            if a is None:
                continue
            graph[a]
            for target in targets:
                b = _child(package, target)
                if b is not None and b != a:
                    graph[a].add(b)
        seen += bool(graph)
        assert not _cycles(graph), (package, _cycles(graph))
    assert seen >= 10


def test_the_manager_contract_loads_no_execution_machinery() -> None:
    """``import rewardq.reward`` (what a scorer process pays) runs none of reward/execution/ but its
    settings and loader: the contract reaches the rest only when a manager first scores or decodes."""
    reach: set[str] = set()
    todo = ["rewardq.reward"]
    while todo:
        name = todo.pop()
        if name not in reach:
            reach.add(name)
            todo.extend(_module_level_imports(name))
    assert "rewardq.reward.base" in reach and "rewardq.reward.registry" in reach
    machinery = {m for m in reach if m.startswith("rewardq.reward.execution.")}
    assert machinery <= {"rewardq.reward.execution.settings", "rewardq.reward.execution.loader"}, machinery


def _path_of(module: str) -> Path:
    path = PACKAGE.parent.joinpath(*module.split("."))
    return path / "__init__.py" if (path / "__init__.py").is_file() else path.with_suffix(".py")


def _module_level_imports(module: str) -> set[str]:
    """The rewardq modules ``module`` imports when it is imported (statements outside functions and
    ``TYPE_CHECKING`` blocks), with the packages a dotted import runs on the way."""
    path = _path_of(module)
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_nodes(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if id(node) in skip or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" if _is_module(f"{base}.{a.name}") else base for a in node.names]
        for name in names:
            parts = name.split(".")
            out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))  # importing a.b.c runs a, a.b
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {m for m in out if m.startswith("rewardq") and _is_module(m)}


def test_every_package_says_its_role_in_its_first_line() -> None:
    for package in _packages():
        doc = ast.get_docstring(ast.parse(_path_of(package).read_text())) or ""
        first = doc.splitlines()[0] if doc else ""
        assert len(first) > 20 and first.rstrip().endswith((".", ")")), f"{package}: {first!r}"


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


# -- each feature in one home (docs/architecture.md) ------------------------------------------
#: Each feature that keeps state in Redis, and the one folder that holds its policy, its Lua and
#: the code that sends its commands.
FEATURES = {
    "rate limits": "rewardq.reward.ratelimit",
    "the judge": "rewardq.reward.judge",
    "dead letters": "rewardq.ops.deadletters",
}
#: Keyspace members that name a feature's keys -> the modules that may use them: the feature's
#: folder, and for dead letters the broker's part that ends trajectories without an answer
#: (``rewardq.queue.endings``), which writes one in the script that fails its trajectory
#: (``lua/fail.lua``). A caller that only names a limiter (``Keyspace.ratelimit``) and hands it to
#: the limiter sends nothing: that key is left out.
FEATURE_KEYS = {
    "judge": ("rewardq.reward.judge",),
    "judge_stats": ("rewardq.reward.judge",),
    "dead": ("rewardq.ops.deadletters", "rewardq.queue.endings"),
    "dead_bytes": ("rewardq.ops.deadletters", "rewardq.queue.endings"),
}
PIPELINE_LUA = PACKAGE / "queue" / "lua"


def _within(module: str, homes: tuple[str, ...]) -> bool:
    return any(module == h or module.startswith(h + ".") for h in homes)


def _trees() -> dict[str, ast.AST]:
    return {_module_name(p): ast.parse(p.read_text(), str(p)) for p in PACKAGE.rglob("*.py")}


TREES = _trees()


def test_every_feature_is_one_package() -> None:
    for feature, package in FEATURES.items():
        assert _path_of(package).name == "__init__.py", feature


def test_lua_lives_in_the_pipelines_folder_or_beside_its_feature() -> None:
    """Every ``.lua`` rewardq ships is a pipeline script of ``queue/lua/`` or sits directly in a
    feature's folder; the pipeline's folder holds only the scripts :mod:`rewardq.queue.scripts` names."""
    from rewardq.queue import scripts

    feature_dirs = {_path_of(p).parent for p in FEATURES.values()}
    for lua in PACKAGE.rglob("*.lua"):
        assert lua.parent == PIPELINE_LUA or lua.parent in feature_dirs, lua
    named = {scripts.FILES.get(n, n) for n in (*scripts.NAMES, *scripts.STANDALONE)} | {"common"}
    assert {p.stem for p in PIPELINE_LUA.glob("*.lua")} == named


def test_a_feature_loads_only_its_own_lua() -> None:
    """``feature_source(package, name)`` is called only from inside ``package``, a feature's folder,
    with literal names of a file that is there; and every feature's ``.lua`` is loaded so."""
    loaded = set()
    for module, tree in TREES.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "feature_source"):
                continue
            package, name = (a.value if isinstance(a, ast.Constant) else None for a in node.args)
            assert isinstance(package, str) and isinstance(name, str), (module, ast.dump(node))
            assert package in FEATURES.values() and _within(module, (package,)), (module, package)
            lua = _path_of(package).parent / f"{name}.lua"
            assert lua.is_file(), lua
            loaded.add(lua)
    shipped = {p for p in PACKAGE.rglob("*.lua") if p.parent != PIPELINE_LUA}
    assert len(shipped) >= 2 and loaded == shipped, (loaded, shipped)


def test_lua_text_is_written_only_in_the_queue_layer_or_a_features_folder() -> None:
    """A string of Lua (one that calls ``redis.call``) in a Python module is the queue layer's or a
    feature's: a script belongs beside the feature it serves."""
    homes = ("rewardq.queue", *FEATURES.values())
    holders = set()
    for module, tree in TREES.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "redis.call(" in node.value:
                holders.add(module)
    assert "rewardq.ops.deadletters.stream" in holders  # the check sees inline Lua
    assert all(_within(m, homes) for m in holders), holders


def _is_keyspace(node: ast.expr) -> bool:
    """Whether an expression reads as a :class:`~rewardq.queue.keys.Keyspace`: ``ks``, ``self.ks``,
    ``keyspace``, ``Keyspace(ns)`` (how every module names one)."""
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Name) and node.func.id == "Keyspace"
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name in {"ks", "keyspace"}


def test_a_features_keys_are_used_only_in_its_folder() -> None:
    """No module outside a feature's folder builds the keys its commands go to, so none sends them."""
    users: dict[str, set[str]] = defaultdict(set)
    for module, tree in TREES.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in FEATURE_KEYS and _is_keyspace(node.value):
                users[node.attr].add(module)
    assert users["judge_stats"] and users["dead"]  # the check sees the features' own uses
    for key, homes in FEATURE_KEYS.items():
        strays = {m for m in users[key] if not _within(m, homes)}
        assert not strays, (key, strays)


def test_the_access_check_and_the_wheel_see_every_features_lua() -> None:
    """A worker's user must be allowed what a feature's script calls, and the wheel ships the script."""
    from rewardq.queue.access import _CALL, script_commands

    feature_lua = [p for p in PACKAGE.rglob("*.lua") if p.parent != PIPELINE_LUA]
    called = {m.upper() for p in feature_lua for m in _CALL.findall(p.read_text())}
    assert "TIME" in called and called <= script_commands(), called - script_commands()
    section = (REPO / "pyproject.toml").read_text().partition("[tool.setuptools.package-data]")[2]
    patterns = ast.literal_eval(section.partition("rewardq = ")[2].partition("\n")[0])
    packaged = {p for pattern in patterns for p in PACKAGE.glob(pattern)}
    assert set(PACKAGE.rglob("*.lua")) <= packaged
