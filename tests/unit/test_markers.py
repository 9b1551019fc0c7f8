"""The suite's markers and tiers say what a test needs, so ``-m "not slow"`` keeps every quick test
and ``tests/unit`` stays fast.

``slow`` marks end-to-end runs with real processes; ``cluster`` marks tests on a local Redis
Cluster. Given every test module, a module-wide ``slow`` mark covers only tests that start a
process (they use the ``procs`` fixture, a fixture that starts worker processes, or spawn one
themselves), and a module-wide ``cluster`` mark only tests that use the cluster. A test that
starts a process (by one of :data:`STARTERS`) belongs in ``tests/integration``: the unit tier
runs in under 30 s on an idle 2-core machine, and a process start costs 0.3-5 s there. The check
reads names, not behaviour: a test that starts processes through a fixture's parameters (a scorer
placement, say) is moved by hand.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli_procs import REPO

TESTS = REPO / "tests"
#: Names a test that starts processes uses: fixtures and helpers from tests/support and the modules.
PROCESS_NAMES = {
    "start_fleet",  # Ray actors running rewardq worker processes
    "share_backlog",  # tests.support.fleet_share: three worker processes
    "recover_dead_worker",
    "procs",
    "sync_fn_worker",
    "math_worker",
    "one_process_worker",  # test_scorer_processes: a worker with one scorer process
    "subprocess",
    "Popen",
    "WorkerProcess",
    "on_a_terminal",
    "worker_argv",
    "ScorerPool",  # scorer processes
    "ProcessPoolExecutor",
    "multiprocessing",
    "run_copy",  # test_settings_doors: the CLI of a patched copy of the package, as a subprocess
}
#: Names that start a process themselves (``worker_argv`` only builds a process's arguments).
STARTERS = PROCESS_NAMES - {"worker_argv"}
CLUSTER_NAMES = {"redis_cluster", "cns", "start_cluster", "LocalCluster"}


def _module_marks(tree: ast.Module) -> set[str]:
    marks: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            for sub in ast.walk(node.value):
                if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Attribute) and sub.value.attr == "mark":
                    marks.add(sub.attr)
    return marks


def _names(node: ast.AST) -> set[str]:
    """Every name, attribute and argument a function uses."""
    out: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            out.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            out.add(sub.attr)
        elif isinstance(sub, ast.arg):
            out.add(sub.arg)
    return out


@functools.cache
def _parsed(path: Path) -> ast.Module:
    """A test module's syntax tree, parsed once for every check here."""
    return ast.parse(path.read_text(), str(path))


def _tests_under(mark: str | None, folder: Path = TESTS) -> list[tuple[str, set[str]]]:
    """Every test of the modules under ``folder`` that carry a module-wide ``mark`` (None: every
    module), with the names it uses."""
    found = []
    for path in sorted(folder.rglob("test_*.py")):
        tree = _parsed(path)
        if mark is not None and mark not in _module_marks(tree):
            continue
        helpers = {n.name: _names(n) for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                used = _names(node)
                for name in list(used):  # a module's own fixtures and helpers count as what they use
                    used |= helpers.get(name, set())
                found.append((f"{path.relative_to(REPO)}::{node.name}", used))
    return found


@pytest.mark.parametrize(("mark", "needs"), [("slow", PROCESS_NAMES), ("cluster", CLUSTER_NAMES)])
def test_a_module_wide_mark_covers_only_tests_that_need_it(mark: str, needs: Any) -> None:
    covered = _tests_under(mark)
    assert covered, f"no module carries a module-wide {mark} mark: the check would prove nothing"
    misplaced = [name for name, used in covered if not used & needs]
    assert not misplaced, f"tests under a module-wide {mark!r} mark that need none of {sorted(needs)}: {misplaced}"


def test_the_check_finds_a_pure_test_under_slow(tmp_path: Path) -> None:
    tree = ast.parse("import pytest\npytestmark = pytest.mark.slow\ndef test_pure():\n    assert 1 + 1 == 2\n")
    assert _module_marks(tree) == {"slow"}
    (test,) = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert not _names(test) & PROCESS_NAMES


def test_the_unit_tier_starts_no_process() -> None:
    starting = sorted(name for name, used in _tests_under(None, TESTS / "unit") if used & STARTERS)
    assert not starting, (
        f"unit tests that start processes (by {sorted(STARTERS)}): {starting}; "
        "move them to tests/integration, where process starts are paid for"
    )


@pytest.mark.parametrize("starter", ["ScorerPool(2)", "run_copy(root, ['--help'])", "subprocess.run(argv)"])
def test_the_check_finds_a_process_started_by_name(starter: str) -> None:
    tree = ast.parse(f"def test_x(root, argv):\n    {starter}\n")
    (test,) = tree.body
    assert _names(test) & STARTERS
