"""The raw baseline: the least work any Redis-Streams consumer must do for the same records.

Producer: the records rewardq's client would write (``rewardq.queue.codec.encode_output``,
one stream entry ``{key, data, ts}`` per output), sent with pipelined ``XADD``.

Consumer (one process, plain redis-py, no framework): ``XREADGROUP COUNT 256 BLOCK 1000``;
per entry ``msgpack.unpackb`` (token ids as numpy views); when the entry is a trajectory's
final output, score it (decode the response with the demo tokenizer + GSM8K strict regex,
the same function the peers call) and ``HSET`` that score on every output key of the
trajectory, plus one ``XADD`` to a ``done`` stream (what a producer waits on); then one
``XACK`` for the batch, all in one pipeline per batch. It keeps no trajectory state, checks
nothing, never retries, never deletes entries: a floor, not a product.

``--trivial`` replaces the scoring by a constant, to show what the queue alone costs.

Run as ``python -m benchmarks.raw consume ...`` (the benchmark starts it; ``READY``/go
handshake on stdio like :mod:`benchmarks.worker_runner`).
"""

from __future__ import annotations

import argparse
import select
import signal
import sys
import time
from collections.abc import Iterable
from typing import Any

import msgpack
import numpy as np

from benchmarks.common import PYTHON, Child, Cleanup, Row, Settings, connect, redis_cpu_seconds, watch_drain
from benchmarks.workload import Trajectory, Workload, score_final_response, trivial_score

GROUP = "raw"


def keys_of(prefix: str) -> dict[str, str]:
    return {"stream": f"{prefix}:stream", "done": f"{prefix}:done", "reward": f"{prefix}:reward:"}


# ------------------------------------------------------------------------------------------
# producer side
# ------------------------------------------------------------------------------------------


def entries(traj: Trajectory, start: int = 0, stop: int | None = None) -> list[dict[str, Any]]:
    """The stream entries of outputs ``start..stop-1`` of a trajectory (default all): exactly
    rewardq's record bytes, one per output."""
    from rewardq.queue.codec import encode_output

    sample = traj.sample()
    outputs = traj.outputs()
    stop = len(outputs) if stop is None else stop
    return [
        {
            "key": f"{traj.tid}_{i}",
            "data": encode_output(traj.uid, traj.session_id, i, outputs[i], sample, final=(i == traj.n - 1)),
            "ts": f"{time.time():.6f}",
        }
        for i in range(start, stop)
    ]


def fill(r: Any, stream: str, trajs: Iterable[Trajectory], chunk_bytes: int = 4 << 20) -> tuple[int, int]:
    """Pipelined XADD of every output; returns ``(trajectories, outputs)``."""
    pipe, size, nt, no = r.pipeline(transaction=False), 0, 0, 0
    for traj in trajs:
        for fields in entries(traj):
            pipe.xadd(stream, fields)
            size += len(fields["data"])
            no += 1
        nt += 1
        if size >= chunk_bytes:
            pipe.execute()
            pipe, size = r.pipeline(transaction=False), 0
    pipe.execute()
    return nt, no


# ------------------------------------------------------------------------------------------
# consumer side (the subprocess)
# ------------------------------------------------------------------------------------------


def _ext(code: int, data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype={1: "<i4", 2: "<i8", 3: "<f4", 4: "u1"}[code])


def consume(url: str, prefix: str, name: str, trivial: bool) -> None:
    """The baseline consumer loop; returns on SIGTERM/SIGINT (within one BLOCK period)."""
    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.append(1))
    k = keys_of(prefix)
    r = connect(url)
    try:
        r.xgroup_create(k["stream"], GROUP, id="0", mkstream=True)
    except Exception as exc:  # BUSYGROUP: a second consumer of the same group
        if "BUSYGROUP" not in str(exc):
            raise
    if not trivial:
        score_final_response(np.zeros(1, dtype=np.int32), "0")  # load the tokenizer before READY
    print("READY", flush=True)
    while not stopping and not select.select([sys.stdin], [], [], 0.05)[0]:
        pass
    while not stopping:
        resp = r.xreadgroup(GROUP, name, {k["stream"]: ">"}, count=256, block=1000)
        for _stream, batch in resp or []:
            pipe = r.pipeline(transaction=False)
            ids = []
            for eid, fields in batch:
                ids.append(eid)
                rec = msgpack.unpackb(fields[b"data"], raw=False, ext_hook=_ext)
                if not rec["final"]:
                    continue
                tid = f"{rec['uid']}_{rec['session_id']}"
                score = (
                    trivial_score(len(rec["response_ids"]))
                    if trivial
                    else score_final_response(rec["response_ids"], rec["sample"]["reward_model"]["ground_truth"])
                )
                for i in range(rec["index"] + 1):
                    pipe.hset(f"{k['reward']}{tid}_{i}", "score", score)
                pipe.xadd(k["done"], {"tid": tid})
            pipe.xack(k["stream"], GROUP, *ids)
            pipe.execute()
    r.close()


# ------------------------------------------------------------------------------------------
# the benchmark phases
# ------------------------------------------------------------------------------------------


def start_consumer(s: Settings, prefix: str, name: str, trivial: bool) -> Child:
    cmd = [PYTHON, "-m", "benchmarks.raw", "consume", "--url", s.redis_url, "--prefix", prefix, "--name", name]
    if trivial:
        cmd.append("--trivial")
    child = Child(cmd, s.workdir / f"{prefix}-{name}.log", handshake=True)
    child.wait_ready(s.start_timeout)
    return child


