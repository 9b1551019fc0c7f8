"""``rewardq demo``: producers and several worker processes, end to end, with nothing else running.

What happens, in order:

1. generate realistic GRPO math trajectories (:func:`rewardq.demo.data.make_trajectories`);
2. without ``--redis-url``, start an embedded Redis stand-in (:class:`~rewardq.demo.embedded.EmbeddedRedis`,
   fakeredis over TCP, from the ``demo`` extra); where that extra is not installed, use the Redis
   at ``REWARDQ_REDIS_URL`` or ``redis://127.0.0.1:6379/0`` if one answers there, else stop with
   exit code 2 and what to install or pass; with ``--redis-url``, check the real server answers;
3. start N worker **processes** (``python -m rewardq worker ... --tokenizer builtin:demo``) on a
   fresh namespace ``demo-<random>`` and wait until each has sent its first heartbeat (start-up
   time is reported, not counted in throughput);
4. push every trajectory (progress bar), then wait for every reward (progress bar);
5. print the summary: rewards by data source, throughput, push-to-result latency p50/p99,
   errors, and how many rewards equal the value the generator expected;
6. stop every worker (SIGTERM, then SIGKILL after a grace period), delete the generated
   namespace's keys on a real server, stop the embedded server.

``--namespace NAME`` on a real server keeps NAME's keys (results, trajectories, the ``done``
stream, dead letters) for you to look at, and the demo ends by printing the ``redis-cli`` and
``rewardq`` commands that show them (and the one that deletes them). A generated namespace is
deleted. ``--workers 0`` pushes to workers that are already running (``docker compose --profile
demo up producer``): the namespace is ``--namespace``, else ``REWARDQ_NAMESPACE``, else
``rewardq``, and afterwards only the demo's own result and trajectory keys are deleted.

Exit code 0 when every key got a non-error result and every worker exited cleanly, else 1.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rewardq.config import WorkerConfig
from rewardq.demo.hints import kept_note
from rewardq.errors import ConfigError, DemoError
from rewardq.ops.health import HEALTH_MAX_AGE
from rewardq.ops.summary import Pushed, render, summarize
from rewardq.queue.connection import REDIS_URL
from rewardq.queue.keys import NAMESPACE

if TYPE_CHECKING:
    from rich.console import Console

    from rewardq.producers.client import RewardClient

__all__ = ["DemoOptions", "WorkerFleet", "run_demo"]

#: Seconds ``rewardq demo`` waits for its rewards.
DEMO_TIMEOUT = 300.0
#: ``rewardq demo``: worker processes, trajectories, and seconds its workers may take to start.
DEMO_WORKERS = 2
DEMO_TRAJECTORIES = 200
DEMO_READY_TIMEOUT = 120.0
#: Lines of a failed demo worker's log that ``rewardq demo`` prints.
DEMO_LOG_TAIL_LINES = 15


@dataclass
class DemoOptions:
    """``rewardq demo`` options (see the command's ``--help``)."""

    redis_url: str | None = None
    workers: int = DEMO_WORKERS
    trajectories: int = DEMO_TRAJECTORIES
    namespace: str | None = None
    manager: str = WorkerConfig.manager
    seed: int = 0
    as_json: bool = False
    timeout: float = DEMO_TIMEOUT
    ready_timeout: float = DEMO_READY_TIMEOUT
    worker_args: list[str] = field(default_factory=list)


class WorkerFleet:
    """N ``python -m rewardq worker`` processes, each logging to its own file.

    Args:
        n: number of processes.
        redis_url, namespace, manager: passed to every worker.
        logdir: where ``worker-<i>.log`` files go.
        extra_args: more ``rewardq worker`` flags.
    """

    def __init__(
        self, n: int, redis_url: str, namespace: str, manager: str, logdir: Path, extra_args: list[str] | None = None
    ) -> None:
        self.names = [f"{namespace}-w{i}" for i in range(n)]
        self.logdir = logdir
        self.argvs = [
            [
                sys.executable,
                "-m",
                "rewardq",
                "worker",
                "--redis-url",
                redis_url,
                "--namespace",
                namespace,
                "--manager",
                manager,
                "--tokenizer",
                "builtin:demo",
                "--name",
                name,
                "--log-level",
                "WARNING",
                *(extra_args or []),
            ]
            for name in self.names
        ]
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[Any] = []

    def start(self) -> None:
        for i, argv in enumerate(self.argvs):
            log = open(self.logdir / f"worker-{i}.log", "wb")
            self._logs.append(log)
            self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))

    def log_tail(self, i: int, lines: int = DEMO_LOG_TAIL_LINES) -> str:
        try:
            text = (self.logdir / f"worker-{i}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def dead(self) -> list[tuple[int, int]]:
        """``(index, exit code)`` of workers that have exited."""
        return [(i, p.returncode) for i, p in enumerate(self.procs) if p.poll() is not None]

    def wait_ready(self, client: RewardClient, timeout: float) -> float:
        """Block until every worker has sent a heartbeat; returns the seconds it took."""
        t0 = time.monotonic()
        keys = [client.keyspace.worker(name) for name in self.names]
        while True:
            dead = self.dead()
            if dead:
                i, rc = dead[0]
                raise DemoError(f"worker {i} exited with code {rc} during start-up; its log:\n{self.log_tail(i)}")
            pipe = client.r.pipeline(transaction=False)
            for k in keys:
                pipe.exists(k)
            if all(pipe.execute()):
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                raise DemoError(f"workers did not start within {timeout:.0f}s; worker 0 log:\n{self.log_tail(0)}")
            time.sleep(0.1)

    def stop(self, grace: float = WorkerConfig.shutdown_grace) -> list[int | None]:
        """SIGTERM every worker, wait up to ``grace`` seconds, SIGKILL the rest; returns exit codes."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for log in self._logs:
            log.close()
        return [p.returncode for p in self.procs]


def wait_for_live_worker(client: RewardClient, timeout: float, fresh: float = HEALTH_MAX_AGE) -> float:
    """Block until some worker has beaten its heart on the client's namespace in the last ``fresh`` seconds."""
    t0 = time.monotonic()
    while not client.r.zrangebyscore(client.keyspace.workers, time.time() - fresh, "+inf", start=0, num=1):
        if time.monotonic() - t0 > timeout:
            ns = client.keyspace.namespace
            raise DemoError(
                f"no live worker on namespace {ns!r} after {timeout:.0f}s; start one with "
                f"`rewardq worker --namespace {ns} --tokenizer builtin:demo`, or drop --workers 0"
            )
        time.sleep(0.2)
    return time.monotonic() - t0


def _progress(console: Console) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        console=console,
    )


