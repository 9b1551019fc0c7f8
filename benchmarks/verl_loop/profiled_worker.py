"""``python -m benchmarks.verl_loop.profiled_worker FILE <rewardq worker arguments>``: ``rewardq worker``
under cProfile (its event loop's thread), the stats dumped to ``FILE`` when it ends.

``rewardq``'s console entry ends its process with ``os._exit`` (torch's interpreter teardown),
which ``python -m cProfile`` does not survive; this runs the same ``main`` with the arguments given,
dumps the stats, then exits the same way. cProfile slows the event loop ~2x: read its shares, not its times.

Its clock is the event loop thread's CPU time (``time.thread_time``), not the wall: on a core shared
with Redis and scorer processes (``--pinned``), a wall clock charges a ``send`` for the time the
process then waited for the core while Redis ran.
"""

from __future__ import annotations

import cProfile
import os
import sys
import time


def main() -> None:
    out, argv = sys.argv[1], sys.argv[2:]
    from rewardq.cli import main as rewardq_main

    profile = cProfile.Profile(time.thread_time)
    code = 1
    profile.enable()
    try:
        rewardq_main(argv)  # with argv given, it ends in sys.exit, not os._exit
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    finally:
        profile.disable()
        profile.dump_stats(out)
    os._exit(code)  # as rewardq's own entry point does: no torch teardown


if __name__ == "__main__":
    main()
