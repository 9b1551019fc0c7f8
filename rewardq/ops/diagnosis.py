"""``rewardq status``'s diagnosis: one line per thing an operator should act on, each saying what
to do (start a worker, look at a dead worker's entries, retry dead letters, fix a sandbox or a
judge), built from the status dict :func:`rewardq.ops.status.collect` reads.

Each is ``{"level", "message", "commands"}``: the message is prose, and the commands it asks for
are a list of their own, in the order the prose names them, so that the screen can give each one
a line (:func:`rewardq.ops.status_view.diagnosis_lines`) and a script can run them.
"""

from __future__ import annotations

from typing import Any, Protocol

from rewardq.ops.layout import fmt_duration
from rewardq.queue.keys import NAMESPACE

__all__ = ["diagnose"]


class Say(Protocol):
    """Adds one diagnosis: its level, its prose, the commands the prose asks for."""

    def __call__(self, level: str, message: str, *commands: str) -> None: ...


def _sayer(out: list[dict[str, object]]) -> Say:
    def say(level: str, message: str, *commands: str) -> None:
        out.append({"level": level, "message": message, "commands": list(commands)})

    return say


def _ns(namespace: str) -> str:
    """`` --namespace NS`` for a command hint, or nothing for the default namespace."""
    return "" if namespace == NAMESPACE else f" --namespace {namespace}"


def _n(count: int, one: str, many: str | None = None) -> str:
    """``1 entry``, ``3 entries``, ``14,496 entries``."""
    return f"{count:,} {one if count == 1 else many or one + 's'}"


def diagnose(st: dict[str, Any]) -> list[dict[str, Any]]:
    """What an operator should look at, most urgent first: ``[{"level", "message", "commands"}]``.

    Levels: ``error`` (nothing progresses), ``warning`` (something is stuck or failed),
    ``ok`` (all clear).
    """
    ns = st["namespace"]
    out: list[dict[str, Any]] = []
    say = _sayer(out)
    no_group = [str(sh["shard"]) for sh in st["shards"] if not sh["group"]]
    backlog = sum(sh["backlog"] for sh in st["shards"])
    pending = sum(sh["pending"] for sh in st["shards"])
    collecting = _n(st["waiting_total"], "trajectory", "trajectories")
    if no_group:
        say(
            "error",
            f"shard(s) {','.join(no_group)} have no consumer group {st['group']!r}: no worker has started "
            f"on namespace {ns!r} (or the group was deleted); start one:",
            f"rewardq worker{_ns(ns)}",
        )
    if not st["workers"] and (backlog or pending or st["waiting_total"]):
        say(
            "error",
            f"nothing is being scored: no live worker on namespace {ns!r} while "
            f"{_n(backlog, 'entry', 'entries')} wait in the streams, {pending} pending, {collecting} "
            "collecting. Start one (if one runs, check its --redis-url and --namespace):",
            f"rewardq worker{_ns(ns)}",
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
    _collecting(st, say)
    if st["dead_letters"]:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(st["dead_letters_by_kind"].items()))
        say(
            "warning",
            f"{_n(st['dead_letters'], 'dead letter')} ({kinds or 'kinds not counted'}): read why, and "
            "after a fix retry them:",
            *_dead_letter_commands(ns),
        )
    shared = sorted(w["name"] for w in st["workers"] if _recent(w.get("shared_name_s_ago")))
    if shared:
        say(
            "warning",
            f"two or more live processes beat under the worker name(s) {', '.join(shared)}: each takes the "
            "other's leases as a new attempt (attempts, crash attribution and quarantine count wrongly). Give "
            "every process its own --name (a pod's name, host and pid) and restart the duplicates",
        )
    broken = {ds: c["statuses"]["error"] for ds, c in st.get("code", {}).items() if c["statuses"].get("error")}
    if broken:
        shown = ", ".join(f"{ds} {n}" for ds, n in sorted(broken.items()))
        say(
            "warning",
            f"{_n(sum(broken.values()), 'code response')} could not be scored because the code sandbox failed "
            f"({shown}): their trajectories have error results naming why. Read them, check the worker logs "
            "and sandbox_fusion_url, then retry them:",
            *_dead_letter_commands(ns),
        )
    hacks = {ds: sum(c.get("tripwires", {}).values()) for ds, c in st.get("code", {}).items()}
    hacks = {ds: n for ds, n in hacks.items() if n}
    if hacks:
        shown = ", ".join(f"{ds} {n}" for ds, n in sorted(hacks.items()))
        say(
            "warning",
            f"{_n(sum(hacks.values()), 'code response')} tripped a reward-hack wire ({shown}) and scored 0.0: "
            "the policy may be learning to game the tests; reward_extra_info['tripwire'] names each hack "
            "(docs/code-execution.md)",
        )
    refused = {m: j["failed"] for m, j in st.get("judges", {}).items() if j.get("failed")}
    if refused:
        shown = ", ".join(f"{m} {n}" for m, n in sorted(refused.items()))
        say(
            "warning",
            f"{_n(sum(refused.values()), 'judge call')} refused for good ({shown}): those trajectories have "
            "error results naming the judge's status. Read them, check the judge server, base_url and the "
            "API key, then retry them:",
            *_dead_letter_commands(ns),
        )
    _failures(st, say)
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


#: Seconds a worker name stays flagged as shared by two live processes after the last beat that found it.
SHARED_NAME_RECENT = 120.0


def _recent(seconds_ago: float | None) -> bool:
    return seconds_ago is not None and seconds_ago < SHARED_NAME_RECENT