def check_rewards(r: Any, prefix: str, trajs: list[Trajectory], trivial: bool) -> str:
    """Compare sampled rewards with the expected GSM8K scores: ``ok`` or what differs."""
    pipe = r.pipeline(transaction=False)
    for t in trajs:
        pipe.hget(f"{keys_of(prefix)['reward']}{t.keys[0]}", "score")
    got = pipe.execute()
    scorer = "trivial" if trivial else "gsm8k"
    bad = sum(1 for t, g in zip(trajs, got) if g is None or float(g) != t.expected_for(scorer))
    return "ok" if bad == 0 else f"{bad}/{len(trajs)} wrong"


def run(s: Settings, cleanup: Cleanup, trivial: bool = False) -> list[Row]:
    """Throughput (backlog pre-filled, time to drain), then latency at a low steady rate.

    ``trivial``: the loop with the trivial scorer, the ``raw-noscore`` row of a GSM8K run;
    in a run with ``--scorer trivial`` that loop is the ``raw`` baseline itself.
    """
    baseline = s.scorer == "trivial" or not trivial
    trivial = trivial or s.scorer == "trivial"
    system = "raw" if baseline else "raw-noscore"
    prefix = s.prefix(system)
    cleanup.add(f"{prefix}:*")
    k = keys_of(prefix)
    r = connect(s.redis_url)
    rows: list[Row] = []
    child = None
    try:
        wl = Workload(s.seed, tag=f"{system}-")
        if "throughput" in s.phases:
            r.xgroup_create(k["stream"], GROUP, id="0", mkstream=True)
            nt, no = fill(r, k["stream"], wl.range(0, s.trajectories))
            child = start_consumer(s, prefix, "c0", trivial)
            child.go()
            d = watch_drain(
                lambda: r.xlen(k["done"]),
                nt,
                s.drain_timeout,
                alive=child.alive,
                snaps={"cpu": child.cpu_seconds, "redis": lambda: redis_cpu_seconds(r)},
            )
            rows.append(
                Row(
                    system,
                    "throughput",
                    1,
                    outputs=round(no * d.last_count / nt) if nt else 0,
                    rss_mb=child.peak_rss_mb(),
                    check=check_rewards(r, prefix, [wl[i] for i in range(0, nt, max(1, nt // 50))], trivial),
                    note=("plain redis-py loop, trivial scorer" if baseline else "queue only, trivial scorer")
                    if trivial
                    else "plain redis-py loop",
                    **d.row_fields(nt, no),
                )
            )
        if "latency" in s.phases and baseline:
            if child is None:
                r.xgroup_create(k["stream"], GROUP, id="0", mkstream=True)
                child = start_consumer(s, prefix, "c0", trivial)
                child.go()
            rows.append(latency(s, r, prefix, Workload(s.seed + 1, tag=f"{system}-lat-")))
    finally:
        if child is not None:
            child.stop()
        r.close()
        cleanup.run([f"{prefix}:*"])
    return rows


def latency(s: Settings, r: Any, prefix: str, wl: Workload) -> Row:
    """Put one trajectory (pipelined XADD), block on the done stream, read the final key's score."""
    k = keys_of(prefix)
    last = [(r.xrevrange(k["done"], count=1) or [(b"0-0", None)])[0][0]]
    bad: list[str] = []

    def one(i: int) -> float | None:
        traj = wl[i]
        t0 = None
        if s.latency_mode == "final":
            if traj.n > 1:
                pipe = r.pipeline(transaction=False)
                for f in entries(traj, 0, traj.n - 1):
                    pipe.xadd(k["stream"], f)
                pipe.execute()
                time.sleep(s.latency_gap)
            t0 = time.perf_counter()
            fields = entries(traj, traj.n - 1)
        else:
            fields = entries(traj)
        pipe = r.pipeline(transaction=False)
        for f in fields:
            pipe.xadd(k["stream"], f)
        pipe.execute()
        while True:
            resp = r.xread({k["done"]: last[0]}, block=5000) or []
            for _name, items in resp:
                for eid, fields in items:
                    last[0] = eid
                    if fields[b"tid"].decode() == traj.tid:
                        got = r.hget(f"{k['reward']}{traj.keys[-1]}", "score")
                        if got is None or float(got) != traj.expected_for(s.scorer):
                            bad.append(traj.tid)
                        return None if t0 is None else time.perf_counter() - t0
            if not resp:
                raise TimeoutError(f"raw: no reward for {traj.tid} within 5 s")

    from benchmarks.latency import measure, summarize

    row = summarize("raw", measure(s, one), s, f"{s.latency_rate:g} traj/s, XREAD BLOCK on done + HGET")
    row.check = "ok" if not bad else f"{len(bad)} wrong"
    return row


def cli() -> None:
    p = argparse.ArgumentParser(description="raw baseline consumer (started by python -m benchmarks)")
    p.add_argument("command", choices=["consume"])
    p.add_argument("--url", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--name", default="c0")
    p.add_argument("--trivial", action="store_true")
    a = p.parse_args()
    consume(a.url, a.prefix, a.name, a.trivial)


if __name__ == "__main__":
    cli()
