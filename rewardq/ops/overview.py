"""The whole pipeline in one dict: what ``rewardq status`` shows and ``--json`` prints.

Built from the reads of :mod:`rewardq.queue.reads` (shards, workers, waiting and finished
trajectories), :class:`rewardq.ops.deadletters.stream.DeadLetters`, the judge cache's totals, and the
live workers' failures by kind and trajectories waiting on a retry (:mod:`rewardq.ops.failures_view`);
:mod:`rewardq.ops.status` renders it. Read-only.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rewardq.consumers.reward_health import judge, merge
from rewardq.ops.deadletters.stream import DeadLetters
from rewardq.ops.failures_view import failure_totals, retry_totals
from rewardq.queue.keys import Keyspace
from rewardq.queue.reads import (
    STATUS_WAITING_LIMIT,
    as_number,
    backlog_status,
    recent_activity,
    shard_status,
    waiting_count,
    waiting_status,
    workers_status,
)
from rewardq.queue.scoring_record import recorded_scoring_sync
from rewardq.reward.judge.cache import judge_totals

if TYPE_CHECKING:
    from rewardq.queue.clients import SyncRedis


def pipeline_status(r: SyncRedis, ks: Keyspace, *, waiting_limit: int = STATUS_WAITING_LIMIT) -> dict[str, Any]:
    """Everything ``rewardq status`` shows, as one dict."""
    now = time.time()
    dead_total, dead_by_kind = DeadLetters(r, ks).tally()
    waiting_total = waiting_count(r, ks)
    workers = workers_status(r, ks, now)
    shards = [shard_status(r, ks, s) for s in range(ks.shards)]
    backlog = backlog_status(shards, workers)
    recorded = recorded_scoring_sync(r, ks)
    return {
        "namespace": ks.namespace,
        "group": ks.group,
        "scoring": {"digest": recorded.digest, "config": recorded.config} if recorded is not None else None,
        "shards": shards,
        "backlog": backlog,
        "backlog_seconds": backlog["seconds"],
        "workers": workers,
        "code": code_totals(workers),
        "failures": failure_totals(workers),
        "retrying": retry_totals(workers),
        "ledger": ledger_totals(workers),
        "reward_health": judge(merge(w.get("health") or {} for w in workers)),
        "judges": judge_totals(r, ks),
        "dead_letters": dead_total,
        "dead_letters_by_kind": dead_by_kind,
        "waiting_total": waiting_total,
        "waiting": waiting_status(r, ks, waiting_limit, now),
        "recent": recent_activity(r, ks, 60.0, now),
        "time": now,
    }


def ledger_totals(workers: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The live workers' ledgers (their ``ledger`` fields): rows written, trajectories not written,
    keys given no row by design (``refused``),
    bytes waiting in spools, and the workers whose ledger is failing with their last error; None
    when no live worker writes one. Each count is a live worker's since its process started (no
    total over stopped workers or earlier processes is kept)."""
    with_ledger = [w for w in workers if w.get("ledger")]
    if not with_ledger:
        return None
    total = {"urls": sorted({str(w["ledger"].get("url", "")) for w in with_ledger}), "workers": len(with_ledger)}
    names = ("rows", "unwritten", "refused", "unreadable", "pending_bytes", "pending_segments", "adopted", "errors")
    for name in names:
        total[name] = sum(int(as_number(w["ledger"].get(name))) for w in with_ledger)
    total["failing"] = {
        w["name"]: str(w["ledger"].get("last_error", "")) for w in with_ledger if w["ledger"].get("state") == "failing"
    }
    return total


def code_totals(workers: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Code-execution counters per data source, summed over live workers (their ``code`` fields)."""
    out: dict[str, dict[str, Any]] = {}
    for w in workers:
        for ds, st in (w.get("code") or {}).items():
            if not isinstance(st, dict):
                continue
            tot = out.setdefault(
                ds, {"backend": "", "trajectories": 0, "runs": 0, "seconds": 0.0, "statuses": {}, "tripwires": {}}
            )
            tot["backend"] = str(st.get("backend", tot["backend"]))
            tot["trajectories"] += int(as_number(st.get("trajectories")))
            tot["runs"] += int(as_number(st.get("runs")))
            tot["seconds"] += as_number(st.get("seconds"))
            for field in ("statuses", "tripwires"):
                for name, n in (st.get(field) or {}).items():
                    tot[field][name] = tot[field].get(name, 0) + int(as_number(n))
    return dict(sorted(out.items()))
