"""Importing this module leaves a trace: the file named by ``REWARDQ_TEST_CANARY`` (if set).

``tests/test_security.py`` names it in records (as a data source, a reward function, a
manager) to prove that a worker imports code only from its operator's configuration,
never because a record asked for it.
"""

import os

_path = os.environ.get("REWARDQ_TEST_CANARY")
if _path:
    with open(_path, "a") as f:
        f.write(f"imported by pid {os.getpid()}\n")


def compute_score(**kwargs: object) -> float:  # what a record might try to name
    return 1.0
