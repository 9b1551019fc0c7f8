"""Fixtures for tests/verl: worker fleets started from this (verl) environment, and verl objects.

These tests run only in the verl 0.9.1 environment that .ci/run builds (tensordict 0.10); the
main run does not collect them (pyproject ``testpaths``).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

try:
    import verl  # noqa: F401 - imported to fail here, clearly, rather than in every test module
except ImportError as exc:
    raise pytest.UsageError(
        f"tests/verl compares rewardq with verl itself and runs only where verl 0.9.1 is installed ({exc}). "
        "Run it from the verl environment .ci/run builds: .venv-verl/bin/python -m pytest tests/verl"
    ) from None

from tests.conftest import REDIS_URL, _delete_namespace
from tests.support.cli_procs import Proc, Procs, wait_for, worker_argv
from tests.support.sync_client import SyncClient, connect
from tests.verl.harness import CREATED_NAMESPACES, start_local_ray, stop_local_ray

#: The reward function of :func:`failing_fleet`: raises for responses marked ``FAIL``.
FAILING_SCORER = str(Path(__file__).with_name("failing_scorer.py")) + ":compute_score"


@dataclass
class Fleet:
    """Worker processes serving one namespace."""

    namespace: str
    workers: list[Proc]


def start_fleet(procs: Procs, sync_redis: SyncClient, *extra: str, n: int = 1, tag: str = "w") -> Fleet:
    ns = f"t-verl-{uuid.uuid4().hex[:8]}"
    CREATED_NAMESPACES.add(ns)
    names = [f"{tag}{i}-{uuid.uuid4().hex[:4]}" for i in range(n)]
    workers = [
        procs.start(worker_argv(REDIS_URL, ns, name, "--log-level", "WARNING", *extra, tokenizer=None), tag=name)
        for name in names
    ]
    wait_for(lambda: all(sync_redis.exists(f"{ns}:worker:{n}") for n in names), 120, "worker heartbeats", procs=workers)
    return Fleet(ns, workers)


@pytest.fixture(scope="module")
def module_procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Procs]:
    p = Procs(tmp_path_factory.mktemp("procs"))
    yield p
    p.kill_all()


@pytest.fixture(scope="module")
def module_redis() -> Iterator[SyncClient]:
    r = connect(REDIS_URL)
    yield r
    r.close()


@pytest.fixture(scope="module")
def naive_fleet(module_procs: Procs, module_redis: SyncClient) -> Iterator[Fleet]:
    """Two naive workers with the demo tokenizer, started from this environment."""
    fleet = start_fleet(module_procs, module_redis, "--manager", "naive", "--tokenizer", "builtin:demo", n=2)
    yield fleet
    for w in fleet.workers:
        w.terminate()
    _delete_namespace(REDIS_URL, fleet.namespace)


@pytest.fixture(scope="module")
def failing_fleet(module_procs: Procs, module_redis: SyncClient) -> Iterator[Fleet]:
    """Two naive workers whose reward function raises for a response marked ``FAIL`` and scores the
    rest as the default scorers do (``custom``: the count of ``a`` / 4; tests/verl/failing_scorer.py)."""
    fleet = start_fleet(
        module_procs,
        module_redis,
        "--manager",
        "naive",
        "--tokenizer",
        "builtin:demo",
        "--reward-fn",
        FAILING_SCORER,
        n=2,
    )
    yield fleet
    for w in fleet.workers:
        w.terminate()
    _delete_namespace(REDIS_URL, fleet.namespace)


@pytest.fixture(scope="module")
def echo_fleet(module_procs: Procs, module_redis: SyncClient) -> Iterator[Fleet]:
    """A worker whose manager gives one reward per output (tests.support.managers.EchoManager)."""
    fleet = start_fleet(
        module_procs, module_redis, "--manager", "tests.support.managers:EchoManager", "--tokenizer", "builtin:demo"
    )
    yield fleet
    for w in fleet.workers:
        w.terminate()
    _delete_namespace(REDIS_URL, fleet.namespace)


@pytest.fixture(autouse=True)
async def close_adapter_clients(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[None]:
    """Close the Redis clients adapters opened in this test, on the test's own event loop."""
    from rewardq.integrations.verl.scoring import VerlScorer

    created: list[VerlScorer] = []
    init = VerlScorer.__init__

    def tracking_init(self: VerlScorer, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        created.append(self)

    monkeypatch.setattr(VerlScorer, "__init__", tracking_init)
    yield
    for scorer in created:
        await scorer.aclose()


@pytest.fixture(autouse=True)
def fresh_failure_budgets() -> Iterator[None]:
    """Every test starts with empty run budgets: the tests of a module share a namespace and a run
    (the Ray job, or ``local``), and a budget is counted per namespace and run. Only this run's
    namespaces: other engineers' runs share the Redis."""
    r = connect(REDIS_URL)
    try:
        for ns in list(CREATED_NAMESPACES):
            for key in r.scan_iter(match=f"{ns}*:verl-budget:*", count=1000):
                r.delete(key)
    finally:
        r.close()
    yield


#: Seconds a test that uses this run's Ray may take: the first one on an xdist worker starts Ray and
#: TransferQueue's storage actors (225-300+ s of set-up beside the main suite's tail in CI, where the
#: tests' 300 s default ran out and every later TransferQueue test on that worker errored).
RAY_TEST_TIMEOUT = 900


#: tests/verl's files (and tests/unit/test_batch.py, which runs beside them), longest first: xdist
#: hands a file to each worker in turn in this order, so the longest begin first and the two workers
#: end together (1 s apart) instead of one idling for minutes while the other runs a long file begun
#: last. Measured per file on a 2-core machine under load 20-35: the smoke run 390-713 s, masking
#: 300, code parity 299, the budget test 288, fleet 250, the rest 1-90 each. A file not listed
#: goes after these.
LONGEST_FIRST = (
    "test_verl_loop_benchmark.py",
    "test_masking.py",
    "test_code_parity.py",
    "test_fleet_budget.py",
    "test_fleet.py",
    "test_safety.py",
    "test_trainers.py",
    "test_adapter.py",
    "test_stop.py",
    "test_plugin.py",
    "test_verl_config_workers.py",
    "test_adapter_images.py",
    "test_math_parity.py",
    "test_managers.py",
)


def pytest_configure(config: pytest.Config) -> None:
    # xdist's default hands out the files with the most tests first, whatever their length; this
    # directory orders its files itself (pytest_collection_modifyitems, LONGEST_FIRST)
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def _rank(item: pytest.Item) -> int:
    name = item.path.name
    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_rank)  # stable: a file's tests keep their order
    for item in items:
        if "local_ray" in getattr(item, "fixturenames", ()) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(RAY_TEST_TIMEOUT))


@pytest.fixture(scope="session")
def local_ray() -> Iterator[None]:
    """A Ray of this test run's own (``address="local"``), for verl's reward loop and TransferQueue."""
    temp = start_local_ray()
    yield
    stop_local_ray(temp)


@pytest.fixture(scope="session")
def real_tq(local_ray: None) -> Iterator[ModuleType]:
    """The registry's ``transfer_queue`` package, initialised on the local Ray (what verl's V1 trainer imports)."""
    import transfer_queue as tq

    tq.init()
    yield tq
    tq.close()
