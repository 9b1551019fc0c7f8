"""What the ledger's own tests feed it: a scored trajectory's facts, and a ledger opened under a
test's folder (``ledger/``, spooled in ``spool/``) with the bounds those tests share."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from rewardq.ledger.frames import TrajectoryFacts, trajectory_frame
from rewardq.ledger.sink import Ledger
from rewardq.ledger.spool import Spool
from rewardq.queue.codec import OutputRecord
from rewardq.queue.results import RESULT_FIELDS, RewardResult, encode_results

SAMPLE = {
    "data_source": "openai/gsm8k",
    "reward_model": {"ground_truth": "72", "style": "rule"},
    "extra_info": {"i": 1},
}


def facts(uid: str, n: int = 2, *, score: float = 1.0, scored_at: float = 1.8e9, attempt: int = 1) -> TrajectoryFacts:
    """Trajectory ``<uid>_s`` of ``n`` outputs, every key scored ``score`` by worker ``w``."""
    recs = [
        OutputRecord(uid, "s", i, i == n - 1, np.arange(3, dtype=np.int32), np.arange(i + 4, dtype=np.int32))
        for i in range(n)
    ]
    res = [RewardResult(r.key, "ok", score, {"acc": score}, worker="w", scored_at=scored_at) for r in recs]
    enc = encode_results(res, 1 << 20)
    return TrajectoryFacts(recs, SAMPLE, RESULT_FIELDS, enc.rows, attempt, scored_at - 1, 2.0, "p" * 16, "text")


def make_ledger(tmp_path: Path, url: str | None = None, *, flusher_process: bool = False, **kw: Any) -> Ledger:
    """An open ledger of worker ``w1`` writing to ``url`` (``tmp_path/ledger``), spooled in ``tmp_path/spool``.
    The unit tier starts no process: ``flusher_process=True`` is the integration tier's."""
    settings: dict[str, Any] = dict(flush_interval=60.0, file_bytes=1 << 20, spool_max_bytes=1 << 30)
    settings["flusher_process"] = flusher_process
    led = Ledger(url or str(tmp_path / "ledger"), worker="w1", spool=str(tmp_path / "spool"), **{**settings, **kw})
    led.open()
    return led


def open_spools(folder: Path, *owners: str, writing: tuple[str, ...] = ()) -> list[Spool]:
    """The opened spools of ``owners`` in ``folder``; each of ``writing`` with one trajectory
    spooled (named after its owner)."""
    spools = [Spool(folder, o, segment_bytes=1 << 20, segment_seconds=60, settle_seconds=1) for o in owners]
    for s in spools:
        s.open()
        if s.owner in writing:
            s.append(s.ticket(), trajectory_frame(1, facts(s.owner)))
    return spools


def read_facts(uid: str, n: int = 2) -> TrajectoryFacts:
    """:func:`facts` with the records the worker read (``payloads``): spooled as those records."""
    from rewardq.queue.codec import decode_output, encode_output

    out = {"prompt_ids": np.arange(3, dtype=np.int32), "response_ids": np.arange(5, dtype=np.int32)}
    payloads = [encode_output(uid, "s", i, out, SAMPLE, final=i == n - 1) for i in range(n)]
    records = [decode_output(p) for p in payloads]
    return replace(facts(uid, n), records=records, sample=records[-1].sample, payloads=payloads)


def damaged_segment(path: Path) -> dict[str, int]:
    """A spool segment with trajectories ``a`` and ``b`` whole (2 outputs each), between them one
    whose last record is damaged on disk (``bad``) and a frame of a kind not known here, and at its
    end a torn frame (``torn``, cut short); what each part's bytes are."""
    import struct

    import msgpack

    from rewardq.ledger.frames import outcome_frame, trajectory_frame

    bad_facts = read_facts("bad")
    bad = bytearray(trajectory_frame(2, bad_facts))
    last = len((bad_facts.payloads or [b""])[-1])
    bad[-last:] = b"\xc1" * last  # 0xc1: never valid msgpack
    unknown = msgpack.packb({"k": "z", "tk": 9, "raw": 3}) + b"xyz"
    torn = trajectory_frame(4, read_facts("torn"))
    parts = [
        trajectory_frame(1, read_facts("a")) + outcome_frame(1, True),
        bytes(bad) + outcome_frame(2, True),
        struct.pack("<I", len(unknown) - 3) + unknown,
        trajectory_frame(3, read_facts("b")) + outcome_frame(3, True),
        torn[: len(torn) // 2],
    ]
    path.write_bytes(b"".join(parts))
    return {"torn": len(parts[-1]), "size": path.stat().st_size}
