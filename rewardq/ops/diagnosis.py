"""``rewardq status``'s diagnosis: one line per thing an operator should act on, each saying what
to do (start a worker, look at a dead worker's entries, retry dead letters, fix a sandbox or a
judge), built from the status dict :func:`rewardq.ops.status.collect` reads."""

from __future__ import annotations

from typing import Any

from rewardq import defaults
from rewardq.ops.layout import fmt_duration

__all__ = ["diagnose"]


def _ns(namespace: str) -> str:
    """`` --namespace NS`` for a command hint, or nothing for the default namespace."""
    return "" if namespace == defaults.NAMESPACE else f" --namespace {namespace}"


def _n(count: int, one: str, many: str | None = None) -> str:
    """``1 entry``, ``3 entries``."""
    return f"{count} {one if count == 1 else many or one + 's'}"


def diagnose(st: dict[str, Any]) -> list[dict[str, str]]:
    """What an operator should look at, most urgent first: ``[{"level", "message"}]``.

    Levels: ``error`` (nothing progresses), ``warning`` (something is stuck or failed),
    ``ok`` (all clear).
    """
    ns = st["namespace"]
    out: list[dict[str, str]] = []

    def say(level: str, message: str) -> None:
        out.append({"level": level, "message": message})

    no_group = [str(sh["shard"]) for sh in st["shards"] if not sh["group"]]
    backlog = sum(sh["backlog"] for sh in st["shards"])
    pending = sum(sh["pending"] for sh in st["shards"])
    collecting = _n(st["waiting_total"], "trajectory", "trajectories")
    if no_group:
        say(
            "error",
            f"shard(s) {','.join(no_group)} have no consumer group {st['group']!r}: no worker has started "
            f"on namespace {ns!r} (or the group was deleted); start one: rewardq worker{_ns(ns)}",
        )
    if not st["workers"] and (backlog or pending or st["waiting_total"]):
        say(
            "error",
            f"nothing is being scored: no live worker on namespace {ns!r} while "
            f"{_n(backlog, 'entry', 'entries')} wait in the streams, {pending} pending, {collecting} "
            f"collecting; start one: rewardq worker{_ns(ns)} (if one runs, check its --redis-url and "
            "--namespace)",
        )
    elif not st["workers"]:
        say("warning", f"no live worker on namespace {ns!r} (nothing is waiting)")
    recorded = (st.get("scoring") or {}).get("digest")
    others = sorted(w["name"] for w in st["workers"] if recorded and w.get("scoring") not in (None, "", recorded))
    if others:
        say(
            "warning",
            f"live worker(s) {', '.join(others)} run another scoring configuration than the namespace "
            "records: a --takeover ends with them (see docs/operations.md, one namespace, one scoring configuration)",
        )
    orphans = {o["name"]: o["pending"] for sh in st["shards"] for o in sh.get("owners", []) if not o["alive"]}
    if orphans:
        shown = ", ".join(f"{n} ({p})" for n, p in sorted(orphans.items()))
        say(
            "warning",
            f"{_n(sum(orphans.values()), 'entry', 'entries')} held by consumers that are not alive: "
            f"{shown}; a live worker reclaims them after claim_idle seconds",
        )
    waiting = [w for w in st["waiting"] if w["missing"] or w["final"] is None]
    if waiting:
        w = waiting[0]
        what = (
            f"outputs {','.join(map(str, w['missing']))}"
            if w["missing"]
            else "its final output (no put_output with final=True)"
        )
        say(
            "warning",
            f"{collecting} waiting for outputs; the oldest, {w['tid']}, has waited "
            f"{fmt_duration(w['waited_s'])} for {what} and is given up in "
            f"{fmt_duration(w['expires_in_s'])} (then every key gets an error result and an 'incomplete' "
            "dead letter). Check that the rollout side pushes every index from 0 to the final one: "
            f"rewardq inspect {w['tid']}{_ns(ns)}",
        )
    if st["dead_letters"]:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(st["dead_letters_by_kind"].items()))
        say(
            "warning",
            f"{_n(st['dead_letters'], 'dead letter')} ({kinds or 'kinds not counted'}): rewardq "
            f"dead-letters list{_ns(ns)}; after a fix: rewardq dead-letters retry --all{_ns(ns)}",
        )
    broken = {ds: c["statuses"]["error"] for ds, c in st.get("code", {}).items() if c["statuses"].get("error")}
    if broken:
        shown = ", ".join(f"{ds} {n}" for ds, n in sorted(broken.items()))
        say(
            "warning",
            f"{_n(sum(broken.values()), 'code response')} could not be scored because the code sandbox failed "
            f"({shown}): their trajectories have error results naming why (rewardq dead-letters list{_ns(ns)}); "
            "check the worker logs and sandbox_fusion_url, then rewardq dead-letters retry --all",
        )
    gave_up = {m: j["failed"] for m, j in st.get("judges", {}).items() if j.get("failed")}
    if gave_up:
        shown = ", ".join(f"{m} {n}" for m, n in sorted(gave_up.items()))
        say(
            "warning",
            f"{_n(sum(gave_up.values()), 'judge call')} gave up after retries ({shown}): those trajectories have "
            f"error results naming the judge's status (rewardq dead-letters list{_ns(ns)}); check the judge "
            "server and base_url, then rewardq dead-letters retry --all",
        )
    out += accountability(st)
    rec = st["recent"]
    if rec["errors"]:
        say(
            "warning",
            f"{rec['errors']} of {rec['trajectories']} trajectories finished in the last "
            f"{rec['window_s']:g}s ended with an error result",
        )
    if not out:
        say("ok", "all clear: nothing is stuck")
    return out


def accountability(st: dict[str, Any]) -> list[dict[str, str]]:
    """Warnings of the reward health (a data source whose reward or error share jumped) and errors of
    the ledger (not written), from ``rewardq status``'s facts."""
    out: list[dict[str, str]] = []

    def say(level: str, message: str) -> None:
        out.append({"level": level, "message": message})

    for row in st.get("reward_health") or []:
        if row["jumps"]:
            say(
                "warning",
                f"{row['data_source']}: {'; '.join(row['jumps'])} in the last 60 s against the 10 minutes before "
                "(a jump of 4 standard errors or more: docs/operations.md#reward-health); check its scorer, judge "
                "or data (rewardq dead-letters list, a worker's log)",
            )
    ledger = st.get("ledger")
    if ledger and (ledger["failing"] or ledger["unwritten"]):
        name, error = next(iter(sorted(ledger["failing"].items())), ("", ""))
        say(
            "error",
            f"the ledger is not being written ({_n(ledger['unwritten'], 'trajectory', 'trajectories')} not kept, "
            f"{ledger['pending_bytes']:,} bytes waiting in spools)"
            + (f"; {name}: {error}" if name else "")
            + ". Scoring goes on; fix the destination (permissions, bucket, disk) and the spools are written "
            "(docs/ledger.md)",
        )
    return out