def _rate(done: int, t0: float) -> str:
    return f"{done / max(time.perf_counter() - t0, 1e-9):,.0f}/s"


def run_demo(  # noqa: C901 - one linear script of demo steps; splitting it scatters the story
    opts: DemoOptions, console: Console | None = None, err: Console | None = None
) -> tuple[int, dict[str, Any]]:
    """Run the demo (see the module docstring); returns ``(exit_code, summary)``."""
    from rich.console import Console
    from rich.markup import escape

    from rewardq.demo.data import make_trajectories
    from rewardq.demo.embedded import EmbeddedRedis
    from rewardq.ops.waiting import done_marks, wait_for_results
    from rewardq.producers.client import RewardClient
    from rewardq.queue.connection import redact_url
    from rewardq.queue.namespace import delete_namespace, delete_trajectory_keys
    from rewardq.queue.reachability import probe_redis
    from rewardq.reward.tokenizer import load_tokenizer

    console = console or Console()
    err = err or Console(stderr=True, soft_wrap=True)
    external = opts.workers == 0
    if external and opts.redis_url is None:
        raise ConfigError(
            "--workers 0 pushes to workers that are already running, so it needs --redis-url (and "
            "--namespace or REWARDQ_NAMESPACE naming their namespace)"
        )
    namespace = opts.namespace or (
        os.environ.get("REWARDQ_NAMESPACE") or NAMESPACE if external else f"demo-{os.urandom(4).hex()}"
    )
    found: str | None = None  # a real Redis the demo found because its stand-in is not installed
    if opts.redis_url is None and not embedded_available():
        found = local_redis_or_refuse()
    embedded = EmbeddedRedis() if opts.redis_url is None and found is None else None
    logdir = Path(tempfile.mkdtemp(prefix="rewardq-demo-"))
    fleet: WorkerFleet | None = None
    client: RewardClient | None = None
    pushed: list[Pushed] = []
    kept = opts.namespace is not None and not external  # a namespace the user named: its keys stay
    cleanup = None if embedded is not None or kept else "own-keys" if external else "namespace"
    exit_codes: list[int | None] = []
    failed = True
    try:
        t_gen = time.perf_counter()
        with err.status(f"generating {opts.trajectories} trajectories"):
            trajectories = make_trajectories(
                opts.trajectories, seed=opts.seed, tokenizer=load_tokenizer("builtin:demo")
            )
        gen_s = time.perf_counter() - t_gen
        if embedded is not None:
            url = embedded.start().url
            where = f"embedded Redis stand-in (fakeredis over TCP at {url})"
        elif found is not None:
            url = found
            where = f"Redis at {redact_url(url)} (the embedded stand-in needs rewardq[demo], not installed)"
        else:
            assert opts.redis_url is not None  # no embedded stand-in means a URL was given
            url = opts.redis_url
            probe_redis(url)
            where = f"Redis at {redact_url(url)}"
        mode = f"{where}, " + (
            "workers already running"
            if external
            else f"{opts.workers} worker process{'es' if opts.workers != 1 else ''}"
        )
        err.print(
            "[bold]rewardq demo[/]: "
            + escape(
                f"{len(trajectories)} trajectories ({sum(len(t['outputs']) for t in trajectories)} outputs, "
                f"generated in {gen_s:.2f}s); {mode}; namespace {namespace}"
            )
        )
        client = RewardClient.from_url(url, namespace=namespace)
        _ = client.keyspace  # creates <ns>:meta with one shard before the workers start
        if external:
            with err.status(f"waiting for a live worker on namespace {namespace}"):
                startup_s = wait_for_live_worker(client, opts.ready_timeout)
        else:
            fleet = WorkerFleet(opts.workers, url, namespace, opts.manager, logdir, opts.worker_args)
            fleet.start()
            with err.status(f"starting {opts.workers} worker processes"):
                startup_s = fleet.wait_ready(client, opts.ready_timeout)

        marks = done_marks(client)
        t0 = time.perf_counter()
        with _progress(err) as progress:
            task = progress.add_task("pushing trajectories", total=len(trajectories), rate="")
            for t in trajectories:
                keys = client.put_trajectory(t["uid"], t["session_id"], t["outputs"], t["sample"])
                pushed.append(Pushed(keys, t["sample"]["data_source"], t.get("expected")))
                progress.update(task, advance=1, rate=_rate(len(pushed), t0))
        push_s = time.perf_counter() - t0
        with _progress(err) as progress:
            task = progress.add_task("waiting for rewards   ", total=len(pushed), rate="")
            results, finished = wait_for_results(
                client,
                pushed,
                marks,
                opts.timeout,
                lambda done: progress.update(task, completed=done, rate=_rate(done, t0)),
            )
        summary = summarize(
            pushed,
            results,
            elapsed_s=finished - t0,
            extra={
                "mode": mode,
                "workers": opts.workers,
                "namespace": namespace,
                "kept_namespace": kept and embedded is None,
                "manager": opts.manager,
                "startup_s": round(startup_s, 3),
                "push_s": round(push_s, 3),
            },
        )
        if fleet is not None:
            exit_codes = fleet.stop()
            summary["worker_exit_codes"] = exit_codes
        failed = bool(summary["missing"] or summary["errors"] or any(rc != 0 for rc in exit_codes))
    finally:
        if fleet is not None and not exit_codes:
            fleet.stop()
        if client is not None:
            try:
                if cleanup == "namespace":
                    delete_namespace(client.r, namespace)
                elif cleanup == "own-keys":
                    delete_trajectory_keys(client, [k for p in pushed for k in p.keys])
            except Exception as exc:  # noqa: BLE001 - clean-up must not hide the real outcome
                err.print(f"[yellow]could not delete the demo's keys under {namespace}: {escape(str(exc))}[/]")
            client.close()
        if embedded is not None:
            embedded.stop()
        if failed and fleet is not None:
            err.print(f"[yellow]worker logs kept in {escape(str(logdir))}[/]")
        else:
            shutil.rmtree(logdir, ignore_errors=True)
    if opts.as_json:
        print(json.dumps(summary), flush=True)
    else:
        render(summary, console, title="rewardq demo: rewards by data source")  # the mode is a row below
        if any(rc != 0 for rc in exit_codes):
            console.print(f"[red]worker exit codes: {exit_codes}[/]")
    if kept:
        err.print(kept_note(namespace, None if embedded is not None else url, [k for p in pushed for k in p.keys]))
    return (1 if failed else 0), summary


