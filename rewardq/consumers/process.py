"""Settings of a worker *process*: things only the process's owner should change.

A :class:`~rewardq.consumers.worker.Worker` embedded in someone else's process (a test, the
embedded demo) leaves the interpreter alone except for torch's intra-op thread count;
``rewardq worker`` also freezes the start-up heap (and raises the collector's young threshold)
and installs :class:`StopSignals`, which guarantee that SIGTERM ends the process within
``shutdown_grace`` + 5 s.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable

logger = logging.getLogger("rewardq.worker")


#: The garbage collector's young-generation threshold in a worker's own process (CPython's default: 700).
GC_YOUNG_THRESHOLD = 10_000


def freeze_startup_heap() -> None:
    """Move every object alive after start-up into the garbage collector's permanent generation,
    and collect the young generation less often.

    torch, tensordict and the tokenizer leave ~310,000 tracked objects behind, none of which
    ever becomes garbage, and a full collection walks all of them: 120 ms on the benchmark
    machine, one every few thousand trajectories, a stall that lands in some trajectory's
    latency. After ``gc.freeze()`` collections see only objects created later (0 full
    collections and ~1.5 % less worker CPU in a 6,000-trajectory drain, docs/performance.md).

    A read batch allocates a few thousand objects at once (records, batches, results), nearly all
    freed by their reference counts when their trajectories are committed; with CPython's
    threshold of 700 every batch set off young collections that walked the trajectories in flight
    (~350 young and ~30 middle collections per 2,000 trajectories, ~7 % of the event loop's CPU).
    At :data:`GC_YOUNG_THRESHOLD` a batch rarely reaches one; garbage in reference cycles still
    goes at the next collection. For the owner of the process only (``rewardq worker``, the
    benchmark's runner): it affects every object of the interpreter, not just the worker's.
    """
    gc.collect()
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, GC_YOUNG_THRESHOLD), middle, old)


def limit_torch_threads() -> None:
    """One intra-op thread: a trajectory batch is a few thousand ids, too small to split.

    With torch's default (one thread per core) small ops wake the OpenMP pool, whose threads
    spin: docs/performance.md measured 7.0 ms of worker CPU per trajectory with 2 threads,
    3.1 ms with 1, on 2 cores. An explicit ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` wins.
    """
    if "OMP_NUM_THREADS" in os.environ or "MKL_NUM_THREADS" in os.environ:
        return
    import torch

    if torch.get_num_threads() > 1:
        torch.set_num_threads(1)


class EarlySignals:
    """Remember SIGTERM/SIGINT received before the worker's own handlers (:class:`StopSignals`) are
    installed: while ``rewardq worker`` imports torch and waits for Redis.

    ``target`` (a stop request) is called when set; ``received`` holds the signal's name.
    """

    def __init__(self) -> None:
        self.received: str | None = None
        self.target: Callable[[str], None] | None = None

    def install(self) -> EarlySignals:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        self.received = signal.Signals(signum).name
        if self.target is not None:
            self.target(self.received)


class StopSignals:
    """SIGTERM/SIGINT handling for a process the worker owns, with a deadline that always holds.

    The first signal asks the worker to stop (``on_stop(name)``, run in its event loop) and
    arms a deadline: ``deadline`` seconds later the process ends with ``os._exit`` whatever
    still runs. What it guards against: a thread running a hung reward function (Python
    cannot stop one; asyncio waits for its default executor's threads when the loop closes,
    and the interpreter joins ``concurrent.futures`` threads at exit), a child that ignores
    SIGTERM, or an event loop blocked by user code.

    The handlers are plain ``signal.signal`` ones, which the main thread runs between two
    bytecodes even while user code holds the event loop, not ``loop.add_signal_handler``
    ones, which run only once the loop gets control back.

    Args:
        loop: the worker's event loop.
        on_stop: called in the loop with the signal's name (the worker's ``request_stop``).
        deadline: seconds from the first signal to the forced exit.
        exit_code: called at the deadline for the exit status (0 when the worker had
            stopped cleanly and only leftovers kept the process alive).
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        on_stop: Callable[[str], None],
        *,
        deadline: float,
        exit_code: Callable[[], int],
    ) -> None:
        self.loop = loop
        self.on_stop = on_stop
        self.deadline = deadline
        self.exit_code = exit_code
        self.received: str | None = None

    def install(self) -> StopSignals:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if self.received is None:
            self.received = name
            exit_after(self.deadline, self.exit_code, why=f"{name} received")
        try:
            self.loop.call_soon_threadsafe(self.on_stop, name)
        except RuntimeError:  # the loop is closed: the worker has stopped already
            pass


_deadline_lock = threading.Lock()
_deadline: list[float] = []  # the monotonic time of the forced exit, once armed


def exit_after(seconds: float, exit_code: Callable[[], int], *, why: str) -> None:
    """End the process with ``os._exit(exit_code())`` in ``seconds`` unless it ended by then.

    A daemon thread waits, logs what is still running, flushes the log handlers and exits.
    Arming it again can only bring the exit closer (the earlier deadline wins).
    """
    at = time.monotonic() + seconds
    with _deadline_lock:
        if _deadline:
            _deadline[0] = min(_deadline[0], at)
            return
        _deadline.append(at)

    def expire() -> None:
        while True:
            with _deadline_lock:
                left = _deadline[0] - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(left, 0.1))
        others = [t.name for t in threading.enumerate() if t is not threading.current_thread() and t.is_alive()]
        code = exit_code()
        logger.error(
            "process still running after %s (threads: %s); exiting now with code %d",
            why,
            ", ".join(others) or "none",
            code,
        )
        for handler in logging.getLogger().handlers:
            try:
                handler.flush()
            except Exception:  # noqa: BLE001 - exiting anyway
                pass
        remove_multiprocessing_folder()
        os._exit(code)

    threading.Thread(target=expire, name="rewardq-exit-deadline", daemon=True).start()


def remove_multiprocessing_folder() -> None:
    """Remove the folder multiprocessing made for this process (``/tmp/pymp-*``, where the scorer
    processes' forkserver listens), as its exit handler would: a process that ends with
    ``os._exit`` (the CLI's end, :func:`exit_after`) skips that handler, and every stopped worker
    left one behind. Its path is in multiprocessing's per-process config, a private attribute:
    ``multiprocessing.util.get_temp_dir()`` would make one where there is none."""
    process = sys.modules.get("multiprocessing.process")
    config = getattr(process.current_process(), "_config", None) if process is not None else None
    folder = config.get("tempdir") if isinstance(config, dict) else None
    if isinstance(folder, str):
        shutil.rmtree(folder, ignore_errors=True)
