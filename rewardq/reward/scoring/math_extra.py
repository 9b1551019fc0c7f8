"""Optional dependencies of the built-in scorers, imported when a sample first needs them.

The ``numina_*`` and ``hiyouga/geometry3k`` scorers need sympy, pylatexenc and mathruler
(the ``math`` extra). They are imported on first use, never when the worker starts, so a
worker without the extra runs every other data source, and a sample that needs the extra
gets an error result naming the install command instead of a crash at start-up.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from rewardq.errors import MissingScorerExtra

__all__ = ["MATH_EXTRA_MODULES", "import_math_extra"]

#: Top-level modules the ``math`` extra installs (mathruler's grader also imports tqdm).
MATH_EXTRA_MODULES = frozenset({"sympy", "mpmath", "pylatexenc", "mathruler", "tqdm"})


def import_math_extra(module: str, scorer: str) -> ModuleType:
    """Import ``module``; a missing ``math``-extra package raises MissingScorerExtra naming the fix.

    Args:
        module: what to import (a rewardq module that needs the extra, or the package itself).
        scorer: the scorer's name, for the message.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing not in MATH_EXTRA_MODULES:
            raise
        raise MissingScorerExtra(
            f"the {scorer} scorer needs the {missing!r} package, which is not installed: pip install 'rewardq[math]'"
        ) from None