def _dead_letter_commands(ns: str) -> tuple[str, str]:
    """What a diagnosis about failed trajectories asks for: read why, then (after a fix) retry."""
    return f"rewardq dead-letters list{_ns(ns)}", f"rewardq dead-letters retry --all{_ns(ns)}"


def _collecting(st: dict[str, Any], say: Say) -> None:
    """Lines for trajectories still collecting outputs.

    One on a shard whose stream still holds unread entries (consumer-group lag) most likely has
    its missing outputs among them: it waits for the backlog to drain, not for the rollout side,
    and is a problem only if it will be given up before the drain ends.
    """
    ns = st["namespace"]
    lag = {sh["shard"]: int(sh["backlog"]) for sh in st["shards"]}
    waiting = [w for w in st["waiting"] if w["missing"] or w["final"] is None]
    draining = [w for w in waiting if lag.get(w["shard"], 0) > 0]
    stuck = [w for w in waiting if lag.get(w["shard"], 0) <= 0]
    backlog = st.get("backlog") or {}
    drain_s = backlog.get("seconds")
    if draining:
        unread = sum(lag.get(s, 0) for s in {w["shard"] for w in draining})
        drains = "does not drain (nothing is scored)" if drain_s is None else f"drains in {fmt_duration(drain_s)}"
        late = [w for w in draining if drain_s is None or w["expires_in_s"] < drain_s]
        if late:
            w = late[0]
            say(
                "warning",
                f"the backlog ({_n(unread, 'unread entry', 'unread entries')} on their shards) {drains}, but "
                f"{_n(len(late), 'trajectory', 'trajectories')} collecting outputs will be given up before it "
                f"ends (the first, {w['tid']}, in {fmt_duration(w['expires_in_s'])}): start more workers, "
                "or raise --incomplete-timeout. A worker starts with:",
                f"rewardq worker{_ns(ns)}",
            )
        else:
            say(
                "ok",
                f"the backlog is draining: {_n(len(draining), 'trajectory', 'trajectories')} collecting outputs "
                f"on shards with {_n(unread, 'unread entry', 'unread entries')}, where their missing outputs "
                f"most likely wait; it {drains}",
            )
    if stuck:
        w = stuck[0]
        what = (
            f"outputs {','.join(map(str, w['missing']))}"
            if w["missing"]
            else "its final output (no put_output with final=True)"
        )
        say(
            "warning",
            f"{_n(len(stuck) if draining else st['waiting_total'], 'trajectory', 'trajectories')} waiting for "
            f"outputs; the oldest, {w['tid']}, has waited {fmt_duration(w['waited_s'])} for {what} and is given up in "
            f"{fmt_duration(w['expires_in_s'])} (then every key gets an error result and an 'incomplete' "
            "dead letter). Check that the rollout side pushes every index from 0 to the final one:",
            f"rewardq inspect {w['tid']}{_ns(ns)}",
        )


def _failures(st: dict[str, Any], say: Say) -> None:
    """Lines for trajectories waiting on a retry and for failures no retry mends (``config``)."""
    ns = st["namespace"]
    retrying = st.get("retrying") or {"n": 0, "waiting": []}
    if retrying["n"]:
        first = retrying["waiting"][0] if retrying["waiting"] else {}
        say(
            "warning",
            f"{_n(retrying['n'], 'trajectory', 'trajectories')} waiting on a retry after a transient failure"
            + (
                f", the next ({first.get('tid')}, {first.get('data_source') or 'no data source'}) because "
                f"{first.get('reason')}"
                if first
                else ""
            )
            + ": each is scored again after a pause (Retry-After when the server sent one) until retry_for "
            "runs out, then gets a transient error result; check the judge or sandbox it calls",
        )
    config = {ds: kinds["config"] for ds, kinds in (st.get("failures") or {}).items() if kinds.get("config")}
    if config:
        shown = ", ".join(f"{ds} {n}" for ds, n in sorted(config.items()))
        say(
            "error",
            f"{_n(sum(config.values()), 'trajectory', 'trajectories')} could not be scored as the fleet is "
            f"configured (config failures: {shown}): an unknown data source, a missing extra, a judge refusing "
            "the key... Read the reason, fix the configuration, then retry them:",
            *_dead_letter_commands(ns),
        )


def accountability(st: dict[str, Any]) -> list[dict[str, object]]:
    """Warnings of the reward health (a data source whose reward or error share jumped) and errors of
    the ledger (not written), from ``rewardq status``'s facts."""
    out: list[dict[str, Any]] = []
    say = _sayer(out)
    for row in st.get("reward_health") or []:
        if row["jumps"]:
            say(
                "warning",
                f"{row['data_source']}: {'; '.join(row['jumps'])} in the last 60 s against the 10 minutes before "
                "(a jump of 4 standard errors or more: docs/operations.md#reward-health); check its scorer, judge "
                "or data: a worker's log, and the dead letters:",
                f"rewardq dead-letters list{_ns(st['namespace'])}",
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
    if ledger and ledger.get("unreadable"):
        say(
            "error",
            f"{_n(ledger['unreadable'], 'spooled frame', 'spooled frames')} could not be read back by the ledger's "
            "flusher (damaged on disk, written by a newer rewardq, or a field of the wrong type; the log names the "
            "field) and are not in the ledger; each segment is "
            "kept in its spool as *.wal.unreadable and named in the worker's log (docs/ledger.md#unreadable-frames)",
        )
    return out
