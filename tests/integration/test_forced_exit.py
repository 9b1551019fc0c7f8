"""A process ended by :func:`rewardq.consumers.process.exit_after` (``os._exit``, which skips
multiprocessing's exit handler) still removes the folder multiprocessing made for it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CHILD = """
import multiprocessing, sys, time
from rewardq.consumers.process import exit_after

ctx = multiprocessing.get_context("forkserver")
p = ctx.Process(target=print)  # the forkserver listens in a pymp-* folder under TMPDIR
p.start()
p.join()
print(multiprocessing.util.get_temp_dir(), flush=True)
exit_after(0.05, lambda: 3, why="the test")
time.sleep(30)
"""


def test_a_forced_exit_removes_the_multiprocessing_folder(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    folder = Path(done.stdout.strip().splitlines()[-1])
    assert folder.parent == tmp_path and folder.name.startswith("pymp-")
    assert not folder.exists() and list(tmp_path.iterdir()) == []
