"""Run one rewardq worker for the benchmark, gated so several workers start consuming together.

``python -m benchmarks.worker_runner --namespace NS [--name N] [--url URL]``

The worker is put together as every worker is (:mod:`rewardq.consumers.compose`:
``prepare_worker`` then ``open_worker``), and its life is :meth:`~rewardq.consumers.worker.Worker.run`'s
(``serve`` -> ``stop``; SIGTERM/SIGINT request a clean stop) with one addition: once it is open
(imports, groups, manager and tokenizer set up) it prints ``READY`` and waits for a line on stdin
before ``serve`` reads the first entry. The worker is built from a plain
:class:`~rewardq.config.WorkerConfig` with the defaults (``naive`` manager, the bundled demo
tokenizer, concurrency 32, batch 256), so what is measured is what ``rewardq worker`` runs.

With ``BENCH_PYINSTRUMENT=FILE`` the serving part runs under pyinstrument (main thread only;
the scoring executor thread is invisible to it: prefer py-spy, see ``docs/performance.md``).
With ``BENCH_CPROFILE=FILE`` it runs under cProfile (the event loop's thread only), whose stats
are dumped to ``FILE`` (read them with ``pstats``); cProfile slows the loop ~2x, so take its
shares, not its times.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from rewardq.config import WorkerConfig
from rewardq.consumers.compose import open_worker, prepare_worker
from rewardq.consumers.process import freeze_startup_heap


async def _wait_go(stopped: asyncio.Event) -> bool:
    """Wait for a line on stdin (go) or a stop signal; True means go."""
    loop = asyncio.get_running_loop()
    go = asyncio.Event()
    loop.add_reader(sys.stdin.fileno(), go.set)
    waits = [asyncio.ensure_future(stopped.wait()), asyncio.ensure_future(go.wait())]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    loop.remove_reader(sys.stdin.fileno())
    for w in waits:
        w.cancel()
    return go.is_set() and not stopped.is_set()


async def main(args: argparse.Namespace) -> None:
    cfg = WorkerConfig(
        redis_url=args.url,
        namespace=args.namespace,
        name=args.name,
        manager=args.manager,
        concurrency=args.concurrency,
        batch_size=args.batch_size,
        tokenizer="builtin:demo",  # the workload's ids are the demo tokenizer's
        ledger=args.ledger,
        ledger_flush_interval=args.ledger_flush_interval,
    ).validate()
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()

    def on_signal(name: str) -> None:
        stopped.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig.name)
    worker = await open_worker(prepare_worker(cfg), stopping=stopped)
    if worker is None:
        return
    for sig in (signal.SIGTERM, signal.SIGINT):  # from now on a stop also wakes readers waiting for room
        loop.add_signal_handler(sig, worker.request_stop, sig.name)
    freeze_startup_heap()  # as `rewardq worker` does after start-up
    try:
        print("READY", flush=True)
        if not await _wait_go(stopped):
            return
        profile_path = os.environ.get("BENCH_PYINSTRUMENT")
        cprofile_path = os.environ.get("BENCH_CPROFILE")
        if cprofile_path:
            import cProfile

            prof_c = cProfile.Profile()
            prof_c.enable()
            try:
                await worker.serve()
            finally:
                prof_c.disable()
                prof_c.dump_stats(cprofile_path)
        elif profile_path:
            from pyinstrument import Profiler

            with Profiler(interval=0.0005, async_mode="enabled") as prof:
                await worker.serve()
            with open(profile_path, "w") as f:
                f.write(prof.output_text(unicode=False, color=False, show_all=False))
        else:
            await worker.serve()
    finally:
        await worker.stop()


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--namespace", required=True)
    p.add_argument("--name", default=None)
    p.add_argument("--concurrency", type=int, default=WorkerConfig.concurrency)
    p.add_argument("--batch-size", type=int, default=WorkerConfig.batch_size)
    p.add_argument("--manager", default=WorkerConfig.manager, help="as `rewardq worker --manager`")
    p.add_argument("--ledger", default=None, help="as `rewardq worker --ledger` (off by default)")
    p.add_argument("--ledger-flush-interval", type=float, default=WorkerConfig.ledger_flush_interval)
    args = p.parse_args()
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    asyncio.run(main(args))
    # like the rewardq CLI: the worker has stopped and closed everything; skip torch's ~2 s
    # interpreter teardown so a stopped worker is gone when its parent waits for it
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    cli()
