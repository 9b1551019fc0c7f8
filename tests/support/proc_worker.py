"""Run one reward worker as a real process, for fault-injection tests and ``benchmarks.faults``.

    python -m tests.support.proc_worker --redis-url redis://127.0.0.1:7001/0 --namespace t1 \\
        --manager tests.support.managers:EchoManager --manager-options '{"sleep": 0.2}' --claim-idle 2

Every :class:`~rewardq.config.WorkerConfig` setting is a flag (``--claim-idle``,
``--result-ttl``, ...; dicts as JSON objects) and, as in production, a ``REWARDQ_<NAME>`` variable. The worker
is put together and runs exactly as ``rewardq worker``'s (:mod:`rewardq.consumers.compose`:
``run_worker(prepare_worker(cfg), own_process=True)``; SIGTERM hands in-flight work back), logging to stderr.

Test-only faults
----------------
``REWARDQ_TEST_FAULT=<mode>[:<n>]`` makes the worker SIGKILL itself at a precise point,
the n-th time (default 1) it gets there. The hook lives here, not in the library:

``kill-after-read``
    XREADGROUP returned entries (now pending for this consumer); die before storing them.
``kill-before-commit``
    the manager has scored a trajectory; write every key's result hash exactly as the
    commit would (for the first trajectory of a commit batch), then die before the commit
    scripts, which are what acknowledges (the "between write-back and acknowledgement"
    window of a non-atomic design).
``kill-after-commit``
    the commit scripts of a batch ran (results written, entries acknowledged); die before
    the worker records that they finished.

Killing "while scoring" needs no hook: use ``EchoManager(sleep=..., mark_dir=...)`` and
SIGKILL the process from the test once a mark file appears.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rewardq.config import WorkerConfig
from rewardq.consumers.compose import prepare_worker, run_worker
from rewardq.consumers.worker import Worker
from rewardq.logs import setup_logging
from rewardq.queue.broker import RESULT_FIELDS, StreamBroker
from rewardq.settings import parse_text
from tests.support.cli_procs import REPO

logger = logging.getLogger("rewardq.test.fault")
FAULT_ENV = "REWARDQ_TEST_FAULT"
FAULT_MODES = ("kill-after-read", "kill-before-commit", "kill-after-commit")


def _die(what: str) -> None:
    logger.warning("FAULT %s: SIGKILL pid %d now", what, os.getpid())
    for h in logging.getLogger().handlers:
        h.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def install_fault(broker: StreamBroker, spec: str) -> None:
    """Patch ``broker`` so the process SIGKILLs itself as ``spec`` says (see the module doc)."""
    mode, _, nth = spec.partition(":")
    if mode not in FAULT_MODES:
        raise SystemExit(f"{FAULT_ENV}={spec!r}: mode must be one of {FAULT_MODES}")
    target = int(nth or 1)
    seen = 0

    def hit() -> bool:
        nonlocal seen
        seen += 1
        return seen >= target

    if mode == "kill-after-read":
        read = broker.read

        async def faulty_read(*args: Any, **kwargs: Any) -> Any:
            entries = await read(*args, **kwargs)
            if entries and hit():
                _die(f"kill-after-read: {len(entries)} entries delivered, none stored")
            return entries

        broker.read = faulty_read  # type: ignore[method-assign]  # the fault hook replaces the method
        return

    commit_many = broker.commit_many

    async def faulty_commit_many(items: Any) -> list[Any]:
        if mode == "kill-before-commit" and hit():
            shard, tid, results = items[0]
            results = getattr(results, "results", results)  # EncodedResults keeps the RewardResults
            pipe = broker.r.pipeline(transaction=False)
            for r in results:
                rkey = broker.ks.reward(shard, r.key)
                h = r.to_hash()
                pipe.hset(rkey, mapping={f: h[f] for f in RESULT_FIELDS})
                if broker.result_ttl > 0:
                    pipe.expire(rkey, broker.result_ttl)
            await pipe.execute()
            _die(f"kill-before-commit: wrote {len(results)} results of {tid}, acknowledged nothing")
        done = await commit_many(items)
        if mode == "kill-after-commit" and hit():
            _die(f"kill-after-commit: {', '.join(tid for _, tid, _ in items)} committed and acknowledged")
        return done

    async def faulty_commit(shard: int, tid: str, results: Any, status: str = "ok") -> bool:
        if status != "ok":
            return await commit(shard, tid, results, status)
        reply = (await faulty_commit_many([(shard, tid, results)]))[0]
        if isinstance(reply, Exception):
            raise reply
        return bool(reply)

    # the worker commits through its CommitCoalescer: commit alone, commit_many in batches
    commit = broker.commit
    broker.commit_many = faulty_commit_many  # type: ignore[method-assign]  # fault hook
    broker.commit = faulty_commit  # type: ignore[method-assign]  # fault hook


def parse_args(argv: list[str] | None = None) -> dict[str, Any]:
    """One ``--flag`` per WorkerConfig setting (values as in ``REWARDQ_*``); returns the overrides given."""
    known = WorkerConfig.settings()
    p = argparse.ArgumentParser(prog="python -m tests.support.proc_worker", description=__doc__.splitlines()[0])
    for name in known:
        p.add_argument("--" + name.replace("_", "-"), dest=name, default=None)
    given = {name: raw for name, raw in vars(p.parse_args(argv)).items() if raw is not None}
    return {name: parse_text(known[name], raw, f"--{name.replace('_', '-')}={raw!r}") for name, raw in given.items()}


class WorkerProcess:
    """A worker process started by a test (or the fault run); stopped by its PID only.

    The Redis URL travels in ``REWARDQ_REDIS_URL`` (not on the command line, where ``ps``
    would show its password).

    Args:
        url, namespace: where it works.
        fault: a ``REWARDQ_TEST_FAULT`` spec (see the module doc), or None.
        cli: run the real ``python -m rewardq worker`` command instead of this module
            (no fault hooks there).
        log_dir: where its stderr goes (``<name>.log``); default: a temp dir.
        env: extra environment variables.
        settings: WorkerConfig fields (``manager="naive"``, ``claim_idle=2``, ...).
    """

    def __init__(
        self,
        url: str,
        namespace: str,
        *,
        fault: str | None = None,
        cli: bool = False,
        log_dir: str | Path | None = None,
        env: dict[str, str] | None = None,
        **settings: Any,
    ) -> None:
        if cli and fault:
            raise ValueError("fault hooks exist only in tests.support.proc_worker, not in the rewardq CLI")
        self.name = str(settings.setdefault("name", f"pw-{os.urandom(3).hex()}"))
        settings.setdefault("tokenizer", "builtin:demo")  # the tests' ids are the demo tokenizer's: asked for by name
        self.namespace = settings["namespace"] = namespace
        extra_env = env or {}
        env = {k: v for k, v in os.environ.items() if not k.startswith("REWARDQ_")}
        env.update(extra_env)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env["REWARDQ_REDIS_URL"] = url
        if fault:
            env[FAULT_ENV] = fault
        args = (
            [sys.executable, "-m", "rewardq", "worker"] if cli else [sys.executable, "-m", "tests.support.proc_worker"]
        )
        for k, v in settings.items():
            raw = json.dumps(v) if isinstance(v, dict) else str(v)
            if cli and k == "manager_options":
                for ok, ov in v.items():
                    args += ["--manager-option", f"{ok}={json.dumps(ov)}"]
            elif cli and isinstance(v, bool):
                flag = WorkerConfig.settings()[k].flag
                args.append(flag if v else "--no-" + flag[2:])
            elif cli:
                args += [WorkerConfig.settings()[k].flag, "none" if v is None else raw]
            else:
                args += ["--" + k.replace("_", "-"), raw]
        self.log_path = Path(log_dir or tempfile.mkdtemp(prefix="rewardq-worker-")) / f"{self.name}.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            args, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL (a crash): nothing is handed back or unregistered."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self._log.close()

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM (a graceful stop) and wait; returns the exit code."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.returncode
        finally:
            self._log.close()

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_for_log(self, text: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log():
                return True
            if not self.alive():
                return text in self.log()
            time.sleep(0.05)
        return False


def main(argv: list[str] | None = None) -> int:
    cfg = WorkerConfig.load(overrides=parse_args(argv))
    setup_logging(cfg.log_level, cfg.log_format)
    fault = os.environ.get(FAULT_ENV) or None

    def arm(worker: Worker) -> None:  # the test fault (if any), on the broker once the worker is open
        if fault:
            install_fault(worker.broker, fault)
            logger.info("worker %s armed with fault %s", worker.name, fault)

    asyncio.run(run_worker(prepare_worker(cfg), own_process=True, on_open=arm))
    return 0


if __name__ == "__main__":
    sys.exit(main())
