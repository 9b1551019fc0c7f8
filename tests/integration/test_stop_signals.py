"""A worker process ends within its deadline whatever keeps it alive (real subprocesses, no Redis)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

SCRIPT = textwrap.dedent(
    """
    import asyncio, logging, os, signal, sys, threading, time
    from rewardq.consumers.process import StopSignals

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)

    async def main():
        loop = asyncio.get_running_loop()
        StopSignals(loop, lambda name: print("stop requested", name, flush=True), deadline=1.0,
                    exit_code=lambda: 3).install()
        threading.Thread(target=time.sleep, args=(3600,)).start()  # a hung, non-daemon thread
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(3600)  # user code blocking the event loop

    asyncio.run(main())
    """
)


def test_sigterm_ends_the_process_at_its_deadline_even_with_a_blocked_loop_and_a_hung_thread() -> None:
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    assert done.returncode == 3, done.stderr
    assert "exiting now with code 3" in done.stderr and "SIGTERM received" in done.stderr
    assert "Thread-1" in done.stderr  # the log names what was still running
    assert took < 20  # the deadline is 1 s; interpreter start-up on a busy machine is the rest
