"""Summarise a ``py-spy record --format raw --threads`` profile: where a worker's time goes.

Each line of the raw (collapsed) format is ``frame;frame;...;leaf COUNT`` with frames
``function (file:line)``, the thread first when ``--threads`` was given. The summary lists
the share of samples per thread, the functions with the most *own* samples (the leaf,
where the CPU actually was) and the most *inclusive* samples (anywhere on the stack,
counted once per sample), with line numbers dropped so a function is one entry.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

_LINE = re.compile(r"^(.*) (\d+)$")
_FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def _name(frame: str, root: str) -> str:
    m = _FRAME.match(frame)
    if not m:
        return frame
    path = m.group("file")
    for marker in ("site-packages/", "/work/main/", "lib/python3.11/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{m.group('fn')} ({path})"


#: Frames every sample passes through (interpreter start, the event loop): hidden from the
#: inclusive list, which is about the worker's own steps.
_BORING = (
    "<frozen runpy>",
    "asyncio/runners.py",
    "asyncio/base_events.py",
    "asyncio/events.py",
    "benchmarks/worker_runner.py",
    "threading.py",
)


def summarize(folded: str | Path, top: int = 30) -> str:
    """A plain-text report of the profile in ``folded``."""
    total = 0
    threads: Counter[str] = Counter()
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    for line in Path(folded).read_text().splitlines():
        m = _LINE.match(line.strip())
        if not m:
            continue
        stack, n = m.group(1).split(";"), int(m.group(2))
        total += n
        thread = stack[0] if stack and stack[0].startswith(("thread", "process")) else "?"
        frames = [_name(f, "") for f in stack if not f.startswith(("thread", "process"))]
        threads[thread] += n
        if frames:
            own[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    if not total:
        return "no samples\n"
    out = [f"{total} samples (non-idle)", "", "by thread:"]
    out += [f"  {100 * n / total:5.1f}%  {t}" for t, n in threads.most_common()]
    out += ["", f"top {top} by own time (the leaf frame):"]
    out += [f"  {100 * n / total:5.1f}%  {f}" for f, n in own.most_common(top)]
    out += ["", f"top {top} by inclusive time (event-loop and start-up frames hidden):"]
    shown = [(f, n) for f, n in incl.most_common() if not any(b in f for b in _BORING)][:top]
    out += [f"  {100 * n / total:5.1f}%  {f}" for f, n in shown]
    return "\n".join(out) + "\n"
