"""Every worker is put together in one place, :mod:`rewardq.consumers.compose`.

A second place that builds a worker's :class:`~rewardq.reward.context.ManagerContext`, its manager from
its settings, or the :class:`~rewardq.consumers.worker.Worker` itself drifts from the first: a CLI
worker's genrm once kept judge answers for the 7-day default whatever ``--result-ttl`` said, because
the CLI built its own context and left ``result_ttl`` out. The scan reads every call in the code
that starts workers (rewardq/, benchmarks/, tests/support/) and, for the worker's own constructors,
in every test too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.cli_procs import REPO
from tests.support.entry_points import installed_entry_points
from tests.support.seqpo_simt import ENTRY_POINT

ROOT = "rewardq/consumers/compose.py"
#: What only the composition root may call, and where else a call is allowed, with why.
ONLY_IN_THE_ROOT: dict[str, dict[str, str]] = {
    "ManagerContext": {
        "rewardq/reward/base.py": "the context of a manager built outside any worker (a user's own test)",
        "rewardq/reward/factory.py": "the same, when such a manager is given code-execution options",
        "benchmarks/managers.py": "times managers alone, with no worker around them",
    },
    "build_from_config": {},
    "Worker": {},
    "WorkerParts": {},
}
#: The worker's own constructors: no test builds a worker but through the root either.
WORKER_ONLY = ("Worker", "WorkerParts", "build_from_config")
SCANNED = ("rewardq", "benchmarks", "tests/support")


def _calls(tree: ast.AST, names: set[str]) -> list[tuple[str, int]]:
    """Calls of ``names`` (``Name(...)`` or ``module.Name(...)``) in ``tree``, with their lines."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in names:
                found.append((name, node.lineno))
    return found


def _offenders(files: list[tuple[str, str]], names: dict[str, dict[str, str]]) -> list[str]:
    """``path:line calls Name(...)`` for each call of ``names`` in ``files`` (path, source) outside the
    root and the places each name allows."""
    out = []
    for rel, source in files:
        if rel == ROOT:
            continue
        for name, line in _calls(ast.parse(source, rel), set(names)):
            if rel not in names[name]:
                out.append(f"{rel}:{line} calls {name}(...)")
    return out


def _python_files(*folders: str) -> list[tuple[str, str]]:
    paths = sorted(p for folder in folders for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts)
    return [(p.relative_to(REPO).as_posix(), p.read_text()) for p in paths]


def test_only_the_composition_root_builds_a_worker_its_context_or_its_manager() -> None:
    assert _calls(ast.parse((REPO / ROOT).read_text()), set(ONLY_IN_THE_ROOT)), "the scan no longer sees the root"
    offenders = _offenders(_python_files(*SCANNED), ONLY_IN_THE_ROOT)
    assert not offenders, f"only {ROOT} puts a worker together; use prepare_worker/open_worker/run_worker: {offenders}"


def test_no_test_builds_a_worker_but_through_the_root() -> None:
    names: dict[str, dict[str, str]] = {n: {} for n in WORKER_ONLY}
    offenders = _offenders(_python_files("tests"), names)
    assert not offenders, f"build test workers with tests.support.helpers.open_test_worker: {offenders}"


@pytest.mark.parametrize(
    ("code", "name"),
    [
        ("ctx = ManagerContext(redis_url=url, result_ttl=60)", "ManagerContext"),
        ("w = worker_mod.Worker(parts)", "Worker"),
        ("m = factory.build_from_config(cfg, ctx, tok)", "build_from_config"),
    ],
)
def test_the_scan_sees_each_way_of_calling(code: str, name: str) -> None:
    probe = [("tests/support/probe.py", f"def start(cfg):\n    {code}\n")]
    assert _offenders(probe, ONLY_IN_THE_ROOT) == [f"tests/support/probe.py:2 calls {name}(...)"]
    assert _offenders([(ROOT, code)], ONLY_IN_THE_ROOT) == []


def test_the_one_context_is_filled_from_the_settings() -> None:
    # the reproduction: a CLI worker's genrm kept judge answers 604800 s whatever --result-ttl said
    from rewardq.config import WorkerConfig
    from rewardq.consumers.compose import prepare_worker

    cfg = WorkerConfig.load(
        env={},
        overrides={
            "manager": "genrm",
            "tokenizer": "builtin:demo",
            "result_ttl": 60.0,
            "namespace": "t-root",
            "redis_url": "redis+cluster://127.0.0.1:7301",
            "scorer_processes": 3,
            "manager_options": {"base_url": "http://127.0.0.1:9/v1", "model": "j"},
        },
    )
    prepared = prepare_worker(cfg)
    ctx = prepared.manager.context
    assert (ctx.result_ttl, ctx.namespace, ctx.worker_name, ctx.cluster) == (60.0, "t-root", prepared.name, True)
    assert ctx.redis_url == cfg.redis_url and ctx.scoring.processes == 3 and prepared.tokenizer is not None
    assert prepared.name and cfg.name is None  # named, without changing the caller's settings
    # and a manager scored outside any worker (rewardq.testing) keeps its state in the process
    assert prepare_worker(cfg, standalone=True).manager.context.redis_url is None


def test_a_manager_spec_is_checked_without_importing_a_manager(tmp_path: Path) -> None:
    from rewardq.errors import UnknownManagerError
    from rewardq.reward.registry import ENTRY_POINT_GROUP, check_manager_spec

    with installed_entry_points(tmp_path / "site", ENTRY_POINT_GROUP, ENTRY_POINT):
        for fine in ("naive", "limited", "seqpo_simt", "pkg.imported_later:Mine"):  # seqpo_simt: an entry point
            check_manager_spec(fine)
    with pytest.raises(UnknownManagerError, match="unknown reward manager 'nope'; known: .*naive"):
        check_manager_spec("nope")
    with pytest.raises(UnknownManagerError, match="no such file"):
        check_manager_spec(f"{tmp_path}/missing.py:Mine")
    check_manager_spec("nope", names_may_register=True)  # a --reward-fn module may still register it


def test_a_manager_the_reward_fn_module_registers_is_found(tmp_path: Path) -> None:
    from rewardq.config import WorkerConfig
    from rewardq.consumers.compose import prepare_worker
    from rewardq.reward import registry

    module = tmp_path / "registering_rewards.py"
    module.write_text(
        "from rewardq.reward import register\n"
        "from rewardq.reward.managers.naive import NaiveRewardManager\n\n\n"
        "@register('t-registered-by-its-reward-fn')\n"
        "class Mine(NaiveRewardManager):\n    pass\n\n\n"
        "def compute_score(**kw):\n    return 1.0\n"
    )
    cfg = WorkerConfig(
        manager="t-registered-by-its-reward-fn",
        tokenizer="builtin:demo",
        reward_fn=str(module),
        reward_fn_placement="inline",
    ).validate()
    try:
        assert type(prepare_worker(cfg, standalone=True).manager).__name__ == "Mine"
    finally:
        registry._REGISTRY.pop("t-registered-by-its-reward-fn", None)
