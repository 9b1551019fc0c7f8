"""Shared fixtures for tests/unit and tests/integration; shared helpers live in tests/support.

Integration tests use the real Redis at 127.0.0.1:6379, in a numbered database this run claims for
itself (``tests.support.claimed_db``), each test in its own namespace, deleting only its keys. A run
that leaves any key in its database fails, with the keys listed (:func:`pytest_sessionfinish`).
``REWARDQ_TEST_REDIS_URL`` names another Redis instead; the run then fails when that database holds
keys at the end that it did not hold at the start.

The suite runs on pytest-xdist's worker processes (``-n``, ``pyproject.toml``). The controller
claims the database and checks it once at the end, after every worker has finished; the workers
inherit its URL through the environment. Tests that share a resource of the machine run on one
worker, one after another (:func:`pytest_collection_modifyitems`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
import redis

from rewardq.queue import scripts
from tests.support.alone import machine_lock, run_lock
from tests.support.ci_tail import Tail
from tests.support.claimed_db import ClaimedDb, NoDatabaseFree, claim
from tests.support.cli_procs import Procs
from tests.support.cluster import ClusterStartError, LocalCluster
from tests.support.sync_client import ClusterClient, SyncClient, connect, connect_cluster

if TYPE_CHECKING:  # both import torch (through tensordict): imported in the fixtures that use them, so a
    # pytest run that loads this file as a plugin (tests/integration/test_leftover_keys.py) starts in
    # a fraction of the time
    from rewardq.reward.managers.naive import NaiveRewardManager
    from tests.support.managers import LengthManager

T = TypeVar("T")

SHARED_REDIS = "redis://127.0.0.1:6379/0"
#: Set for the processes a claiming run starts (pytest in a subprocess, Ray's actors): they use the
#: run's database as it is, and only the run that claimed it checks it.
INHERITED = "REWARDQ_TEST_REDIS_INHERITED"
#: Set by pytest-xdist in its worker processes; the controller (or a run without xdist) has none.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")


def _needs_redis(argv: list[str]) -> bool:
    """Whether this command line may collect tests that use Redis: a run of tests/unit alone needs none."""
    unit = (Path(__file__).parent / "unit").resolve()
    paths = [Path(a.split("::")[0]) for a in argv[1:] if not a.startswith("-")]
    paths = [p.resolve() for p in paths if p.exists()]
    return not paths or any(p != unit and unit not in p.parents for p in paths)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """Run tests/unit alone in this process unless ``-n`` is given: its tests take milliseconds, and four
    workers that each import torch and collect the suite cost more than they save (88 s against 54 s
    for tests/unit on 2 cores, measured)."""
    given = config.invocation_params.args
    if not _needs_redis(sys.argv) and not any(a == "-n" or a.startswith(("-n", "--numprocesses")) for a in given):
        config.option.numprocesses = 0


def _redis_for_this_run() -> tuple[str, ClaimedDb | None]:
    explicit = os.environ.get("REWARDQ_TEST_REDIS_URL")
    if explicit:
        return explicit, None
    if XDIST_WORKER:  # the controller claims (or found no Redis, or needs none) before it starts workers
        return SHARED_REDIS, None
    if not _needs_redis(sys.argv):
        return SHARED_REDIS, None
    try:
        claimed = claim(SHARED_REDIS)
    except redis.ConnectionError:
        return SHARED_REDIS, None  # no Redis here: the tests that need it say so (fixture redis_url)
    except NoDatabaseFree as exc:
        raise pytest.UsageError(str(exc)) from None
    os.environ["REWARDQ_TEST_REDIS_URL"] = claimed.url
    os.environ[INHERITED] = "1"
    return claimed.url, claimed


REDIS_URL, CLAIMED = _redis_for_this_run()
_KEYS_AT_START: set[str] | None = None


def _all_keys(url: str) -> set[str]:
    r = redis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=2)
    try:
        return set(r.scan_iter(count=1000))
    finally:
        r.close()


def pytest_sessionstart(session: pytest.Session) -> None:
    """Say which database the run claimed; with a Redis of the developer's own, note its keys to compare at the end."""
    global _KEYS_AT_START
    _TAIL.watch(session)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if CLAIMED is not None and reporter is not None and CLAIMED.cleaned:
        reporter.write_line(
            f"Redis database {CLAIMED.db}: deleted {len(CLAIMED.cleaned)} key(s) an ended or killed run left "
            f"(e.g. {CLAIMED.cleaned[0]})",
            yellow=True,
        )
    own_redis = os.environ.get("REWARDQ_TEST_REDIS_URL") and not os.environ.get(INHERITED)
    if CLAIMED is None and own_redis and not XDIST_WORKER:
        try:
            _KEYS_AT_START = _all_keys(REDIS_URL)
        except redis.ConnectionError:
            _KEYS_AT_START = None


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when it left keys in Redis, naming them (and deleting them from a claimed database)."""
    for folder in _RUN_LOCK_FOLDERS:
        shutil.rmtree(folder, ignore_errors=True)
    if CLAIMED is not None:
        left = CLAIMED.leftovers()
        CLAIMED.delete(left)
        CLAIMED.release()
        where = f"database {CLAIMED.db} (claimed by this run; deleted now)"
    elif _KEYS_AT_START is not None:
        left = sorted(_all_keys(REDIS_URL) - _KEYS_AT_START)
        where = f"{REDIS_URL} (not there when the run started)"
    else:
        return
    if not left:
        return
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    title = f"this run left {len(left)} key(s) in Redis {where}: every test must delete what it creates"
    lines = left[:50] + ([f"... and {len(left) - 50} more"] if len(left) > 50 else [])
    if reporter is None:
        print(title, *lines, sep="\n", file=sys.stderr)
        return
    reporter.write_sep("=", "keys left in Redis", red=True)
    for line in (title, *lines):
        reporter.write_line(line, red=True)


#: Modules that run programs in the local code sandbox. Some check the whole machine (the sandbox's
#: uids in ``ps``, the harness's processes, the ``/tmp/rewardq-code-*`` work dirs), so two of them
#: at once would each see the other's programs: they share one xdist worker, and each test holds a
#: machine-wide lock, so tests/verl's parity test (run beside the main suite in CI) and other
#: developers' runs wait for it too.
LOCAL_SANDBOX_MODULES = {
    "test_code_container.py",
    "test_code_hostile.py",
    "test_code_hostile_jobs.py",
    "test_code_local.py",
    "test_code_modes.py",
    "test_code_nonroot.py",
    "test_code_parity.py",  # tests/verl
}


def _xdist_group(item: pytest.Item) -> str | None:
    """The xdist group a test runs in (``--dist loadgroup``: one worker runs a group's tests in turn)."""
    if "redis_cluster" in getattr(item, "fixturenames", ()):
        return "redis-cluster"  # one session-scoped local cluster serves them all
    if item.path.name in LOCAL_SANDBOX_MODULES:
        return "local-code-sandbox"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test's xdist group. First among the hooks: xdist's worker reads the groups in its own
    ``pytest_collection_modifyitems`` (it puts ``@group`` on the test's id, which is what
    ``--dist loadgroup`` schedules by), and that plugin is registered after this file, so it runs before
    any hook here that is not ``tryfirst`` and would see no group at all."""
    for item in items:
        group = _xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def pytest_collection_finish(session: pytest.Session) -> None:
    """(xdist worker, ``--dist loadgroup``) Fail the run when the groups did not reach the test ids, as
    with pytest 9.2 and pytest-xdist 3.8 (constraints.txt): the tests of a group would run on several
    workers at once, each waiting for the machine's sandbox lock or starting a Redis Cluster of its own."""
    if not (XDIST_WORKER and session.config.getvalue("loadgroup")):
        return
    lost = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
    if lost:
        raise pytest.UsageError(
            f"--dist loadgroup: {len(lost)} test(s) have an xdist_group but their ids carry none (e.g. {lost[0]}); "
            "this pytest and pytest-xdist do not work together (pins: constraints.txt)"
        )


def _run_lock_folder(testrunuid: str) -> Path:
    """Where the workers of one xdist run keep the lock of ``alone`` tests (``tests.support.alone``)."""
    return Path(tempfile.gettempdir()) / f"rewardq-test-run-{testrunuid}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    """On an xdist worker, run a test marked ``alone`` while no other test runs, every other test beside
    others; a local code sandbox test holds the machine's sandbox lock."""
    with contextlib.ExitStack() as held:
        run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
        if XDIST_WORKER and run:
            folder = _run_lock_folder(run)
            folder.mkdir(exist_ok=True)
            held.enter_context(run_lock(folder, alone=item.get_closest_marker("alone") is not None))
        if item.path.name in LOCAL_SANDBOX_MODULES:
            held.enter_context(machine_lock("local-code-sandbox"))
        return (yield)


_RUN_LOCK_FOLDERS: set[Path] = set()
_TAIL = Tail()


def pytest_configure_node(node: Any) -> None:
    """(xdist controller) Note the run's lock folder, removed when the run ends."""
    _RUN_LOCK_FOLDERS.add(_run_lock_folder(node.workerinput["testrunuid"]))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """(controller) Count finished tests: CI starts tests/verl in the suite's tail (tests.support.ci_tail)."""
    if report.when == "teardown" and not XDIST_WORKER:
        _TAIL.test_done()


def pytest_testnodedown(node: Any, error: object) -> None:
    """(xdist controller) Note when a worker was done (tests.support.ci_tail)."""
    _TAIL.node_down()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    _TAIL.summary(terminalreporter)


def _delete_namespace(url: str, ns: str) -> None:
    r = redis.Redis.from_url(url)
    try:
        for pattern in (f"{ns}:*",):
            batch = []
            for k in r.scan_iter(match=pattern, count=1000):
                batch.append(k)
                if len(batch) >= 500:
                    r.delete(*batch)
                    batch = []
            if batch:
                r.delete(*batch)
    finally:
        r.close()


@pytest.fixture(scope="session")
def redis_url() -> str:
    r = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        r.ping()
    except redis.ConnectionError as exc:  # fail, never skip: the real server is part of the contract
        pytest.fail(f"Redis is not reachable at {REDIS_URL} ({exc}); start it with `redis-server --daemonize yes`")
    finally:
        r.close()
    return REDIS_URL


@pytest.fixture
def ns(redis_url: str) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    yield name
    _delete_namespace(redis_url, name)


@pytest.fixture
def sync_redis(redis_url: str) -> Iterator[SyncClient]:
    r = connect(redis_url)
    yield r
    r.close()


@pytest.fixture
def length_manager() -> LengthManager:
    from tests.support.managers import LengthManager

    LengthManager.calls = []
    return LengthManager(None)


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.get_event_loop().run_until_complete(coro)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    """CLI processes started by a test (``tests.support.cli_procs.Procs``), killed after it."""
    p = Procs(tmp_path)
    yield p
    p.kill_all()


@pytest.fixture
async def naive() -> AsyncIterator[Callable[..., NaiveRewardManager]]:
    """``make(fn, **settings)``: a naive manager over ``fn`` with those ScoringSettings, closed after the test."""
    from rewardq.reward.base import ManagerContext, ScoreFn
    from rewardq.reward.execution.settings import ScoringSettings
    from rewardq.reward.managers.naive import NaiveRewardManager
    from tests.support.records import TOK

    made: list[NaiveRewardManager] = []

    def make(fn: ScoreFn, **settings: Any) -> NaiveRewardManager:
        m = NaiveRewardManager(TOK, fn, context=ManagerContext(scoring=ScoringSettings(**settings)))
        made.append(m)
        return m

    yield make
    for m in made:
        await m.close()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalCluster]:
    """A fresh 3-master cluster for the session; fails (never skips) when it cannot start."""
    try:
        cluster = LocalCluster().start()
    except ClusterStartError as exc:
        pytest.fail(f"could not start the local Redis Cluster:\n{exc}")
    print(f"\n[cluster] 3 masters on ports {cluster.ports} ready in {cluster.startup_seconds:.2f}s")
    yield cluster
    cluster.stop()


@pytest.fixture
def rc(redis_cluster: LocalCluster) -> Iterator[ClusterClient]:
    """A blocking client of the local cluster, for the checks of the cluster tests."""
    r = connect_cluster("127.0.0.1", redis_cluster.ports[0])
    yield r
    r.close()


@pytest.fixture
def cns() -> str:
    """A namespace of its own on the local cluster for each test (the cluster is thrown away at the end)."""
    return f"c-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def single_slot_scripts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run every rewardq script with a ``#!lua`` shebang in the tests that use it (the scripts of
    ``scripts.FLAGS`` with their own flags, every other one with none).

    Scripts without a shebang may touch any key of the node they run on (Redis keeps that
    for old scripts); with it, the cluster refuses any key outside the slot of the declared
    keys, including the keys a script builds from a prefix. So every script that runs here
    is proven to stay in one slot.
    """
    plain = scripts.source

    def with_shebang(name: str, flagged: bool = True) -> str:
        src = plain(name, flagged)
        return src if src.startswith("#!") or not flagged else "#!lua\n" + src

    monkeypatch.setattr(scripts, "source", with_shebang)
