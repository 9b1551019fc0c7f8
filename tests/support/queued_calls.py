"""A reward function for the queue-ahead tests: it notes each call it runs, then acts as
:func:`tests.support.misbehaving.misbehave` does (``sleep:<s>``, ``hang``, ...).

``extra_info["notes"]`` names a file; each call appends ``<solution_str> <pid>`` to it first, so a
test sees which calls ran, how often, and in which process.
"""

from __future__ import annotations

import os
from typing import Any

from tests.support.misbehaving import misbehave


def noted(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float | dict[str, object]:
    with open(extra_info["notes"], "a") as f:
        f.write(f"{extra_info['name']} {os.getpid()}\n")
    return misbehave(data_source, solution_str, ground_truth, extra_info)
