"""``python -m benchmarks.fleet_share``: how three worker processes share a backlog, and how fast they
take over a SIGKILLed worker's entries.

It starts its own ``redis-server`` and runs the two scenarios of :mod:`tests.support.fleet_share`:

* ``share``: three workers (concurrency 8, 0.5 s per trajectory) resumed at once on a backlog of 150;
  prints the trajectories each scored;
* ``recovery``: three workers (concurrency 8, 1 s per trajectory, ``claim_idle`` 5 s) on a backlog of
  600, one SIGKILLed once 20 are done; prints the entries it held, the seconds from the kill to the
  last of its trajectories finished, and to the whole backlog finished.

Each line ends with the machine's load average (``os.getloadavg``).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

from tests.support.fleet_share import recover_dead_worker, share_backlog
from tests.support.redis_server import RedisServer

#: Fast recovery settings of the ``recovery`` scenario.
RECOVERY: dict[str, Any] = dict(
    claim_idle=5.0, lease_seconds=3.0, heartbeat_interval=0.5, maintenance_interval=1.0, block_ms=200
)


def _load() -> str:
    return "load=" + "/".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fleet_share", description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--only", choices=("share", "recovery"), default=None)
    args = p.parse_args(argv)
    with RedisServer() as srv, tempfile.TemporaryDirectory(prefix="fleet-share-") as tmp:
        r = srv.client()
        for _ in range(args.runs):
            if args.only in (None, "share"):
                s = share_backlog(srv.url, r, f"fs-{uuid.uuid4().hex[:6]}", Path(tmp), concurrency=8, block_ms=200)
                print(f"share: per_worker={s.counts} clean={s.clean} {_load()}", flush=True)
            if args.only in (None, "recovery"):
                rec = recover_dead_worker(
                    srv.url, r, f"fr-{uuid.uuid4().hex[:6]}", Path(tmp), concurrency=8, **RECOVERY
                )
                print(
                    f"recovery: held={rec.held} entries ({rec.held_trajectories} trajectories) "
                    f"last_of_dead={rec.last_of_dead:.1f}s all_done={rec.all_done:.1f}s "
                    f"done_after_last_of_dead={rec.done_after_last_of_dead} once={rec.finished_once} "
                    f"clean={rec.clean} per_worker={sorted(rec.per_worker.values(), reverse=True)} {_load()}",
                    flush=True,
                )
        r.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