def embedded_available() -> bool:
    """Whether the embedded stand-in can run: fakeredis and its Lua (the ``demo`` extra)."""
    import importlib.util

    for module in ("fakeredis", "lupa"):  # found, not imported: lupa must not be imported beside fakeredis
        try:
            if importlib.util.find_spec(module) is None:
                return False
        except (ImportError, ValueError):  # a finder that refuses it, or a module set to None
            return False
    return True


def local_redis_or_refuse() -> str:
    """The URL of a Redis that answers at ``REWARDQ_REDIS_URL`` or the default URL, for a demo
    whose embedded stand-in is not installed; else a :class:`ConfigError` saying what to do."""
    from rewardq.errors import RedisUnavailable
    from rewardq.queue.connection import redact_url
    from rewardq.queue.reachability import probe_redis

    url = os.environ.get("REWARDQ_REDIS_URL") or REDIS_URL
    try:
        probe_redis(url)
    except RedisUnavailable as exc:
        raise ConfigError(
            "rewardq demo without --redis-url runs an embedded Redis stand-in, which needs the demo "
            f"extra: pip install 'rewardq[demo]'. Or give it a real Redis: start one (redis-server) at "
            f"{redact_url(url)}, or pass --redis-url redis://host:port/0 ("
            + ("nothing answers there now)" if exc.retryable else f"the one there refused: {exc})")
        ) from None
    return url
