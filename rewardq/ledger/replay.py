"""What ``rewardq replay`` scores again: a ledger's trajectories, rebuilt as their producers sent them.

A replay is a worker run like any other, so every reward comes out of the worker's own scoring
machinery (the manager, its scorer processes, the code sandbox, the judge with its cache):

1. the filters (``--where``, a time range) select trajectories: every row (one per key) of each
   trajectory with a row that passes them is read, and the trajectories are rebuilt as the
   producer sent them (ids, masks, turns, extra fields, the sample), in ``scored_at`` order, at
   most ``limit`` of them; a trajectory whose final output never arrived (ended by
   ``incomplete_timeout``, never scored) is counted, not replayed;
2. a :class:`~rewardq.consumers.worker.Worker` with the given settings starts in this process,
   with ``ledger`` set to the output ledger, on a namespace of its own: on the Redis of
   ``--redis-url``, or, without one, on an embedded Redis stand-in (``rewardq[demo]``): no fleet;
3. the judge's cached answers the ledger kept are put back into the namespace's answer cache,
   so a judge asked the same question (the same request, byte for byte) reuses its answer
   instead of paying again; a changed prompt or model asks anew;
4. the trajectories are pushed (at most ``window`` at a time) and their results awaited, with a
   progress bar; the worker writes each into the output ledger before its commit;
5. at the end, or on Ctrl-C, the worker stops and flushes the output ledger. A replay run again
   with the same ``--out`` skips the trajectories the output ledger already holds: stopping and
   resuming loses nothing and repeats nothing. The output ledger records the scoring
   configuration that writes it (:data:`RECORD`): a resume under another is refused.

Replaying with the scoring configuration that made the ledger gives every rule-based reward
exactly (the same code on the same ids); ``rewardq diff`` shows what a new one changes.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rewardq.errors import ConfigError
from rewardq.ledger.read import Where, read_table
from rewardq.ledger.store import check_folder, is_local, local_path, open_filesystem, write_whole
from rewardq.ledger.table import from_json, sample_of

logger = logging.getLogger("rewardq.replay")

#: Columns a replay reads from the source ledger.
_COLUMNS = [
    "key",
    "uid",
    "session_id",
    "index",
    "outputs",
    "data_source",
    "ground_truth",
    "extra_info",
    "sample",
    "prompt_ids",
    "response_ids",
    "response_mask",
    "num_turns",
    "extra_fields",
    "rollout_reward_score",
    "final",
    "scored_at",
    "judge_request",
    "judge_answer",
]


@dataclass
class Trajectory:
    """One trajectory rebuilt from its ledger rows, as ``put_trajectory`` takes it."""

    uid: str
    session_id: str
    outputs: list[dict[str, Any]]
    sample: dict[str, Any]
    judged: dict[str, str] = field(default_factory=dict)  # request digest -> answer

    @property
    def keys(self) -> list[str]:
        return [f"{self.uid}_{self.session_id}_{i}" for i in range(len(self.outputs))]


@dataclass
class Plan:
    """What a replay will do: the trajectories to score, and what it leaves out and why. Every
    trajectory the filters select is counted once: replayed (in ``trajectories``), or in one of
    the counts below."""

    trajectories: list[Trajectory]
    selected: int = 0  # trajectories the filters selected (every one, when none is given)
    done_before: int = 0  # already in the output ledger (a resumed replay)
    incomplete: int = 0  # no row is final: the final output never arrived (never scored)
    rows_missing: int = 0  # final, but the ledger lacks the row of an output before it (never written)
    unreadable: int = 0  # trajectories with a row without ids (its records never decoded)
    over_limit: int = 0  # would be replayed, past --limit


def _output(row: dict[str, Any]) -> dict[str, object]:
    out: dict[str, Any] = {
        "prompt_ids": np.frombuffer(row["prompt_ids"], "<i4"),
        "response_ids": np.frombuffer(row["response_ids"], "<i4"),
        "extra_fields": from_json(row["extra_fields"]) or {},
    }
    if row["response_mask"] is not None:
        out["response_mask"] = np.frombuffer(row["response_mask"], "u1")
    if row["num_turns"] is not None:
        out["num_turns"] = row["num_turns"]
    if row["rollout_reward_score"] is not None:
        out["reward_score"] = row["rollout_reward_score"]
    return out


def plan(
    source: str,
    *,
    where: Where | None = None,
    since: str | None = None,
    until: str | None = None,
    limit: int | None = None,
    skip_keys: set[str] | None = None,
) -> Plan:
    """The trajectories of ledger ``source`` to replay (see the module doc).

    The filters select trajectories, not rows: a trajectory is replayed whole (every row of it
    read back) when any of its rows passes them, and ``limit`` counts trajectories."""
    rows = _selected_rows(source, where, since, until)
    by_tid: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        by_tid.setdefault((r["uid"], r["session_id"]), []).append(r)
    out = Plan([], selected=len(by_tid))
    ordered = sorted(by_tid.items(), key=lambda kv: _first_scored(kv[1]))
    for (uid, sid), group in ordered:
        group.sort(key=lambda r: r["index"])
        # a trajectory ended by incomplete_timeout has rows for the outputs that arrived, none final:
        # it was never scored, so scoring it now would not be a replay of anything
        finals = [r["index"] for r in group if r["final"]]
        if not finals:
            out.incomplete += 1
            continue
        # a late record's key past the final output (a dead letter's row) is not part of it
        group = [r for r in group if r["index"] <= min(finals)]
        if [r["index"] for r in group] != list(range(len(group))):
            out.rows_missing += 1
            continue
        if any(_no_ids(r) for r in group):
            out.unreadable += 1
            continue
        t = Trajectory(uid, sid, [_output(r) for r in group], _sample(group[-1]))
        if skip_keys is not None and all(k in skip_keys for k in t.keys):
            out.done_before += 1
            continue
        if limit is not None and len(out.trajectories) >= limit:
            out.over_limit += 1
            continue
        t.judged = {r["judge_request"]: r["judge_answer"] for r in group if r["judge_request"] and r["judge_answer"]}
        out.trajectories.append(t)
    return out


def _selected_rows(source: str, where: Where | None, since: str | None, until: str | None) -> list[dict[str, Any]]:
    """Every row (one per key) of the trajectories of ``source`` that have a row passing the
    filters; of every trajectory when there are none."""
    if not (where or since or until):
        return list(read_table(source, columns=_COLUMNS).to_pylist())
    picked = read_table(source, where=where, since=since, until=until, columns=["uid", "session_id"])
    tids = set(zip(picked["uid"].to_pylist(), picked["session_id"].to_pylist()))
    if not tids:
        return []
    rows = read_table(source, where={"uid": sorted({uid for uid, _ in tids})}, columns=_COLUMNS).to_pylist()
    return [r for r in rows if (r["uid"], r["session_id"]) in tids]


def _no_ids(row: dict[str, Any]) -> bool:
    """Whether a row has no ids to send again: none (its records never decoded), or ids that are
    not whole int32s (a ledger not written by rewardq's flusher)."""
    prompt, response = row["prompt_ids"] or b"", row["response_ids"] or b""
    return (not prompt and not response) or bool(len(prompt) % 4 or len(response) % 4)


def _first_scored(group: list[dict[str, Any]]) -> float:
    """When a trajectory's rows were first scored (unix seconds; 0 when no row says: its results'
    ``scored_at`` did not read as a time)."""
    return min((r["scored_at"].timestamp() for r in group if r["scored_at"] is not None), default=0.0)


def _sample(row: dict[str, Any]) -> dict[str, object]:
    return sample_of(row["data_source"], row["ground_truth"], row["extra_info"], row["sample"])


def existing_keys(out: str) -> set[str]:
    """The keys an output ledger already holds (none when it does not exist yet)."""
    try:
        return set(read_table(out, columns=["key"], dedup=False)["key"].to_pylist())
    except ConfigError:
        return set()


#: The file of a replay's output ledger that records the scoring configuration that wrote it
#: (readers skip ``_`` names): a replay resumed into it must have the same one.
RECORD = "_rewardq_replay.json"


def check_out(source: str, out: str) -> None:
    """Refuse an output ledger that is ``source``, lies inside it, or holds it (ConfigError): its rows
    would be read as the source's, or as already replayed; and a local one that cannot be made or
    written (:func:`~rewardq.ledger.store.check_folder`)."""
    if is_local(out):
        check_folder("--out", local_path(out))
    (fs_a, a), (fs_b, b) = open_filesystem(source), open_filesystem(out)
    if is_local(source) and is_local(out):
        a, b = os.path.realpath(a), os.path.realpath(b)
    elif fs_a.protocol != fs_b.protocol:
        return

    def inside(x: str, y: str) -> bool:
        return x == y or x.startswith(y.rstrip("/") + "/")

    if inside(b, a) or inside(a, b):
        where = "is" if a == b else "lies inside" if inside(b, a) else "holds"
        raise ConfigError(
            f"--out {out} {where} the ledger it replays ({source}): a replay writes a ledger of its own; "
            "give --out a folder outside it (e.g. beside it: <ledger>-replay)"
        )


def read_record(out: str) -> dict[str, Any] | None:
    """What :data:`RECORD` of output ledger ``out`` holds (None: no record, or no such ledger)."""
    fs, root = open_filesystem(out)
    try:
        with fs.open(f"{root}/{RECORD}", "rb") as f:
            record = json.loads(f.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--out {out}: its {RECORD} cannot be read ({exc}); remove it, or give a new --out") from exc
    return record if isinstance(record, dict) else None


def write_record(out: str, record: dict[str, Any]) -> None:
    """Write :data:`RECORD` into output ledger ``out`` (made if missing), whole or not at all: a stop
    midway leaves the record as it was (:func:`~rewardq.ledger.store.write_whole`)."""
    fs, root = open_filesystem(out)
    write_whole(fs, root, RECORD, json.dumps(record, indent=1, sort_keys=True).encode())


def scorings_in(out: str) -> set[str]:
    """The scoring fingerprints (``scoring``) of the rows output ledger ``out`` holds (none when it
    does not exist yet; rows without one are left out)."""
    try:
        values = read_table(out, columns=["scoring"], dedup=False)["scoring"].to_pylist()
    except ConfigError:
        return set()
    return {v for v in values if v}
