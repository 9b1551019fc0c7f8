"""``assert_case`` problems for the local runner: honest solutions (which no tripwire may touch)
and reward hacks written as a policy writes them (each must score 0.0 with its tripwire named).

The problems and :class:`AssertCase` are in :mod:`tests.support.assert_problems`, the responses in
:mod:`tests.support.assert_honest` (``HONEST``: right and wrong solutions in many styles) and
:mod:`tests.support.assert_hacks` (``HACKS``: the known ways to pass assertions without solving;
``REFUSED``: hacks an assertion run refuses); the tests take them from here.
"""

from tests.support.assert_hacks import HACKS, REFUSED
from tests.support.assert_honest import HONEST
from tests.support.assert_problems import AssertCase

__all__ = ["HACKS", "HONEST", "REFUSED", "AssertCase"]
