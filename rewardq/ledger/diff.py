"""Two ledgers (or a ledger and its replay) compared key by key: :func:`compare`.

Each ledger is read with one row per key (:func:`~rewardq.ledger.read.latest_rows`), and the keys
of both are compared. Per key, a result is its ``(status, reward_score)``:

* ``compared``: keys in both ledgers; ``only_before`` / ``only_after``: keys in one of them (for a
  ledger and its replay, ``only_before`` holds what the replay left out: trajectories whose final
  output never arrived, rows without ids, rows filtered out or past ``--limit``); a key in one
  ledger only is never ``changed``;
* ``changed``: compared keys whose status or reward differs (rewards compared exactly, as floats);
* ``newly_failed``: ok before, an error after; ``newly_scored``: an error before, ok after;
* per data source (the *before* row's): ``compared``, ``changed``, ``newly_failed``,
  ``newly_scored``, and ``mean_before`` / ``mean_after``, the mean reward of the compared keys that
  are ok on that side (None when none are);
* ``largest``: the compared keys ok on both sides, largest ``|after - before|`` first, each with
  both rewards, its data source, and the decoded final response of its trajectory.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rewardq.ledger.read import Where, read_table
from rewardq.queue.states import NO_DATA_SOURCE

#: The largest reward changes ``rewardq diff`` lists.
DIFF_TOP = 10


#: What :func:`compare` reads of each ledger.
_COLUMNS = ["key", "uid", "session_id", "final", "data_source", "status", "reward_score", "response", "error"]


def _side(url: str, where: Where | None) -> dict[str, dict[str, Any]]:
    rows = read_table(url, where=where, columns=_COLUMNS).to_pylist()
    responses = {(r["uid"], r["session_id"]): r["response"] for r in rows if r["final"]}
    for r in rows:
        r["response"] = responses.get((r["uid"], r["session_id"]))
    return {r["key"]: r for r in rows}


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return a == b or (math.isnan(a) and math.isnan(b))


def compare(before: str, after: str, *, where: Where | None = None, top: int = DIFF_TOP) -> dict[str, Any]:
    """Compare ledger ``before`` with ledger ``after`` (see the module doc); ``where``: only these rows
    (:func:`~rewardq.ledger.read.parse_where`) of both; ``top``: how many largest changes to list."""
    a, b = _side(before, where), _side(after, where)
    common = sorted(set(a) & set(b))
    out: dict[str, Any] = {
        "before": before,
        "after": after,
        "compared": len(common),
        "changed": 0,
        "newly_failed": 0,
        "newly_scored": 0,
        "only_before": len(set(a) - set(b)),
        "only_after": len(set(b) - set(a)),
    }
    groups: dict[str, dict[str, Any]] = {}
    moved: list[tuple[float, str]] = []
    for key in common:
        x, y = a[key], b[key]
        ds = x["data_source"] or NO_DATA_SOURCE
        g = groups.setdefault(
            ds,
            {"compared": 0, "changed": 0, "newly_failed": 0, "newly_scored": 0, "_before": [], "_after": []},
        )
        g["compared"] += 1
        ok_x, ok_y = x["status"] == "ok", y["status"] == "ok"
        if ok_x and x["reward_score"] is not None:
            g["_before"].append(x["reward_score"])
        if ok_y and y["reward_score"] is not None:
            g["_after"].append(y["reward_score"])
        if x["status"] == y["status"] and _same(x["reward_score"], y["reward_score"]):
            continue
        out["changed"] += 1
        g["changed"] += 1
        if ok_x and not ok_y:
            out["newly_failed"] += 1
            g["newly_failed"] += 1
        elif ok_y and not ok_x:
            out["newly_scored"] += 1
            g["newly_scored"] += 1
        elif ok_x and ok_y and x["reward_score"] is not None and y["reward_score"] is not None:
            moved.append((abs(y["reward_score"] - x["reward_score"]), key))
    out["by_data_source"] = {ds: _summary(g) for ds, g in sorted(groups.items())}
    moved.sort(key=lambda m: (-m[0], m[1]))
    out["largest"] = [_change(a[k], b[k]) for _, k in moved[:top]]
    failed = [k for k in common if a[k]["status"] == "ok" and b[k]["status"] != "ok"][:top]
    out["failed_examples"] = [{**_change(a[k], b[k]), "error": b[k]["error"]} for k in failed]
    return out


def nothing_compared(result: Mapping[str, Any]) -> str | None:
    """Why a comparison of :func:`compare` compared nothing (a warning), or None when it compared keys."""
    if result["compared"]:
        return None
    a_rows = result["compared"] + result["only_before"]
    b_rows = result["compared"] + result["only_after"]
    if not a_rows or not b_rows:
        empty = " and ".join(url for url, n in ((result["before"], a_rows), (result["after"], b_rows)) if not n)
        return f"nothing compared: {empty} has no rows (for these filters)"
    return f"nothing compared: no key is in both ledgers ({a_rows:,} only in A, {b_rows:,} only in B)"


def _summary(g: Mapping[str, Any]) -> dict[str, Any]:
    before, after = g["_before"], g["_after"]
    return {
        "compared": g["compared"],
        "changed": g["changed"],
        "newly_failed": g["newly_failed"],
        "newly_scored": g["newly_scored"],
        "mean_before": sum(before) / len(before) if before else None,
        "mean_after": sum(after) / len(after) if after else None,
    }


def _change(x: Mapping[str, object], y: Mapping[str, object]) -> dict[str, Any]:
    return {
        "key": x["key"],
        "data_source": x["data_source"],
        "before": x["reward_score"],
        "after": y["reward_score"],
        "status_before": x["status"],
        "status_after": y["status"],
        "response": x["response"],
    }
